"""The PPO baseline: CORY's loop for a single agent, steps 1, 2, 5 and 7 of docs/method.md §1.2."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from cory.algorithms.base import StepOutput, agent_metrics, sample_rows
from cory.ppo.learner import Agent
from cory.tasks.base import SafeScorer, Task


class PPO:
    """One agent `llm1`: act on the query-only prompt, score, learn on its own task reward."""

    def __init__(
        self, task: Task, make_agent: Callable[[str], Agent], generation_batch_size: int, log_samples: int
    ) -> None:
        self.task, self.scorer = task, SafeScorer(task)
        self.agents = {"llm1": make_agent("llm1")}
        self.generation_batch_size, self.log_samples = generation_batch_size, log_samples

    def step(self, queries: list[str], max_new_tokens: int, iteration: int) -> StepOutput:
        agent, t0 = self.agents["llm1"], time.perf_counter()
        # 1-2. generate a ~ π(·|x) on the query-only prompt
        rollout = agent.act(
            [self.task.pioneer_prompt(q) for q in queries],
            max_new_tokens,
            self.task.generation_kwargs,
            self.generation_batch_size,
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
        return StepOutput(metrics, sample_rows(queries, {"pioneer": rollout}, {"pioneer": scores}, self.log_samples))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
