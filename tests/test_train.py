"""End-to-end `train(cfg)` on `experiment=smoke` for PPO and CORY, and the real entrypoint once.

Checks the run folder: metrics.jsonl rows and metric names, summary.json, the curves PNG and checkpoints.
Run: `pytest tests/test_train.py` (about 20 s).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.runners import REPO, check_run_folder, read_rows, smoke

from cory.train import train


@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_train_in_process_writes_the_run_folder(tmp_path, algorithm):
    cfg = smoke(tmp_path, f"algorithm={algorithm}")
    run_dir = tmp_path / "run"
    summary = train(cfg, run_dir)
    check_run_folder(run_dir, algorithm, cfg.iterations)
    assert summary["completed"] is True
    if algorithm == "cory":
        rows = [r for r in read_rows(run_dir) if "cory/swaps" in r]
        assert {"train/pioneer/task_reward", "train/observer/kl"} <= set(rows[0])


def test_the_real_entrypoint_runs_the_smoke_experiment(tmp_path):
    run_dir = tmp_path / "cli"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cory.train",
            "experiment=smoke",
            "progress=false",
            f"hydra.run.dir={run_dir}",
            f"cache_dir={tmp_path / 'cache'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    check_run_folder(run_dir, "ppo", 4)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "run_config.yaml").is_file()
    assert "held-out task reward" in out.stdout
