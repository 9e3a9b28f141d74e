"""CORY's two roles on other update schedules and weight layouts (docs/method.md §11).

Three switches, each a key of the `cory_*` algorithm configs (`cory/conf/algorithm/cory_{interleaved,shared,
lora_roles}.yaml`), beside CORY's own:

`schedule`: who takes a PPO update in iteration k, and whether the roles exchange.
  role_swap     both agents every iteration, roles exchanged every `swap_period` (CORY, Alg. 1, Eq. 5).
  simultaneous  both agents every iteration, roles fixed: llm1 pioneer, llm2 observer ("CORY w/o REx").
  interleaved   one agent per block of `interleave_period` = K iterations, llm1 first: llm1 learns in iterations
                [0, K), llm2 in [K, 2K), and so on (SWIRL's staged interleaved updates; ReMA's and MARFT's
                alternating agent updates). The other agent is frozen: it still acts in its role and is scored,
                its reward still enters its partner's collective reward (Eq. 4), but it takes no optimiser step and
                its KL controller, score statistics and minibatch RNG do not move. Roles stay fixed: interleaving
                replaces the role exchange, as in SWIRL and ReMA, where each agent keeps one role throughout.

`policy_sharing`: which weights play the two roles.
  separate       two agents, each its own weights (CORY).
  lora_per_role  one frozen base with one LoRA adapter per role, named `pioneer` and `observer` (llm1 trains
                 `pioneer`, llm2 `observer`); an adapter never leaves its role, so no role exchange. Needs LoRA.
  shared         one policy (one set of weights, value head and optimiser) plays both roles and is trained on both
                 roles' samples in one PPO update per iteration (self-play, as in online self-play RL for language
                 models where one model plays attacker and defender): `SharedPolicyCORY`.

`critic`: `per_agent` (each agent's own value head) or `centralized` (one critic on the joint sequence for both
  actors, `cory/algorithms/cory_cc.py`: `ScheduledCORY` is a `CORYCC`); under `interleaved` the critic learns from
  the learning agent's returns. One shared policy takes `per_agent` only.

`cory_variant` (the configs' `_target_`) builds `SharedPolicyCORY` for `policy_sharing=shared` and `ScheduledCORY`
otherwise; `schedule=role_swap, policy_sharing=separate, critic=per_agent` is CORY itself, bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cory.algorithms.base import RunContext, StepOutput
from cory.algorithms.cory import CORY, episode_samples, play
from cory.algorithms.cory_cc import CORYCC
from cory.algorithms.team import AgentTeam, TeamAlgorithm
from cory.errors import ConfigError
from cory.metrics import AGENT_PLACEHOLDER, role_key
from cory.ppo.metrics import agent_metrics, headline, nonfinite
from cory.ppo.rollout import Rollout
from cory.preemption import abandonable
from cory.tasks.base import SafeScorer

SCHEDULES = ("role_swap", "simultaneous", "interleaved")
POLICY_SHARING = ("separate", "lora_per_role", "shared")
# `lora_per_role`: the adapter each agent trains, named after the role it keeps.
ROLE_ADAPTERS = {"llm1": "pioneer", "llm2": "observer"}
# What a frozen agent's iteration cannot report: statistics of an update it did not take.
_UPDATE_ONLY = ("scaled_collective_reward", "entropy", "sampled_entropy")

# The names these variants log beyond PPO's per-agent and CORY's by-role catalogues.
VARIANT_METRICS: dict[str, str] = {
    f"schedule/{AGENT_PLACEHOLDER}/learned": (
        "1 when the agent took its PPO update this iteration, 0 when `schedule=interleaved` froze it (it still "
        "acted and was scored; no optimiser, KL-controller, score-statistics or RNG change)."
    ),
    f"schedule/{AGENT_PLACEHOLDER}/updates": "PPO updates the agent has taken so far, this iteration's included.",
}


def check_switches(
    schedule: str, interleave_period: int, policy_sharing: str, role_exchange: bool, faithful_official_swap: bool
) -> None:
    """The switches' values and combinations, one line naming the key (before any model loads)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"algorithm.schedule={schedule!r}: allowed {SCHEDULES}")
    if policy_sharing not in POLICY_SHARING:
        raise ConfigError(f"algorithm.policy_sharing={policy_sharing!r}: allowed {POLICY_SHARING}")
    if not (isinstance(interleave_period, int) and not isinstance(interleave_period, bool) and interleave_period >= 1):
        raise ConfigError(f"algorithm.interleave_period={interleave_period}: must be an integer >= 1")
    if role_exchange != (schedule == "role_swap"):
        raise ConfigError(
            f"algorithm.role_exchange={str(role_exchange).lower()} contradicts algorithm.schedule={schedule}: roles "
            f"exchange with schedule=role_swap only (set algorithm.role_exchange={str(not role_exchange).lower()})"
        )
    if faithful_official_swap and schedule != "role_swap":
        raise ConfigError(
            f"algorithm.faithful_official_swap=true needs role exchanges, which schedule={schedule} never makes"
        )
    if policy_sharing == "shared" and schedule != "simultaneous":
        raise ConfigError(
            f"algorithm.policy_sharing=shared has one policy in both roles: algorithm.schedule={schedule} has nothing "
            "to freeze or exchange (use schedule=simultaneous)"
        )
    if policy_sharing == "lora_per_role" and schedule == "role_swap":
        raise ConfigError(
            "algorithm.policy_sharing=lora_per_role keeps each role's adapter in its role: algorithm.schedule must be "
            "simultaneous or interleaved, not role_swap"
        )


def cory_variant(
    agent,
    knowledge_transfer: bool,
    role_exchange: bool,
    swap_period: int,
    w_self: float,
    w_other: float,
    faithful_official_swap: bool,
    log_samples: int,
    schedule: str,
    interleave_period: int,
    policy_sharing: str,
    critic: str = "per_agent",
    *,
    context: RunContext,
) -> ScheduledCORY | SharedPolicyCORY:
    """The algorithm of a `cory_*` config: `SharedPolicyCORY` when `policy_sharing=shared`, else `ScheduledCORY`."""
    cls = SharedPolicyCORY if policy_sharing == "shared" else ScheduledCORY
    return cls(
        agent,
        knowledge_transfer,
        role_exchange,
        swap_period,
        w_self,
        w_other,
        faithful_official_swap,
        log_samples,
        schedule,
        interleave_period,
        policy_sharing,
        critic,
        context=context,
    )


def _variant_name(schedule: str, policy_sharing: str, critic: str = "per_agent") -> str:
    base = "cory_cc" if critic == "centralized" else "cory"
    if policy_sharing != "separate":
        return f"{base}_{policy_sharing}" + ("" if schedule == "simultaneous" else f"_{schedule}")
    return base if schedule == "role_swap" else f"{base}_{schedule}"


class RoleAdapters:
    """A `cory.policy.Backbone` whose agents' LoRA adapters are named after their roles (`llm1` → `pioneer`)."""

    def __init__(self, backbone, adapters: dict[str, str]) -> None:
        self._backbone, self._adapters = backbone, adapters

    def policy(self, name: str, init_seed: int):
        # an agent's adapter is named after its role; another handle (the centralised critic's) keeps its name
        return self._backbone.policy(self._adapters.get(name, name), init_seed)

    def __getattr__(self, attr: str):  # the tokenizer, the reference, the LoRA settings: the backbone's own
        return getattr(self._backbone, attr)


def _role_adapters(context: RunContext, learner) -> RunContext:
    """The run's context with a backbone that names each agent's adapter after its role; refuses full fine-tuning."""
    learner.check_batch(context.settings.batch_size)  # as the team does: a bad value costs seconds, not a load
    backbone = context.backbone()
    if backbone.lora is None:
        raise ConfigError(
            "algorithm.policy_sharing=lora_per_role trains one LoRA adapter per role, but model.lora.enabled=false "
            "(full fine-tuning): set model.lora.enabled=true or algorithm.policy_sharing=separate"
        )
    if not backbone.lora.share_base:
        raise ConfigError(
            "algorithm.policy_sharing=lora_per_role puts both roles' adapters on one base, but "
            "model.lora.share_base=false"
        )
    roles = RoleAdapters(backbone, ROLE_ADAPTERS)
    return dataclasses.replace(context, backbone=lambda: roles)


class ScheduledCORY(CORYCC):
    """CORY's two agents with `schedule` and `policy_sharing` in {separate, lora_per_role} (module docstring), with
    each agent's own value head or one centralised critic (`critic`, `cory/algorithms/cory_cc.py`).

    CORY's iteration (Alg. 1) runs unchanged; only step 5 asks the schedule whether each agent learns (`learns`).
    """

    def __init__(
        self,
        agent,
        knowledge_transfer: bool,
        role_exchange: bool,
        swap_period: int,
        w_self: float,
        w_other: float,
        faithful_official_swap: bool,
        log_samples: int,
        schedule: str,
        interleave_period: int,
        policy_sharing: str,
        critic: str = "per_agent",
        *,
        context: RunContext,
    ) -> None:
        check_switches(schedule, interleave_period, policy_sharing, role_exchange, faithful_official_swap)
        if policy_sharing == "shared":
            raise ConfigError("algorithm.policy_sharing=shared is SharedPolicyCORY (build it with cory_variant)")
        self.schedule, self.interleave_period, self.policy_sharing = schedule, interleave_period, policy_sharing
        if policy_sharing == "lora_per_role":
            context = _role_adapters(context, agent)
        super().__init__(
            agent,
            critic,
            knowledge_transfer,
            role_exchange,
            swap_period,
            w_self,
            w_other,
            faithful_official_swap,
            log_samples,
            context=context,
        )
        self.updates = dict.fromkeys(self.team.agents, 0)

    def describe(self) -> dict:
        identity = super().describe() | {
            "algorithm": _variant_name(self.schedule, self.policy_sharing, self.critic_mode),
            "schedule": self.schedule,
            "policy_sharing": self.policy_sharing,
        }
        if self.critic is None:  # each agent's own value head, as CORY: not named
            identity.pop("critic")
        return identity

    def learns(self, agent_id: str, iteration: int) -> bool:
        """Whether `agent_id` takes its update in iteration k: always, except with `interleaved`, where llm1 learns
        in blocks 0, 2, 4, … of `interleave_period` iterations and llm2 in blocks 1, 3, 5, …"""
        if self.schedule != "interleaved":
            return True
        turn = (iteration // self.interleave_period) % 2
        return list(self.team.agents).index(agent_id) == turn

    def _learn(self, iteration: int, agent, rollout, rewards: list[float]) -> dict[str, float]:
        if self.learns(agent.name, iteration):
            self.updates[agent.name] += 1
        return super()._learn(iteration, agent, rollout, rewards)  # a frozen agent is not touched (CORY._learn)

    def step(self, iteration: int) -> StepOutput:
        out = super().step(iteration)
        for agent_id in self.team.agents:
            learned = self.learns(agent_id, iteration)
            out.metrics[f"schedule/{agent_id}/learned"] = float(learned)
            out.metrics[f"schedule/{agent_id}/updates"] = float(self.updates[agent_id])
            if not learned:
                for name in _UPDATE_ONLY:
                    out.metrics.pop(f"train/{agent_id}/{name}", None)
        return out

    def _state(self) -> dict:
        return super()._state() | {"updates": dict(self.updates)}

    def _restore(self, state: dict) -> None:
        super()._restore(state)
        self.updates = {agent_id: int(n) for agent_id, n in state["updates"].items()}


class SharedPolicyCORY(TeamAlgorithm):
    """One policy `llm1` in both roles, trained on both roles' samples (`policy_sharing=shared`, docs/method.md §11.2).

    Per iteration: CORY's steps 1-4 with π_P = π_O = π_θ (one module acts twice), then ONE PPO update on the 2B
    sequences [pioneer's; observer's] with their collective rewards [R_P; R_O] (Eq. 4): one advantage
    whitening, one KL-controller update on the batch's mean KL, minibatches drawn across both roles.
    """

    def __init__(
        self,
        agent,
        knowledge_transfer: bool,
        role_exchange: bool,
        swap_period: int,
        w_self: float,
        w_other: float,
        faithful_official_swap: bool,
        log_samples: int,
        schedule: str,
        interleave_period: int,
        policy_sharing: str,
        critic: str = "per_agent",
        *,
        context: RunContext,
    ) -> None:
        check_switches(schedule, interleave_period, policy_sharing, role_exchange, faithful_official_swap)
        if critic != "per_agent":
            raise ConfigError(
                f"algorithm.critic={critic}: one shared policy has one value head for both roles "
                "(algorithm.policy_sharing=shared takes algorithm.critic=per_agent)"
            )
        if policy_sharing != "shared":
            raise ConfigError(f"algorithm.policy_sharing={policy_sharing}: SharedPolicyCORY is policy_sharing=shared")
        self.knowledge_transfer, self.w_self, self.w_other = knowledge_transfer, w_self, w_other
        self.learner, self.log_samples, self.settings = agent, log_samples, context.settings
        longest = CORY._longest_observer_prompt if knowledge_transfer else None
        self.team = AgentTeam(context, agent, ["llm1"], longest_prompt=longest)
        self.task, self.scorer = self.team.task, SafeScorer(self.team.task)
        self.updates = 0

    def describe(self) -> dict:
        return {
            "algorithm": "cory_shared",
            "kl_coef": self.learner.init_kl_coef,
            "schedule": "simultaneous",
            "policy_sharing": "shared",
        }

    def step(self, iteration: int) -> StepOutput:
        policy = self.team.agents["llm1"]
        queries, max_new_tokens = self.team.batch(iteration)
        t0 = time.perf_counter()
        with abandonable():  # a stop signal drops the iteration up to step 4: nothing a checkpoint holds has changed
            # 1-4. CORY's steps with π_P = π_O = π_θ: the policy answers as pioneer, then as observer with its own
            # first answer in view; both answers scored, collective rewards (Eq. 4)
            ep = play(self, policy, policy, queries, max_new_tokens)
        t1 = time.perf_counter()
        # 5. one PPO update on both roles' 2B samples
        both = concat_rollouts(ep.pioneer, ep.observer, policy.tokenizer.pad_token_id)
        rewards, collective = ep.r_pioneer + ep.r_observer, ep.R_pioneer + ep.R_observer
        stats = policy.learn(both, torch.tensor(collective))
        self.updates += 1
        metrics = agent_metrics("llm1", both, rewards, collective, stats, self.task.eval_kl_coef)
        for role, rollout, r in (("pioneer", ep.pioneer, ep.r_pioneer), ("observer", ep.observer, ep.r_observer)):
            metrics[role_key(role, "task_reward")] = float(torch.tensor(r).mean())  # the roles' halves
            metrics[role_key(role, "kl")] = rollout.kls.sum(-1).mean().item()
        metrics |= {
            "schedule/llm1/learned": 1.0,
            "schedule/llm1/updates": float(self.updates),
            "time/generate_s": t1 - t0,
            "time/learn_s": time.perf_counter() - t1,
            "train/reward_failures": float(ep.failures),
        }
        samples = episode_samples(queries, ep, self.log_samples)
        return StepOutput(metrics, samples, nonfinite(metrics), headline(metrics, ["llm1"]))

    def save(self, directory: Path) -> None:
        self.team.save(directory, {"updates": self.updates})

    def load(self, directory: Path) -> None:
        self.updates = int(self.team.load(directory)["updates"])


def concat_rollouts(a: Rollout, b: Rollout, pad_token_id: int) -> Rollout:
    """`a`'s samples then `b`'s as one batch: prompts re-padded on the left and responses on the right to the wider
    of the two (padding is masked and positions come from the masks, so no log-prob or value changes)."""
    out = {}
    for field in dataclasses.fields(Rollout):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, list) or x.dim() == 1:  # texts, per-sample flags
            out[field.name] = x + y if isinstance(x, list) else torch.cat([x, y])
            continue
        left = field.name.startswith("prompt_")  # [B, P] left-padded; every other [B, T] right-padded
        value = pad_token_id if field.name.endswith("_ids") else 0
        width = max(x.shape[1], y.shape[1])
        padded = [F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value) for t in (x, y)]
        out[field.name] = torch.cat(padded)
    return Rollout(**out)
