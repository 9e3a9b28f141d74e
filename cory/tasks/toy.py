"""A synthetic task a tiny random model learns on a CPU in seconds (tests, `experiment=smoke`).

Queries are short random strings; the reward is a part (`task.reward`, called as the task's `score` is: queries and
responses in, one score per response out), by default `CharacterShare`: the fraction of response characters found
in a set, whatever the query. It is not a paper task: it exists to
show that reward rises and to exercise every code path without downloads. A test or another project that needs
another reward gives another part (`task.reward._target_=...`), never a subclass of the task.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from transformers import PreTrainedTokenizerBase


class CharacterShare:
    """The share of each response's characters that are in `characters` (0 for an empty response); the queries are
    not read."""

    def __init__(self, characters: str) -> None:
        self.characters = characters

    def __call__(self, queries: list[str], responses: list[str]) -> list[float]:
        return [sum(c in self.characters for c in r) / max(len(r), 1) for r in responses]


class ToyTask:
    """Reward = `reward(queries, responses)`, a part; the observer sees the pioneer's answer.

    No argument has a default: `cory/conf/task/toy.yaml` is the only place their values are written. `tokenizer` is
    accepted (Hydra passes the policy tokenizer to every task) and unused: queries are plain characters.
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "num_train": "[1, inf)",
        "num_eval": "[1, inf)",
        "query_chars": "[1, inf)",
        "eval_kl_coef": "[0, inf)",
    }

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        reward: Callable[[list[str], list[str]], list[float]],
        num_train: int,
        num_eval: int,
        query_chars: tuple[int, int],
        max_new_tokens: tuple[int, int],
        generation_kwargs: dict,
        eval_kl_coef: float,
        failure_reward: float,
        observer_template: str,
        seed: int,
        name: str,
    ) -> None:
        self.name, self.reward, self.observer_template = name, reward, observer_template
        self.eval_kl_coef, self.failure_reward = eval_kl_coef, failure_reward
        self.max_new_tokens = (int(max_new_tokens[0]), int(max_new_tokens[1]))
        self.generation_kwargs = dict(generation_kwargs)
        rng = np.random.default_rng(seed)
        alphabet = list("bcdfghjklmnpqrstvwxyz ")
        lo, hi = query_chars
        queries = ["".join(rng.choice(alphabet, rng.integers(lo, hi + 1))) for _ in range(num_train + num_eval)]
        self._train, self._eval = queries[:num_train], queries[num_train:]

    def train_queries(self) -> list[str]:
        return list(self._train)

    def eval_queries(self) -> list[str]:
        return list(self._eval)

    def pioneer_prompt(self, query: str) -> str:
        return query

    def observer_prompt(self, query: str, pioneer_response: str) -> str:
        return self.observer_template.format(query=query, response=pioneer_response)

    def score(self, queries: list[str], responses: list[str]) -> list[float]:
        return [float(score) for score in self.reward(queries, responses)]
