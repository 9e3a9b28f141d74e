"""Tests for `cory.loggers`: JSONL round trip and resume truncation, the W&B mirror (disabled, offline, failing init,
failing log), secret stripping, and the metric-name schema. No network: W&B runs in disabled/offline mode or is
faked. Run with `pytest tests/test_loggers.py`.
"""

from __future__ import annotations

import json
import math

import pytest

from cory import loggers
from cory.loggers import (
    METRICS,
    JsonlLogger,
    WandbLogger,
    eval_key,
    is_known_metric,
    metric_names,
    metrics_markdown_table,
    ppo_key,
    resolve_wandb_mode,
    role_key,
    strip_secrets,
    train_key,
)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_round_trip_with_non_finite(tmp_path):
    with JsonlLogger(tmp_path / "run") as lg:
        lg.log({"train/llm1/kl": 1.5, "bad": float("nan"), "inf": float("inf"), "n": 3}, step=0)
        lg.log({"train/llm1/kl": 2.0}, step=1)
        lg.log_table("samples", [{"prompt": "p", "reward": float("-inf")}, {"prompt": "q", "reward": 0.5}], step=1)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows == [
        {"iteration": 0, "train/llm1/kl": 1.5, "bad": None, "inf": None, "n": 3},
        {"iteration": 1, "train/llm1/kl": 2.0},
    ]
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert samples == [
        {"iteration": 1, "table": "samples", "prompt": "p", "reward": None},
        {"iteration": 1, "table": "samples", "prompt": "q", "reward": 0.5},
    ]


def test_jsonl_numpy_scalars_and_flush(tmp_path):
    np = pytest.importorskip("numpy")
    lg = JsonlLogger(tmp_path)
    lg.log({"a": np.float32(0.5), "b": np.float64("nan"), "c": np.int64(7)}, step=np.int64(2))
    # Flushed per line: readable before close.
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 2, "a": 0.5, "b": None, "c": 7}]
    lg.close()
    lg.close()  # idempotent
    lg.log({"a": 1.0}, step=3)  # after close: ignored, no crash


def test_jsonl_resume_truncation_equals_uninterrupted(tmp_path):
    def metrics(i):
        return {"train/llm1/task_reward": i * 0.1, "train/llm1/kl": float(i)}

    with JsonlLogger(tmp_path / "full") as lg:
        for i in range(6):
            lg.log(metrics(i), step=i)
            lg.log_table("samples", [{"i": i}], step=i)

    # Interrupted after iteration 4 (with a partial line), checkpoint at iteration 3, resumed from 3.
    with JsonlLogger(tmp_path / "resumed") as lg:
        for i in range(5):
            lg.log(metrics(i), step=i)
            lg.log_table("samples", [{"i": i}], step=i)
    with (tmp_path / "resumed" / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 5, "train/llm1/ta')
    with JsonlLogger(tmp_path / "resumed", resume_from=3) as lg:
        assert [r["iteration"] for r in read_jsonl(lg.metrics_path)] == [0, 1, 2]
        for i in range(3, 6):
            lg.log(metrics(i), step=i)
            lg.log_table("samples", [{"i": i}], step=i)

    for name in ("metrics.jsonl", "samples.jsonl"):
        assert (tmp_path / "resumed" / name).read_text() == (tmp_path / "full" / name).read_text()


def test_jsonl_resume_without_existing_file(tmp_path):
    with JsonlLogger(tmp_path, resume_from=10) as lg:
        lg.log({"x": 1.0}, step=10)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 10, "x": 1.0}]


def test_strip_secrets_recursive():
    config = {
        "lr": 1e-5,
        "WANDB_API_KEY": "abc",
        "hf_token": "t",
        "model": {"name": "gpt2", "Secret_Sauce": 1, "layers": [{"password": "p", "n": 2}]},
        "monkey_key": "gone",
        "keep": ["x", {"AccessToken": 1, "y": 2}],
    }
    assert strip_secrets(config) == {
        "lr": 1e-5,
        "model": {"name": "gpt2", "layers": [{"n": 2}]},
        "keep": ["x", {"y": 2}],
    }
    assert config["WANDB_API_KEY"] == "abc"  # input untouched


def test_resolve_wandb_mode(monkeypatch, tmp_path):
    assert resolve_wandb_mode("online") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_wandb_mode() == "offline"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_wandb_mode() == "offline"  # no key anywhere
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert resolve_wandb_mode() == "online"
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert resolve_wandb_mode() == "online"


def test_wandb_logger_disabled(tmp_path):
    lg = WandbLogger(tmp_path, {"a": 1}, mode="disabled", run_id="abc123")
    assert lg.mode == "disabled" and not lg.mirroring and lg.run_id == "abc123"
    lg.log({"train/llm1/kl": 0.5}, step=0)
    lg.log_table("samples", [{"prompt": "p"}], step=0)
    lg.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 0, "train/llm1/kl": 0.5}]
    assert not (tmp_path / "wandb").exists()


def test_wandb_logger_offline(tmp_path):
    run_dir = tmp_path / "run"
    lg = WandbLogger(run_dir, {"lr": 1.0, "api_key": "s"}, mode="offline", name="ppo-kl0.3-seed0", group="g")
    assert lg.mirroring and lg.run_id
    lg.log({"train/llm1/task_reward": 1.0, "train/llm1/kl": float("nan")}, step=0)
    lg.log_table("samples", [{"prompt": "p", "response": "r", "reward": 1.0}], step=0)
    lg.log({"train/llm1/task_reward": 2.0}, step=1)
    lg.close()
    offline = list((run_dir / "wandb").glob(f"offline-run-*-{lg.run_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{lg.run_id}.wandb").is_file()
    assert [r["iteration"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1]
    assert read_jsonl(run_dir / "metrics.jsonl")[0]["train/llm1/kl"] is None
    assert read_jsonl(run_dir / "samples.jsonl")[0]["response"] == "r"


class FakeRun:
    def __init__(self, fail_log=False):
        self.id = "fake01"
        self.fail_log = fail_log
        self.logged = []
        self.finished = False

    def log(self, data, step):
        if self.fail_log:
            raise ConnectionError("broken pipe\nsecond line")
        self.logged.append((step, data))

    def finish(self, exit_code=None):
        self.finished = True


def test_wandb_init_kwargs_and_secret_stripping(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    calls = []
    run = FakeRun()

    def fake_init(**kwargs):
        calls.append(kwargs)
        return run

    monkeypatch.setattr(wandb, "init", fake_init)
    config = {"seed": 0, "wandb": {"api_key": "SECRET"}, "hub_token": "SECRET", "algorithm": {"name": "cory"}}
    lg = WandbLogger(tmp_path, config, mode="online", group="sweep", tags=["cory"], name="n", run_id="fake01")
    (kwargs,) = calls
    assert "SECRET" not in json.dumps(kwargs["config"])
    assert kwargs["config"] == {"seed": 0, "wandb": {}, "algorithm": {"name": "cory"}}
    assert kwargs["id"] == "fake01" and kwargs["resume"] == "allow" and kwargs["mode"] == "online"
    assert kwargs["dir"] == str(tmp_path) and kwargs["group"] == "sweep" and kwargs["tags"] == ["cory"]
    assert kwargs["settings"].init_timeout <= 30
    lg.log({"a": float("nan"), "b": 1.0}, step=4)
    lg.close()
    assert run.logged[0][0] == 4 and math.isnan(run.logged[0][1]["a"]) and run.logged[0][1]["b"] == 1.0
    assert run.finished


def test_wandb_init_failure_falls_back_to_jsonl(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")

    def failing_init(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", failing_init)
    lg = WandbLogger(tmp_path, {"a": 1}, mode="online", run_id="keepme")
    err = capsys.readouterr().err
    warning_lines = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warning_lines) == 1
    assert "UsageError" in warning_lines[0] and "No API key" in warning_lines[0]
    assert "WANDB_MODE=offline" in warning_lines[0]
    assert not lg.mirroring and lg.run_id == "keepme"
    lg.log({"x": 1.0}, step=0)
    lg.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 0, "x": 1.0}]


def test_wandb_log_failure_keeps_jsonl(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")
    run = FakeRun(fail_log=True)
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    lg = WandbLogger(tmp_path, {}, mode="online")
    assert lg.mirroring and lg.run_id == "fake01"
    for i in range(3):
        lg.log({"x": float(i)}, step=i)
    lg.log_table("samples", [{"p": "q"}], step=2)
    lg.close()
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "WARNING" in line]) == 1
    assert not lg.mirroring and run.finished
    assert [r["x"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0.0, 1.0, 2.0]
    assert read_jsonl(tmp_path / "samples.jsonl") == [{"iteration": 2, "table": "samples", "p": "q"}]


REQUIRED = (
    [f"train/<agent>/{n}" for n in (
        "task_reward", "kl", "kl_per_token", "kl_coef", "combined_reward", "combined_reward_current_beta",
        "response_length", "tokens", "hit_max_tokens", "entropy", "sampled_entropy", "collective_reward")]
    + [f"ppo/<agent>/{n}" for n in (
        "policy_loss", "value_loss", "clipfrac", "value_clipfrac", "approx_kl", "entropy", "ratio",
        "ratio_threshold_hits", "explained_variance", "mean_non_score_reward")]
    + [f"eval/<agent>/{n}" for n in ("task_reward", "kl", "combined_reward", "response_length")]
    + ["time/iteration_s", "time/generate_s", "time/learn_s", "memory/peak_mb"]
    + ["train/pioneer/task_reward", "train/pioneer/kl", "train/observer/task_reward", "train/observer/kl"]
    + ["cory/llm1_role", "cory/swaps"]
)  # fmt: skip


def test_metric_schema_and_table():
    assert set(REQUIRED) <= set(METRICS)
    assert all(isinstance(d, str) and d and "\n" not in d for d in METRICS.values())
    table = metrics_markdown_table()
    lines = table.strip().splitlines()
    assert len(lines) == len(METRICS) + 2
    for name in REQUIRED:
        assert f"| `{name}` |" in table
    assert all(line.count("|") - line.count("\\|") == 3 for line in lines)  # escaped pipes keep 2 columns


def test_key_helpers():
    assert train_key("llm1", "kl") == "train/llm1/kl"
    assert ppo_key("llm2", "clipfrac") == "ppo/llm2/clipfrac"
    assert eval_key("llm1", "task_reward") == "eval/llm1/task_reward"
    assert role_key("pioneer", "kl") == "train/pioneer/kl"
    with pytest.raises(ValueError):
        role_key("leader", "kl")
    names = metric_names(["llm1", "llm2"])
    assert "train/llm2/kl_coef" in names and "cory/swaps" in names and not any("<agent>" in n for n in names)
    assert all(is_known_metric(n) for n in names)
    assert not is_known_metric("train/llm1/nonsense") and not is_known_metric("foo")
    assert loggers.CORY_LLM1_ROLE == "cory/llm1_role"


def test_readme_documents_every_metric() -> None:
    """The README's metric table is generated from METRICS; a new metric must be documented there too."""
    from pathlib import Path

    from cory.loggers import METRICS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing = [name for name in METRICS if f"`{name}`" not in readme]
    assert not missing, f"README.md lacks {missing}: paste cory.loggers.metrics_markdown_table() into it"
