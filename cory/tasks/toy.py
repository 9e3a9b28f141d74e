"""A synthetic task a tiny random model learns on a CPU in seconds (tests, `experiment=smoke`).

Queries are short random strings; the reward is the fraction of response characters found in `target`. It is
not a paper task: it exists to show that reward rises and to exercise every code path without downloads. Its
reward ignores the query, so tests of what a reward is computed on use a query-dependent task of their own.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase


class ToyTask:
    """Reward = share of response characters that are in `target`; the observer sees the pioneer's answer.

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
        target: str,
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
        self.name, self.target, self.observer_template = name, target, observer_template
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
        return [sum(c in self.target for c in r) / max(len(r), 1) for r in responses]
