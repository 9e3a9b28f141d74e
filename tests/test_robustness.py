"""A run survives kills, signals, crashes mid-write, NaNs, failing rewards and bad configuration.

- SIGKILL at an arbitrary iteration, then `python -m cory.train resume=<run folder>`: the metrics equal an
  uninterrupted run's (PPO and CORY, across a role swap), and the W&B run id continues.
- SIGTERM / SIGINT: checkpoint at the end of the iteration, before any evaluation it was due (the resume does
  it), a `resume=` hint, exit code 0; the "last good checkpoint" is named only when there is one. Ctrl-C while a
  run starts (before the trainer's handler): one line, exit code 130, no folder left (a resume's is untouched).
- Atomic checkpoints; a damaged checkpoint (truncated, unreadable, missing keys, an empty file, a pickle, NaN
  weights) is refused in one line naming it, and the run folder is left as it was; keep-last-K.
- Non-finite updates are skipped, then stop the run; non-finite weights stop it at once; exploded weights stop
  it in one line; a failing reward is counted and printed once; a full disk is one line naming the file.
- (Bad configuration, an unreachable Hub and W&B without network: tests/test_inputs.py.)
- Checkpoints hold no pickle but the optimiser (`weights_only=True`); no secret reaches the run folder.

Subprocesses use the real entrypoint and one torch thread (as the in-process reference runs do), so their
numbers match to float precision. Run: `pytest tests/test_robustness.py` (about two minutes on 2 CPUs).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.from_config import task_kwargs
from helpers.runners import (
    REPO,
    assert_same_rows,
    check_run_folder,
    cli,
    env,
    finished_run,
    read_rows,
    resume,
    resume_run,
    run_main,
    smoke,
    snapshot,
    start,
    start_run,
    wait_for_train_row,
)
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import cory.build
import cory.checkpoints
import cory.models
import cory.ppo.learner
import cory.train
from cory.algorithms.agents import QuerySchedule
from cory.algorithms.team import Team
from cory.checkpoints import latest_checkpoint
from cory.errors import CheckpointError, ConfigError, NonFiniteError
from cory.tasks.toy import CharacterShare, ToyTask
from cory.train import train
from cory.trainer import Trainer

# Six iterations, a checkpoint every two, an evaluation every two (smoke's); CORY swaps roles every two, so a
# swap falls after every checkpoint a resume starts from.
RESUMABLE = ["iterations=6", "save_every=2", "algorithm.schedule.period=2"]
SECRET = "secret-test-value"


def overrides(algorithm: str) -> list[str]:
    return [f"algorithm={algorithm}", *(RESUMABLE if algorithm == "cory" else RESUMABLE[:2])]


_UNINTERRUPTED: dict[str, list[dict]] = {}


def reference_rows(algorithm: str, tmp_path_factory) -> list[dict]:
    """metrics.jsonl of an uninterrupted in-process run with the resumable settings (computed once)."""
    if algorithm not in _UNINTERRUPTED:
        run_dir = tmp_path_factory.mktemp(f"reference-{algorithm}")
        train(smoke(run_dir, *overrides(algorithm)), run_dir / "run")
        _UNINTERRUPTED[algorithm] = read_rows(run_dir / "run")
    return _UNINTERRUPTED[algorithm]


# ------------------------------------------------------------------------------ SIGTERM/SIGINT, SIGKILL, resume
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "sig"), [("ppo", signal.SIGTERM), ("cory", signal.SIGINT)], ids=["ppo-sigterm", "cory-sigint"]
)
def test_signal_then_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, tmp_path_factory, algorithm, sig):
    """One run interrupted twice (three process starts instead of four for the two guarantees)."""
    want = reference_rows(algorithm, tmp_path_factory)
    run_dir = tmp_path / "run"
    # PPO also checks W&B: offline mode, and a key in the environment that must not leak into the run folder
    wandb = {"WANDB_MODE": "offline", "WANDB_API_KEY": SECRET} if algorithm == "ppo" else {}
    logger = ["logger=wandb"] if wandb else []

    # 1. SIGTERM / SIGINT during an iteration: it finishes, checkpoints, prints the resume command, exits 0
    proc = start(run_dir, [*overrides(algorithm), *logger], **wandb)
    try:
        wait_for_train_row(run_dir, proc, 1)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert f"resume={run_dir}" in (tmp_path / "run.out").read_text()
    done = [r for r in read_rows(run_dir) if any(k.startswith("train/") for k in r)]
    stopped = latest_checkpoint(run_dir)
    assert stopped.name == f"iter_{len(done):06d}"  # saved at the end of the interrupted iteration
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is False
    run_id = json.loads((stopped / "trainer.json").read_text())["wandb_run_id"]

    # 2. resume, then SIGKILL at an arbitrary later iteration, past the iteration-2 checkpoint
    proc = subprocess.Popen(
        cli(f"resume={run_dir}"), cwd=REPO, env=env(**wandb), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_train_row(run_dir, proc, 4)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert latest_checkpoint(run_dir).name in ("iter_000002", "iter_000004")
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is False  # still step 1's

    # 3. resume again: the log equals the uninterrupted run's, role swaps included
    resume(run_dir, **wandb)
    assert_same_rows(read_rows(run_dir), want)
    check_run_folder(run_dir, algorithm, 6)
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is True
    # Hydra's snapshot of the first start survives; the resumed starts (default config + `resume=`) go aside
    assert "build_tiny_gpt2" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert f"resume={run_dir}" in (run_dir / ".hydra" / "resumed" / "overrides.yaml").read_text()
    if algorithm == "cory":
        swaps = [r["cory/swaps"] for r in read_rows(run_dir) if "cory/swaps" in r]
        assert swaps == [0, 0, 1, 1, 2, 2]  # the role map continued across both interruptions
    if wandb:
        final = json.loads((latest_checkpoint(run_dir) / "trainer.json").read_text())["wandb_run_id"]
        assert run_id and final == run_id  # each resumed logger was initialised with the same id
        assert len(list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))) == 3  # three starts, one run
        leaked = [p for p in run_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert not leaked


# ------------------------------------------------------------------------------------------------ checkpoints
def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, tmp_path_factory, monkeypatch):
    want = reference_rows("ppo", tmp_path_factory)
    run_dir = tmp_path / "run"
    real_save, calls = cory.ppo.learner.Agent.save, []

    def save_then_crash(self, directory):
        calls.append(directory)
        if len(calls) == 2:  # the second checkpoint (iteration 4): die halfway through writing it
            (directory / "policy.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (directory / "policy.safetensors").write_bytes(b"half")
            raise OSError("disk full")
        real_save(self, directory)

    monkeypatch.setattr(cory.ppo.learner.Agent, "save", save_then_crash)
    with pytest.raises(OSError, match="disk full"):
        train(smoke(tmp_path, *overrides("ppo")), run_dir)
    assert latest_checkpoint(run_dir).name == "iter_000002"
    assert list((run_dir / "checkpoints").glob(".tmp-*"))  # the half-written one is there, and ignored

    monkeypatch.setattr(cory.ppo.learner.Agent, "save", real_save)
    train(smoke(tmp_path, f"resume={run_dir}"), run_dir)
    assert_same_rows(read_rows(run_dir), want)
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_000004", "iter_000006"]  # keep 2


class Evil:
    """Not a tensor: a checkpoint holding one must be refused without running any of its code."""


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _nan_weight(path: Path) -> None:
    tensors = load_file(str(path))
    name = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name][0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})


def _drop_key(path: Path) -> None:
    state = json.loads(path.read_text())
    del state["rng"]
    path.write_text(json.dumps(state))


DAMAGE = {  # what is done to the checkpoint → what the one-line refusal must say
    "truncated weights": ("algorithm/llm1/policy.safetensors", _truncate, r"is corrupt .*algorithm/llm1"),
    "trainer.json not json": ("trainer.json", lambda p: p.write_text("{not json"), r"is unreadable"),
    "trainer.json lacks a key": ("trainer.json", _drop_key, r"is unreadable \(trainer.json lacks rng\)"),
    "empty optimizer": ("algorithm/llm1/optimizer.pt", lambda p: p.write_bytes(b""), r"optimizer.pt is empty"),
    "a pickle": (
        "algorithm/llm1/optimizer.pt",
        lambda p: torch.save({"x": Evil()}, p),
        r"objects other than tensors",
    ),
    "NaN weights": ("algorithm/llm1/policy.safetensors", _nan_weight, r"holds non-finite values in algorithm/llm1"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_in_one_line_and_the_run_folder_is_untouched(tmp_path, damage):
    run_dir = finished_run(tmp_path)
    ckpt = latest_checkpoint(run_dir)
    name, spoil, message = DAMAGE[damage]
    spoil(ckpt / name)
    before = snapshot(run_dir)
    with pytest.raises((CheckpointError, ConfigError)) as err:  # trainer.json: refused with the folder's check
        resume_run(run_dir, "iterations=3")  # extending the run loads the checkpoint
    text = str(err.value)
    assert re.search(rf"^checkpoint {re.escape(str(ckpt))} .*{message}", text) and "\n" not in text
    assert "weights_only" not in text and "delete that checkpoint folder" in text
    assert snapshot(run_dir) == before  # metrics not truncated, nothing written: the run can still be rescued


def test_checkpoints_hold_no_pickle_but_the_optimizer(tmp_path):
    ckpt = latest_checkpoint(finished_run(tmp_path))
    files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    assert files == [
        "algorithm/llm1/agent.json",
        "algorithm/llm1/optimizer.pt",
        "algorithm/llm1/policy.safetensors",
        "algorithm/policies.json",  # the folders that hold policies (cory-evaluate and cory-export read it)
        "algorithm/team.json",
        "torch_rng.safetensors",
        "trainer.json",
    ]
    for name in files:
        path = ckpt / name
        if name.endswith(".json"):
            json.loads(path.read_text())
        elif name.endswith(".safetensors"):
            load_file(str(path))
    state = torch.load(ckpt / "algorithm/llm1/optimizer.pt", weights_only=True)  # tensors and plain containers only
    assert state["state"]


# ------------------------------------------------------------------------------------------------ non-finite
def test_nonfinite_rewards_skip_updates_then_stop_the_run(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    poisoned, skipped = [], []
    real_save, real_update = Trainer.save_checkpoint, cory.ppo.learner.PPOLearner.update

    def save_then_poison(self):
        path = real_save(self)
        poisoned.append(path)  # from the first checkpoint on, every reward is NaN
        return path

    def score(self, queries, responses):
        return [math.nan if poisoned else 0.5 for _ in responses]

    def update(self, batch):
        before = {k: v.clone() for k, v in self.trainee.policy.state_dict().items()}
        out = real_update(self, batch)
        if out.stats["nonfinite_skipped"]:
            assert all(torch.equal(before[k], v) for k, v in self.trainee.policy.state_dict().items())
            skipped.append(out)
        return out

    monkeypatch.setattr(Trainer, "save_checkpoint", save_then_poison)
    monkeypatch.setattr(ToyTask, "score", score)
    monkeypatch.setattr(cory.ppo.learner.PPOLearner, "update", update)
    with pytest.raises(NonFiniteError, match=r"^3 consecutive iterations .*max_bad_iterations=3"):
        train(smoke(tmp_path, *overrides("ppo")), run_dir)
    rows = [r for r in read_rows(run_dir) if "ppo/llm1/nonfinite_skipped" in r]
    assert [r["ppo/llm1/nonfinite_skipped"] for r in rows] == [0, 0, 1, 1, 1]
    assert [r["train/nonfinite_iterations"] for r in rows] == [0, 0, 1, 2, 3]
    assert len(skipped) == 3
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["iter_000002"]  # no bad one saved

    monkeypatch.setattr(ToyTask, "score", lambda self, q, r: [0.5] * len(r))
    summary = train(smoke(tmp_path, f"resume={run_dir}"), run_dir)  # the last good checkpoint loads and finishes
    assert summary["completed"] and summary["iterations"] == 6


@pytest.mark.parametrize(("at", "last_good"), [(0, None), (3, "iter_000002")], ids=["first", "after-checkpoint"])
def test_nonfinite_weights_stop_the_run_before_they_are_saved(tmp_path, monkeypatch, at, last_good):
    real_update, steps = cory.ppo.learner.PPOLearner.update, []

    def update(self, batch):
        out = real_update(self, batch)
        if len(steps) == at:  # a NaN weight, as an overflowing update would leave it
            with torch.no_grad():
                self.trainee.trainable_parameters()[0].view(-1)[0] = float("nan")
        steps.append(at)
        return out

    monkeypatch.setattr(cory.ppo.learner.PPOLearner, "update", update)
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteError) as err:
        start_run(tmp_path, run_dir, *overrides("ppo")[1:])
    text = str(err.value)
    assert text.startswith(f"iteration {at + 1} left non-finite weights (llm1/") and "\n" not in text
    if last_good:  # named only when it exists
        assert f"The last good checkpoint, {run_dir / 'checkpoints' / last_good}, is intact" in text
        assert latest_checkpoint(run_dir).name == last_good
    else:
        assert "No checkpoint was written before this point" in text and latest_checkpoint(run_dir) is None
    train_rows = [r for r in read_rows(run_dir) if "train/llm1/kl" in r]
    assert [r["iteration"] for r in train_rows] == list(range(1, at + 2))  # logged up to the bad step, nothing lost


def test_exploded_weights_stop_the_run_in_one_line(tmp_path):
    """A huge but finite step gives inf logits, and sampling then fails inside torch: one line, not a traceback."""
    with pytest.raises(NonFiniteError) as err:
        start_run(tmp_path, tmp_path / "run", "algorithm.agent.learning_rate=1e30")
    text = str(err.value)
    assert re.match(r"^iteration \d+ (left non-finite weights|met non-finite numbers)", text) and "\n" not in text
    assert "lower learning rate" in text


# ------------------------------------------------------------------------------------------------ signals, disk
def test_sigterm_checkpoints_before_the_evaluation_it_was_due(tmp_path, tmp_path_factory, monkeypatch, capsys):
    want = reference_rows("ppo", tmp_path_factory)
    real_step, real_evaluate, evaluations = Team.step, Trainer.evaluate, []

    def step(self, iteration):
        out = real_step(self, iteration)
        if iteration == 1:  # SLURM's SIGTERM during iteration 1; smoke evaluates every 2 iterations
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    def evaluate(self, final=False):
        evaluations.append(self.iteration)
        return real_evaluate(self, final)

    monkeypatch.setattr(Team, "step", step)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run_dir = tmp_path / "run"
    summary = start_run(tmp_path, run_dir, *overrides("ppo")[1:])
    assert summary["stopped_by"] == "SIGTERM" and summary["completed"] is False
    assert evaluations == [0]  # the evaluation due after iteration 1 is left to the resume
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.name == "iter_000002" and json.loads((ckpt / "trainer.json").read_text())["pending_eval"] is True
    assert "stopped after iteration 2 on a signal; checkpoint saved" in capsys.readouterr().out

    monkeypatch.setattr(Team, "step", real_step)
    resume_run(run_dir)
    assert evaluations[1] == 2  # the resume owes it, and does it first
    assert_same_rows(read_rows(run_dir), want)


def test_a_signal_before_any_checkpoint_does_not_claim_one(tmp_path, monkeypatch, capsys):
    real_evaluate = Trainer.evaluate

    def evaluate(self, final=False):  # Ctrl-C during the evaluation before training
        os.kill(os.getpid(), signal.SIGINT)
        return real_evaluate(self, final)

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run_dir = tmp_path / "run"
    summary = start_run(tmp_path, run_dir)
    out = capsys.readouterr().out
    assert summary["stopped_by"] == "SIGINT" and summary["iterations"] == 0
    assert "no new checkpoint. No checkpoint was written before this point" in out and "is intact" not in out
    assert latest_checkpoint(run_dir) is None and not [r for r in read_rows(run_dir) if "eval/llm1/kl" in r]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["disk-full", "read-only"])
def test_a_failed_write_is_one_line_naming_the_file_and_keeps_what_was_written(tmp_path, monkeypatch, capsys, code):
    real_save, calls = cory.checkpoints.save_file, []

    def save_file_or_full(tensors, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint
            raise OSError(code, os.strerror(code), path)
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(cory.checkpoints, "save_file", save_file_or_full)
    run_dir, args = tmp_path / "run", ["experiment=smoke", "progress=false", *overrides("ppo")[1:]]
    message = cory.train.run_reporting_errors(compose_cfg(args), run_dir, args, "train.log")
    err = capsys.readouterr().err
    assert err == f"error: {message}\n" and message.startswith(f"cannot write {calls[1]} ({os.strerror(code)})")
    assert f"the run folder {run_dir} keeps everything written" in message
    assert latest_checkpoint(run_dir).name == "iter_000002"
    assert [r["iteration"] for r in read_rows(run_dir) if "train/llm1/kl" in r] == [1, 2, 3, 4]


def test_training_outside_the_main_thread_leaves_signals_alone(tmp_path):
    """Some launchers (joblib's threading backend) run jobs in threads, where signal handlers cannot be set."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(start_run(tmp_path, tmp_path / "run", "iterations=1")))
    thread.start()
    thread.join(timeout=120)
    assert result.get("completed") is True


def test_a_failing_reward_gets_the_failure_reward_and_is_counted(tmp_path, monkeypatch, capsys):
    failing: set[str] = set()
    real_batch, real_score = QuerySchedule.batch, ToyTask.score

    def batch(self, k):
        queries = real_batch(self, k)
        if k == 0:
            failing.update(queries[:2])  # the first two queries of the first batch break the reward
        return queries

    def score(self, queries, responses):
        if failing & set(queries):
            raise ValueError("reward model crashed")
        return real_score(self, queries, responses)

    monkeypatch.setattr(QuerySchedule, "batch", batch)
    monkeypatch.setattr(ToyTask, "score", score)
    held_out = ToyTask(tokenizer=None, reward=CharacterShare("aeiou"), **task_kwargs("toy")).eval_queries()
    failing.update(held_out[:1])  # the held-out evaluations fail on one query too
    run_dir = tmp_path / "run"
    train(smoke(tmp_path, "task.failure_reward=-1.0"), run_dir)
    failures = [r["train/reward_failures"] for r in read_rows(run_dir) if "train/reward_failures" in r]
    assert failures == [2, 0, 0, 0]
    assert capsys.readouterr().out.count("reward failed on") == 1  # the first error only, evaluations included
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    first = [s for s in samples if s["table"] == "train/samples" and s["iteration"] == 1]
    assert [s["pioneer_reward"] for s in first[:2]] == [-1.0, -1.0]


def test_a_bit_flip_that_still_parses_is_refused_naming_the_file(tmp_path):
    """A weight changed on disk loads without complaint from safetensors; the checksums recorded at save refuse it."""
    run_dir = finished_run(tmp_path)
    ckpt = latest_checkpoint(run_dir)
    path = ckpt / "algorithm/llm1/policy.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # one bit of one weight (the tensor data sits at the end of the file)
    path.write_bytes(bytes(data))
    load_file(str(path))  # still a valid safetensors file
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError) as err:
        resume_run(run_dir, "iterations=3")
    text = str(err.value)
    assert "algorithm/llm1/policy.safetensors does not match the checksum" in text and "\n" not in text
    assert snapshot(run_dir) == before


def test_the_summary_counts_the_wall_time_of_every_start(tmp_path):
    run_dir = finished_run(tmp_path)
    first = json.loads((run_dir / "summary.json").read_text())
    state = json.loads((latest_checkpoint(run_dir) / "trainer.json").read_text())
    assert 0 < state["wall_time_s"] <= first["wall_time_s"]
    second = resume_run(run_dir, "iterations=3")
    assert second["wall_time_this_start_s"] < second["wall_time_s"]
    assert second["wall_time_s"] == pytest.approx(state["wall_time_s"] + second["wall_time_this_start_s"])


# A model that takes long to load: the process says so in a marker file, then waits there for Ctrl-C.
_SLOW_START = """
import signal, sys, time
from pathlib import Path
import cory.build, cory.train
# Ctrl-C as in a terminal: a process started in the background of a non-interactive shell (`pytest ... &`)
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)
marker = Path(sys.argv.pop(1))
def loading(*args, **kwargs):
    marker.write_text("loading")
    while True:
        time.sleep(0.05)
cory.build.build_algorithm = loading
cory.train.main()
"""


def test_ctrl_c_while_starting_is_one_line_and_leaves_no_run_folder(tmp_path):
    """SIGINT before the trainer's handler is set (the model still loading): no traceback, one line, exit code
    130, and no skeleton folder (Hydra's files, run_config.yaml, run.lock) that `resume=` could not use."""
    run_dir, marker = tmp_path / "run", tmp_path / "loading"
    args = ["experiment=smoke", "progress=false", f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"]
    cmd = [cli()[0], "-c", _SLOW_START, str(marker), *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    assert (run_dir / "run_config.yaml").exists()  # the start had written into its folder
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines() == [
        "error: interrupted (SIGINT); it stopped before its first iteration and nothing was kept; start the run again"
    ]
    assert not run_dir.exists()


def test_ctrl_c_while_a_resume_starts_leaves_the_run_folder_as_it_was(tmp_path, monkeypatch, capsys):
    run_dir = finished_run(tmp_path)
    before = snapshot(run_dir)

    def loading(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cory.build, "build_algorithm", loading)
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3")
    assert code == 130 and err == (
        f"error: interrupted (SIGINT); the run folder {run_dir} keeps what was written (the last complete checkpoint "
        f"included); continue with `python -m cory.train resume={run_dir}`\n"
    )
    # the run's files as they were (Hydra keeps its own record of each resume command under .hydra/)
    assert {k: v for k, v in snapshot(run_dir).items() if not k.startswith(".hydra/")} == before


def _torch_save_full(obj, path, *args, **kwargs):  # as torch.save fails on a full disk: a part written, no OSError
    Path(path).write_bytes(b"PK\0")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


def _safetensors_full(tensors, path, *args, **kwargs):  # safetensors' own error, not an OSError
    Path(path).write_bytes(b"\0" * 8)
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize(
    ("module", "name", "fake", "file"),
    [
        (torch, "save", _torch_save_full, "algorithm/llm1/optimizer.pt"),
        (cory.checkpoints, "save_file", _safetensors_full, "torch_rng.safetensors"),
    ],
    ids=["torch.save", "safetensors"],
)
def test_a_full_disk_inside_a_library_write_is_one_line_naming_the_file(
    tmp_path, monkeypatch, capsys, module, name, fake, file
):
    """The libraries report a full disk as RuntimeError (torch.save; the filesystem then has no block, or a few MB,
    left) or SafetensorError, never OSError: one line naming the file, the previous checkpoint kept, no traceback."""
    real, calls = getattr(module, name), []

    def second_checkpoint_fails(obj, path, *args, **kwargs):
        calls.append(path)
        if "iter_000004" in str(path):
            return fake(obj, path)
        return real(obj, path, *args, **kwargs)

    class NoBlockLeft:  # nearly full: 4 MB left when asked (the failed writer, or another process, freed a few)
        f_bavail, f_frsize = 1000, 4096

    monkeypatch.setattr(module, name, second_checkpoint_fails)
    monkeypatch.setattr(os, "statvfs", lambda path: NoBlockLeft)
    run_dir, args = tmp_path / "run", ["experiment=smoke", "progress=false", *overrides("ppo")[1:]]
    message = cory.train.run_reporting_errors(compose_cfg(args), run_dir, args, "train.log")
    assert capsys.readouterr().err == f"error: {message}\n"
    written = next(p for p in calls if "iter_000004" in str(p))
    assert message.startswith(f"cannot write {written} (No space left on device)") and str(written).endswith(file)
    assert latest_checkpoint(run_dir).name == "iter_000002"
