"""CORY: two copies of the LLM, pioneer and observer, trained on a collective reward with role exchange.

Read against the paper's Algorithm 1 (arXiv 2410.06101) and docs/method.md §1. Each agent is the PPO learner
of `cory/ppo/learner.py`, unchanged: what CORY adds is only this orchestration.
  1. the pioneer answers the query                          (Alg. 1 l.7;  docs/method.md §1.2 step 2)
  2. the observer answers with the pioneer's answer in view (Alg. 1 l.8-9, knowledge transfer; §1.2 steps 3-4)
  3. both answers are scored on the original query          (Alg. 1 l.12-13, Eq. 4; l.13's r(s0, a1) is a typo)
  4. collective reward R_i = w_self·r_i + w_other·r_{-i}    (Eq. 4; defaults 1, 1; [v2] signs for ablations)
  5. two independent PPO updates, each with its own KL to π0 on its own prompt (Eq. 2 / Eq. 8; §1.4)
  6. every `swap_period` iterations the roles are exchanged (Eq. 5): the role map flips, the weights stay.
Deviation (docs/implementation-notes.md): roles are swapped by exchanging the role map rather than the
weights (equivalent to Eq. 5, docs/method.md §1.5); `faithful_official_swap=true` adds the official code's resets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from cory.algorithms.base import RunContext, StepOutput
from cory.algorithms.team import AgentTeam, TeamAlgorithm, learner_identity
from cory.errors import ConfigError
from cory.metrics import role_key
from cory.ppo.metrics import agent_metrics, headline, nonfinite, sample_rows
from cory.ppo.rollout import Rollout
from cory.preemption import abandonable
from cory.tasks.base import SafeScorer, Task

# CORY's by-role views and role exchange (per-agent names: `cory.ppo.metrics.PPO_METRICS`).
CORY_METRICS: dict[str, str] = {
    # CORY by role and role exchange.
    role_key("pioneer", "task_reward"): "Task reward of whichever agent is the pioneer this iteration.",
    role_key("pioneer", "kl"): "KL_seq of whichever agent is the pioneer this iteration.",
    role_key("observer", "task_reward"): "Task reward of whichever agent is the observer this iteration.",
    role_key("observer", "kl"): "KL_seq of whichever agent is the observer this iteration.",
    "cory/llm1_role": "Role held by LLM1 this iteration: 0 = pioneer, 1 = observer (LLM2 holds the other).",
    "cory/swaps": "Cumulative number of role exchanges so far.",
}


@dataclass
class Episode:
    """Steps 1-4 of one CORY iteration, for a batch of B queries: each role's rollout (B samples), task rewards
    r_i = r(q, a_i) on the original query, collective rewards R_i (Eq. 4) and the number of failed scorings."""

    pioneer: Rollout
    observer: Rollout
    r_pioneer: list[float]
    r_observer: list[float]
    R_pioneer: list[float]
    R_observer: list[float]
    failures: int


def play(cory, pioneer, observer, queries: list[str], max_new_tokens: int) -> Episode:
    """CORY's steps 1-4 (Alg. 1 l.7-13): `pioneer` and `observer` are agents (the same one under one shared policy,
    `cory/algorithms/cory_variants.py`); `cory` supplies the task, scorer, generation batch size, knowledge-transfer
    switch and the reward weights (w_self, w_other)."""
    task, batch, gen = cory.task, cory.team.generation_batch_size, cory.task.generation_kwargs
    # 1. pioneer: a1 ~ π_P(· | x_P)
    pio = pioneer.act([task.pioneer_prompt(q) for q in queries], max_new_tokens, gen, batch)
    # 2. observer: x_O = T_obs(q, a1) from decoded text, then a2 ~ π_O(· | x_O), same generation settings
    if cory.knowledge_transfer:
        obs_prompts = [task.observer_prompt(q, a1) for q, a1 in zip(queries, pio.responses)]
    else:  # "CORY w/o KT": the observer sees the query alone (§1.7)
        obs_prompts = [task.pioneer_prompt(q) for q in queries]
    obs = observer.act(obs_prompts, max_new_tokens, gen, batch)
    # 3. task rewards on the original query only: r1 = r(q, a1), r2 = r(q, a2)
    r1, failed1 = cory.scorer(queries, pio.responses)
    r2, failed2 = cory.scorer(queries, obs.responses)
    # 4. collective reward (Eq. 4): R_P = w_self·r1 + w_other·r2, R_O = w_self·r2 + w_other·r1
    R_pio = [cory.w_self * a + cory.w_other * b for a, b in zip(r1, r2)]
    R_obs = [cory.w_self * b + cory.w_other * a for a, b in zip(r1, r2)]
    return Episode(pio, obs, r1, r2, R_pio, R_obs, failed1 + failed2)


def episode_samples(queries: list[str], ep: Episode, n: int) -> list[dict]:
    """The first `n` queries' rows of the `train/samples` table: both roles' prompts, answers and task rewards."""
    rollouts, rewards = (
        {"pioneer": ep.pioneer, "observer": ep.observer},
        {"pioneer": ep.r_pioneer, "observer": ep.r_observer},
    )
    return sample_rows(queries, rollouts, rewards, n)


class CORY(TeamAlgorithm):
    """Pioneer/observer co-training of `llm1` and `llm2` (docs/method.md §1).

    Built by Hydra from `cory/conf/algorithm/cory.yaml`, the only place the switches' values are written
    (docs/method.md §1.7); `agent` is the learner node, shared verbatim with PPO; `context` comes from the entry
    point (`cory.build`).
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
        *,
        context: RunContext,
    ) -> None:
        if not (isinstance(swap_period, int) and not isinstance(swap_period, bool) and swap_period >= 1):
            raise ConfigError(f"algorithm.swap_period={swap_period}: must be an integer >= 1")
        self.knowledge_transfer, self.role_exchange, self.swap_period = knowledge_transfer, role_exchange, swap_period
        self.w_self, self.w_other = w_self, w_other
        self.faithful_official_swap = faithful_official_swap
        self.learner, self.log_samples, self.settings = agent, log_samples, context.settings
        # both agents start from the same weights, value head included (the team builds them from one init seed)
        longest = self._longest_observer_prompt if knowledge_transfer else None
        self.team = AgentTeam(context, agent, ["llm1", "llm2"], longest_prompt=longest)
        self.task, self.scorer = self.team.task, SafeScorer(self.team.task)
        self.roles = {"pioneer": "llm1", "observer": "llm2"}  # LLM1 starts as pioneer (§1.1)
        self.swaps = 0

    def describe(self) -> dict:
        return learner_identity(self.learner, "cory")

    def step(self, iteration: int) -> StepOutput:
        pio_id, obs_id = self.roles["pioneer"], self.roles["observer"]
        pioneer, observer = self.team.agents[pio_id], self.team.agents[obs_id]
        queries, max_new_tokens = self.team.batch(iteration)
        t0 = time.perf_counter()
        with abandonable():  # a stop signal drops the iteration up to step 4: nothing a checkpoint holds has changed
            # 1-4. the pioneer answers, the observer answers with the pioneer's answer in view, both are scored on
            # the query, and each gets its collective reward (Eq. 4): `play`
            ep = play(self, pioneer, observer, queries, max_new_tokens)
        t1 = time.perf_counter()
        # 5. the updates: two independent PPO updates (both rollouts were collected first, so the order does not
        # matter); a variant changes only this step (`_update`)
        stats_pio, stats_obs = self._update(
            iteration, (pioneer, ep.pioneer, ep.R_pioneer), (observer, ep.observer, ep.R_observer)
        )
        eta = self.task.eval_kl_coef
        metrics = agent_metrics(pio_id, ep.pioneer, ep.r_pioneer, ep.R_pioneer, stats_pio, eta)
        metrics |= agent_metrics(obs_id, ep.observer, ep.r_observer, ep.R_observer, stats_obs, eta)
        for role, agent_id in self.roles.items():  # per-role views of the same numbers
            metrics[role_key(role, "task_reward")] = metrics[f"train/{agent_id}/task_reward"]
            metrics[role_key(role, "kl")] = metrics[f"train/{agent_id}/kl"]
        metrics |= {
            "cory/llm1_role": float(pio_id != "llm1"),  # 0 pioneer, 1 observer
            "cory/swaps": float(self.swaps),
            "time/generate_s": t1 - t0,
            "time/learn_s": time.perf_counter() - t1,
            "train/reward_failures": float(ep.failures),
        }
        samples = episode_samples(queries, ep, self.log_samples)
        # 6. role exchange (Eq. 5) after iteration k when (k + 1) mod T_REx = 0
        if self.role_exchange and (iteration + 1) % self.swap_period == 0:
            self.roles = {"pioneer": obs_id, "observer": pio_id}
            self.swaps += 1
            if self.faithful_official_swap:  # the official disk swap's side effects (§1.5), RNGs included
                for agent in self.team.agents.values():
                    agent.reset_training_state()
                self.team.reseed(iteration + 1)
        return StepOutput(metrics, samples, nonfinite(metrics), headline(metrics, ["llm1", "llm2"]))

    def _update(self, iteration: int, pioneer: tuple, observer: tuple) -> tuple[dict, dict]:
        """Step 5: each `(agent, rollout, collective rewards)` learns on its own (`_learn`); returns both agents'
        update statistics. A variant with a shared value function (`cory/algorithms/cory_cc.py`) overrides this."""
        return self._learn(iteration, *pioneer), self._learn(iteration, *observer)

    def learns(self, agent_id: str, iteration: int) -> bool:
        """Whether `agent_id` takes its update in iteration k: CORY updates both agents every iteration; a schedule
        that freezes one (`cory/algorithms/cory_variants.py`) overrides this."""
        return True

    def _learn(self, iteration: int, agent, rollout, rewards: list[float]) -> dict[str, float]:
        """One agent's PPO update on its own rollout and collective rewards, when the schedule says it learns
        (`learns`); a frozen agent is not touched (no optimiser, KL-controller, score-statistics or RNG change)."""
        if not self.learns(agent.name, iteration):
            return {"kl_coef": agent.kl_ctl.value}
        return agent.learn(rollout, torch.tensor(rewards))

    def save(self, directory: Path) -> None:
        self.team.save(directory, self._state())

    def load(self, directory: Path) -> None:
        self._restore(self.team.load(directory))

    def _state(self) -> dict:
        """The algorithm's own counters for a checkpoint (JSON); a variant with more extends it and `_restore`."""
        return {"roles": dict(self.roles), "swaps": self.swaps}

    def _restore(self, state: dict) -> None:
        self.roles, self.swaps = dict(state["roles"]), int(state["swaps"])

    @staticmethod
    def _longest_observer_prompt(task: Task, query: str, max_new_tokens: int) -> tuple[str, int]:
        """The observer prompt of `query` around an empty pioneer response, and the response's length to add."""
        return task.observer_prompt(query, ""), max_new_tokens
