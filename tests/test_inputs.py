"""Bad inputs a user may type or leave lying around: each is one `error:` line naming the key or path, exit code 2.

Values of the wrong type or out of range (checked against the targets' own annotations), non-finite numbers,
an unknown device, an observer template with an unknown field, prompts longer than the model's context, data
files that are missing, empty, header-only or lack the needed columns, a corrupt `run_config.yaml`, a run
folder that cannot be created, and corrupt caches (the message names them and says to delete them). Through
the command line, a refused run leaves no run folder behind. Also: Hydra's own composition errors, the real
entrypoint (subprocesses, two at a time) on bad values, a damaged checkpoint, an unreachable Hub model (fast,
naming a local folder as the way out) and W&B without a key or network (falls back to metrics.jsonl).

Run: `pytest tests/test_inputs.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers.fakes import write_reviews_csv
from helpers.runners import REPO, cli, env, finished_run, one_error_line, run_main, smoke, start_run

import cory.models
from cory.checkpoints import latest_checkpoint
from cory.errors import AssetUnavailableError, ConfigError
from cory.tasks.rewards import TfidfSentimentReward
from cory.train import train

# A bad input must fail at start-up cost: no model load, no Hub retry (each costs >= 25 s). Start-up itself takes
# ~10 s on an idle 2-CPU machine and 30 s or more on a loaded one, so the bound is relative: the slowest of two
# runs of `--cfg job` (the same interpreter, imports and composition, no training) timed in the same pool, plus
# less than one Hub retry. That no model is built is proven in-process
# (`test_bad_config_fails_before_any_model_loads`).
FAIL_FAST_MARGIN_S = 20.0
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
    "algorithm.advantage.gamma=1.5": "algorithm.advantage.gamma=1.5: must be in [0, 1]",
    "algorithm.advantage.lam=-0.1": "algorithm.advantage.lam=-0.1: must be in [0, 1]",
    "task.max_new_tokens=0": "task.max_new_tokens=0: expected [min, max], two integers",
    "task.max_new_tokens=[5,2]": "task.max_new_tokens=[5, 2]: need 1 <= min <= max",
    "algorithm=cory algorithm.credit.w_other=abc": "algorithm.credit.w_other=abc: expected a number",
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
        (["task.num_eval=0"], "task: no held-out queries to evaluate on"),
        (["num_eval=0"], "num_eval=0: must be >= 1 or null"),
    ],
    ids=[
        "type",
        "integer",
        "context",
        "data-file",
        "unwritable-folder",
        "corrupt-run-config",
        "no-task-eval",
        "no-eval",
    ],
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


# ------------------------------------------------------------------------------------------- bad configuration
BAD = {  # override → key the one-line message must name
    "algorithm.agent.mini_batch_size=5": "algorithm.agent.mini_batch_size",
    "algorithm.agent.learning_rate=-1e-3": "algorithm.agent.learning_rate",
    "algorithm.agent.init_kl_coef=-0.1": "algorithm.agent.init_kl_coef",
    "algorithm.agent.kl_penalty=kl2": "algorithm.agent.kl_penalty",
    "+algorithm.agent.lr=0.1": "algorithm.agent.lr",
    "iterations=0": "iterations",
    "save_every=-1": "save_every",
    "model=gpt2 model.name_or_path=/nonexistent/dir": "model.name_or_path",
    "task=imdb task.reward._target_=cory.tasks.rewards.NoSuchReward": "task.reward._target_",
    "task=imdb task.source=web": "task.source",
    "algorithm=cory algorithm.schedule.period=0": "algorithm.schedule.period=0: must be an integer >= 1",
}
if not torch.cuda.is_available():
    BAD |= {"+model.load_in_4bit=true": "model.load_in_4bit", "hardware=gpu": "hardware.device"}


@pytest.mark.parametrize("override", list(BAD))
def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch, override):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for an invalid configuration")

    for builder in ("build_tiny_gpt2", "load_pretrained", "load_smollm2_135m"):
        monkeypatch.setattr(cory.models, builder, no_model)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, *override.split()), tmp_path / "run")
    message = str(err.value)
    assert BAD[override] in message and "\n" not in message
    if "kl_penalty" in override:
        assert "allowed" in message and "'full'" in message


def test_a_batch_larger_than_the_training_set_is_one_line(tmp_path):
    """The task's size is known once it is built (after the tokenizer loads): still one line, before any step."""
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, "batch_size=1024"), tmp_path / "run")
    message = str(err.value)
    assert message.startswith("batch_size=1024: the task has only") and "\n" not in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("task/reward=nope", "Available options in 'task/reward': distilbert_imdb tfidf"),
        ("model=nope", "Could not find 'model/nope'"),
        ("algorithm.agent.lr=1", "algorithm.agent.lr"),
    ],
)
def test_unknown_option_or_key_is_one_error_line(monkeypatch, capsys, override, named):
    """Composition errors (Hydra's own) get the same one-line treatment, before anything is built."""
    monkeypatch.setattr(sys, "argv", ["cory.train", "experiment=smoke", "task=imdb", override])
    monkeypatch.setattr(cory.train, "_hydra_main", lambda: pytest.fail("Hydra's run was reached"))
    with pytest.raises(SystemExit) as exit_:
        cory.train.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and named in err


CLI_BAD = [
    "algorithm.agent.mini_batch_size=5",
    "model=gpt2 model.name_or_path=/nonexistent/dir",
    "+model.load_in_4bit=true",
]


@pytest.fixture(scope="module")
def entrypoint(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """The entrypoint checks that need no interaction, run two at a time (2 CPUs): name → (result, seconds)."""
    tmp = tmp_path_factory.mktemp("entrypoint")
    corrupt = finished_run(tmp)
    (latest_checkpoint(corrupt) / "trainer.json").write_text("{not json")
    no_wandb = {k: v for k, v in env().items() if not k.startswith("WANDB_")}
    no_wandb |= {
        "WANDB_MODE": "online",
        "NETRC": str(tmp / "no-netrc"),
        "WANDB_DIR": str(tmp),
        "WANDB_CONFIG_DIR": str(tmp),
    }
    jobs = {
        o: (cli("experiment=smoke", f"hydra.run.dir={tmp / str(i)}", *o.split()), env())
        for i, o in enumerate(CLI_BAD)
        if o in BAD
    }
    jobs["gpt2"] = (cli("experiment=smoke", "model=gpt2", f"hydra.run.dir={tmp / 'gpt2'}"), env(HF_HUB_OFFLINE="1"))
    jobs["corrupt"] = (cli(f"resume={corrupt}", "iterations=3"), env())
    for k in ("startup_first", "startup_last"):  # first and last in the pool: the start-up cost around the checks
        jobs[k] = (cli("experiment=smoke", "--cfg", "job"), env())
    jobs = {"startup_first": jobs.pop("startup_first"), **jobs}
    jobs["wandb"] = (
        cli("experiment=smoke", "progress=false", "logger=wandb", "iterations=2", f"hydra.run.dir={tmp / 'wandb'}"),
        no_wandb,
    )

    def run(cmd: list[str], environ: dict) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        out = subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
        return out, time.monotonic() - t0

    jobs["startup_last"] = jobs.pop("startup_last")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, *job) for name, job in jobs.items()}
    results = {name: f.result() for name, f in futures.items()}
    for k in ("startup_first", "startup_last"):
        assert results[k][0].returncode == 0, results[k][0].stderr[-2000:]
    startup = max(results["startup_first"][1], results["startup_last"][1])
    return results | {"wandb_dir": (None, tmp / "wandb"), "fail_fast_s": (None, startup + FAIL_FAST_MARGIN_S)}


@pytest.mark.parametrize("override", CLI_BAD)
def test_bad_config_through_the_entrypoint_is_one_error_line(entrypoint, override):
    if override not in BAD:
        pytest.skip("valid on a CUDA machine")
    out, seconds = entrypoint[override]
    assert seconds < entrypoint["fail_fast_s"][1]
    assert BAD[override] in one_error_line(out)


def test_corrupt_checkpoint_through_the_entrypoint_is_one_error_line(entrypoint):
    out, _ = entrypoint["corrupt"]
    assert "iter_000002 is unreadable" in one_error_line(out)


# -------------------------------------------------------------------------------------- unreachable services
def test_unreachable_hub_model_fails_fast_naming_a_local_folder(entrypoint):
    out, seconds = entrypoint["gpt2"]
    assert seconds < entrypoint["fail_fast_s"][1]
    line = one_error_line(out)
    assert "'gpt2'" in line and "local folder" in line


def test_wandb_online_without_key_or_network_falls_back_to_jsonl(entrypoint):
    out, _ = entrypoint["wandb"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "W&B init failed" in out.stderr and "continuing with" in out.stderr
    assert json.loads((entrypoint["wandb_dir"][1] / "summary.json").read_text())["completed"] is True


def test_resume_of_a_missing_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["cory.train", f"resume={tmp_path / 'nope'}"])
    with pytest.raises(SystemExit) as exit_:
        cory.train.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: resume={tmp_path / 'nope'}: no such run folder"
    assert not (tmp_path / "nope").exists()
