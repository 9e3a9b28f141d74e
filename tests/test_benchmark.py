"""`scripts/benchmark.py` runs both algorithms and reports a consistent JSON (no timing is asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_benchmark_reports_ratio_and_its_token_split():
    cmd = [sys.executable, "scripts/benchmark.py", "--warmup", "0", "--iterations", "2", "--threads", "1"]
    # the child inherits conftest's offline environment (HF_*_OFFLINE, WANDB_MODE=disabled)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert (out["model"], out["task"], out["batch_size"], out["iterations"]) == ("tiny_gpt2", "toy", 16, 2)
    ppo, cory = out["ppo"], out["cory"]
    for run in (ppo, cory):
        assert run["timed_iterations"] == 2 and run["s_per_iter"] > 0 and run["peak_mb"] > 0
        assert run["generate_s"] + run["learn_s"] <= run["s_per_iter"]
    # the observer's prompt quotes the query and the pioneer's answer, so CORY processes more than twice the tokens
    assert cory["tokens_per_iter"] > 2 * ppo["tokens_per_iter"]
    assert abs(out["ratio"] - cory["s_per_iter"] / ppo["s_per_iter"]) < 1e-9
    assert abs(out["ratio"] - out["token_ratio"] * out["cost_per_token_ratio"]) < 1e-6
    assert out["target_ratio"] == 2.2 and out["meets_target"] == (out["ratio"] <= 2.2)
