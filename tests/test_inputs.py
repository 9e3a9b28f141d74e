"""Bad inputs a user may type or leave lying around: each is one `error:` line naming the key or path, exit code 2.

Values of the wrong type or out of range (checked against the targets' own annotations), non-finite numbers,
an unknown device, an observer template with an unknown field, prompts longer than the model's context, data
files that are missing, empty, header-only or lack the needed columns, a corrupt `run_config.yaml`, a run
folder that cannot be created, and corrupt caches (the message names them and says to delete them). Through
the command line, a refused run leaves no run folder behind.

Run: `pytest tests/test_inputs.py` (about 30 s on 2 CPUs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import write_reviews_csv
from test_robustness import run_main, start_run
from test_train import smoke

import cory.models
from cory.config import ConfigError
from cory.hub import AssetUnavailableError
from cory.rewards import TfidfSentimentReward
from cory.train import train

EXPECTED_COLUMNS = "expected a CSV with columns text,label[,source]"
TYPED = {  # override → the one-line message starts with
    "seed=abc": "seed=abc: expected an integer",
    "seed=1.5": "seed=1.5: expected an integer",
    "seed=-1": "seed=-1: must be in [0, 2^32)",
    "batch_size=abc": "batch_size=abc: expected an integer",
    "iterations=2.5": "iterations=2.5: expected an integer",
    "algorithm.agent.learning_rate=fast": "algorithm.agent.learning_rate=fast: expected a number",
    "algorithm.agent.learning_rate=inf": "algorithm.agent.learning_rate=inf: must be a finite number",
    "algorithm.agent.init_kl_coef=nan": "algorithm.agent.init_kl_coef=nan: must be a finite number",
    "algorithm.agent.gamma=1.5": "algorithm.agent.gamma=1.5: must be in [0, 1]",
    "algorithm.agent.lam=-0.1": "algorithm.agent.lam=-0.1: must be in [0, 1]",
    "task.max_new_tokens=0": "task.max_new_tokens=0: expected [min, max], two integers",
    "task.max_new_tokens=[5,2]": "task.max_new_tokens=[5, 2]: need 1 <= min <= max",
    "algorithm=cory algorithm.w_other=abc": "algorithm.w_other=abc: expected a number",
    "hardware.device=tpu": "hardware.device=tpu: not a device; use cpu, cuda, cuda:<n> or auto",
    "task.observer_template='{query}{foo}'": "task.observer_template='{query}{foo}': unknown field {foo}",
}


@pytest.mark.parametrize("override", list(TYPED))
def test_a_value_of_the_wrong_type_or_range_is_one_line_before_any_model_loads(tmp_path, monkeypatch, override):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for an invalid configuration")

    monkeypatch.setattr(cory.models, "build_tiny_gpt2", no_model)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, *override.split()), tmp_path / "run")
    assert str(err.value).startswith(TYPED[override]) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def _csv(tmp_path: Path, content: str | None) -> Path:
    path = tmp_path / "reviews.csv"
    if content is not None:
        path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("", "the file is empty"),
        ("text,label,source\n", "a header but no rows"),
        ("review,score\nGreat film,1\n", "no column text (header: review,score)"),
    ],
    ids=["missing", "empty", "header-only", "wrong-columns"],
)
def test_a_bad_data_file_names_the_path_and_the_expected_columns(tmp_path, content, problem):
    path = _csv(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, "task=imdb", f"task.data_files={path}"), tmp_path / "run")
    assert str(err.value) == f"task.data_files={path}: {problem}; {EXPECTED_COLUMNS}"


def _outputs(tmp_path: Path) -> list[Path]:
    """Run folders under the default `outputs/` (those Hydra wrote a snapshot into)."""
    return sorted(p.parent for p in (tmp_path / "outputs").rglob(".hydra"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["seed=abc"], "seed=abc: expected an integer"),
        (["iterations=2.5"], "iterations=2.5: expected an integer"),
        (["model.n_positions=12"], "the longest prompt plus a response of task.max_new_tokens=10 is 16 tokens"),
        (["task=imdb", "task.data_files={tmp}/header.csv"], "task.data_files={tmp}/header.csv: a header but no rows"),
        (["hydra.run.dir={tmp}/afile/run"], "hydra.run.dir={tmp}/afile/run: cannot create the run folder"),
        (["resume={tmp}/broken"], "resume={tmp}/broken: {tmp}/broken/run_config.yaml is unreadable"),
    ],
    ids=["type", "integer", "context", "data-file", "unwritable-folder", "corrupt-run-config"],
)
def test_through_the_command_line_a_refused_run_is_one_line_and_leaves_no_folder(
    tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "header.csv").write_text("text,label,source\n")
    (tmp_path / "afile").write_text("a file where a folder is expected")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run_config.yaml").write_text("seed: [unclosed\n")
    argv = ["experiment=smoke", "progress=false", *(a.format(tmp=tmp_path) for a in args)]
    code, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: " + message.format(tmp=tmp_path))
    assert _outputs(tmp_path) == []  # Hydra created a folder for it; the refusal removed it


def test_a_corrupt_reward_cache_is_named_with_the_way_out(tmp_path):
    data = write_reviews_csv(tmp_path / "reviews.csv")
    reward = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    arrays = reward.path / "arrays.safetensors"
    arrays.write_bytes(arrays.read_bytes()[:100])
    with pytest.raises(AssetUnavailableError) as err:
        TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    text = str(err.value)
    assert text.startswith(f"the cached TF-IDF reward {reward.path} is corrupt") and "delete that folder" in text


def test_a_corrupt_model_cache_is_named_with_the_way_out(tmp_path):
    model, tokenizer = cory.models.build_tiny_gpt2()
    cached = tmp_path / "cache" / "smollm2-135m"  # where `model=smollm2_135m` keeps its converted weights
    model.save_pretrained(cached)
    tokenizer.save_pretrained(cached)
    weights = cached / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(AssetUnavailableError) as err:
        start_run(tmp_path, tmp_path / "run", "model=smollm2_135m")
    text = " ".join(str(err.value).split())
    assert f"Cannot load the model from the local folder {cached}" in text and "delete it" in text
