"""Device tier: the smoke run on one CUDA device with bf16 autocast, for PPO and CORY.

Marked `gpu`: skipped where CUDA is absent (every CI machine of this project), run by `make test-all` on a GPU
machine. Run: `python -m pytest -m gpu tests/test_gpu.py`.
"""

from __future__ import annotations

import math

import pytest
from conftest import compose_cfg

from cory.train import train


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_smoke_on_one_gpu_with_bf16(tmp_path, algorithm: str) -> None:
    cfg = compose_cfg(
        [
            "experiment=smoke",
            "hardware=gpu",
            f"algorithm={algorithm}",
            "progress=false",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["completed"]
    for agent in summary["agents"].values():
        assert all(math.isfinite(v) for v in agent.values())
