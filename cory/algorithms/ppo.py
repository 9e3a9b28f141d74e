"""The PPO baseline: CORY's loop for a single agent, steps 1, 2, 5 and 7 of docs/method.md §1.2."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from cory.algorithms.base import RunContext, StepOutput
from cory.algorithms.team import AgentTeam, TeamAlgorithm, learner_identity
from cory.ppo.metrics import agent_metrics, headline, nonfinite, sample_rows
from cory.preemption import abandonable
from cory.tasks.base import SafeScorer


class PPO(TeamAlgorithm):
    """One agent `llm1`: act on the query-only prompt, score, learn on its own task reward.

    Built by Hydra from `cory/conf/algorithm/ppo.yaml` (`agent`: the learner node); `context` comes from the entry
    point (`cory.build`).
    """

    def __init__(self, agent, log_samples: int, *, context: RunContext) -> None:
        self.team = AgentTeam(context, agent, ["llm1"])
        self.task, self.scorer = self.team.task, SafeScorer(self.team.task)
        self.learner, self.log_samples, self.settings = agent, log_samples, context.settings

    def describe(self) -> dict:
        return learner_identity(self.learner, "ppo")

    def step(self, iteration: int) -> StepOutput:
        agent, t0 = self.team.agents["llm1"], time.perf_counter()
        queries, max_new_tokens = self.team.batch(iteration)
        with abandonable():  # a stop signal drops the iteration up to here: nothing a checkpoint holds has changed
            # 1-2. generate a ~ π(·|x) on the query-only prompt
            rollout = agent.act(
                [self.task.pioneer_prompt(q) for q in queries],
                max_new_tokens,
                self.task.generation_kwargs,
                self.team.generation_batch_size,
            )
            # 5. task reward r(q, a) on the original query
            scores, failed = self.scorer(queries, rollout.responses)
        t1 = time.perf_counter()
        # 7. one PPO update on R = r
        stats = agent.learn(rollout, torch.tensor(scores))
        metrics = agent_metrics("llm1", rollout, scores, scores, stats, self.task.eval_kl_coef)
        metrics |= {
            "time/generate_s": t1 - t0,
            "time/learn_s": time.perf_counter() - t1,
            "train/reward_failures": float(failed),
        }
        samples = sample_rows(queries, {"pioneer": rollout}, {"pioneer": scores}, self.log_samples)
        return StepOutput(metrics, samples, nonfinite(metrics), headline(metrics, ["llm1"]))

    def save(self, directory: Path) -> None:
        self.team.save(directory, {})

    def load(self, directory: Path) -> None:
        self.team.load(directory)
