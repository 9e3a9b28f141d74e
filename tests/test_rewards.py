"""Sentiment rewards (`cory.tasks.rewards`): raw positive logits from a classifier folder, and the TF-IDF stand-in.

`ClassifierReward` is checked on a tiny random DistilBERT saved to a tmp folder (score == raw POSITIVE logit,
label lookup by name, truncation). `TfidfSentimentReward` is trained on a hand-made CSV into a tmp cache:
positive texts score higher, the cache holds no pickle, and a reload gives identical scores without retraining.
The real 25k-review training is `slow`. Run: `pytest -q tests/test_rewards.py -m "not slow"`.
"""

from __future__ import annotations

import csv
import errno
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.fakes import save_tiny_classifier, write_reviews_csv
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

import cory.tasks.rewards
from cory.errors import AssetUnavailableError
from cory.tasks.rewards import ClassifierReward, TfidfSentimentReward


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")


@pytest.mark.parametrize(
    "id2label, positive_index",
    [({0: "NEGATIVE", 1: "POSITIVE"}, 1), ({0: "POSITIVE", 1: "NEGATIVE"}, 0), ({0: "LABEL_0", 1: "LABEL_1"}, 1)],
)
def test_classifier_reward_is_raw_positive_logit(tmp_path: Path, id2label: dict, positive_index: int) -> None:
    save_tiny_classifier(tmp_path, id2label)
    reward = ClassifierReward(str(tmp_path), batch_size=2)
    texts = ["This movie was great", "terrible boring film", "ok", "x" * 500]  # the last one needs truncation
    scores = reward(texts)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    with torch.no_grad():
        for text, score in zip(texts, scores, strict=True):
            ids = reward.tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
            expected = reward.model(**ids).logits[0, positive_index].item()
            assert score == pytest.approx(expected, abs=1e-5)


def test_tfidf_reward_trains_caches_without_pickle_and_reloads(tmp_path: Path, capsys) -> None:
    data = write_reviews_csv(tmp_path / "reviews.csv")
    reward = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    assert "held-out accuracy" in capsys.readouterr().out
    assert reward.meta["n_train"] == 48 and reward.meta["n_eval"] == 12  # the 3 non-imdb rows are dropped
    positive = ["The acting was wonderful and superb", "a delightful, charming film"]
    negative = ["The acting was awful and boring", "a dreadful, tedious film"]
    scores = np.array(reward(positive + negative))
    assert scores[:2].min() > 0 > scores[2:].max()

    files = {p.name for p in reward.path.iterdir()}
    assert files == {"vocabulary.json", "arrays.safetensors", "meta.json"}
    reloaded = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    assert capsys.readouterr().out == ""  # loaded from the cache, not retrained
    assert reloaded(positive + negative) == scores.tolist()
    other_seed = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data), seed=1)
    assert other_seed.path != reward.path


def test_tfidf_reward_matches_sklearn(tmp_path: Path) -> None:
    """The pickle-free scorer equals sklearn's TfidfVectorizer + LogisticRegression fitted the same way."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    data = write_reviews_csv(tmp_path / "reviews.csv")
    reward = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data), eval_fraction=0.0)
    rows = list(csv.DictReader(data.open()))
    rows = [r for r in rows if r["source"] == "imdb"]
    order = np.random.default_rng(0).permutation(len(rows))  # same shuffle; no held-out rows here
    texts, labels = [rows[i]["text"] for i in order], [int(rows[i]["label"]) for i in order]
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=200_000, sublinear_tf=True)
    classifier = LogisticRegression(C=4, max_iter=1000).fit(vectorizer.fit_transform(texts), labels)
    probe = ["wonderful acting", "boring and painful script", "nothing in the vocabulary zzz", ""]
    expected = classifier.decision_function(vectorizer.transform(probe))
    np.testing.assert_allclose(reward(probe), expected, rtol=0, atol=1e-9)


@pytest.mark.long
@pytest.mark.slow
def test_real_tfidf_reward_on_packaged_imdb(tmp_path: Path) -> None:
    """Trains on the 25k packaged IMDB reviews (~20 s): docs/method.md §8 reports its held-out accuracy (0.90)."""
    reward = TfidfSentimentReward(cache_dir=str(tmp_path))
    assert reward.accuracy > 0.88
    great, terrible = reward(["This movie was great", "terrible boring film"])
    assert great > 2.0 and terrible < -3.0


def test_a_full_disk_while_caching_is_an_oserror_naming_the_file_and_leaves_no_cache(tmp_path: Path, monkeypatch):
    """safetensors reports a full disk as its own error, not an OSError: the entry points would print a traceback."""

    def full(tensors, path):  # as safetensors fails: the file is created, part of it written, then its own error
        Path(path).write_bytes(b"\0" * 8)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(cory.tasks.rewards, "save_file", full)
    data = write_reviews_csv(tmp_path / "reviews.csv")
    with pytest.raises(OSError) as info:
        TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    assert info.value.errno == errno.ENOSPC and info.value.filename.endswith("arrays.safetensors")
    assert list((tmp_path / "cache").iterdir()) == []  # the temporary folder is gone; the next run trains again


def test_a_cached_reward_with_nonfinite_weights_is_named_as_corrupt(tmp_path: Path) -> None:
    """A NaN coefficient would score every text NaN and stop training later, far from the cause."""
    data = write_reviews_csv(tmp_path / "reviews.csv")
    reward = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    arrays = load_file(str(reward.path / "arrays.safetensors"))
    arrays["coef"][3] = np.nan
    save_file(arrays, str(reward.path / "arrays.safetensors"))
    with pytest.raises(AssetUnavailableError, match=r"is corrupt \(ValueError: arrays.safetensors holds non-finite"):
        TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
