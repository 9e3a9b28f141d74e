"""Starting, resuming and inspecting runs the way a user does, shared by the run-folder tests.

In-process helpers go through the same functions as `python -m cory.train` (`cory.train.train` with the
overrides recorded, `cory.cli.resume_overrides` for a resume, `cory.train.main` for the whole command line);
subprocess helpers use the real entrypoint with one torch thread (as the in-process runs do), so numbers
match to float precision. `check_run_folder` is what every finished smoke run must leave behind, `smoke` the
`smoke_cfg` fixture's config with more overrides.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import cory.train
from cory.cli import resume_overrides
from helpers.compose import compose_cfg

if TYPE_CHECKING:
    from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[2]


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    """Same rows in the same order; every number equal to 1e-5 except wall time and memory."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith(("time/", "memory/"))}
        assert keys == {k for k in g if not k.startswith(("time/", "memory/"))}
        for k in keys:
            if isinstance(w[k], float) and isinstance(g[k], float):
                assert math.isclose(g[k], w[k], rel_tol=1e-5, abs_tol=1e-5), (w["iteration"], k, g[k], w[k])
            else:
                assert g[k] == w[k], (w["iteration"], k)


def start_run(tmp_path: Path, run_dir: Path, *overrides: str) -> dict:
    """A smoke run started the way `python -m cory.train` starts one (its overrides recorded), in-process."""
    args = ["experiment=smoke", "progress=false", f"cache_dir={tmp_path / 'cache'}", *overrides]
    return cory.train.train(compose_cfg(args), run_dir, args)


def resume_run(run_dir: Path, *overrides: str) -> dict:
    """`python -m cory.train resume=<run_dir> <overrides>`, in-process, composed as the command line does."""
    args = resume_overrides(run_dir, [f"resume={run_dir}", *overrides])
    return cory.train.train(compose_cfg(args), run_dir, args)


def run_main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    """`python -m cory.train <argv>` in-process: (exit code, stderr)."""
    code, _, err = run_main_output(monkeypatch, capsys, *argv)
    return code, err


def run_main_output(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m cory.train <argv>` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # restored after the test (cory.cli sets it)
    monkeypatch.setattr(sys, "argv", ["cory.train", *argv])
    try:
        cory.train.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: equal snapshots mean nothing was touched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def env(**extra: str) -> dict[str, str]:
    # one thread: the same kernels as the in-process reference (conftest), and kind to a shared 2-CPU machine
    # without the W&B service address an in-process W&B run of this test process left behind: a subprocess starts its
    # own service, as a user's run does (a shared one still holds the id of a run this test killed)
    inherited = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return inherited | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} | extra


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cory.train", *args]


def start(run_dir: Path, args: list[str], **extra_env: str) -> subprocess.Popen:
    """Launch a smoke run in `run_dir`; output goes to files so a full pipe can never block it."""
    run_dir.mkdir(parents=True)
    out, err = (run_dir.parent / f"{run_dir.name}.{s}" for s in ("out", "err"))
    cmd = cli(
        "experiment=smoke",
        "progress=false",
        f"hydra.run.dir={run_dir}",
        f"cache_dir={run_dir.parent / 'cache'}",
        *args,
    )
    return subprocess.Popen(cmd, cwd=REPO, env=env(**extra_env), stdout=out.open("w"), stderr=err.open("w"))


def wait_for_train_row(run_dir: Path, proc: subprocess.Popen, iteration: int, timeout: float = 90.0) -> None:
    """Poll metrics.jsonl until the training row logged after `iteration` completed iterations is written; the
    process must still be running."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before iteration {iteration}"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.endswith("}") and '"train/' in line and json.loads(line)["iteration"] == iteration:
                    return
        time.sleep(0.01)
    raise AssertionError(f"no training row for iteration {iteration} within {timeout} s")


def run_cli(*args: str, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """`python -m cory.train <args>` as a subprocess from the repository; it must succeed."""
    out = subprocess.run(cli(*args), cwd=REPO, env=env(**extra_env), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def resume(run_dir: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """`python -m cory.train resume=<run_dir>` as a subprocess; it must succeed."""
    return run_cli(f"resume={run_dir}", timeout=120, **extra_env)


def one_error_line(out: subprocess.CompletedProcess) -> str:
    """The run failed in one `error:` line with exit code 2 and no traceback."""
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return errors[0]


def finished_run(tmp_path: Path) -> Path:
    """A two-iteration PPO run with one checkpoint kept."""
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, "iterations=2", "save_every=1", "keep_checkpoints=1")
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["iter_000002"]  # keep_checkpoints=1
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run folder at `tmp_path/run` (links kept as links): one `finished_run` per test module, spoilt
    differently by each test."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


# ------------------------------------------------------------------------------------------ a finished run folder
TRAIN_KEYS = ("task_reward", "kl", "kl_coef", "combined_reward", "response_length")
PPO_KEYS = ("policy_loss", "value_loss", "clipfrac", "approx_kl", "entropy")
EVAL_KEYS = ("task_reward", "kl", "combined_reward")
RUN_KEYS = ("time/iteration_s", "time/generate_s", "time/learn_s", "memory/peak_mb")
AGENTS = {"ppo": ["llm1"], "cory": ["llm1", "llm2"]}


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def exact_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without wall time and memory: what two runs of the same numbers log alike (compared with `==`)."""
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and "memory" not in k} for r in read_rows(run_dir)
    ]


def check_run_folder(run_dir: Path, algorithm: str, iterations: int) -> None:
    """What every finished smoke run must leave behind."""
    agents = AGENTS[algorithm]
    rows = read_rows(run_dir)
    assert all(isinstance(r["iteration"], int) for r in rows)
    train_rows = [r for r in rows if any(k.startswith("train/") for k in r)]
    eval_rows = [r for r in rows if any(k.startswith("eval/") for k in r)]
    assert [r["iteration"] for r in train_rows] == list(range(1, iterations + 1))  # completed iterations
    assert eval_rows[0]["iteration"] == 0 and eval_rows[-1]["iteration"] == iterations
    required = set(RUN_KEYS)
    for a in agents:
        required |= {f"train/{a}/{k}" for k in TRAIN_KEYS} | {f"ppo/{a}/{k}" for k in PPO_KEYS}
    for r in train_rows:
        assert required <= set(r), required - set(r)
        assert all(r[k] is not None for k in required)
    for r in eval_rows:
        assert {f"eval/{a}/{k}" for a in agents for k in EVAL_KEYS} <= set(r)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == algorithm and summary["iterations"] == iterations
    assert {"kl_coef", "seed"} <= set(summary)
    assert sorted(summary["agents"]) == agents
    for a in agents:
        final = summary["agents"][a]
        assert set(EVAL_KEYS) <= set(final) and all(isinstance(final[k], float) for k in EVAL_KEYS)
        assert final["task_reward"] == eval_rows[-1][f"eval/{a}/task_reward"]

    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoints = sorted((run_dir / "checkpoints").glob("iter_*"))
    assert checkpoints and checkpoints[-1].name == f"iter_{iterations:06d}"
    for a in agents:  # the whole policy, or (LoRA) the adapter and value head
        saved = {p.name for p in (checkpoints[-1] / "algorithm" / a).iterdir()}
        assert "policy.safetensors" in saved or {"adapter_model.safetensors", "value_head.safetensors"} <= saved


def smoke(tmp_path: Path, *overrides: str) -> DictConfig:
    """The `smoke_cfg` fixture's config with more overrides (e.g. `algorithm=cory`)."""
    return compose_cfg(["experiment=smoke", "progress=false", f"cache_dir={tmp_path / 'cache'}", *overrides])
