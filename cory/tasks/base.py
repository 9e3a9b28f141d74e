"""The `Task` protocol: what data, what reward, which prompt templates (docs/method.md §1.3, §3).

A task is built by Hydra from `cory/conf/task/*.yaml` with the policy tokenizer passed at run time
(`instantiate(cfg.task, tokenizer=tokenizer)`). It owns its prompts, its reward and its templates; it knows
nothing about PPO or CORY.
"""

from __future__ import annotations

import inspect
import typing
import weakref
from typing import Any, ClassVar, Protocol

from cory import runtime


class Task(Protocol):
    """A text task with a scalar reward per (query, response)."""

    name: str
    # η_eval of docs/method.md §1.6: the fixed KL coefficient of the combined reward, shared by all algorithms.
    eval_kl_coef: float
    # Reward given to a sample whose scoring raised (malformed generation, classifier error).
    failure_reward: float
    # Inclusive range of `max_new_tokens`; one value is drawn per training iteration (docs/method.md §3.1).
    max_new_tokens: tuple[int, int]
    # Sampling settings passed to `generate` (repetition_penalty, top_k, top_p, temperature).
    generation_kwargs: dict

    def train_queries(self) -> list[str]:
        """Training queries q (decoded text), in a fixed order; the trainer shuffles them."""
        ...

    def eval_queries(self) -> list[str]:
        """Held-out queries, disjoint from the training ones, in a fixed order."""
        ...

    def pioneer_prompt(self, query: str) -> str:
        """The query-only prompt x_P (IMDB: q itself; GSM8K: the one-shot prompt)."""
        ...

    def observer_prompt(self, query: str, pioneer_response: str) -> str:
        """The observer prompt x_O = T_obs(q, a1), built from decoded text (docs/method.md §1.3)."""
        ...

    def score(self, queries: list[str], responses: list[str]) -> list[float]:
        """Task reward r(q, a) for each pair, scored on the original query plus the response only."""
        ...

    # Optional: `eval_metrics(queries, responses) -> dict[str, float]`, metrics of held-out responses that the task
    # adds to the evaluation (`cory.ppo.evaluation`); reasoning tasks also give `train_problems()`/`eval_problems()`.


class SafeScorer:
    """Scores a batch; a sample whose reward raises gets the task's failure reward and is counted.

    The first error is printed once per task, with its sample (training and evaluation scorers share the flag),
    so a broken reward is visible without flooding the log.
    """

    _reported: ClassVar[weakref.WeakSet] = weakref.WeakSet()  # tasks whose first reward error was printed

    def __init__(self, task: Task) -> None:
        self.task = task

    def __call__(self, queries: list[str], responses: list[str]) -> tuple[list[float], int]:
        """Returns (scores, number of samples that failed in this call)."""
        try:
            scores = [float(s) for s in self.task.score(queries, responses)]
            if len(scores) == len(queries):
                return scores, 0
        except Exception:  # noqa: BLE001 - fall back to per-sample scoring to isolate the bad sample
            pass
        scores, failed = [], 0
        for q, a in zip(queries, responses):
            try:
                scores.append(float(self.task.score([q], [a])[0]))
            except Exception as err:  # noqa: BLE001 - any reward error becomes the failure reward
                failed += 1
                scores.append(float(self.task.failure_reward))
                if self.task not in SafeScorer._reported:
                    SafeScorer._reported.add(self.task)
                    runtime.say(
                        f"[cory] reward failed on query={q!r} response={a!r}: {type(err).__name__}: {err} "
                        f"(given failure_reward={self.task.failure_reward}; further failures are only counted)"
                    )
        return scores, failed


def provides_problems(target: Any) -> bool:
    """Whether a task `_target_` (a class, or a function that returns one) gives problems with exact answers
    (`train_problems()`, `eval_problems()`): what pass@k and Multiagent Finetuning need, told before it is built."""
    if not inspect.isclass(target):
        try:
            target = typing.get_type_hints(target).get("return")
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate says nothing
            return False
    return inspect.isclass(target) and hasattr(target, "eval_problems")
