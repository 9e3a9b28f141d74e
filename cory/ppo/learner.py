"""`Agent`: one trainable LLM with its value head, optimiser, KL controller and score statistics.

PPO has one agent and CORY two; both call exactly this code (docs/method.md §1.1, §2). `learn` is TRL 0.11.4's
`PPOTrainer.step` after generation: for the same weights, tokens, scores and permutation seed it gives the
same update (`scripts/check_trl_parity.py`). Deliberate differences, listed in docs/implementation-notes.md:
responses are stored response-aligned, forwards get explicit position ids, and generation runs in eval mode (TRL's
train-mode generation is `generate_in_train_mode=true`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cory import distributed, engines
from cory.checkpoints import tensors_of
from cory.errors import ConfigError
from cory.policy import PolicyWithValueHead
from cory.ppo import core as ppo_core
from cory.ppo.backends import HFBackend, RolloutBackend
from cory.ppo.core import KL_ESTIMATORS
from cory.ppo.rollout import Rollout, encode_prompts, forward_logits, pad, score_forward

# The learner block's only written values: `cory/conf/algorithm/ppo.yaml` (experiments change them by small diffs).
LEARNER_YAML = Path(__file__).resolve().parents[1] / "conf" / "algorithm" / "ppo.yaml"
AGENT_STATE = "agent.json"  # an agent's checkpoint folder: what marks it as a policy's (a critic's is not)


@dataclass(frozen=True)
class PPOConfig:
    """Learner hyperparameters: the `algorithm.agent` block, identical for PPO and CORY (docs/method.md §2).

    No field has a default: the numbers live in `cory/conf/algorithm/ppo.yaml` (and the experiments' diffs) only, so a
    changed YAML value cannot silently differ from code that builds this class. Outside Hydra (scripts, tests),
    `PPOConfig.from_yaml(**overrides)` reads that block.
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "learning_rate": "(0, inf)",
        "init_kl_coef": "[0, inf)",
        "kl_target": "(0, inf)",
        "kl_horizon": "(0, inf)",
        "gamma": "[0, 1]",
        "lam": "[0, 1]",
        "cliprange": "(0, 1]; the ratio is clipped to [1 - cliprange, 1 + cliprange]",
        "cliprange_value": "(0, inf)",
        "vf_coef": "[0, inf)",
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
    gamma: float
    lam: float
    cliprange: float
    cliprange_value: float
    vf_coef: float
    ppo_epochs: int
    mini_batch_size: int
    gradient_accumulation_steps: int
    ratio_threshold: float
    ratio_threshold_skip: bool  # TRL zeroes the loss but still steps Adam (§2.6); true skips the step
    use_score_scaling: bool  # R̃ = R/σ with running moments (§2.3)
    use_score_norm: bool  # R̃ = (R − μ)/σ
    score_clip: float | None
    max_grad_norm: float | None
    whiten_rewards: bool
    early_stopping: bool
    target_kl: float
    generate_in_train_mode: bool  # TRL samples with dropout on after the first step (§2.1); evaluation never does

    def __post_init__(self) -> None:
        """Ranges and combinations, checked when Hydra builds the node: one line naming the key (`ConfigError`)."""
        key = "algorithm.agent."
        _check(self.learning_rate > 0, f"{key}learning_rate={self.learning_rate}: must be > 0")
        _check(self.init_kl_coef >= 0, f"{key}init_kl_coef={self.init_kl_coef}: must be >= 0")
        _check(self.kl_penalty in KL_ESTIMATORS, f"{key}kl_penalty={self.kl_penalty!r}: allowed {KL_ESTIMATORS}")
        _check(self.ppo_epochs >= 1, f"{key}ppo_epochs={self.ppo_epochs}: must be >= 1")
        for name in ("gamma", "lam"):  # discount and GAE λ
            value = getattr(self, name)
            _check(0 <= value <= 1, f"{key}{name}={value}: must be in [0, 1]")
        _check(
            self.mini_batch_size >= 1 and self.gradient_accumulation_steps >= 1,
            f"{key}mini_batch_size and gradient_accumulation_steps must be >= 1",
        )
        _check(0 <= self.cliprange and 0 <= self.cliprange_value, f"{key}cliprange(_value) must be >= 0")
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
        """What tells this learner's runs apart in names and summaries: its advantage estimator (GAE here)."""
        return {"advantage": "gae"}

    def build(self, name: str, model, ref_model, tokenizer, **placement) -> Agent:
        """One agent with these hyperparameters (`placement`: `Agent`'s seed, device and batch arguments)."""
        return Agent(name, model, ref_model, tokenizer, self, **placement)

    @classmethod
    def from_yaml(cls, **overrides: object) -> PPOConfig:
        """The `agent:` block of `cory/conf/algorithm/ppo.yaml` with `overrides` (code that runs without Hydra)."""
        block = yaml.safe_load(LEARNER_YAML.read_text(encoding="utf-8"))["agent"]
        return cls(**({k: v for k, v in block.items() if not k.startswith("_")} | overrides))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


class Agent:
    """One trainable policy plus everything that belongs to it (docs/method.md §1.1, §1.5).

    Args:
        name: the agent id (`llm1`, `llm2`).
        model: its policy handle (`cory.policy.Backbone.policy`: a full model or one LoRA adapter, with its value
            head), or a bare causal LM that this agent then owns entirely (wrapped here with a fresh value head).
        ref_model: π0, shared and frozen: a frozen copy, or the LoRA base with adapters disabled. Never stepped,
            never saved by an agent.
        tokenizer: the policy's tokenizer.
        config: the learner block.
        seed: seed of this agent's minibatch-permutation stream.
        device, autocast_dtype, forward_batch_size: placement, mixed precision, rollout micro-batch.
        value_head_seed: seed of the value head built for a bare `model` (default `seed`).
        add_special_tokens: tokenise prompts with the tokenizer's special tokens (the model's choice: Llama's BOS).
        backend: what samples the responses (`cory/ppo/backends.py`); default Hugging Face `generate` on the policy.
            Log-probs, values and KL are always this agent's own forward, whichever backend sampled.
    """

    # Whether the update trains this agent's value head (PPO's value loss, §2.6). Learners without one of their own
    # (critic-free, or values from a centralised critic) set it false: no value term, the head is not stepped.
    trains_value = True

    def __init__(
        self,
        name: str,
        model: PreTrainedModel | PolicyWithValueHead,
        ref_model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        config: PPOConfig,
        seed: int,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
        forward_batch_size: int = 64,
        value_head_seed: int | None = None,
        add_special_tokens: bool = False,
        backend: RolloutBackend | None = None,
    ) -> None:
        self.name, self.config, self.tokenizer = name, config, tokenizer
        self.device = torch.device(device)
        if isinstance(model, PolicyWithValueHead):
            self.policy = model  # placed and seeded by `Backbone.policy`
        else:
            with torch.random.fork_rng():
                # the value head is the only random part of a bare model's agent; a fixed seed makes agents identical
                torch.manual_seed(seed if value_head_seed is None else value_head_seed)
                self.policy = PolicyWithValueHead(model).to(self.device)
        self.ref_model = ref_model
        self.add_special_tokens = add_special_tokens
        self.engine = self._new_engine()
        self.kl_ctl = ppo_core.KLController(
            config.init_kl_coef, config.adaptive_kl, config.kl_target, config.kl_horizon
        )
        self.score_moments = ppo_core.RunningMoments()
        # TRL draws minibatch permutations from numpy's legacy global RNG; a RandomState(seed) gives the same
        # sequence as `np.random.seed(seed)` while keeping each agent's stream its own (docs/method.md §1.5).
        self.rng = np.random.RandomState(seed)
        self.seed = seed
        self.autocast_dtype = autocast_dtype
        self.forward_batch_size = forward_batch_size
        self.steps_since_load = 0
        self.advantage_stats: dict[str, float] = {}  # what `advantages` reports of the last update (none for GAE)
        self.policy.eval()  # dropout off in every PPO forward, as TRL (§2.1)
        self.backend = backend if backend is not None else HFBackend(self.policy, tokenizer, self.device)
        # the backend is synced before a generation whenever the policy's `weights_version` moved since the last sync;
        # it lives on the policy handle, so an agent sharing another's policy sees that agent's updates too
        self._synced_version: int | None = None

    # ------------------------------------------------------------------------------------------------ acting
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def act(
        self,
        prompts: list[str],
        max_new_tokens: int,
        generation_kwargs: dict,
        batch_size: int,
        lengths: list[int] | None = None,
        kl_estimator: str | None = None,
        evaluation: bool = False,
    ) -> Rollout:
        """Sample one response per prompt, then compute the rollout-time quantities.

        `lengths` (evaluation) cuts response i to its own cap; sampling is autoregressive, so this has the
        distribution of sampling with `max_new_tokens=lengths[i]` while generating the batch in one call.
        `evaluation=True` always samples in eval mode (dropout off): `generate_in_train_mode` reproduces a quirk
        of TRL's training loop and must not confound a before/after comparison (docs/method.md §2.1, §1.6).
        """
        train_mode = self.config.generate_in_train_mode and self.steps_since_load > 0 and not evaluation
        self.policy.train(train_mode)
        prompt_ids = encode_prompts(self.tokenizer, prompts, self.add_special_tokens)
        version = getattr(self.policy, "weights_version", 0)
        if self._synced_version != version:
            self.backend.sync_weights(self.policy)
            self._synced_version = version
        with self._autocast(), self.engine.generating():  # ZeRO-3: on gathered weights (`cory/engines.py`)
            response_ids = self.backend.generate(prompt_ids, max_new_tokens, generation_kwargs, batch_size)
        self.policy.eval()
        if lengths is not None:
            response_ids = [r[:n] for r, n in zip(response_ids, lengths)]
        rollout = self.score_tokens(prompt_ids, response_ids, prompts, kl_estimator)
        eos = self.tokenizer.eos_token_id
        caps = lengths if lengths is not None else [max_new_tokens] * len(response_ids)
        rollout.hit_max_tokens = torch.tensor([len(r) >= c and r[-1] != eos for r, c in zip(response_ids, caps)])
        return rollout

    @torch.no_grad()
    def score_tokens(
        self,
        prompt_ids: list[torch.Tensor],
        response_ids: list[torch.Tensor],
        prompts: list[str] | None = None,
        kl_estimator: str | None = None,
    ) -> Rollout:
        """The rollout for given token ids (TRL `step`'s first forward passes). Lists of 1-D tensors.

        `kl_estimator` overrides the configured penalty's estimator (evaluation always measures `full` KL).
        """
        if any(len(r) == 0 for r in response_ids):
            raise ValueError("every response needs at least one token (max_new_tokens must be >= 1)")
        p_ids, p_mask = pad(prompt_ids, self.tokenizer.pad_token_id, left=True)
        r_ids, r_mask = pad(response_ids, self.tokenizer.pad_token_id, left=False)
        with self._autocast():
            out = score_forward(
                self.engine.forward_module(self.policy),
                self.ref_model,
                p_ids.to(self.device),
                p_mask.to(self.device),
                r_ids.to(self.device),
                r_mask.to(self.device),
                kl_estimator or self.config.kl_penalty,
                self.forward_batch_size,
            )
        out = {k: v.cpu() for k, v in out.items()}
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        if prompts is None:
            prompts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
        return Rollout(
            prompts=list(prompts),
            responses=texts,
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            response_ids=r_ids,
            response_mask=r_mask,
            logprobs=out["logprobs"],
            ref_logprobs=out["ref_logprobs"],
            values=out["values"],
            kls=out["kls"] * r_mask,
            entropy=out["entropy"],
            hit_max_tokens=torch.zeros(len(r_ids), dtype=torch.bool),
        )

    # ---------------------------------------------------------------------------------------------- learning
    def learn(self, rollout: Rollout, scores: torch.Tensor) -> dict[str, float]:
        """One PPO update on `rollout` with sequence rewards `scores` [B] (TRL `PPOTrainer.step`)."""
        cfg, mask = self.config, rollout.response_mask.float()
        batch_size = len(rollout)
        inputs = (scores.float(), rollout.kls, rollout.logprobs, rollout.values)
        finite = bool(all(torch.isfinite(x).all() for x in inputs))
        # a non-finite reward or KL would poison the weights: skip the whole update and say so, on every process
        # when any has one (the update's gradient exchanges are collective: one process skipping alone hangs them)
        if not all(distributed.every(finite)):
            return {"nonfinite_skipped": 1.0, "kl_coef": self.kl_ctl.value}
        # 1. optional score scaling with this agent's running moments: R → R̃ (§2.3)
        scores = scores.float()
        if cfg.use_score_scaling:
            self.score_moments.update(scores)
            scores = ppo_core.scale_scores(scores, self.score_moments, cfg.use_score_norm, cfg.score_clip)
        elif cfg.score_clip is not None:
            scores = torch.clamp(scores, -cfg.score_clip, cfg.score_clip)
        # 2. KL-shaped token rewards with the β from before this update (Eq. 2 / Eq. 8, §1.4)
        kl_coef = self.kl_ctl.value
        rewards, non_score = ppo_core.penalized_rewards(scores, rollout.kls, kl_coef, mask)
        # 3. advantages and returns: GAE, whitened (§2.5); a critic-free learner overrides `advantages`
        values = rollout.values * mask
        advantages, returns = self.advantages(rewards, values, mask)
        # 4. PPO epochs over shuffled minibatches, one optimiser step per backward batch (§2.6, §2.7)
        backward_batch = cfg.mini_batch_size * cfg.gradient_accumulation_steps
        stats: list[dict[str, float]] = []
        early_stop, nonfinite_steps = False, 0
        for _ in range(cfg.ppo_epochs):
            order = self.rng.permutation(batch_size)
            for b in range(0, batch_size, backward_batch):
                for m in range(b, b + backward_batch, cfg.mini_batch_size):
                    idx = torch.as_tensor(order[m : m + cfg.mini_batch_size])
                    stats.append(self._train_minibatch(rollout, idx, values, advantages, returns))
                nonfinite_steps += not self._optimizer_step()
            # TRL checks early stopping once per epoch, on the epoch's last minibatch (§2.7), with the policy KL
            # averaged over processes, so that every process stops at the same epoch (a process that stopped alone
            # would leave the others waiting in their next gradient exchange)
            if cfg.early_stopping and distributed.mean(stats[-1]["policykl"]) > 1.5 * cfg.target_kl:
                early_stop = True
                break
        # 5. adaptive KL control on the batch-mean sequence KL (§2.8)
        kl_seq = (rollout.kls * mask).sum(-1)
        # as TRL: the mean KL over processes, counted as batch_size × world_size samples (cory/distributed.py)
        self.kl_ctl.update(distributed.mean(kl_seq.mean().item()), batch_size * distributed.world_size())
        self.steps_since_load += 1
        self.weights_changed()
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
        if self.trains_value:
            out["explained_variance"] = ppo_core.explained_variance(values, returns, mask).item()
        out |= self.advantage_stats
        out["scaled_score"] = scores.mean().item()  # R̃: what entered the last token's reward (= R unscaled)
        out["early_stopped"] = float(early_stop)
        out.pop("ratio_threshold_hit")
        return out

    def advantages(
        self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and returns [B, T] from KL-shaped token rewards and V_old (all [B, T]): GAE, then whitening
        (§2.5). The seam of the learners that estimate advantages another way (`cory/ppo/critic_free.py`) or
        take their values from outside (`cory/ppo/central_critic.py`)."""
        cfg = self.config
        return ppo_core.gae(rewards, values, mask, cfg.gamma, cfg.lam, cfg.whiten_rewards)

    def _train_minibatch(
        self,
        rollout: Rollout,
        idx: torch.Tensor,
        values: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
    ) -> dict[str, float]:
        cfg = self.config
        mb = rollout.select(idx)
        mask = mb.response_mask.float().to(self.device)
        args = (mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
        with self._autocast():
            logits, vpreds = forward_logits(
                self.engine.forward_module(self.policy), *(a.to(self.device) for a in args), with_values=True
            )
        logprobs = ppo_core.gather_logprobs(logits, mb.response_ids.to(self.device))
        old_logprobs = mb.logprobs.to(self.device)
        pg_loss, pg_clipfrac, mean_ratio = ppo_core.policy_loss(
            logprobs, old_logprobs, advantages[idx].to(self.device), mask, cfg.cliprange
        )
        if self.trains_value:
            vf_loss, vf_clipfrac = ppo_core.value_loss(
                vpreds, values[idx].to(self.device), returns[idx].to(self.device), mask, cfg.cliprange_value
            )
            loss = pg_loss + cfg.vf_coef * vf_loss
        else:  # no value term: the value head gets no gradient (and is not among the trainable parameters)
            loss = pg_loss
        hit = mean_ratio.item() > cfg.ratio_threshold
        if not (hit and cfg.ratio_threshold_skip and not self.engine.sharded):
            # TRL multiplies the loss by 0 on a hit and still steps Adam, whose momentum moves the weights (§2.6);
            # a sharded engine counts its micro-steps in `backward`, so it takes the zeroed loss even when skipping
            self.engine.backward(loss * 0.0 if hit else loss)  # ÷ gradient_accumulation_steps inside
        with torch.no_grad():
            value_stats = (
                {"value_loss": 0.0 if hit else vf_loss.item(), "value_clipfrac": vf_clipfrac.item()}
                if self.trains_value
                else {}
            )
            return value_stats | {
                "policy_loss": 0.0 if hit else pg_loss.item(),  # TRL logs the zeroed losses on a hit
                "clipfrac": pg_clipfrac.item(),
                "approx_kl": (0.5 * ppo_core.masked_mean((logprobs - old_logprobs) ** 2, mask)).item(),
                "policykl": ppo_core.masked_mean(old_logprobs - logprobs, mask).item(),
                "ratio": mean_ratio.item(),
                "train_entropy": ppo_core.masked_mean(ppo_core.entropy_from_logits(logits), mask).item(),
                "ratio_threshold_hit": float(hit),
            }

    def weights_changed(self) -> None:
        """Mark the policy's weights as changed: the rollout backend is synced before the next generation."""
        self.policy.weights_version = getattr(self.policy, "weights_version", 0) + 1

    def context_length(self) -> int | None:
        """The model's context in positions (None when its config does not say)."""
        config = self.policy.pretrained_model.config.get_text_config()
        return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)

    def token_counts(self, prompts: list[str]) -> list[int]:
        """Prompt lengths in tokens, as `act` tokenises them."""
        ids = self.tokenizer(prompts, add_special_tokens=self.add_special_tokens)["input_ids"]
        return [len(x) for x in ids]

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every weight and optimiser tensor, named: what a loaded checkpoint must hold finite. Collective under a
        sharded engine (the Adam state is gathered; under ZeRO-3 the weights too, copied out on the CPU)."""
        with self.engine.whole():
            tensors = {f"weight {n}": engines.held(t) for n, t in self.policy.state_dict(keep_vars=True).items()}
        return tensors | tensors_of(self.engine.state_dict()["state"], "optimizer state")

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters this agent's optimiser steps, selected by name: its LoRA adapter and value head, or the
        whole policy with full fine-tuning (never by `requires_grad`, which PEFT flips with the active adapter).
        The trainer checks them for finiteness after every step."""
        return self.policy.trainable_parameters()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch Adam that steps this agent's parameters (under ZeRO: this process's shard of them)."""
        return self.engine.optimizer

    def _new_engine(self) -> engines.AdamStep | engines.ZeroStep | engines.FsdpStep:
        """Adam over the trainable parameters, on every process or sharded by ZeRO (`cory/engines.py`, the run's
        hardware option): torch defaults, no weight decay, constant learning rate (docs/method.md §2.1)."""
        cfg = self.config
        return engines.new_engine(
            self.policy,
            self.trainable_parameters(),
            cfg.learning_rate,
            cfg.max_grad_norm,
            cfg.mini_batch_size,
            cfg.gradient_accumulation_steps,
        )

    def _optimizer_step(self) -> bool:
        return self.engine.step()

    # ------------------------------------------------------------------------------------------ checkpointing
    def save(self, directory: Path) -> None:
        """What the policy owns (safetensors: adapter + value head, or all weights), optimiser (tensors only),
        KL controller, score moments and RNG (JSON)."""
        directory.mkdir(parents=True, exist_ok=True)
        optimizer_state = self.engine.state_dict()  # under ZeRO, gathered by every process (collective)
        with self.engine.whole():  # ZeRO-3: the weights gathered on every process (collective), rank 0 writes them
            if distributed.is_main():
                self.policy.save_weights(directory)
        if not distributed.is_main():
            return
        torch.save(optimizer_state, directory / "optimizer.pt")
        rng_name, keys, pos, has_gauss, gauss = self.rng.get_state()
        state = {
            "kl_coef": self.kl_ctl.value,
            "score_moments": asdict(self.score_moments),
            "rng": [rng_name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
            "steps_since_load": self.steps_since_load,
        }
        (directory / AGENT_STATE).write_text(json.dumps(state))

    def load(self, directory: Path) -> None:
        """Inverse of `save`; the optimiser state is read with `weights_only=True` (no pickle execution)."""
        with self.engine.whole(modify=True):  # ZeRO-3: every process reads the file, rank 0's copy is sharded
            self.policy.load_weights(directory)
        self.weights_changed()
        self.engine.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        state = json.loads((directory / AGENT_STATE).read_text())
        self.kl_ctl.value = state["kl_coef"]
        self.score_moments = ppo_core.RunningMoments(**state["score_moments"])
        name, keys, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        self.steps_since_load = state["steps_since_load"]

    def reset_training_state(self) -> None:
        """Fresh optimiser, KL controller and score moments: the official swap's side effects (§1.5)."""
        self.engine.reset(self.config.learning_rate)
        self.kl_ctl.value = self.config.init_kl_coef
        self.score_moments = ppo_core.RunningMoments()
        self.steps_since_load = 0  # the official swap reloads the models
