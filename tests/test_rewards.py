"""Sentiment rewards (`cory.tasks.rewards`): raw positive logits from a classifier folder, and the TF-IDF stand-in.

`ClassifierReward` is checked on a tiny random DistilBERT saved to a tmp folder (score == raw POSITIVE logit,
label lookup by name, truncation). `TfidfSentimentReward` is trained on a hand-made CSV into a tmp cache:
positive texts score higher, the cache holds no pickle, and a reload gives identical scores without retraining.
The bounds (`bound=probability|clip`, `BoundedReward`) against hand-computed values, and CORY's collective reward
as the sum of the bounded rewards (the bound comes first). The null control's `ConstantReward` scores all alike.
The real 25k-review training is `slow`. Run: `pytest -q tests/test_rewards.py -m "not slow"`.
"""

from __future__ import annotations

import csv
import errno
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.compose import compose_cfg
from helpers.cory_setup import make_cory
from helpers.fakes import save_tiny_classifier, write_reviews_csv
from helpers.from_config import task_kwargs
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

import cory.tasks.rewards
from cory.config import validate
from cory.errors import AssetUnavailableError, ConfigError
from cory.ppo.actor import Actor
from cory.ppo.learner import PPOLearner
from cory.tasks.rewards import (
    BoundedReward,
    ClassifierReward,
    ConstantReward,
    TfidfSentimentReward,
    clip_above,
    sigmoid,
)
from cory.tasks.toy import CharacterShare, ToyTask


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


# ------------------------------------------------------------------------------------------------------ bounds
def test_sigmoid_and_clip_by_hand() -> None:
    # σ(0) = 1/2, σ(2) = 1/(1 + e^−2) = 0.880797..., σ(−2) = 1 − σ(2); ±800 would overflow e^x naively
    np.testing.assert_allclose(
        sigmoid(np.array([0.0, 2.0, -2.0, 800.0, -800.0])),
        [0.5, 0.8807970779778823, 0.11920292202211755, 1.0, 0.0],
        rtol=0,
        atol=1e-15,
    )
    np.testing.assert_array_equal(clip_above(np.array([-3.0, 1.0, 2.0, 5.0]), 2.0), [-3.0, 1.0, 2.0, 2.0])


def test_bounded_reward_wraps_any_reward_callable() -> None:
    def raw(texts: list[str]) -> list[float]:
        return [{"bad": -1.0, "meh": 0.0, "good": 3.0}[t] for t in texts]

    texts = ["bad", "meh", "good"]
    # σ(−1) = 0.268941..., σ(0) = 0.5, σ(3) = 0.952574...
    assert BoundedReward(raw, "sigmoid")(texts) == pytest.approx([0.2689414213699951, 0.5, 0.9525741268224334])
    assert BoundedReward(raw, "clip", ceiling=1.0)(texts) == [-1.0, 0.0, 1.0]


def test_tfidf_reward_bounds_are_the_probability_and_the_clipped_logit(tmp_path: Path) -> None:
    """`probability` is the logistic regression's own P(positive) (sklearn's predict_proba), `clip` min(logit, c)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    data = write_reviews_csv(tmp_path / "reviews.csv")
    kwargs = {"cache_dir": str(tmp_path / "cache"), "data_files": str(data), "eval_fraction": 0.0}
    raw = TfidfSentimentReward(**kwargs)
    probe = ["wonderful acting", "boring and painful script", "nothing in the vocabulary zzz"]
    logits = np.array(raw(probe))
    assert logits[0] > 0.5 and logits[1] < -0.5  # both sides of the clip below are exercised

    rows = [r for r in csv.DictReader(data.open()) if r["source"] == "imdb"]
    order = np.random.default_rng(0).permutation(len(rows))
    texts, labels = [rows[i]["text"] for i in order], [int(rows[i]["label"]) for i in order]
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=200_000, sublinear_tf=True)
    classifier = LogisticRegression(C=4, max_iter=1000).fit(vectorizer.fit_transform(texts), labels)
    expected = classifier.predict_proba(vectorizer.transform(probe))[:, 1]
    probability = TfidfSentimentReward(**kwargs, bound="probability")(probe)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=1e-9)
    assert all(0.0 < p < 1.0 for p in probability)

    clipped = TfidfSentimentReward(**kwargs, bound="clip", ceiling=0.5)(probe)
    assert clipped[:2] == [0.5, logits[1]] and clipped[2] == min(logits[2], 0.5)  # above the ceiling: cut; below: kept


def test_classifier_reward_bounds(tmp_path: Path) -> None:
    """`probability` is the softmax over the classifier's labels at the positive one, not σ of its logit alone."""
    save_tiny_classifier(tmp_path, {0: "NEGATIVE", 1: "POSITIVE"})
    texts = ["This movie was great", "terrible boring film"]
    raw = ClassifierReward(str(tmp_path))
    with torch.no_grad():
        logits = raw.model(**raw.tokenizer(texts, padding=True, return_tensors="pt")).logits.double()
    (n0, p0), (n1, p1) = logits.tolist()
    by_hand = [np.exp(p0) / (np.exp(p0) + np.exp(n0)), np.exp(p1) / (np.exp(p1) + np.exp(n1))]
    assert ClassifierReward(str(tmp_path), bound="probability")(texts) == pytest.approx(by_hand, abs=1e-6)
    ceiling = (p0 + p1) / 2  # between the two logits: one is clipped, the other not
    clipped = ClassifierReward(str(tmp_path), bound="clip", ceiling=ceiling)(texts)
    assert clipped == pytest.approx([min(p0, ceiling), min(p1, ceiling)], abs=1e-6)
    assert min(p0, p1) < ceiling < max(p0, p1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"bound": "sigmoid"}, "task.reward.bound=sigmoid: expected one of none, probability, clip"),
        ({"bound": "clip"}, "task.reward.ceiling=None: set a ceiling exactly with task.reward.bound=clip"),
        ({"bound": "probability", "ceiling": 1.0}, "task.reward.ceiling=1.0: set a ceiling exactly with"),
    ],
)
def test_a_wrong_bound_is_one_line_before_any_training(tmp_path: Path, kwargs: dict, message: str) -> None:
    data = write_reviews_csv(tmp_path / "reviews.csv")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data), **kwargs)
    assert not (tmp_path / "cache").exists()


def test_a_wrong_bound_on_the_command_line_is_refused_when_the_config_is_validated() -> None:
    """Before the model loads: the reward's `bound` is a closed set of values (a `Literal` annotation)."""
    with pytest.raises(ConfigError, match="task.reward.bound=sigmoid: expected one of none, probability, clip"):
        validate(compose_cfg(["experiment=quickstart", "task.reward.bound=sigmoid"]))
    validate(compose_cfg(["experiment=quickstart", "task.reward.bound=probability"]))
    validate(compose_cfg(["experiment=quickstart", "task/reward=distilbert_imdb", "task.reward.bound=clip"]))


def test_the_null_controls_constant_reward_scores_every_text_alike() -> None:
    """`task/reward=constant`: the same score for any text (the null control of a study), chosen from the command
    line and validated like the other rewards; a non-number is refused before anything loads."""
    from hydra.utils import instantiate

    cfg = compose_cfg(["experiment=quickstart", "algorithm=ppo", "task/reward=constant", "task.reward.value=0.355"])
    validate(cfg)
    reward = instantiate(cfg.task.reward)
    texts = ["This movie was great, wonderful acting", "terrible boring film", ""]
    assert reward(texts) == [0.355, 0.355, 0.355] and reward([]) == []
    assert isinstance(reward, ConstantReward)  # the option replaced the packaged reward, not merged into it
    with pytest.raises(ConfigError, match=r"task\.reward\.value"):
        validate(compose_cfg(["experiment=quickstart", "task/reward=constant", "task.reward.value=high"]))


def test_the_toy_task_scores_the_response_or_the_query_and_response_with_its_reward_part() -> None:
    share = CharacterShare("aeiou")
    assert share(["ab", "", "xyz", "ae"]) == [0.5, 0.0, 0.0, 1.0]
    toy = task_kwargs("toy")
    assert toy["scored"] == "response"  # the config's: the vowels of the answer alone
    assert ToyTask(None, reward=share, **toy).score(["aa"], ["bb"]) == [0.0]
    assert ToyTask(None, reward=share, **(toy | {"scored": "query_response"})).score(["aa"], ["bb"]) == [0.5]
    with pytest.raises(ValueError, match="task.scored must be one of"):
        ToyTask(None, reward=share, **(toy | {"scored": "answer"}))


def logit_toy(texts: list[str]) -> list[float]:
    """The toy task's reward part (on responses): a logit-like 12·(vowel share) − 3 (about −3 … +9), bounded per
    response by σ as a reward part."""
    logits = [12 * v - 3 for v in CharacterShare("aeiou")(texts)]
    return BoundedReward(lambda _: logits, "sigmoid")(texts)


def test_cory_sums_the_bounded_rewards_not_the_bound_of_the_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """R = σ(l1) + σ(l2), in [0, 2], reaches both updates: the bound acts on each response before Eq. 4's sum
    (`score_clip`, after the sum, would bound r1 + r2 instead)."""
    learned, responses, act, update = [], [], Actor.act, PPOLearner.update

    def update_spy(self, batch):
        learned.append(batch.scores.clone())
        return update(self, batch)

    def act_spy(self, *args, **kwargs):
        responses.append(act(self, *args, **kwargs))
        return responses[-1]

    monkeypatch.setattr(PPOLearner, "update", update_spy)
    monkeypatch.setattr(Actor, "act", act_spy)
    algorithm = make_cory(reward=logit_toy)
    torch.manual_seed(0)
    algorithm.step(0)
    raw = [[12 * v - 3 for v in CharacterShare("aeiou")(r.responses)] for r in responses]
    s1, s2 = sigmoid(np.array(raw[0])), sigmoid(np.array(raw[1]))
    assert len(learned) == 2
    for scores in learned:
        np.testing.assert_allclose(scores.numpy(), s1 + s2, rtol=0, atol=1e-6)
    assert not np.allclose(s1 + s2, sigmoid(np.array(raw[0]) + np.array(raw[1])), atol=1e-3)
