"""What a W&B user sees, parsed from the offline run files (`wandb leet inspect --json`, W&B's own reader).

- curves are declared against `iteration` (`define_metric`: `train/*` summarised by their last value, `eval/*` by
  their last and best), the run has a `job_type`, a group and tags, and its config holds the config-group
  choices and the overrides, so runs can be filtered by `algorithm=cory` or `experiment=smoke` in the UI;
- the per-iteration training samples are one table, logged once; the figures of the run folder are logged;
- a run killed with SIGKILL and resumed carries its whole history in its (resumed) W&B run: every iteration,
  the baseline evaluation included, present exactly once.

Run: `pytest tests/test_wandb.py` (about half a minute; smoke runs in subprocesses).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runners import REPO, env, resume, start, wait_for_train_row

WANDB = Path(sys.executable).parent / "wandb"


def records(run_dir: Path, newest: bool = True) -> list[dict]:
    """The records of the run's newest (or oldest) offline W&B run file."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {run_dir}"
    out = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", str(files[-1] if newest else files[0])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def history(recs: list[dict]) -> list[dict]:
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


@pytest.mark.long
@pytest.mark.slow
def test_a_run_is_declared_against_iteration_and_filterable(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, ["logger=wandb", "algorithm=cory"], WANDB_MODE="offline")
    assert proc.wait(timeout=300) == 0, (run_dir.parent / "run.err").read_text()[-3000:]
    recs = records(run_dir)
    metrics = {
        r["metric"].get("glob_name") or r["metric"].get("name"): r["metric"] for r in recs if r["type"] == "metric"
    }
    assert metrics["train/*"]["step_metric"] == "iteration" and metrics["train/*"]["summary"] == {"last": True}
    assert metrics["eval/*"]["summary"] == {"last": True, "max": True} and "iteration" in metrics
    (run,) = [r["run"] for r in recs if r["type"] == "run"]
    assert run["job_type"] == "train" and run["run_group"] == "smoke"
    assert {"algorithm=cory", "experiment=smoke"} <= set(run["tags"])
    config = run["config"]["update"]
    choices = json.loads(config["choices"]["value_json"]) if "value_json" in config["choices"] else config["choices"]
    assert choices["algorithm"] == "cory" and choices["experiment"] == "smoke"
    rows = history(recs)
    assert [r["_step"] for r in rows] == list(range(len(rows)))
    assert all(r.get("iteration") == r["_step"] for r in rows)
    keys = [k for r in rows for k in r]
    assert sum(k == "train/samples._type" for k in keys) == 1  # one growing table, not one per iteration
    assert any(k.startswith("curves.") for k in keys)  # the run folder's figure


@pytest.mark.long
@pytest.mark.slow
def test_a_killed_and_resumed_run_carries_its_whole_history(tmp_path):
    run_dir = tmp_path / "run"
    # W&B's service can be slow to start on a loaded machine: a generous init timeout, and a failed init is named
    args = ["logger=wandb", "+logger.init_timeout=300", "iterations=6", "save_every=2"]
    proc = start(run_dir, args, WANDB_MODE="offline")
    wait_for_train_row(run_dir, proc, 4)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    out = resume(run_dir, WANDB_MODE="offline")
    assert "W&B init failed" not in out.stderr and "W&B log failed" not in out.stderr, out.stderr[-2000:]
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and len({f.name.rsplit("-", 1)[1] for f in folders}) == 1  # one W&B run, continued
    resumed = records(run_dir)
    steps = [r["_step"] for r in history(resumed)]
    assert steps == list(range(7)), steps  # iterations 0..6, each once (6: the final evaluation)
    evals = [r["_step"] for r in history(resumed) if "eval/llm1/task_reward" in r]
    assert evals == [0, 2, 4, 6]  # the baseline evaluation before training included
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["_step"]: r for r in history(resumed)}
    for row in logged:
        for key, value in row.items():
            if key.startswith(("train/llm1/task_reward", "eval/llm1/kl")):
                assert by_step[row["iteration"]][key] == pytest.approx(value), (row["iteration"], key)
