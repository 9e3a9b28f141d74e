"""Data-parallel training through a standard launcher: two gloo processes on the CPU via `torchrun`.

`accelerate launch` and `torchrun` set the same environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT);
`cory/distributed.py` joins that process group. Checks: the run finishes, rank 0 alone writes the run folder,
and both processes end with identical weights (gradients averaged before every step).
Run: `python -m pytest tests/test_distributed.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_two_gloo_processes_stay_in_sync(tmp_path: Path, algorithm: str) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun ships with torch"
    run_dir = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cmd = [
        torchrun,
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cory.train",
        "experiment=smoke",
        f"algorithm={algorithm}",
        "iterations=2",
        "progress=false",
        "save_every=0",
        "num_eval=4",
        f"hydra.run.dir={run_dir}",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["weights_in_sync"] is True
    assert summary["completed"] and summary["iterations"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if any(k.startswith("train/") for k in r)]
    assert [r["iteration"] for r in train_rows] == [0, 1]  # one writer: no duplicated rows
