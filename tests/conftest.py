"""Shared fixtures: offline environment, composed configs and a tiny model.

Everything runs offline on a CPU: the Hub, datasets and W&B are never contacted (a Hub lookup would otherwise
retry for 25–50 s, and an inherited W&B key would hang a run). Hydra and OmegaConf are imported only where a
config is composed: the TRL-parity tests run in a separate venv without them (`make parity`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ[_k] = _v

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONF_DIR = str(Path(__file__).resolve().parents[1] / "cory" / "conf")


def compose_cfg(overrides: list[str] | None = None, return_hydra_config: bool = False) -> DictConfig:
    """The config `python -m cory.train <overrides>` would run with (Hydra compose API)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        return compose("train", overrides=overrides or [], return_hydra_config=return_hydra_config)


@pytest.fixture
def smoke_cfg(tmp_path) -> DictConfig:
    """`experiment=smoke` with progress bars off and the cache in a temporary folder."""
    return compose_cfg(["experiment=smoke", "progress=false", f"cache_dir={tmp_path / 'cache'}"])


@pytest.fixture(autouse=True)
def _one_thread():
    """Two CPUs: keep each test on one torch thread so parallel work cannot starve it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
