"""Pre-emption: a stop signal saves the last completed iteration within seconds, and the run continues by itself.

- SIGTERM / SIGUSR1 / SIGINT while an iteration generates or scores: the iteration is dropped (its draws from the
  global RNGs put back), the last completed one is checkpointed, and the resumed run's metrics equal an
  uninterrupted run's. In the update, the iteration finishes first; with `snapshot_updates=true` it is dropped at
  once too (the state before it was copied aside, and becomes the checkpoint). During an evaluation, it is left owed.
- A subprocess whose reward never returns still exits within seconds of the signal (the old behaviour, finishing
  the iteration, would hang).
- A handler installed before the run (submitit's, which requeues the job) gets the signal after the checkpoint.
- Requeue: a restarted SLURM job (`SLURM_RESTART_COUNT`, the same `SLURM_JOB_ID`) running the same command again
  continues its run; any other start in that folder is still refused.
- `hydra/launcher=slurm_requeue` composes, requeues on timeout and asks SLURM for the signal and `--requeue`.
- A job resumed where torch would take another thread count (another node, another `OMP_NUM_THREADS`) runs at its
  checkpoint's count, on which the float rounding depends, unless `hardware.threads` chooses one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.compose import compose_cfg
from helpers.hang import start_hanging
from helpers.runners import (
    assert_same_rows,
    exact_rows,
    read_rows,
    resume,
    resume_run,
    run_cli,
    run_main,
    smoke,
    start_run,
)

import cory.engines
import cory.ppo.learner
import cory.stopping
import cory.trainer
from cory import preemption, runs
from cory.algorithms.team import Team
from cory.checkpoints import latest_checkpoint
from cory.errors import ConfigError
from cory.tasks.toy import ToyTask
from cory.train import train

CORY_ARGS = ["algorithm=cory", "algorithm.schedule.period=1"]  # a role swap after every iteration, across the stop
_REFERENCE: dict[str, list[dict]] = {}


def reference_rows(tmp_path_factory, algorithm: str) -> list[dict]:
    """metrics.jsonl of an uninterrupted smoke run (4 iterations, evaluation and checkpoint every 2)."""
    if algorithm not in _REFERENCE:
        run_dir = tmp_path_factory.mktemp(f"reference-{algorithm}")
        train(smoke(run_dir, *(CORY_ARGS if algorithm == "cory" else [])), run_dir / "run")
        _REFERENCE[algorithm] = read_rows(run_dir / "run")
    return _REFERENCE[algorithm]


def train_rows(run_dir: Path) -> list[int]:
    return [r["iteration"] for r in read_rows(run_dir) if any(k.startswith("train/") for k in r)]


def signal_during(monkeypatch, sig: signal.Signals, iteration: int, where: str) -> None:
    """Send `sig` to this process from inside training iteration `iteration`: in its reward (after generation) or
    in its PPO update (`where`: "score" or "learn")."""
    current: dict[str, int | None] = {"iteration": None}

    def step(self, k, _step=Team.step):
        current["iteration"] = k
        try:
            return _step(self, k)
        finally:
            current["iteration"] = None

    monkeypatch.setattr(Team, "step", step)
    owner, name = (ToyTask, "score") if where == "score" else (cory.ppo.learner.PPOLearner, "update")
    real, sent = getattr(owner, name), []

    def hooked(self, *args, **kwargs):
        if current["iteration"] == iteration and not sent:
            sent.append(sig)
            os.kill(os.getpid(), sig)  # Python runs the handler before the next line
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)


# ------------------------------------------------------------------------------------------ in-process signals
@pytest.mark.parametrize(
    ("algorithm", "sig"),
    [("ppo", signal.SIGTERM), ("cory", signal.SIGUSR1), ("ppo", signal.SIGINT)],
    ids=["ppo-sigterm", "cory-sigusr1", "ppo-sigint"],
)
def test_a_signal_while_scoring_drops_the_iteration_and_the_resume_equals_an_uninterrupted_run(
    tmp_path, tmp_path_factory, monkeypatch, capsys, algorithm, sig
):
    want = reference_rows(tmp_path_factory, algorithm)
    args = CORY_ARGS if algorithm == "cory" else []
    signal_during(monkeypatch, sig, 1, "score")  # iteration 1 has sampled its responses (torch's RNG moved)
    run_dir = tmp_path / "run"
    summary = start_run(tmp_path, run_dir, *args)
    assert summary["stopped_by"] == sig.name and summary["iterations"] == 1 and summary["completed"] is False
    assert train_rows(run_dir) == [1]  # nothing of the second iteration was logged
    assert latest_checkpoint(run_dir).name == "iter_000001"  # the last completed iteration, saved on the signal
    out = capsys.readouterr().out
    dropped = "stopped after iteration 1 on a signal (iteration 2 was dropped; the resume redoes it); checkpoint saved"
    assert dropped in out

    monkeypatch.undo()
    resume_run(run_dir)
    assert_same_rows(read_rows(run_dir), want)  # the dropped iteration drew the same samples again
    if algorithm == "cory":
        assert [r["cory/swaps"] for r in read_rows(run_dir) if "cory/swaps" in r] == [0, 1, 2, 3]


def test_without_putting_the_rngs_back_the_resume_would_differ(tmp_path, tmp_path_factory, monkeypatch):
    """The control for the test above: the same stop, with the trainer's RNG restore disabled, changes the run."""
    want = reference_rows(tmp_path_factory, "ppo")

    @contextlib.contextmanager
    def keep_moved_rngs():
        outcome = cory.stopping.Outcome()
        try:
            yield outcome
        except preemption.Abandoned:
            outcome.happened = True

    monkeypatch.setattr(cory.trainer, "restore_rng_if_abandoned", keep_moved_rngs)
    signal_during(monkeypatch, signal.SIGTERM, 1, "score")
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir)
    monkeypatch.undo()
    resume_run(run_dir)
    with pytest.raises(AssertionError):
        assert_same_rows(read_rows(run_dir), want)


def test_a_signal_in_the_update_finishes_the_iteration(tmp_path, tmp_path_factory, monkeypatch, capsys):
    want = reference_rows(tmp_path_factory, "ppo")
    signal_during(monkeypatch, signal.SIGTERM, 0, "learn")
    run_dir = tmp_path / "run"
    summary = start_run(tmp_path, run_dir)
    assert summary["stopped_by"] == "SIGTERM" and summary["iterations"] == 1
    assert train_rows(run_dir) == [1] and latest_checkpoint(run_dir).name == "iter_000001"
    assert "stopped after iteration 1 on a signal; checkpoint saved" in capsys.readouterr().out
    monkeypatch.undo()
    resume_run(run_dir)
    assert_same_rows(read_rows(run_dir), want)


def signal_in_optimizer_step(monkeypatch, sig: signal.Signals, iteration: int, call: int) -> list[int]:
    """Send `sig` right after the `call`-th optimiser step (1-based) of training iteration `iteration` has changed
    the weights. Returns the list of optimiser steps taken, by iteration (to see that none ran after the signal)."""
    current: dict[str, int | None] = {"iteration": None}

    def step(self, k, _step=Team.step):
        current["iteration"] = k
        return _step(self, k)

    monkeypatch.setattr(Team, "step", step)
    real, steps = cory.engines.optimizer_step, []

    def hooked(*args, **kwargs):
        done = real(*args, **kwargs)
        steps.append(current["iteration"])
        if current["iteration"] == iteration and steps.count(iteration) == call:
            os.kill(os.getpid(), sig)  # the handler runs before the next line: the rest of the update never runs
        return done

    monkeypatch.setattr(cory.engines, "optimizer_step", hooked)
    return steps


# smoke: batch 16 in minibatches of 8, 2 epochs = 4 optimiser steps per agent; CORY's 6th is in its second agent's
# update, after the first agent's whole update
@pytest.mark.parametrize(("algorithm", "call"), [("ppo", 2), ("cory", 6)])
def test_with_snapshots_a_signal_in_the_update_drops_the_iteration_at_once_and_the_resume_is_exact(
    tmp_path, tmp_path_factory, monkeypatch, capfd, algorithm, call
):
    want = reference_rows(tmp_path_factory, algorithm)
    args = [*(CORY_ARGS if algorithm == "cory" else []), "snapshot_updates=true", f"snapshot_dir={tmp_path / 'shm'}"]
    steps = signal_in_optimizer_step(monkeypatch, signal.SIGTERM, 1, call)
    run_dir = tmp_path / "run"
    summary = start_run(tmp_path, run_dir, *args)
    assert summary["wall_time_s"] == summary["wall_time_this_start_s"]  # the snapshot's reload counts no time twice
    assert steps.count(1) == call  # not one optimiser step after the signal
    assert summary["stopped_by"] == "SIGTERM" and summary["iterations"] == 1 and summary["completed"] is False
    assert train_rows(run_dir) == [1] and latest_checkpoint(run_dir).name == "iter_000001"
    out = capfd.readouterr()  # the handler writes to file descriptor 2
    assert "(iteration 2 was dropped; the resume redoes it); checkpoint saved" in out.out
    assert "the iteration in progress is dropped and redone on resume" in out.err
    assert list((tmp_path / "shm").iterdir()) == []  # the snapshot is removed when the run ends
    monkeypatch.undo()
    resume_run(run_dir)
    assert_same_rows(read_rows(run_dir), want)  # the checkpoint is the state before the half-done update


def test_without_the_snapshot_the_half_done_update_would_be_saved_and_the_resume_would_differ(
    tmp_path, tmp_path_factory, monkeypatch
):
    """The control for the test above: the same stop, saving the weights in memory instead of the snapshot."""
    want = reference_rows(tmp_path_factory, "ppo")
    real = cory.trainer.Trainer._stop_before

    def save_what_memory_holds(self, k, dropped):
        kept, self.snapshots.path = self.snapshots.path, None  # `_stop_before` checkpoints the half-updated weights
        try:
            return real(self, k, dropped)
        finally:
            self.snapshots.path = kept

    monkeypatch.setattr(cory.trainer.Trainer, "_stop_before", save_what_memory_holds)
    signal_in_optimizer_step(monkeypatch, signal.SIGTERM, 1, 2)
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, "snapshot_updates=true", f"snapshot_dir={tmp_path / 'shm'}")
    monkeypatch.undo()
    resume_run(run_dir)
    with pytest.raises(AssertionError):
        assert_same_rows(read_rows(run_dir), want)


def test_snapshots_change_no_number_and_a_killed_runs_snapshot_is_cleared(tmp_path, tmp_path_factory, monkeypatch):
    """An uninterrupted run with snapshots logs what one without logs; a snapshot left by a process that no longer
    exists (SIGKILL: its RAM would stay taken) is removed by the next run that snapshots into the same folder, and
    a live process's is left alone."""
    want = reference_rows(tmp_path_factory, "ppo")
    shm = tmp_path / "shm"
    dead = shm / "cory-snapshot-999999999-abc"  # no such process
    alive = shm / f"cory-snapshot-{os.getppid()}-abc"
    for folder in (dead, alive):
        (folder / "iter").mkdir(parents=True)
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, "snapshot_updates=true", f"snapshot_dir={shm}")
    assert_same_rows(read_rows(run_dir), want)
    assert sorted(shm.iterdir()) == [alive]


def test_a_signal_during_an_evaluation_leaves_it_owed(tmp_path, tmp_path_factory, monkeypatch):
    want = reference_rows(tmp_path_factory, "ppo")
    real_evaluate, real_score, in_eval = cory.trainer.Trainer.evaluate, ToyTask.score, []

    def evaluate(self, final=False):
        in_eval.append(self.iteration)
        try:
            return real_evaluate(self, final)
        finally:
            in_eval.remove(self.iteration)

    def score(self, queries, responses):
        if in_eval == [2]:  # the evaluation after iteration 2, between its generation and its reward
            os.kill(os.getpid(), signal.SIGTERM)
        return real_score(self, queries, responses)

    monkeypatch.setattr(cory.trainer.Trainer, "evaluate", evaluate)
    monkeypatch.setattr(ToyTask, "score", score)
    run_dir = tmp_path / "run"
    assert start_run(tmp_path, run_dir)["stopped_by"] == "SIGTERM"
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "iter_000002"
    assert json.loads((checkpoint / "trainer.json").read_text())["pending_eval"] is True
    assert [r["iteration"] for r in read_rows(run_dir) if "eval/llm1/kl" in r] == [0]
    monkeypatch.undo()
    resume_run(run_dir)
    assert_same_rows(read_rows(run_dir), want)


def test_the_handler_the_run_replaced_gets_the_signal_after_the_checkpoint(tmp_path, monkeypatch):
    """submitit installs a SIGUSR2 handler that checkpoints the job's call, requeues it and exits: the run saves first,
    then hands the signal on."""
    calls = []

    def scheduler(signum, _frame):
        calls.append((signal.Signals(signum).name, latest_checkpoint(tmp_path / "run")))

    previous = signal.signal(signal.SIGUSR2, scheduler)
    try:
        signal_during(monkeypatch, signal.SIGUSR2, 1, "score")
        summary = start_run(tmp_path, tmp_path / "run")
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert summary["stopped_by"] == "SIGUSR2"
    assert [(name, ckpt.name) for name, ckpt in calls] == [("SIGUSR2", "iter_000001")]


# ------------------------------------------------------------------------------------------ subprocess: seconds
@pytest.mark.long
@pytest.mark.slow
def test_sigterm_exits_within_seconds_from_an_iteration_that_would_never_end(tmp_path, tmp_path_factory):
    want = reference_rows(tmp_path_factory, "ppo")
    run_dir = tmp_path / "run"
    proc, out = start_hanging(run_dir, 1)
    try:
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        exit_s = time.monotonic() - sent
    finally:
        proc.kill()
    assert exit_s < 20, exit_s  # about 1 s here: the checkpoint of a tiny model, the summary and its figure
    assert f"resume={run_dir}" in out.read_text() and latest_checkpoint(run_dir).name == "iter_000001"
    resume(run_dir)
    assert_same_rows(read_rows(run_dir), want)


# ------------------------------------------------------------------------------------------ requeue
SLURM = {"SLURM_JOB_ID": "4242"}


@pytest.mark.long
@pytest.mark.slow
def test_a_requeued_slurm_job_running_the_same_command_continues_its_run(tmp_path, tmp_path_factory):
    """SIGUSR1 (SLURM's `--signal=B:USR1@...`), then the same command in the requeued job: no `resume=` typed."""
    want = reference_rows(tmp_path_factory, "ppo")
    run_dir = tmp_path / "run"
    proc, _ = start_hanging(run_dir, 1, **SLURM)
    try:
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert runs.last_holder_job(run_dir) == "4242"
    same = ["experiment=smoke", "progress=false", f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"]
    out = run_cli(*same, SLURM_RESTART_COUNT="1", **SLURM)
    assert f"SLURM job 4242 was requeued (restart 1): resuming its run in {run_dir}" in out.stdout
    assert "resumed" in out.stdout and "from iter_000001" in out.stdout
    assert_same_rows(read_rows(run_dir), want)
    starts = [json.loads(line) for line in (run_dir / runs.STARTS).read_text().splitlines()]
    assert [(s["slurm_job"], s["from_iteration"]) for s in starts] == [("4242", 0), ("4242", 1)]


@pytest.fixture
def stopped_slurm_run(tmp_path, monkeypatch) -> Path:
    """A smoke run of SLURM job 4242 stopped by SIGTERM in iteration 1 (in-process), its environment reset."""
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    signal_during(monkeypatch, signal.SIGTERM, 1, "score")
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir)
    monkeypatch.undo()
    return run_dir


def test_a_requeued_sweep_job_continues_its_run_in_its_fixed_folder(
    stopped_slurm_run, tmp_path, tmp_path_factory, monkeypatch
):
    """submitit calls the Hydra job again with the same overrides and folder; `train` sees the requeue."""
    want = reference_rows(tmp_path_factory, "ppo")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    summary = start_run(tmp_path, stopped_slurm_run)  # exactly the first start's call
    assert summary["completed"] is True
    assert_same_rows(read_rows(stopped_slurm_run), want)


@pytest.mark.parametrize(
    "environment",
    [{"SLURM_JOB_ID": "4242"}, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, {"SLURM_RESTART_COUNT": "1"}],
    ids=["same-job-not-restarted", "another-job-restarted", "no-job"],
)
def test_any_other_new_run_in_that_folder_is_refused(stopped_slurm_run, monkeypatch, capsys, environment):
    for key in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert not runs.requeue_of(stopped_slurm_run)
    code, err = run_main(monkeypatch, capsys, "experiment=smoke", f"hydra.run.dir={stopped_slurm_run}")
    assert code == 2 and "already holds a run" in err
    with pytest.raises(ConfigError, match="already holds a run"):
        train(compose_cfg(["experiment=smoke", "progress=false"]), stopped_slurm_run)


def test_requeue_of_reads_the_job_from_a_lock_a_killed_start_left(tmp_path, monkeypatch):
    """Killed before its first start was recorded (e.g. while loading the model): the lock it held names the job."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / runs.RUN_CONFIG).write_text("algorithm: {}\n")
    owner = {"pid": 1, "host": "node1", "since": "now", "slurm_job": "99_3"}
    (folder / runs.LOCK).write_text(json.dumps(owner))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "99")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "123")  # an array task's own id: the array's `<job>_<task>` names it
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert runs.slurm_job() == "99_3" and runs.requeue_of(folder)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    assert not runs.requeue_of(folder)


# ------------------------------------------------------------------------------------------ the launcher config
def test_the_requeueing_slurm_launcher_composes_and_asks_for_the_signal_and_requeue(tmp_path):
    cfg = compose_cfg(["hydra/launcher=slurm_requeue", "experiment=smoke"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.max_num_timeout > 0 and launcher.signal_delay_s > 0
    from submitit.slurm.slurm import _make_sbatch_string  # what submitit will write for this config

    script = _make_sbatch_string(
        command="python -m submitit.core._submit",
        folder=str(tmp_path),
        signal_delay_s=launcher.signal_delay_s,
        additional_parameters=dict(launcher.additional_parameters),
    )
    assert f"#SBATCH --signal=USR2@{launcher.signal_delay_s}" in script.splitlines()
    assert "#SBATCH --requeue" in script.splitlines()


@pytest.mark.long
@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "no-snapshot"])
def test_the_stop_latency_script_measures_a_stop_in_the_update(snapshot):
    """`cory-measure stop-latency` (docs/running.md): one JSON object on stdout; with snapshots the iteration stopped
    in its update is dropped with no optimiser step after the signal, without them the update finishes."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "cory.studies.measure", "stop-latency", *([] if snapshot else ["--no-snapshot"]),
               "experiment=smoke"]  # fmt: skip
    out = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["stopped_by"] == "SIGTERM" and result["signal_to_checkpoint_s"] > 0
    if snapshot:
        assert result["iterations_completed"] == 1 and result["optimizer_steps_after_signal"] == 0
        assert len(result["snapshot_s"]) == 2
    else:
        assert result["iterations_completed"] == 2 and result["optimizer_steps_after_signal"] > 0
        assert result["snapshot_s"] == []


@pytest.mark.long  # five runs of the CLI (about 50 s): a kill-and-resume process test, with the long ones
def test_a_resume_where_torch_has_other_threads_continues_with_the_checkpoints_count(tmp_path):
    """A product's float rounding depends on how many threads share it. A run checkpointed at one thread and resumed
    where torch would take two (OMP_NUM_THREADS=2) runs at one, says so, and logs the uninterrupted run's rows;
    `hardware.threads=2` runs at two, says that the rounding changes, and its rows differ (so the count matters)."""
    common = ("experiment=smoke", "algorithm=cory", "progress=false", f"cache_dir={tmp_path / 'cache'}")
    run_cli(*common, f"hydra.run.dir={tmp_path / 'whole'}")  # one thread: the test runners' environment
    want = exact_rows(tmp_path / "whole")
    two = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    default = "torch threads: 1, as when the checkpoint was taken (the default here is 2)"
    chosen = "torch threads: 2 (hardware.threads), where the checkpoint was taken with 1"
    cases = (("default", (), default, True), ("chosen", ("hardware.threads=2",), chosen, False))
    for name, extra, said, exact in cases:
        run_cli(*common, "iterations=2", f"hydra.run.dir={tmp_path / name}")
        out = run_cli(f"resume={tmp_path / name}", "iterations=4", *extra, **two)
        assert said in out.stdout + out.stderr, name
        assert (exact_rows(tmp_path / name) == want) is exact, name
