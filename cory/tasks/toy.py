"""A synthetic task a tiny random model learns on a CPU in seconds (tests, `experiment=smoke`).

Queries are short random strings; the reward is a part (`task.reward`, texts in, one float per text out, as every
task's reward), by default `CharacterShare`: the fraction of a text's characters found in a set, read on the
response alone (`scored: response`; `query_response` scores q + a, as IMDB does). It is not a paper task: it exists
to show that reward rises and to exercise every code path without downloads. A test or another project that needs
another reward gives another part (`task.reward._target_=...`), never a subclass of the task.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from transformers import PreTrainedTokenizerBase


class CharacterShare:
    """The share of each text's characters that are in `characters` (0 for an empty text)."""

    def __init__(self, characters: str) -> None:
        self.characters = characters

    def __call__(self, texts: list[str]) -> list[float]:
        return [sum(c in self.characters for c in t) / max(len(t), 1) for t in texts]


class ToyTask:
    """Reward = `reward(texts)` on each response (or query + response, `scored`); the observer sees the pioneer's
    answer.

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
    SCORED = ("response", "query_response")  # values of `task.scored`, checked by `cory.config.validate`

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        reward: Callable[[list[str]], list[float]],
        scored: str,
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
        if scored not in self.SCORED:
            raise ValueError(f"task.scored must be one of {self.SCORED}, got {scored!r}")
        self.scored = scored
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
        keep_query = self.scored == "query_response"
        texts = [(q if keep_query else "") + a for q, a in zip(queries, responses, strict=True)]
        return [float(score) for score in self.reward(texts)]
