"""The PPO learner: the update rule (`PPOLearner`), its node in the YAML (`PPOConfig`), and the `Agent` it builds.

An agent is three parts, none of which is the others:
- a `Trainee` (`cory/ppo/trainee.py`): its weights, engine, RNG stream and files;
- an `Actor` (`cory/ppo/actor.py`): how it answers and the rollout-time forward passes;
- a learner (`PPOLearner` here): the update, with the state that belongs to the rule (the KL controller's β and the
  running score moments), an advantage estimator (`cory/ppo/estimators.py`) and a loss (`cory/ppo/losses.py`).

PPO, CORY and every variant call exactly this update (docs/method.md §1.1, §2): `PPOLearner.update` with the GAE
estimator and `ClippedPPO` is TRL 0.11.4's `PPOTrainer.step` after generation; for the same weights, tokens, scores
and permutation seed it gives the same update (`scripts/check_trl_parity.py`). Deliberate differences, listed in
docs/implementation-notes.md: responses are stored response-aligned, forwards get explicit position ids, and
generation runs in eval mode (TRL's train-mode generation is `generate_in_train_mode=true`).

What an algorithm gives an update and gets back travels in values, never through attributes: `Batch` (the rollout,
the sequence rewards, V_old from whichever critic, the role of every sample, an optional KL budget) in, `Update`
(statistics, the returns a critic learns from, the β that was used) out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import yaml

from cory.errors import ConfigError
from cory.policy import PolicyWithValueHead
from cory.ppo import core as ppo_core
from cory.ppo.actor import Actor
from cory.ppo.backends import RolloutBackend
from cory.ppo.core import KL_ESTIMATORS
from cory.ppo.estimators import AdvantageEstimator, EstimatorInputs
from cory.ppo.losses import Loss, LossInputs
from cory.ppo.rollout import LiveForward, Rollout, forward_logits
from cory.ppo.trainee import Optimization, Trainee

CONF = Path(__file__).resolve().parents[1] / "conf" / "algorithm"
# The learner block's only written values: `cory/conf/algorithm/ppo.yaml` (experiments change them by small diffs).
LEARNER_YAML = CONF / "ppo.yaml"
AGENT_STATE = "agent.json"  # an agent's checkpoint folder: what marks it as a policy's (a critic's is not)


# ------------------------------------------------------------------------------------------------ what travels
@dataclass
class Batch:
    """One update's input.

    Attributes:
        rollout: B samples of this learner (several roles' samples concatenated when one learner plays them all).
        scores: [B] sequence rewards (the collective reward of each sample's role), before score scaling.
        values: [B, T] V_old from a centralised critic, zero on padding; None: the rollout's own values (the
            learner's value head), or none at all for an estimator that ignores them.
        roles: [B] the role index each sample was played in (per-role estimators read it); default all 0.
        kl_budget: stop the epochs once the epoch's last minibatch's ½·mean (Δ log π)² exceeds this (a per-update
            trust region, docs/method.md §12.5); None: none (the learner's own `early_stopping` still applies).
    """

    rollout: Rollout
    scores: torch.Tensor
    values: torch.Tensor | None = None
    roles: torch.Tensor | None = None
    kl_budget: float | None = None


@dataclass
class Update:
    """One update's output: statistics (TRL's key names, `cory.ppo.metrics.agent_metrics` maps them), the returns
    [B, T] a centralised critic learns from (None when the update was skipped), and the β it used."""

    stats: dict[str, float]
    returns: torch.Tensor | None
    kl_coef: float


class Learner(Protocol):
    """What an algorithm asks of a learner: an update, the β it will use next, its state for a checkpoint, and the
    official swap's reset (a fresh optimiser, controller and statistics)."""

    @property
    def kl_coef(self) -> float: ...

    def update(self, batch: Batch) -> Update: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def reset(self) -> None: ...


# ------------------------------------------------------------------------------------------------ the node
@dataclass(frozen=True)
class PPOConfig:
    """The learner block `algorithm.agent`, identical for PPO and CORY (docs/method.md §2), and what builds agents.

    No field has a default: the numbers live in `cory/conf/algorithm/ppo.yaml` (and the experiments' diffs) only, so a
    changed YAML value cannot silently differ from code that builds this class. Outside Hydra (scripts, tests),
    `PPOConfig.from_yaml(**overrides)` reads that block. The advantage estimator and the loss are parts of their own
    (`algorithm.advantage`, `algorithm.loss`), handed to `build`.
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "learning_rate": "(0, inf)",
        "init_kl_coef": "[0, inf)",
        "kl_target": "(0, inf)",
        "kl_horizon": "(0, inf)",
        "ppo_epochs": "[1, inf)",
        "mini_batch_size": "[1, inf)",
        "gradient_accumulation_steps": "[1, inf)",
        "ratio_threshold": "(1, inf); at 1 or below nearly every minibatch is skipped",
        "score_clip": "(0, inf)",
        "max_grad_norm": "(0, inf)",
        "target_kl": "(0, inf)",
    }

    learning_rate: float
    init_kl_coef: float  # β_0 (the paper's η)
    adaptive_kl: bool  # TRL's adaptive controller (docs/method.md §2.8); false keeps β fixed
    kl_target: float
    kl_horizon: float
    kl_penalty: str  # `full` (docs/method.md §1.4) or a sampled estimator `kl` | `abs` | `mse` (§2.4)
    ppo_epochs: int
    mini_batch_size: int
    gradient_accumulation_steps: int
    ratio_threshold: float
    ratio_threshold_skip: bool  # TRL zeroes the loss but still steps Adam (§2.6); true skips the step
    use_score_scaling: bool  # R̃ = R/σ with running moments (§2.3)
    use_score_norm: bool  # R̃ = (R − μ)/σ
    score_clip: float | None
    max_grad_norm: float | None
    early_stopping: bool
    target_kl: float
    generate_in_train_mode: bool  # TRL samples with dropout on after the first step (§2.1); evaluation never does
    # the first minibatch of a batch taken whole reads the rollout's policy forward, kept with its graph, instead of
    # running it again (the same numbers; docs/cost.md "No repeated forward"); false: always its own forward
    reuse_rollout_forward: bool

    def __post_init__(self) -> None:
        """Ranges and combinations, checked when Hydra builds the node: one line naming the key (`ConfigError`)."""
        key = "algorithm.agent."
        _check(self.learning_rate > 0, f"{key}learning_rate={self.learning_rate}: must be > 0")
        _check(self.init_kl_coef >= 0, f"{key}init_kl_coef={self.init_kl_coef}: must be >= 0")
        _check(self.kl_penalty in KL_ESTIMATORS, f"{key}kl_penalty={self.kl_penalty!r}: allowed {KL_ESTIMATORS}")
        _check(self.ppo_epochs >= 1, f"{key}ppo_epochs={self.ppo_epochs}: must be >= 1")
        _check(
            self.mini_batch_size >= 1 and self.gradient_accumulation_steps >= 1,
            f"{key}mini_batch_size and gradient_accumulation_steps must be >= 1",
        )
        _check(self.kl_target > 0 and self.kl_horizon > 0, f"{key}kl_target and kl_horizon must be > 0")

    def check_batch(self, batch_size: int) -> None:
        """The minibatches must divide the batch (one optimiser step per `mini_batch_size × accumulation`)."""
        backward = self.mini_batch_size * self.gradient_accumulation_steps
        _check(
            batch_size % backward == 0,
            f"algorithm.agent.mini_batch_size × gradient_accumulation_steps = {backward} must divide "
            f"batch_size={batch_size}",
        )

    def describe(self) -> dict[str, object]:
        """What tells this learner's runs apart in names and summaries: its initial β."""
        return {"kl_coef": self.init_kl_coef}

    def optimization(self) -> Optimization:
        """How this learner's trainees are stepped (its own and a centralised critic's): Adam at `learning_rate`,
        `max_grad_norm`, `gradient_accumulation_steps` micro-batches of `mini_batch_size` rows per step."""
        return Optimization(
            self.learning_rate, self.max_grad_norm, self.mini_batch_size, self.gradient_accumulation_steps
        )

    def build(
        self,
        name: str,
        policy: PolicyWithValueHead,
        reference: torch.nn.Module,
        tokenizer,
        *,
        advantage: AdvantageEstimator,
        loss: Loss,
        train_value_head: bool,
        seed: int,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
        forward_batch_size: int = 64,
        length_groups: int = 1,
        add_special_tokens: bool = False,
        backend: RolloutBackend | None = None,
    ) -> Agent:
        """One agent on `policy` (its handle from `Backbone.policy`): trainee, actor and this learner's update.

        `train_value_head`: the learner trains its own value head (a per-agent critic); false when values come from a
        centralised critic or the estimator ignores them (the head is then neither trained nor stepped)."""
        trainee = Trainee(
            name,
            policy,
            seed,
            self.optimization(),
            train_value_head=train_value_head,
            device=device,
            autocast_dtype=autocast_dtype,
            forward_batch_size=forward_batch_size,
            length_groups=length_groups,
        )
        learner = PPOLearner(self, trainee, advantage, loss)
        actor = Actor(
            trainee,
            reference,
            tokenizer,
            self.kl_penalty,
            self.generate_in_train_mode,
            add_special_tokens,
            backend,
            planner=learner.planned_order,
        )
        return Agent(name, trainee, actor, learner)

    @classmethod
    def from_yaml(cls, **overrides: object) -> PPOConfig:
        """The `agent:` block of `cory/conf/algorithm/ppo.yaml` with `overrides` (code that runs without Hydra)."""
        block = yaml.safe_load(LEARNER_YAML.read_text(encoding="utf-8"))["agent"]
        return cls(**({k: v for k, v in block.items() if not k.startswith("_")} | overrides))


def part_from_yaml(group: str, option: str, **overrides: object):
    """The part `cory/conf/algorithm/<group>/<option>.yaml` names, with its values and `overrides` (code that runs
    without Hydra: scripts, tests). E.g. `part_from_yaml("advantage", "gae")`."""
    import importlib

    block = yaml.safe_load((CONF / group / f"{option}.yaml").read_text(encoding="utf-8"))
    module, name = block.pop("_target_").rsplit(".", 1)
    target = getattr(importlib.import_module(module), name)
    return target(**({k: v for k, v in block.items() if not k.startswith("_")} | overrides))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# ------------------------------------------------------------------------------------------------ the agent
@dataclass
class Agent:
    """One agent: what it is (`trainee`), how it answers (`actor`), how it learns (`learner`). Its checkpoint folder
    holds the trainee's files with the learner's state in `agent.json`."""

    name: str
    trainee: Trainee
    actor: Actor
    learner: Learner

    def save(self, directory: Path) -> None:
        self.trainee.save(directory, AGENT_STATE, self.learner.state())

    def load(self, directory: Path) -> None:
        self.learner.restore(self.trainee.load(directory, AGENT_STATE))

    def reset(self, reseed: bool) -> None:
        """The official swap's side effects (docs/method.md §1.5): fresh optimiser, controller and score moments,
        and with `reseed` the minibatch stream from its start."""
        self.learner.reset()
        if reseed:
            self.trainee.reseed()


def agent_on(
    name: str,
    model: torch.nn.Module,
    reference: torch.nn.Module,
    tokenizer,
    config: PPOConfig,
    seed: int,
    *,
    advantage: AdvantageEstimator | None = None,
    loss: Loss | None = None,
    value_head_seed: int | None = None,
    device: str | torch.device = "cpu",
    **placement: Any,
) -> Agent:
    """An agent on `model`, a policy handle (`Backbone.policy`) or a bare causal LM that it then owns (wrapped here
    with a fresh value head seeded by `value_head_seed`, default `seed`), with the YAML's GAE estimator and clipped
    loss unless others are given: for scripts and tests that build an agent without a run."""
    if isinstance(model, PolicyWithValueHead):
        policy = model
    else:
        with torch.random.fork_rng():
            # the value head is the only random part of a bare model's agent; a fixed seed makes agents identical
            torch.manual_seed(seed if value_head_seed is None else value_head_seed)
            policy = PolicyWithValueHead(model).to(torch.device(device))
    advantage = advantage if advantage is not None else part_from_yaml("advantage", "gae")
    loss = loss if loss is not None else part_from_yaml("loss", "ppo")
    train_value = placement.pop("train_value_head", advantage.uses_values)
    return config.build(
        name,
        policy,
        reference,
        tokenizer,
        advantage=advantage,
        loss=loss,
        train_value_head=train_value,
        seed=seed,
        device=device,
        **placement,
    )


# ------------------------------------------------------------------------------------------------ the update
class PPOLearner:
    """TRL's PPO update (`PPOTrainer.step` after generation) on one trainee, with a pluggable advantage estimator
    and loss. Owns the β controller (§2.8) and the running score moments (§2.3); the trainee owns the weights,
    optimiser and minibatch stream."""

    def __init__(self, config: PPOConfig, trainee: Trainee, advantage: AdvantageEstimator, loss: Loss) -> None:
        self.config, self.trainee, self.advantage, self.loss = config, trainee, advantage, loss
        self.kl_ctl = ppo_core.KLController(
            config.init_kl_coef, config.adaptive_kl, config.kl_target, config.kl_horizon
        )
        self.score_moments = ppo_core.RunningMoments()

    @property
    def kl_coef(self) -> float:
        """The β the next update uses."""
        return self.kl_ctl.value

    def planned_order(self, n: int) -> np.ndarray | None:
        """The row order of the first minibatch of the next update on a batch of `n`, where that minibatch is the
        whole batch and its forward can be the rollout's (`Actor.act(for_update=True)` then keeps it); else None.

        Read from a copy of the trainee's stream, which it does not advance: `update` draws the same order itself and
        uses the kept forward only if the orders agree, so a draw in between costs the saving, never the numbers.
        Only where the kept forward is the one `update` would run: one process and unsharded weights (a DDP or
        sharded forward pairs with its own backward), full fine-tuning (PEFT moves `requires_grad` between the
        adapters of a shared model), and a batch no wider than the trainee's no-grad micro-batch (the rows the
        rollout's forward would have batched together)."""
        cfg, trainee = self.config, self.trainee
        whole = cfg.mini_batch_size == n and cfg.gradient_accumulation_steps == 1 and n <= trainee.forward_batch_size
        plain = trainee.processes.count == 1 and not trainee.engine.sharded and trainee.policy.adapter is None
        if not (cfg.reuse_rollout_forward and whole and plain):
            return None
        stream = np.random.RandomState()
        stream.set_state(trainee.rng.get_state())
        return stream.permutation(n)

    def update(self, batch: Batch) -> Update:
        """One PPO update on `batch` (TRL `PPOTrainer.step`), steps 1-5 below."""
        cfg, rollout, trainee = self.config, batch.rollout, self.trainee
        live, rollout.live = rollout.live, None  # whatever happens below, the graph is not kept with the rollout
        mask = rollout.response_mask.float()
        batch_size = len(rollout)
        own_values = batch.values is None
        values = rollout.values if own_values else batch.values
        inputs = (batch.scores.float(), rollout.kls, rollout.logprobs, values)
        finite = bool(all(torch.isfinite(x).all() for x in inputs))
        # a non-finite reward or KL would poison the weights: skip the whole update and say so, on every process
        # when any has one (the update's gradient exchanges are collective: one process skipping alone hangs them)
        if not trainee.processes.all(finite):
            return Update({"nonfinite_skipped": 1.0, "kl_coef": self.kl_ctl.value}, None, self.kl_ctl.value)
        # 1. optional score scaling with this learner's running moments: R → R̃ (§2.3)
        scores = batch.scores.float()
        if cfg.use_score_scaling:
            self.score_moments.update(scores)
            scores = ppo_core.scale_scores(scores, self.score_moments, cfg.use_score_norm, cfg.score_clip)
        elif cfg.score_clip is not None:
            scores = torch.clamp(scores, -cfg.score_clip, cfg.score_clip)
        # 2. token rewards: the score on the last token, −β·kl_t on every token with the β from before this update
        # (Eq. 2 / Eq. 8, §1.4), unless the loss carries the KL term itself
        kl_coef = self.kl_ctl.value
        reward_beta = kl_coef if self.loss.kl_in_reward else 0.0
        rewards, non_score = ppo_core.penalized_rewards(scores, rollout.kls, reward_beta, mask)
        # 3. advantages and returns: the estimator (GAE whitened, §2.5; or a group baseline, §9)
        values = values * mask
        roles = batch.roles if batch.roles is not None else torch.zeros(batch_size, dtype=torch.long)
        estimate = self.advantage(
            EstimatorInputs(rewards, values if self.advantage.uses_values else None, mask, roles)
        )
        advantages, returns = estimate.advantages, estimate.returns
        # 4. PPO epochs over shuffled minibatches, one optimiser step per backward batch (§2.6, §2.7)
        backward_batch = cfg.mini_batch_size * cfg.gradient_accumulation_steps
        stats: list[dict[str, float]] = []
        early_stop, nonfinite_steps = False, 0
        for epoch in range(cfg.ppo_epochs):
            order = trainee.permutation(batch_size)
            # the rollout's forward, kept for this minibatch (`planned_order`): the same rows in the same order
            planned = live is not None and cfg.mini_batch_size == batch_size and np.array_equal(order, live.order)
            kept = live if epoch == 0 and planned else None
            live = None
            for b in range(0, batch_size, backward_batch):
                for m in range(b, b + backward_batch, cfg.mini_batch_size):
                    idx = torch.as_tensor(order[m : m + cfg.mini_batch_size])
                    stats.append(self._minibatch(rollout, idx, values, advantages, returns, kl_coef, kept))
                nonfinite_steps += not trainee.step()
            # TRL checks early stopping once per epoch, on the epoch's last minibatch (§2.7), with the policy KL
            # averaged over processes, so that every process stops at the same epoch (a process that stopped alone
            # would leave the others waiting in their next gradient exchange)
            if cfg.early_stopping and trainee.processes.mean(stats[-1]["policykl"]) > 1.5 * cfg.target_kl:
                early_stop = True
                break
            # a trust region of the schedule's (§12.5): ½·mean (Δ log π)², a KL estimate that is never negative,
            # unlike TRL's signed policy KL, which an update that raises the sampled tokens' log-probs drives below 0
            if batch.kl_budget is not None and trainee.processes.mean(stats[-1]["approx_kl"]) > batch.kl_budget:
                early_stop = True
                break
        # 5. adaptive KL control on the batch-mean sequence KL (§2.8), as TRL: the mean over processes, counted as
        # batch_size × processes samples
        kl_seq = (rollout.kls * mask).sum(-1)
        self.kl_ctl.update(trainee.processes.mean(kl_seq.mean().item()), batch_size * trainee.processes.count)
        trainee.updated()
        out = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
        out.update(
            kl=kl_seq.mean().item(),
            kl_coef=kl_coef,
            entropy=ppo_core.masked_mean(rollout.entropy, mask).item(),
            sampled_entropy=(-rollout.logprobs * mask).sum(-1).mean().item(),
            mean_non_score_reward=ppo_core.masked_mean(non_score, mask).item(),
            ratio_threshold_hits=float(sum(s["ratio_threshold_hit"] for s in stats)),
            nonfinite_steps=float(nonfinite_steps),
            nonfinite_skipped=0.0,
        )
        if trainee.train_value_head:
            out["explained_variance"] = ppo_core.explained_variance(values, returns, mask).item()
        out |= estimate.stats
        out["scaled_score"] = scores.mean().item()  # R̃: what entered the last token's reward (= R unscaled)
        out["early_stopped"] = float(early_stop)
        out.pop("ratio_threshold_hit")
        return Update(out, returns, kl_coef)

    def _minibatch(
        self,
        rollout: Rollout,
        idx: torch.Tensor,
        values: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        kl_coef: float,
        kept: LiveForward | None = None,
    ) -> dict[str, float]:
        cfg, trainee = self.config, self.trainee
        device = trainee.device
        mb = rollout.select(idx)
        mask = mb.response_mask.float().to(device)
        if kept is not None:  # the rollout's forward of these rows, in this order, with its graph
            logits, vpreds = kept.logits, kept.values
        else:
            args = (mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
            with trainee.autocast():
                logits, vpreds = forward_logits(
                    trainee.forward_module(), *(a.to(device) for a in args), True, trainee.length_groups
                )
        log_probs = torch.log_softmax(logits, dim=-1)  # once: the loss's log-probs and the entropy statistic read it
        logprobs = ppo_core.gather(log_probs, mb.response_ids.to(device))
        old_logprobs = mb.logprobs.to(device)
        terms = self.loss(
            LossInputs(
                logprobs=logprobs,
                old_logprobs=old_logprobs,
                ref_logprobs=mb.ref_logprobs.to(device),
                advantages=advantages[idx].to(device),
                mask=mask,
                vpreds=vpreds if trainee.train_value_head else None,
                old_values=values[idx].to(device),
                returns=returns[idx].to(device),
                kl_coef=kl_coef,
            )
        )
        hit = terms.ratio.item() > cfg.ratio_threshold
        if not (hit and cfg.ratio_threshold_skip and not trainee.engine.sharded):
            # TRL multiplies the loss by 0 on a hit and still steps Adam, whose momentum moves the weights (§2.6);
            # a sharded engine counts its micro-steps in `backward`, so it takes the zeroed loss even when skipping
            trainee.backward(terms.total * 0.0 if hit else terms.total)  # ÷ gradient_accumulation_steps inside
        with torch.no_grad():
            out: dict[str, float] = {}
            if terms.value is not None:
                out |= {
                    "value_loss": 0.0 if hit else terms.value.item(),
                    "value_clipfrac": terms.value_clipfrac.item(),
                }
            if terms.kl is not None:
                out["kl_loss"] = terms.kl.item()
            return out | {
                "policy_loss": 0.0 if hit else terms.policy.item(),  # TRL logs the zeroed losses on a hit
                "clipfrac": terms.clipfrac.item(),
                "approx_kl": (0.5 * ppo_core.masked_mean((logprobs - old_logprobs) ** 2, mask)).item(),
                "policykl": ppo_core.masked_mean(old_logprobs - logprobs, mask).item(),
                "ratio": terms.ratio.item(),
                "train_entropy": ppo_core.masked_mean(ppo_core.entropy_from_log_probs(log_probs), mask).item(),
                "ratio_threshold_hit": float(hit),
            }

    # ------------------------------------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_ctl.value, "score_moments": asdict(self.score_moments)}

    def restore(self, state: dict[str, Any]) -> None:
        self.kl_ctl.value = state["kl_coef"]
        self.score_moments = ppo_core.RunningMoments(**state["score_moments"])

    def reset(self) -> None:
        """Fresh optimiser, KL controller and score moments: the official swap's side effects (§1.5)."""
        self.trainee.reset()
        self.kl_ctl.value = self.config.init_kl_coef
        self.score_moments = ppo_core.RunningMoments()
