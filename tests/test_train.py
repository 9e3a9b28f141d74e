"""End-to-end `train(cfg)` on `experiment=smoke` for PPO and CORY, and the real entrypoint once.

Checks the run folder: metrics.jsonl rows and metric names, summary.json, the curves PNG and checkpoints.
Run: `pytest tests/test_train.py` (about 20 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose_cfg
from omegaconf import DictConfig

from cory.train import train

REPO = Path(__file__).resolve().parents[1]
TRAIN_KEYS = ("task_reward", "kl", "kl_coef", "combined_reward", "response_length")
PPO_KEYS = ("policy_loss", "value_loss", "clipfrac", "approx_kl", "entropy")
EVAL_KEYS = ("task_reward", "kl", "combined_reward")
RUN_KEYS = ("time/iteration_s", "time/generate_s", "time/learn_s", "memory/peak_mb")
AGENTS = {"ppo": ["llm1"], "cory": ["llm1", "llm2"]}


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_run_folder(run_dir: Path, algorithm: str, iterations: int) -> None:
    """What every finished smoke run must leave behind (shared with tests/test_robustness.py)."""
    agents = AGENTS[algorithm]
    rows = read_rows(run_dir)
    assert all(isinstance(r["iteration"], int) for r in rows)
    train_rows = [r for r in rows if any(k.startswith("train/") for k in r)]
    eval_rows = [r for r in rows if any(k.startswith("eval/") for k in r)]
    assert [r["iteration"] for r in train_rows] == list(range(iterations))
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
