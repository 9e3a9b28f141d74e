"""Stop signals where a run is not a single trainer loop between two iterations.

- Ctrl-C and SIGTERM on a `-m` sweep with the joblib launcher: every running job checkpoints, no job starts after the
  signal, no process is left behind, and the same command continues the sweep (`cory.callbacks.SweepSignals`). The
  sweeps run through the real command line in their own session, as from a terminal: Ctrl-C is SIGINT to the whole
  process group (the master and its loky workers), a scheduler's or `kill`'s SIGTERM goes to the master alone.
- Ctrl-C inside MAFT's fine-tuning (TRL's `SFTTrainer` loop): the round finishes and is saved, and the resume ends
  where an uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers.compose import compose_cfg
from helpers.runners import REPO, assert_same_rows, env, read_rows
from safetensors.torch import load_file

import cory.train
from cory.checkpoints import latest_checkpoint


def sweep_command(tmp_path: Path, *args: str, jobs: int = 2) -> list[str]:
    """A smoke sweep whose first `jobs` jobs start training together and take at least 0.15 s per iteration
    (`helpers.paced`): a job cannot end between "every job trains" and the signal, on however fast a machine."""
    paced = [
        "task.reward._target_=helpers.paced.PacedReward", f"+task.reward.barrier_dir={tmp_path / 'barrier'}",
        f"+task.reward.jobs={jobs}", "+task.reward.pause=0.15",
    ]  # fmt: skip
    return [
        sys.executable, "-m", "cory.train", "-m", "experiment=smoke", "iterations=12", "save_every=0",
        "progress=false", f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *paced, *args,
    ]  # fmt: skip


def paced_env() -> dict[str, str]:
    return env(PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))


def wait_until_training(sweep: Path, proc: subprocess.Popen, jobs: int, timeout: float = 240.0) -> None:
    """Until `jobs` job folders hold a training row in their metrics.jsonl."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the sweep ended (rc {proc.returncode}) before its jobs trained"
        started = [p for p in sweep.rglob("metrics.jsonl") if '"train/' in p.read_text()]
        if len(started) >= jobs:
            return
        time.sleep(0.2)
    raise AssertionError(f"{jobs} jobs were not training within {timeout} s")


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "jobs", "n_jobs", "running"),
    [
        ("ctrl-c", ["algorithm=ppo,cory"], 3, 2),  # a third worker that never gets a job gets the Ctrl-C too
        ("sigterm", ["seed=0,1,2"], 2, 2),  # the third job has not started when the signal comes
    ],
)
def test_a_stopped_joblib_sweep_checkpoints_every_job_and_the_same_command_continues_it(
    tmp_path, how, jobs, n_jobs, running
):
    cmd = sweep_command(tmp_path, *jobs, "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}", jobs=running)
    sweep = tmp_path / "sweep"
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=paced_env(), stdout=out, stderr=err, start_new_session=True)
    try:
        wait_until_training(sweep, proc, running)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= n_jobs
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the master and every worker
        else:
            proc.send_signal(signal.SIGTERM)  # the master alone
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = (tmp_path / "err").read_text()
    assert "Traceback" not in stderr and "error:" not in stderr, stderr[-3000:]
    assert stderr.count("stopping the sweep") == 1
    # no process of the sweep is left: every worker and resource tracker exited with the master
    time.sleep(1.0)
    alive = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [w.cmdline() for w in alive]

    folders = sorted(p.parent for p in sweep.rglob("run_config.yaml"))
    assert len(folders) == running  # a job that had not started when the signal came was not started after it
    stopped_at = {}
    for folder in folders:
        checkpoint = latest_checkpoint(folder)
        assert checkpoint is not None, folder
        stopped_at[folder] = int(checkpoint.name.removeprefix("iter_"))
        assert not json.loads((folder / "summary.json").read_text())["completed"]
    assert "Continue it with: python -m cory.train -m" in (tmp_path / "out").read_text()

    again = subprocess.run(cmd, cwd=REPO, env=paced_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    finished = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert len(finished) == (2 if how == "ctrl-c" else 3)
    for folder in finished:
        assert json.loads((folder / "summary.json").read_text())["completed"]
        starts = [json.loads(line) for line in (folder / "starts.jsonl").read_text().splitlines()]
        # a stopped job resumed from its checkpoint; one never started started once, now
        assert [s["from_iteration"] for s in starts] == ([0, stopped_at[folder]] if folder in stopped_at else [0])
        assert [r["iteration"] for r in read_rows(folder) if "train/llm1/kl" in r] == list(range(1, 13))
    assert (sweep / "frontier.csv").is_file()  # drawn once the sweep completed


def test_a_stop_signal_a_worker_got_while_its_run_was_built_stops_the_run_before_its_first_iteration(tmp_path):
    """A sweep worker's handler (`cory.callbacks._WorkerStop`) records a signal that came before the trainer's own
    handler was set; the trainer takes it as its own as soon as it starts: nothing is trained or evaluated."""
    from helpers.runners import start_run

    from cory.callbacks import _WorkerStop

    worker = _WorkerStop()
    previous = signal.signal(signal.SIGTERM, worker)
    try:
        worker(signal.SIGTERM, None)  # as the kernel would deliver it while the model loads
        summary = start_run(tmp_path, tmp_path / "run", "iterations=2")
        assert signal.getsignal(signal.SIGTERM) is worker  # put back once the run ended
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert summary["stopped_by"] == "SIGTERM" and summary["iterations"] == 0 and not summary["completed"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or read_rows(tmp_path / "run") == []
    assert latest_checkpoint(tmp_path / "run") is None


# ---------------------------------------------------------------------------------------- MAFT's fine-tuning step
# `python -m cory.train` whose first `SFTTrainer.training_step` sends Ctrl-C (SIGINT) to its own process, once: the
# signal lands inside TRL's training loop of round 1's first agent
CTRL_C_IN_SFT = """
import os, signal
import trl
import cory.train
step = trl.SFTTrainer.training_step
def training_step(self, *args, **kwargs):
    if not os.path.exists(os.environ["SFT_MARKER"]):
        open(os.environ["SFT_MARKER"], "w").close()
        os.kill(os.getpid(), signal.SIGINT)
    return step(self, *args, **kwargs)
trl.SFTTrainer.training_step = training_step
cory.train.main()
"""


@pytest.mark.long
@pytest.mark.slow
def test_ctrl_c_during_maft_fine_tuning_saves_the_round_and_the_resume_equals_an_uninterrupted_run(tmp_path):
    args = ["experiment=maft_smoke", "progress=false", "iterations=2"]
    want = tmp_path / "reference"
    cory.train.train(compose_cfg(args), want, args)

    run_dir = tmp_path / "run"
    marker = tmp_path / "sft.marker"
    out = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_SFT, *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env(SFT_MARKER=str(marker)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0 and marker.exists(), out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "error:" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.count("SIGINT received") == 1
    # the round finished its fine-tuning (every agent) and was saved; its evaluation is owed to the resume
    assert "[cory] stopped after iteration 1 on a signal; checkpoint saved" in out.stdout
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "iter_000001"
    assert json.loads((checkpoint / "trainer.json").read_text())["pending_eval"] is True
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGINT" and summary["completed"] is False

    again = subprocess.run(
        [sys.executable, "-m", "cory.train", f"resume={run_dir}"],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "from iter_000001 (iteration 1)" in again.stdout
    assert_same_rows(read_rows(run_dir), read_rows(want))
    final, reference = latest_checkpoint(run_dir), latest_checkpoint(want)
    assert final.name == reference.name == "iter_000002"
    for path in sorted((reference / "algorithm").glob("*.safetensors")):
        got, expected = load_file(final / "algorithm" / path.name), load_file(path)
        assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is True
