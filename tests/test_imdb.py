"""The IMDB task (`cory.tasks.imdb.IMDBTask`) and its config `cory/conf/task/imdb.yaml`.

On a hand-made CSV: queries are the first 2–8 policy tokens of reviews > 200 chars from `source == "imdb"` rows,
evaluation and training reviews are disjoint, the observer prompt is the exact template string, and `score`
feeds q + a to the reward. The config test composes `cory/conf/task/imdb.yaml` with Hydra, instantiates it with the
default TF-IDF reward and with the documented `ClassifierReward` override. The packaged 25k-review CSV and the
SmolLM2 conversion are `slow`. Run: `pytest -q tests/test_imdb.py -m "not slow"`.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import pytest
from helpers.fakes import save_tiny_classifier, write_reviews_csv
from helpers.from_config import task_kwargs
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from cory.errors import AssetUnavailableError
from cory.models import byte_tokenizer
from cory.tasks.imdb import IMDBTask

CONF = Path(__file__).resolve().parents[1] / "cory" / "conf"


def imdb_task(tokenizer, reward, **fields) -> IMDBTask:
    """`IMDBTask` with the values of `cory/conf/task/imdb.yaml` (its only source), `fields` replaced."""
    return IMDBTask(tokenizer, reward, **task_kwargs("imdb", **fields))


def word_tokenizer(csv_path: Path) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over the CSV's words, so a query's first word names its review."""
    words = sorted({w for row in csv.DictReader(csv_path.open()) for w in row["text"].split()})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")


@pytest.fixture
def reviews_csv(tmp_path: Path) -> Path:
    return write_reviews_csv(tmp_path / "reviews.csv", short_imdb=2)


def _length_reward(texts: list[str]) -> list[float]:
    return [float(len(t)) for t in texts]


def test_queries_are_2_to_8_policy_tokens(reviews_csv: Path) -> None:
    tokenizer = byte_tokenizer()
    task = imdb_task(tokenizer, _length_reward, data_files=str(reviews_csv), num_eval=10)
    lengths = [
        len(tokenizer(q, add_special_tokens=False).input_ids) for q in task.train_queries() + task.eval_queries()
    ]
    assert min(lengths) >= 2 and max(lengths) <= 8 and len(set(lengths)) > 3
    again = imdb_task(tokenizer, _length_reward, data_files=str(reviews_csv), num_eval=10)
    assert again.train_queries() == task.train_queries()  # deterministic given the seed
    other = imdb_task(tokenizer, _length_reward, data_files=str(reviews_csv), num_eval=10, seed=1)
    assert other.train_queries() != task.train_queries()


def test_eval_and_train_reviews_are_disjoint(reviews_csv: Path) -> None:
    task = imdb_task(word_tokenizer(reviews_csv), _length_reward, data_files=str(reviews_csv), num_eval=10)
    train_ids = {q.split()[0] for q in task.train_queries()}
    eval_ids = {q.split()[0] for q in task.eval_queries()}
    assert len(eval_ids) == 10 and len(train_ids) == 50 and not train_ids & eval_ids
    assert all(i.startswith("id") for i in train_ids | eval_ids)  # short and non-imdb rows are filtered out
    limited = imdb_task(
        word_tokenizer(reviews_csv), _length_reward, data_files=str(reviews_csv), num_eval=10, num_train=7
    )
    assert len(limited.train_queries()) == 7 and limited.eval_queries() == task.eval_queries()


def test_templates_and_score(reviews_csv: Path) -> None:
    seen: list[list[str]] = []

    def reward(texts: list[str]) -> list[float]:
        seen.append(texts)
        return _length_reward(texts)

    task = imdb_task(byte_tokenizer(), reward, data_files=str(reviews_csv), num_eval=4)
    assert task.pioneer_prompt("This movie") == "This movie"
    assert task.observer_prompt("This movie", " was fine.") == (
        'I can make this sentence "This movie was fine." more positive: This movie'
    )
    assert task.score(["This movie", "I"], [" was fine.", " loved it"]) == [20.0, 10.0]
    assert seen == [["This movie was fine.", "I loved it"]]
    assert task.max_new_tokens == (4, 15) and task.generation_kwargs["top_k"] == 0


def test_scored_response_feeds_the_response_alone_and_a_bad_value_is_refused(reviews_csv: Path) -> None:
    seen: list[list[str]] = []

    def reward(texts: list[str]) -> list[float]:
        seen.append(texts)
        return _length_reward(texts)

    task = imdb_task(byte_tokenizer(), reward, data_files=str(reviews_csv), num_eval=4, scored="response")
    assert task.score(["This movie", "I"], [" was fine.", " loved it"]) == [10.0, 9.0]
    assert seen == [[" was fine.", " loved it"]]
    # the observer's prompt still carries the query: only what the reward reads changes
    assert task.observer_prompt("This movie", " was fine.").endswith("more positive: This movie")
    with pytest.raises(ValueError, match="task.scored must be one of"):
        imdb_task(byte_tokenizer(), reward, data_files=str(reviews_csv), num_eval=4, scored="query")


def test_hub_source_fails_fast_offline() -> None:
    start = time.perf_counter()
    with pytest.raises(AssetUnavailableError, match="'imdb'.*task.source=packaged"):
        imdb_task(byte_tokenizer(), _length_reward, source="hub")
    assert time.perf_counter() - start < 10.0


def test_hub_source_uses_test_split_for_eval(monkeypatch: pytest.MonkeyPatch, reviews_csv: Path) -> None:
    texts = [row["text"] for row in csv.DictReader(reviews_csv.open()) if row["text"].startswith("id")]
    splits = {"train": {"text": texts[:40]}, "test": {"text": texts[39:]}}  # texts[39] is in both splits
    monkeypatch.setattr("cory.tasks.imdb.load_dataset_or_fail", lambda name, key, hint, split: splits[split])
    task = imdb_task(word_tokenizer(reviews_csv), _length_reward, source="hub", num_eval=21)
    eval_ids = {q.split()[0] for q in task.eval_queries()}
    train_ids = {q.split()[0] for q in task.train_queries()}
    assert eval_ids == {t.split()[0] for t in texts[39:]} and len(train_ids) == 39 and not eval_ids & train_ids


def _compose(tmp_path: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    conf = tmp_path / "conf"
    shutil.copytree(CONF / "task", conf / "task")
    # A minimal root config standing in for cory/conf/train.yaml: the task group and the `cache_dir` it interpolates.
    (conf / "root.yaml").write_text(f"defaults:\n  - task: imdb\n  - _self_\ncache_dir: {tmp_path / 'cache'}\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("root", overrides=overrides)


def test_config_instantiates_with_default_and_classifier_rewards(tmp_path: Path, reviews_csv: Path) -> None:
    from hydra.utils import instantiate

    from cory.tasks.rewards import ClassifierReward, TfidfSentimentReward

    data = [f"task.data_files={reviews_csv}", "task.num_eval=10", f"+task.reward.data_files={reviews_csv}"]
    task = instantiate(_compose(tmp_path, data).task, tokenizer=byte_tokenizer())
    assert isinstance(task.reward, TfidfSentimentReward) and task.reward.path.parent == tmp_path / "cache"
    assert len(task.eval_queries()) == 10 and isinstance(task.generation_kwargs, dict)
    positive, negative = task.score(["The film was"] * 2, [" wonderful and superb", " awful and boring"])
    assert positive > negative

    save_tiny_classifier(tmp_path / "clf", {0: "NEGATIVE", 1: "POSITIVE"})
    override = [  # the override documented at the top of cory/conf/task/imdb.yaml
        "task/reward=distilbert_imdb",
        f"task.reward.name_or_path={tmp_path / 'clf'}",
    ]
    cfg = _compose(tmp_path / "second", override)
    assert isinstance(instantiate(cfg.task.reward), ClassifierReward)


@pytest.mark.slow
def test_packaged_imdb_with_smollm2_tokenizer() -> None:
    """The real assets: 25k packaged reviews cut with the SmolLM2 tokenizer (converted once into ~/.cache/cory)."""
    from transformers import AutoTokenizer

    from cory.assets import smollm2_135m_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_135m_dir(Path("~/.cache/cory").expanduser()))
    task = imdb_task(tokenizer, _length_reward)
    assert len(task.eval_queries()) == 256 and len(task.train_queries()) > 24_000
    lengths = {len(tokenizer(q, add_special_tokens=False).input_ids) for q in task.eval_queries()}
    assert lengths <= set(range(1, 9))  # decode → re-encode may merge tokens, never add them
