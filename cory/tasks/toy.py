"""A synthetic task a tiny random model learns on a CPU in seconds (tests, `experiment=smoke`).

Queries are short random strings; the reward is the fraction of response characters found in `target`
(REFERENCE-free: it exists to show that reward rises, and to exercise every code path without downloads).
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase


class ToyTask:
    """Reward = share of response characters that are in `target`; the observer sees the pioneer's answer."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        target: str = "aeiou",
        num_train: int = 512,
        num_eval: int = 32,
        query_chars: tuple[int, int] = (2, 6),
        max_new_tokens: tuple[int, int] = (6, 10),
        generation_kwargs: dict | None = None,
        eval_kl_coef: float = 0.3,
        failure_reward: float = 0.0,
        observer_template: str = "{query}{response}|{query}",
        seed: int = 0,
        name: str = "toy",
    ) -> None:
        self.name, self.target, self.observer_template = name, target, observer_template
        self.eval_kl_coef, self.failure_reward = eval_kl_coef, failure_reward
        self.max_new_tokens = (int(max_new_tokens[0]), int(max_new_tokens[1]))
        self.generation_kwargs = dict(generation_kwargs or {"do_sample": True, "top_k": 0, "top_p": 1.0})
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
