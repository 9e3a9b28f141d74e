"""Sweeps, run folders and resume: the README's guarantees about where a run lives and what a resume does.

- Folder names resolve for single runs and sweeps (`${hydra:...}` cannot be used in `hydra.sweep.dir`), read
  like a table row, and differ between two starts of the same second.
- A real `python -m cory.train -m` sweep of the tiny model (joblib launcher) writes one complete folder per
  job; with the basic launcher, a failing job is one `error:` line, leaves no folder, and the other job runs.
- A folder belongs to one run: a new run refuses a folder that holds one (before Hydra writes into it), a live
  process's lock refuses a second process, a dead process's lock is taken over; two runs started together get
  two folders.
- Resume: allowed changes are applied and recorded in `starts.jsonl`; changes to the experiment are refused
  naming the keys, with the folder untouched; extending a finished run equals a longer run; resuming a finished
  run is a no-op; `hydra.run.dir` or `-m` with `resume=` are refused.
- Caches: the TF-IDF cache key ignores where the data file lives; a builder that loses the race keeps the
  winner's copy (TF-IDF and SmolLM2).

Run: `pytest tests/test_sweeps.py` (about a minute on 2 CPUs, mostly the command-line sweeps).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.compose import compose_cfg
from helpers.runners import assert_same_rows, check_run_folder, env, read_rows, run_main, snapshot
from helpers.runners import resume_run as resume
from helpers.runners import start_run as start
from hydra.core.hydra_config import HydraConfig

from cory import assets, cli, runs
from cory.errors import ConfigError
from cory.runs import RunLock
from cory.tasks import rewards

REPO = Path(__file__).resolve().parents[1]
STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d-[0-9a-f]{6}"


def cli_env() -> dict[str, str]:
    """For commands run outside the repository (so `outputs/` lands in a tmp folder)."""
    return env(PYTHONPATH=str(REPO))


# --------------------------------------------------------------------------------------------------- folder names
def _hydra(overrides: list[str]):
    cfg = compose_cfg(overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what @hydra.main does before resolving `${hydra:...}`
    return cfg.hydra


@pytest.mark.parametrize(
    ("overrides", "sweep_dir", "subdir"),
    [
        (["experiment=smoke", "seed=3", "progress=false"], "smoke", "seed=3"),
        (
            ["experiment=smoke", "algorithm=cory", "algorithm.agent.init_kl_coef=0.1", "seed=1", "logger=jsonl"],
            "smoke",
            "algorithm.agent.init_kl_coef=0.1,algorithm=cory/seed=1",
        ),
        (["sweep=imdb_kl_frontier", "task/reward=tfidf"], "imdb_kl_frontier", "task_reward=tfidf/seed=0"),
    ],
)
def test_sweep_folder_names_resolve_and_read_like_the_table(overrides, sweep_dir, subdir):
    hydra = _hydra(overrides)
    assert re.fullmatch(rf"outputs/multiruns/{sweep_dir}/{STAMP}", hydra.sweep.dir)
    assert hydra.sweep.subdir == subdir  # seed, logger, progress, experiment are not repeated in the name


def test_two_starts_in_the_same_second_get_different_folders():
    first, second = _hydra(["experiment=smoke"]).run.dir, _hydra(["experiment=smoke"]).run.dir
    assert re.fullmatch(rf"outputs/runs/toy/ppo/{STAMP}", first) and first != second


@pytest.mark.long
def test_two_runs_started_together_run_in_two_folders(tmp_path):
    cmd = [sys.executable, "-m", "cory.train", "experiment=smoke", "iterations=1", "progress=false"]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stderr.read().decode()[-2000:]
    folders = sorted((tmp_path / "outputs" / "runs" / "toy" / "ppo").iterdir())
    assert len(folders) == 2
    for folder in folders:
        check_run_folder(folder, "ppo", 1)
        assert len((folder / runs.STARTS).read_text().splitlines()) == 1  # one start each


# --------------------------------------------------------------------------------------------------- real sweeps
@pytest.mark.long
def test_a_two_job_sweep_writes_one_complete_folder_per_job(tmp_path):
    """Through the real command line, with the joblib launcher (two worker processes). The basic launcher runs
    the same jobs in-process: the README's sweep (tests/test_commands.py) and the tests below."""
    cmd = [sys.executable, "-m", "cory.train", "-m", "experiment=smoke", "iterations=1", "seed=0,1", "progress=false"]
    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    out = subprocess.run(
        [*cmd, f"cache_dir={tmp_path / 'cache'}", *launcher],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "multiruns" / "smoke").iterdir()  # one folder for the whole sweep
    assert re.fullmatch(STAMP, sweep.name) and (sweep / "multirun.yaml").is_file()
    jobs = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert [str(j.relative_to(sweep)) for j in jobs] == ["iterations=1/seed=0", "iterations=1/seed=1"]
    for job in jobs:
        check_run_folder(job, "ppo", 1)
    assert read_rows(jobs[0]) != read_rows(jobs[1])  # two seeds, two runs


def test_a_failing_sweep_job_is_one_line_and_the_other_job_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_main(
        monkeypatch, capsys, "-m", "experiment=smoke", "iterations=1", "seed=0,-1", "progress=false",
        f"cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "seed=-1: must be in [0, 2^32)" in errors[0]  # the job's line, then the sweep's
    assert errors[1].startswith("error: a sweep job failed") and errors[1].endswith("the other jobs ran")
    (sweep,) = (tmp_path / "outputs" / "multiruns" / "smoke").iterdir()
    assert sorted(p.name for p in (sweep / "iterations=1").iterdir()) == ["seed=0"]  # no empty folder for -1
    check_run_folder(sweep / "iterations=1" / "seed=0", "ppo", 1)


def test_a_sweep_over_a_key_left_out_of_folder_names_keeps_jobs_apart(tmp_path, monkeypatch, capsys):
    """`eval_every` is left out of job folder names; sweeping it must not put two jobs in one folder."""
    monkeypatch.chdir(tmp_path)
    code, err = run_main(
        monkeypatch, capsys, "-m", "experiment=smoke", "iterations=1", "eval_every=0,1", "progress=false",
        f"cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert code == 0, err
    (sweep,) = (tmp_path / "outputs" / "multiruns" / "smoke").iterdir()
    names = sorted(str(p.parent.relative_to(sweep)) for p in sweep.rglob("summary.json"))
    assert names == ["eval_every=0,iterations=1/seed=0", "eval_every=1,iterations=1/seed=0"]


def test_a_sweep_refuses_a_folder_that_holds_one(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}")
    code, err = run_main(monkeypatch, capsys, "-m", "experiment=smoke", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert code == 2 and err == (
        f"error: hydra.sweep.dir={sweep} already holds a sweep; rerun that sweep's own command to continue it, or "
        f"choose a new folder\n"
    )
    assert [p.name for p in sweep.iterdir()] == ["multirun.yaml"]


def test_a_sweep_folder_holding_another_sweep_is_refused_naming_its_overrides(tmp_path, monkeypatch, capsys):
    """The same command (`hydra.sweep.dir` included) continues a sweep (tests/test_stop_signals.py); other overrides
    into its folder would mix two sweeps there."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - experiment=smoke\n    - seed=0,1\n")
    code, err = run_main(monkeypatch, capsys, "-m", "experiment=smoke", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    assert code == 2 and err.count("\n") == 1
    assert "already holds a sweep of other overrides (experiment=smoke seed=0,1); rerun that sweep's own" in err
    assert [p.name for p in sweep.iterdir()] == ["multirun.yaml"]


# ---------------------------------------------------------------------------------------------- folder ownership
@pytest.fixture
def finished(tmp_path) -> Path:
    """A finished two-iteration smoke run (checkpoints at 1 and 2), started like the command line does."""
    run_dir = tmp_path / "run"
    start(tmp_path, run_dir, "iterations=2", "save_every=1")
    return run_dir


def test_a_new_run_refuses_a_folder_that_holds_one(tmp_path, finished, monkeypatch, capsys):
    before = snapshot(finished)
    with pytest.raises(ConfigError, match=r"run folder=.*run already holds a run .*resume="):
        start(tmp_path, finished, "seed=1")
    # on the command line, before Hydra writes its .hydra/ snapshot into the folder
    code, err = run_main(monkeypatch, capsys, "experiment=smoke", f"hydra.run.dir={finished}")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: hydra.run.dir={finished} already holds a run") and f"resume={finished}" in err
    assert snapshot(finished) == before


def test_a_live_lock_refuses_a_second_process_and_a_dead_one_is_taken_over(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(folder / runs.LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"run folder {folder} is in use by pid {holder.pid} on host"):
            RunLock(folder).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: the kernel releases it
        holder.wait()
    lock = RunLock(folder)
    lock.acquire()
    assert f"taking over the lock left by pid {holder.pid}" in capsys.readouterr().out
    assert json.loads((folder / runs.LOCK).read_text())["pid"] == os.getpid()
    lock.release()


_HOLD_LOCK = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": "now"}).encode())
print("locked", flush=True)
time.sleep(120)
"""


# ------------------------------------------------------------------------------------------------------ resume
def test_extending_a_finished_run_equals_a_longer_run(tmp_path, finished, capsys):
    longer = tmp_path / "longer"
    start(tmp_path, longer, "iterations=4", "save_every=1")
    summary = resume(finished, "iterations=4")
    assert summary["completed"] and summary["iterations"] == 4
    assert_same_rows(read_rows(finished), read_rows(longer))
    assert "resume changes iterations: 2 → 4" in capsys.readouterr().out
    starts = [json.loads(line) for line in (finished / runs.STARTS).read_text().splitlines()]
    assert [s["from_iteration"] for s in starts] == [0, 2]
    assert starts[1]["changes"] == {"iterations": [2, 4]} and starts[1]["overrides"] == ["iterations=4"]


def test_resuming_a_finished_run_changes_nothing(finished, capsys):
    before = snapshot(finished)
    summary = resume(finished)
    assert summary["completed"] and "already completed its 2 iterations; nothing to do" in capsys.readouterr().out
    assert snapshot(finished) == before


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["seed=1"], "seed (0 → 1)"),
        (["algorithm.agent.learning_rate=1e-4"], "algorithm.agent.learning_rate (0.001 → 0.0001)"),
        (["algorithm=cory", "iterations=4"], "algorithm.episode.name ('ppo' → 'cory')"),
        (["model.n_layer=3"], "model.n_layer (2 → 3)"),
    ],
)  # fmt: skip
def test_a_resume_that_would_change_the_experiment_is_refused_naming_the_keys(finished, overrides, named):
    before = snapshot(finished)
    with pytest.raises(ConfigError) as err:
        resume(finished, *overrides)
    message = str(err.value)
    assert "\n" not in message and named in message and "iterations (" not in message
    assert snapshot(finished) == before


def test_allowed_changes_are_applied_and_recorded(finished):
    allowed = ["iterations=3", "save_every=3", "keep_checkpoints=3", "progress=true", "hardware.forward_batch_size=8"]
    resume(finished, *allowed)
    assert sorted(p.name for p in (finished / "checkpoints").iterdir()) == [f"iter_00000{i}" for i in (1, 2, 3)]
    last = json.loads((finished / runs.STARTS).read_text().splitlines()[-1])
    assert set(last["changes"]) == {cli.override_key(o) for o in allowed} and last["overrides"] == allowed
    assert runs.load_run_config(finished).iterations == 2  # the first start's config stays the record


def test_retyping_the_original_command_with_resume_changes_nothing(tmp_path, finished, capsys):
    resume(finished, "experiment=smoke", "progress=false", f"cache_dir={tmp_path / 'cache'}", "iterations=2")
    assert "nothing to do" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["iterations=1"], "iterations=1: the run at .* has already done 2 iterations"),
    ],
)
def test_shrinking_a_run_is_refused(finished, overrides, message):
    with pytest.raises(ConfigError, match=message):
        resume(finished, *overrides)


def test_a_finished_run_without_checkpoint_cannot_be_extended_unless_saved_final(tmp_path):
    bare, final = tmp_path / "bare", tmp_path / "final"
    start(tmp_path, bare, "iterations=1", "save_every=0")
    assert not (bare / "checkpoints").exists()  # save_every=0: no checkpoint at all
    with pytest.raises(ConfigError, match="completed but saved no checkpoint"):
        resume(bare, "iterations=2")
    start(tmp_path, final, "iterations=1", "save_every=0", "save_final=true")
    assert resume(final, "iterations=2")["iterations"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["resume={run}", "hydra.run.dir={tmp}/elsewhere"], "continues the run in its own folder; drop hydra.run"),
        (["-m", "resume={run}", "iterations=3,4"], "cannot be part of a -m sweep"),
    ],
)
def test_resume_with_another_folder_or_a_sweep_is_refused(tmp_path, finished, monkeypatch, capsys, argv, message):
    before = snapshot(finished)
    argv = [a.format(tmp=tmp_path, run=finished) for a in argv]
    code, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message in err
    assert snapshot(finished) == before and not (tmp_path / "elsewhere").exists()


def test_a_job_started_from_a_sweep_file_in_run_mode_resumes_as_one_run(tmp_path, monkeypatch, capsys):
    """`cory-sweep` starts each job as `sweep=<file> … hydra.mode=RUN`; the sweep file sets MULTIRUN, and
    its resume must still continue the one run in its folder, not start a sweep elsewhere."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "job"
    job = ["experiment=smoke", "sweep=cpu_imdb_frontier", "algorithm=ppo", "algorithm.agent.init_kl_coef=0.1",
           "seed=0", "iterations=1", "save_every=1", "progress=false", f"cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    code, err = run_main(monkeypatch, capsys, *job, "hydra.mode=RUN", f"hydra.run.dir={run}")
    assert code == 0, err
    code, err = run_main(monkeypatch, capsys, f"resume={run}", "iterations=2")
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["iterations"] == 2
    assert [r["iteration"] for r in read_rows(run) if "train/llm1/kl" in r] == [1, 2]
    assert not (tmp_path / "outputs").exists()  # no multirun folder


# ------------------------------------------------------------------------------------------------------ caches
def test_the_tfidf_cache_key_ignores_where_the_data_lives(tmp_path):
    from helpers.fakes import write_reviews_csv

    a = write_reviews_csv(tmp_path / "a.csv")
    (tmp_path / "elsewhere").mkdir()
    b = Path(shutil.copy(a, tmp_path / "elsewhere" / "b.csv"))
    first = rewards.TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(a))
    second = rewards.TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(b))
    assert first.path == second.path  # a fresh clone or venv (another absolute path) reuses the cache
    b.write_text(b.read_text().replace("wonderful", "splendid"))
    assert rewards.TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(b)).path != first.path


def test_a_tfidf_builder_that_loses_the_race_keeps_the_winners_cache(tmp_path):
    from helpers.fakes import write_reviews_csv

    data = write_reviews_csv(tmp_path / "reviews.csv")
    winner = rewards.TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    before = snapshot(winner.path)
    # a second run that found the cache empty finishes training after the first published it
    rewards._train_and_save(winner.path, str(data), 0, None, 0.2)
    assert snapshot(winner.path) == before
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [winner.path.name]  # no temporary folder left


def test_publish_replaces_an_incomplete_folder_but_never_a_complete_one(tmp_path):
    def complete(folder: Path) -> bool:
        return (folder / "done").is_file()

    final = tmp_path / "cache"
    final.mkdir()
    (final / "partial").write_text("old")
    ours = tmp_path / ".ours"
    ours.mkdir()
    (ours / "done").write_text("ours")
    assets.publish(ours, final, complete)
    assert (final / "done").read_text() == "ours" and not (final / "partial").exists()
    theirs = tmp_path / ".theirs"
    theirs.mkdir()
    (theirs / "done").write_text("theirs")
    assets.publish(theirs, final, complete)  # the first one won: it stays
    assert (final / "done").read_text() == "ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".theirs", "cache"]  # the caller removes its own copy


def test_the_smollm2_conversion_keeps_a_winner_published_meanwhile(tmp_path, monkeypatch):
    import transformers

    from cory.models import build_tiny_gpt2

    model, tokenizer = build_tiny_gpt2()
    model.hf_quantizer, model.config.quantization_config = None, {}
    cache = tmp_path / "cache"
    winner = cache / "smollm2-135m"

    def load_model(*args, **kwargs):  # the slow GGUF load, during which another run publishes the cache
        winner.mkdir(parents=True)
        (winner / "config.json").write_text("{}")
        (winner / "model.safetensors").write_text("winner")
        return model

    monkeypatch.setattr(assets, "_smollm2_gguf_dir", lambda: tmp_path)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load_model)
    assert assets.smollm2_135m_dir(cache) == winner
    assert (winner / "model.safetensors").read_text() == "winner"
    assert [p.name for p in cache.iterdir()] == ["smollm2-135m"]


@pytest.mark.parametrize("name", ["iterations=2/seed=0", "a folder with spaces", "résumé-ü"])
def test_resume_takes_any_folder_a_shell_can_pass(tmp_path, monkeypatch, capsys, name):
    """A sweep job's folder (`…/iterations=2/seed=0`), spaces, non-ASCII: started there and resumed as printed."""
    run_dir = tmp_path / name
    smoke = ["experiment=smoke", "progress=false", "iterations=2", f"cache_dir={tmp_path / 'cache'}"]
    code, err = run_main(monkeypatch, capsys, *smoke, f"hydra.run.dir={run_dir}")
    assert code == 0, err
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", "iterations=3")
    assert code == 0, err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "train/llm1/kl" in r] == [1, 2, 3]
