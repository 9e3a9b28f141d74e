"""What a W&B user sees, read back from the offline run files with W&B's own reader (`wandb leet inspect`, through
`cory.loggers.read_wandb_run` for the summary).

- curves are declared against `iteration`, W&B's step is the console's iteration count, and no metric is given a
  summary option: every summary is the metric's last value, a plain number (what a frontier reader takes), and
  only the metrics `cory.metrics.BEST` names keep a best (`best/<name>`); the run has a `job_type`, a group and
  tags, and its config holds the config-group choices and the overrides;
- the samples reach W&B as they are made: one incremental table per name, logged at every iteration and every
  evaluation, so a run killed with SIGKILL has them; each checkpoint is a version of a model artifact which, put
  together as it would be downloaded, is a run folder `cory-export` exports; `logger.log_checkpoints=false` logs
  none;
- a run killed with SIGKILL and resumed carries its whole history in its (resumed) W&B run: every iteration, the
  baseline evaluation included, present exactly once, and every sample row;
- a pass@k run names the training run it evaluated (id, name, checkpoint);
- a joblib sweep's console: each job's lines start with its name, and W&B prints nothing in the workers.

Run: `pytest tests/test_wandb.py` (a few minutes on 2 CPUs; smoke runs in subprocesses).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.compose import compose_cfg
from helpers.runners import REPO, env, read_rows, resume, start, wait_for_train_row

from cory.loggers import offline_run_file, read_wandb_run

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


def logged_at(recs: list[dict], table: str) -> list[int]:
    """The steps at which the table `table` was logged."""
    return [r["_step"] for r in history(recs) if f"{table}._type" in r]


def sample_rows(run_dir: Path, table: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return [r for r in rows if r["table"] == table]


def model_artifacts(recs: list[dict]) -> list[dict]:
    return [r["artifact"] for r in recs if r["type"] == "artifact" and r["artifact"]["type"] == "model"]


def wandb_env(tmp_path: Path) -> dict[str, str]:
    """Offline W&B, its staging copies (tables, checkpoints) under the test's folder."""
    return {"WANDB_MODE": "offline", "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


@pytest.mark.long
@pytest.mark.slow
def test_a_run_is_what_wandb_shows_as_it_goes(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, ["logger=wandb", "algorithm=cory"], **wandb_env(tmp_path))
    assert proc.wait(timeout=300) == 0, (run_dir.parent / "run.err").read_text()[-3000:]
    recs = records(run_dir)
    metrics = {
        r["metric"].get("glob_name") or r["metric"].get("name"): r["metric"] for r in recs if r["type"] == "metric"
    }
    assert set(metrics) == {"iteration", "*"} and metrics["*"]["step_metric"] == "iteration"
    assert not [m for m in metrics.values() if m.get("summary")]  # no {"last": .., "max": ..} anywhere
    (run,) = [r["run"] for r in recs if r["type"] == "run"]
    assert run["job_type"] == "train" and run["run_group"] == "smoke"
    assert {"algorithm=cory", "experiment=smoke"} <= set(run["tags"])
    config = run["config"]["update"]
    choices = json.loads(config["choices"]["value_json"]) if "value_json" in config["choices"] else config["choices"]
    assert choices["algorithm"] == "cory" and choices["experiment"] == "smoke"
    rows = history(recs)
    assert [r["_step"] for r in rows] == list(range(len(rows)))
    assert all(r.get("iteration") == r["_step"] for r in rows)
    assert any(k.startswith("curves.") for r in rows for k in r)  # the run folder's figure

    # as it goes: the training samples at every iteration, each evaluation's at its iteration
    assert logged_at(recs, "train/samples") == [1, 2, 3, 4]
    assert logged_at(recs, "eval/llm2/samples") == [0, 2, 4]

    # the summary: last values, plain numbers; bests only for the declared metrics
    wandb_run = read_wandb_run(run_dir)
    summary, logged = wandb_run["summary"], read_rows(run_dir)
    evals = [r for r in logged if "eval/llm1/task_reward" in r]
    assert summary["eval/llm1/task_reward"] == pytest.approx(evals[-1]["eval/llm1/task_reward"])
    assert isinstance(summary["eval/llm1/task_reward"], float) and summary["_step"] == 4
    assert summary["train/llm2/kl"] == pytest.approx([r for r in logged if "train/llm2/kl" in r][-1]["train/llm2/kl"])
    best = max(evals, key=lambda r: r["eval/llm2/task_reward"])
    assert summary["best/eval/llm2/task_reward"] == pytest.approx(best["eval/llm2/task_reward"])
    assert summary["best_iteration/eval/llm2/task_reward"] == best["iteration"]
    bests = {k for k in summary if k.startswith("best/")}
    assert bests == {f"best/eval/{a}/{m}" for a in ("llm1", "llm2") for m in ("task_reward", "combined_reward")}
    assert not [k for k, v in summary.items() if isinstance(v, dict) and "_type" not in v]  # a dict: a table, a figure
    assert summary["train/samples"]["nrows"] == len(sample_rows(run_dir, "train/samples"))

    # each checkpoint a version of one model artifact; the latest, put together as downloaded, exports
    versions = model_artifacts(recs)
    assert [sorted(v["aliases"]) for v in versions] == [["iter_000002", "latest"], ["iter_000004", "latest"]]
    assert {v["name"] for v in versions} == {f"checkpoint-{wandb_run['id']}"}
    downloaded = tmp_path / "downloaded"
    for entry in versions[-1]["manifest"]["contents"]:
        (downloaded / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(entry["local_path"], downloaded / entry["path"])
    assert sorted(p.name for p in downloaded.iterdir()) == ["checkpoints", "run_config.yaml"]
    out = subprocess.run(
        [sys.executable, "-m", "cory.export", str(downloaded), "--agent", "llm2", "--out", str(tmp_path / "llm2")],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "llm2" / "cory_export.json").read_text())["checkpoint"] == "iter_000004"


@pytest.mark.long
@pytest.mark.slow
def test_a_killed_and_resumed_run_carries_its_whole_history(tmp_path):
    run_dir = tmp_path / "run"
    # W&B's service can be slow to start on a loaded machine: a generous init timeout, and a failed init is named
    args = ["logger=wandb", "+logger.init_timeout=300", "iterations=6", "save_every=2", "logger.log_checkpoints=false"]
    # W&B writes its run file every 15 s: a long run killed keeps all but its last seconds there; this run of a few
    # seconds stands for one with a flush every half second
    proc = start(run_dir, args, **wandb_env(tmp_path), WANDB__TRANSACTION_LOG_FLUSH_INTERVAL="0.5")
    wait_for_train_row(run_dir, proc, 4)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed = records(run_dir)  # the killed start's run file already holds the samples it made
    done = {r["iteration"] for r in sample_rows(run_dir, "train/samples")}
    assert 1 in logged_at(killed, "train/samples") and set(logged_at(killed, "train/samples")) <= done  # to its flush
    out = resume(run_dir, **wandb_env(tmp_path))
    assert "W&B init failed" not in out.stderr and "W&B log failed" not in out.stderr, out.stderr[-2000:]
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and len({f.name.rsplit("-", 1)[1] for f in folders}) == 1  # one W&B run, continued
    resumed = records(run_dir)
    steps = [r["_step"] for r in history(resumed)]
    assert steps == list(range(7)), steps  # iterations 0..6, each once (6: the final evaluation)
    evals = [r["_step"] for r in history(resumed) if "eval/llm1/task_reward" in r]
    assert evals == [0, 2, 4, 6]  # the baseline evaluation before training included
    logged = read_rows(run_dir)
    by_step = {r["_step"]: r for r in history(resumed)}
    for row in logged:
        for key, value in row.items():
            if key.startswith(("train/llm1/task_reward", "eval/llm1/kl")):
                assert by_step[row["iteration"]][key] == pytest.approx(value), (row["iteration"], key)
    summary = read_wandb_run(run_dir)["summary"]  # the resumed run's tables hold every row, the killed start's too
    assert summary["train/samples"]["nrows"] == len(sample_rows(run_dir, "train/samples"))
    assert summary["eval/llm1/samples"]["nrows"] == len(sample_rows(run_dir, "eval/llm1/samples"))
    assert summary["best/eval/llm1/task_reward"] == pytest.approx(
        max(r["eval/llm1/task_reward"] for r in logged if "eval/llm1/task_reward" in r)
    )
    assert not model_artifacts(killed) and not model_artifacts(resumed)  # logger.log_checkpoints=false


@pytest.mark.slow
def test_a_passk_run_names_the_training_run_it_evaluated(tmp_path, monkeypatch):
    from cory.evaluate import evaluate_run
    from cory.train import train

    for key, value in wandb_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    train(compose_cfg(["experiment=gsm8k_smoke", "iterations=1", "logger=wandb", "progress=false"]), run_dir)
    trained = read_wandb_run(run_dir)
    evaluate_run(run_dir, [], n=2, ks=[1, 2], num_problems=2, batch_size=4, seed=0, out=tmp_path / "eval")
    passk = read_wandb_run(tmp_path / "eval")
    assert offline_run_file(tmp_path / "eval") != offline_run_file(run_dir)
    assert passk["job_type"] == "evaluate" and passk["group"] == trained["group"]
    link = passk["config"]["train_run"]
    assert (link["id"], link["name"], link["checkpoint"]) == (trained["id"], trained["name"], "iter_000001")
    assert f"train_run={trained['id']}" in passk["tags"]


@pytest.mark.long
def test_a_joblib_sweeps_console_names_each_jobs_lines_and_wandb_is_quiet(tmp_path):
    cmd = [sys.executable, "-m", "cory.train", "-m", "experiment=smoke", "iterations=1", "seed=0,1", "progress=false"]
    cmd += ["logger=wandb", "logger.log_checkpoints=false", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    extra = wandb_env(tmp_path) | {"PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [*cmd, f"cache_dir={tmp_path / 'cache'}"],
        cwd=tmp_path,
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (out.stdout + out.stderr).splitlines()
    jobs = {0: "iterations=1/seed=0", 1: "iterations=1/seed=1"}
    named = [line for line in lines if re.match(r"\[job \d", line)]
    for num, folder in jobs.items():  # every line a job says carries its name, the job's own lines only
        mine = [line for line in named if line.startswith(f"[job {num} {folder}] ")]
        assert any("[cory] iteration 1/1" in line for line in mine) and any("wall time" in line for line in mine)
        assert all(f"seed {num};" in line for line in mine if "plan:" in line)
    assert not [line for line in lines if line.startswith("[cory]") and "sweep frontier" not in line], lines
    sweep_dir = next((tmp_path / "outputs" / "multiruns" / "smoke").iterdir())
    assert all(offline_run_file(sweep_dir / folder).is_file() for folder in jobs.values())  # each job's W&B run
    banners = [line for line in lines if line.startswith("wandb:")]  # only the sweep's summary run (the master)
    assert sum("Tracking run" in line for line in banners) == 1 and not [b for b in banners if "seed=" in b]
