"""Tests for `cory.loggers`: JSONL round trip, the W&B mirror (disabled, offline, failing init,
failing log), secret stripping, and the metric-name schema. No network: W&B runs in disabled/offline mode or is
faked. Run with `pytest tests/test_loggers.py`.
"""

from __future__ import annotations

import json
import math

import pytest

from cory.algorithms.team import TEAM_METRICS, role_metrics
from cory.loggers import JsonlLogger, WandbLogger, read_wandb_run, resolve_wandb_mode, strip_secrets
from cory.metrics import BEST, ROLES, RUN_METRICS, best_table, eval_key, markdown_table, ppo_key, role_key, train_key
from cory.metrics import is_known_metric as _is_known
from cory.ppo.metrics import PPO_METRICS

# What PPO and CORY runs log: the PPO learner's names, a team's by-role views, the trainer's own (docs/metrics.md;
# a team's role map and schedule: `TEAM_METRICS`, its own table there).
METRICS = PPO_METRICS | role_metrics(ROLES) | RUN_METRICS


def is_known_metric(name: str) -> bool:
    return _is_known(name, METRICS | TEAM_METRICS)


def metrics_markdown_table(catalogue: dict[str, str] | None = None) -> str:
    """The docs table of `catalogue` (PPO and CORY's names by default)."""
    return markdown_table(METRICS if catalogue is None else catalogue)


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

    def define_metric(self, name, **kwargs):
        self.defined = [*getattr(self, "defined", []), (name, kwargs)]

    def log(self, data, step=None):
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


def test_metric_table_renders_every_definition_on_one_row():
    assert all(isinstance(d, str) and d and "\n" not in d for d in METRICS.values())
    lines = metrics_markdown_table().strip().splitlines()
    assert lines[2:] == [f"| `{name}` | {d.replace('|', chr(92) + '|')} |" for name, d in METRICS.items()]
    assert all(line.count("|") - line.count("\\|") == 3 for line in lines)  # escaped pipes keep 2 columns


def test_key_helpers_and_known_names():
    with pytest.raises(ValueError):
        role_key("leader", "kl")
    for name in (train_key("llm2", "kl_coef"), ppo_key("llm1", "clipfrac"), eval_key("llm1", "task_reward")):
        assert is_known_metric(name), name
    assert is_known_metric("cory/swaps") and is_known_metric("train/any_agent/kl")
    assert is_known_metric(role_key("pioneer", "kl"))
    assert not is_known_metric("train/llm1/nonsense") and not is_known_metric("foo")
    assert not is_known_metric("train/pioneer/entropy")  # by-role views exist for reward and KL only


def test_readme_documents_every_metric() -> None:
    """The metric table of docs/metrics.md (the README links it) is `metrics_markdown_table()` verbatim: every
    metric, every definition."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    assert metrics_markdown_table() in page, "paste metrics_markdown_table()'s output into docs/metrics.md"


def test_readme_documents_every_maft_metric() -> None:
    """Multiagent Finetuning's metric table is in docs/metrics.md too, generated from `MAFT_METRICS` (a MAFT run
    logs only names of that table: tests/test_maft.py)."""
    from pathlib import Path

    from cory.maft.metrics import MAFT_METRICS

    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    table = metrics_markdown_table(MAFT_METRICS)
    assert table in page, "paste metrics_markdown_table(MAFT_METRICS)'s output into docs/metrics.md"
    assert table != metrics_markdown_table()


# --------------------------------------------------------------------------------- W&B summaries, read back
def test_summaries_are_last_values_and_bests_only_where_a_direction_is_declared(tmp_path, monkeypatch):
    """A real offline W&B run read back with W&B's own reader (`read_wandb_run`): every metric's summary is its last
    value as a plain number (a frontier reader's `summary["eval/llm1/task_reward"]`), `best/` only for the metrics
    `BEST` names, tables summarised by nothing; a resumed run's best counts the history before it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    evals = [(0, 0.2, 0.0), (2, 0.5, 3.0), (4, 0.3, 1.0)]  # (iteration, task reward, KL): the best reward at 2
    lg = WandbLogger(run_dir, {"seed": 0}, group="g", job_type="train", name="ppo-kl0.3-s0", best=BEST)
    for step, reward, kl in evals[:2]:
        lg.log({"eval/llm1/task_reward": reward, "eval/llm1/kl": kl, "eval/llm1/task_reward_se": 0.1}, step=step)
        lg.log_table("eval/llm1/samples", [{"prompt": "p", "response": f"r{step}", "reward": reward}], step=step)
    run_id = lg.run_id
    lg.close()
    # resumed: the same W&B run, from the rows metrics.jsonl and samples.jsonl hold
    lg = WandbLogger(run_dir, {"seed": 0}, group="g", name="ppo-kl0.3-s0", run_id=run_id, best=BEST)
    step, reward, kl = evals[2]
    lg.log({"eval/llm1/task_reward": reward, "eval/llm1/kl": kl, "eval/llm1/task_reward_se": 0.2}, step=step)
    lg.log_table("eval/llm1/samples", [{"prompt": "p", "response": "r4", "reward": reward}], step=step)
    lg.close()

    run = read_wandb_run(run_dir)  # the newest run file: the resumed start's, which carries the whole run
    assert (run["id"], run["name"], run["group"], run["state"]) == (run_id, "ppo-kl0.3-s0", "g", "finished")
    summary = run["summary"]
    assert summary["eval/llm1/task_reward"] == 0.3 and isinstance(summary["eval/llm1/task_reward"], float)
    assert summary["eval/llm1/kl"] == 1.0 and summary["eval/llm1/task_reward_se"] == 0.2 and summary["_step"] == 4
    assert summary["best/eval/llm1/task_reward"] == 0.5 and summary["best_iteration/eval/llm1/task_reward"] == 2
    assert not [k for k in summary if k.startswith("best") and ("/kl" in k or k.endswith("_se"))]
    numbers = {k: v for k, v in summary.items() if not k.endswith("/samples")}
    assert all(not isinstance(v, dict) for v in numbers.values()), numbers  # no {"last": .., "max": ..}
    table = summary["eval/llm1/samples"]  # one incremental table: every evaluation's rows, the resumed one's too
    assert table["_type"] == "incremental-table-file" and table["nrows"] == 3 and table["ncols"] == 4
    assert not [k for k in summary if k.startswith("eval/llm1/samples.") or k.startswith("best/eval/llm1/samples")]


def test_best_directions_name_logged_metrics_and_are_in_the_docs() -> None:
    """`BEST` names metrics of the catalogues, none of KL, standard errors or counts, and docs/metrics.md shows its
    table verbatim."""
    from pathlib import Path

    from cory.maft.metrics import is_maft_metric

    assert all(is_known_metric(name) or is_maft_metric(name) for name in BEST)
    assert not [name for name in BEST if name.endswith(("kl", "_se", "failures", "length", "problems"))]
    assert set(BEST.values()) <= {"max", "min"}
    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    assert best_table() in page, "paste cory.metrics.best_table()'s output into docs/metrics.md"
