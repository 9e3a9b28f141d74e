"""The resumable sweep driver (`cory-sweep`, `cory/studies/run_sweep.py`) and the CPU reproduction script built on it.

- Jobs are Hydra's own expansion of the sweep; folders are named `<what varies>/seed=<n>`.
- A sweep stopped by a signal resumes from its checkpoints when the same command runs again, and the resumed
  run's metrics equal one uninterrupted run's rows (each iteration once); finished runs are skipped.
- `--jobs 0` or `--threads 0` is refused in one line (it would wait forever).
- `scripts/reproduce_cpu.sh` (the README's `make reproduce-cpu`) runs end to end on the tiny model and writes the
  curves and the frontier.
Run: `pytest tests/test_run_sweep.py` (about a minute: real runs in subprocesses).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cory.studies import run_sweep

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "CORY_CACHE": str(tmp_path / "cache")}


def test_jobs_are_hydras_expansion_and_folders_read_like_the_table(tmp_path):
    jobs, cfg = run_sweep.expand(["experiment=smoke", "sweep=cpu_imdb_frontier", "seed=0,1"])
    assert len(jobs) == 2 * 3 * 2 and cfg.sweep.name == "cpu_imdb_frontier"  # algorithm × η × seed
    folders = run_sweep.job_folders(jobs, tmp_path, default_seed=0)
    names = {str(f.relative_to(tmp_path)) for f in folders}
    assert "algorithm=cory,algorithm.agent.init_kl_coef=0.03/seed=1" in names and len(names) == 12
    # keys every job shares (experiment, sweep, adaptive_kl) do not name folders; no seed swept: the config's seed
    (only,) = run_sweep.job_folders([["experiment=smoke"]], tmp_path, default_seed=7)
    assert only == tmp_path / "run" / "seed=7"


@pytest.mark.long
@pytest.mark.slow
def test_a_stopped_sweep_resumes_and_a_finished_one_is_skipped(tmp_path):
    out = tmp_path / "sweep"
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "cory.studies.run_sweep", "--dir", str(out), "--jobs", "1",
           "--results", str(results),
           "experiment=smoke", "iterations=40", "save_every=2", "eval_every=0", "seed=3"]  # fmt: skip
    run = out / "run" / "seed=3"
    driver = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not list(run.glob("checkpoints/iter_*")) and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)  # like `kill <driver>`: the job checkpoints and stops
    first = driver.communicate(timeout=300)[0].decode()
    assert driver.returncode == 1 and "stopped" in first and "run the same command again" in first, first
    assert not (results / "run" / "seed=3").exists()  # only finished runs are collected
    stopped_at = json.loads((run / "summary.json").read_text())
    assert stopped_at["completed"] is False and 0 < stopped_at["iterations"] < 40

    second = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resume=" in second.stdout and "finished" in second.stdout
    assert f"(iteration {stopped_at['iterations']})" in (out / "logs" / "run_seed=3.log").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "train/llm1/kl" in r] == list(range(1, 41))  # each iteration once
    assert json.loads((run / "summary.json").read_text())["completed"] is True
    assert (out / "frontier.csv").is_file()  # summarised like a multirun
    # --results: the finished run's small files, byte for byte, and nothing else (no checkpoint, no weights)
    kept = results / "run" / "seed=3"
    made = [n for n in run_sweep.RESULT_FILES if n != "eval_outcomes.jsonl"]  # MAFT's own file: not in a PPO run
    assert sorted(p.name for p in kept.iterdir()) == sorted(Path(n).name for n in made)
    assert (kept / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    assert (kept / "overrides.yaml").read_bytes() == (run / ".hydra" / "overrides.yaml").read_bytes()

    third = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and "skip (finished): run/seed=3" in third.stdout and "start" not in third.stdout


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("retries", [0, 1])
def test_a_job_killed_on_its_own_is_resumed_at_once_with_retries(tmp_path, retries):
    """SIGKILL to the job alone (as the out-of-memory killer does) while the driver runs on: without `--retries` the
    job is left failed for the next start of the sweep; with `--retries 1` the driver resumes it from its last
    checkpoint at once and the run ends with each iteration logged once. A second kill would find no retry left."""
    import psutil

    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "cory.studies.run_sweep", "--dir", str(out), "--jobs", "1", "--retries",
           str(retries), "experiment=smoke", "iterations=40", "save_every=2", "eval_every=0", "seed=3"]  # fmt: skip
    run = out / "run" / "seed=3"
    driver = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not list(run.glob("checkpoints/iter_*")) and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)
    (job,) = psutil.Process(driver.pid).children()
    job.send_signal(signal.SIGKILL)
    printed = driver.communicate(timeout=600)[0].decode()
    assert "failed" in printed and "(exit -9)" in printed, printed
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    if retries == 0:
        assert driver.returncode == 1 and "retry" not in printed and "run the same command again" in printed
        assert not summary.get("completed")
        return
    assert driver.returncode == 0, printed
    assert "retry run/seed=3: killed by SIGKILL; resuming from its last checkpoint (0 retries left)" in printed
    assert summary["completed"] is True
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "train/llm1/kl" in r] == list(range(1, 41))  # each iteration once


def test_caches_are_warmed_through_the_entry_points_loaders(monkeypatch):
    """The model node holds keys for the agents (`add_special_tokens`, `lora`) that the loader does not take: the
    driver prepares it through `cory.build.load_model`, as a run does, not by instantiating the node whole."""
    import hydra.utils

    import cory.build

    seen = {}
    monkeypatch.setattr(cory.build, "load_model", lambda node: seen.setdefault("model", node))
    monkeypatch.setattr(hydra.utils, "instantiate", lambda node: seen.setdefault("reward", node))
    run_sweep.warm_caches(["experiment=quickstart"])  # SmolLM2 and the TF-IDF reward both cache
    assert "add_special_tokens" in seen["model"] and seen["model"]._target_.endswith("load_smollm2_135m")
    assert seen["reward"]._target_ == "cory.tasks.rewards.TfidfSentimentReward"


def test_a_second_driver_on_the_same_sweep_is_refused(tmp_path, capsys):
    (tmp_path / run_sweep.LOCK).write_text(str(os.getpid()))  # this process is alive
    assert run_sweep.main(["--dir", str(tmp_path), "experiment=smoke"]) == 2
    assert f"error: another cory-sweep (pid {os.getpid()}) is running in {tmp_path}" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--jobs", "--threads"])
def test_no_slot_or_thread_to_run_in_is_refused_in_one_line(tmp_path, flag):
    """`--jobs 0` would wait forever for a free slot: refused before anything is written."""
    cmd = [
        sys.executable,
        "-m",
        "cory.studies.run_sweep",
        "--dir",
        str(tmp_path / "sweep"),
        flag,
        "0",
        "experiment=smoke",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    refusal = f"error: cory-sweep: argument {flag}: 0 is below 1; see `cory-sweep --help`\n"
    assert out.returncode == 2 and out.stderr == refusal
    assert not (tmp_path / "sweep").exists()


@pytest.mark.long
@pytest.mark.slow
def test_reproduce_cpu_runs_end_to_end(tmp_path):
    """The README's `make reproduce-cpu` is `bash scripts/reproduce_cpu.sh`; here: tiny model, one seed, one η."""
    env = _env(tmp_path) | {"OUT": str(tmp_path / "repro"), "EXPERIMENT": "smoke", "PY": sys.executable}
    cmd = ["bash", "scripts/reproduce_cpu.sh", "seed=0", "algorithm.agent.init_kl_coef=0.1"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "repro"
    for name in ("curves.png", "curves.pdf", "curves.json", "frontier.png", "frontier.csv", "frontier.json"):
        assert (out / name).is_file(), name
    assert len(list((out / "runs").rglob("summary.json"))) == 4  # (ppo, cory) × (curves, frontier)
    curves = json.loads((out / "curves.json").read_text())
    assert {c["label"] for c in curves["curves"]} == {"algorithm=ppo", "algorithm=cory"}


@pytest.mark.long
@pytest.mark.slow
def test_evaluate_scores_each_trained_run_once_and_keeps_its_passk_with_the_results(tmp_path, capsys, monkeypatch):
    """`--evaluate`: pass@k of the base model and the agent after training, in the job's slot; its files join the
    results; a run trained but not yet scored (its evaluation lost) is scored again, without training again."""
    out, results = tmp_path / "sweep", tmp_path / "results"
    args = ["--dir", str(out), "--jobs", "1", "--results", str(results), "--evaluate", "--n 2 --num-problems 3",
            "experiment=gsm8k_smoke", "iterations=1", "seed=0"]  # fmt: skip
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)  # the driver's jobs inherit it
    assert run_sweep.main(args) == 0
    first = capsys.readouterr().out
    assert "[sweep] trained" in first and "start run/seed=0: cory.evaluate" in first
    run, kept = out / "run" / "seed=0", results / "run" / "seed=0"
    passk = json.loads((kept / "passk.json").read_text())
    assert set(passk) == {"base", "llm1"} and set(passk["llm1"]) >= {"pass@1", "pass@2", "greedy_accuracy"}
    assert (kept / "passk.json").read_bytes() == (run / run_sweep.PASSK / "passk.json").read_bytes()
    rows = [json.loads(line) for line in (kept / "passk_results.jsonl").read_text().splitlines()]
    assert sorted(r["model"] for r in rows) == ["base"] * 3 + ["llm1"] * 3
    starts = (run / "starts.jsonl").read_text()

    shutil.rmtree(run / run_sweep.PASSK)  # trained, its pass@k not written: only the evaluation runs again
    (kept / "passk.json").unlink()
    assert run_sweep.main(args) == 0
    printed = capsys.readouterr().out
    assert "cory.evaluate" in printed and "cory.train" not in printed.split("[sweep] start", 1)[1]
    assert (run / "starts.jsonl").read_text() == starts and (kept / "passk.json").is_file()
    assert run_sweep.main(args) == 0 and "skip (finished): run/seed=0" in capsys.readouterr().out


def test_a_run_whose_folder_is_gone_but_whose_results_are_kept_is_not_run_again(tmp_path, capsys):
    """A sweep continued on a fresh machine: the committed small files of a finished run stand for it (they go back
    into its folder and the sweep's summary counts it); kept files without the pass@k `--evaluate` owes do not."""
    committed = REPO / "outputs" / "family_cpu" / "results" / "algorithm=ppo" / "seed=0"  # a real finished run
    out, results = tmp_path / "sweep", tmp_path / "results"
    shutil.copytree(committed, results / "run" / "seed=0")
    args = ["--dir", str(out), "--results", str(results), "--evaluate", "--n 16",
            "experiment=gsm8k_cpu", "algorithm=ppo", "seed=0"]  # fmt: skip
    assert run_sweep.main(args) == 0
    printed = capsys.readouterr().out
    assert "skip (finished; its files restored from" in printed and "0 to run" in printed and "start" not in printed
    run = out / "run" / "seed=0"
    assert (run / ".hydra" / "overrides.yaml").read_bytes() == (committed / "overrides.yaml").read_bytes()
    assert (run / run_sweep.PASSK / "results.jsonl").read_bytes() == (committed / "passk_results.jsonl").read_bytes()
    assert "ppo,0.01,0,llm1,0.53125,1.70132" in (out / "frontier.csv").read_text()  # the restored run is summarised

    (results / "run" / "seed=0" / "passk.json").unlink()  # trained, but its pass@k was never kept
    assert not run_sweep.restore(results / "run" / "seed=0", tmp_path / "elsewhere", evaluate=True)
    assert not (tmp_path / "elsewhere").exists()
    assert run_sweep.restore(results / "run" / "seed=0", tmp_path / "elsewhere", evaluate=False)
    assert not run_sweep.restore(results / "run" / "seed=0", run, evaluate=False)  # a folder that is there stays
