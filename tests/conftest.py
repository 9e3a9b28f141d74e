"""The offline environment, the `smoke_cfg` fixture, one torch thread per test, the root logger restored after each
test and the `gpu` marker's skip.

Everything runs offline on a CPU: the Hub, datasets and W&B are never contacted (a Hub lookup would otherwise
retry for 25–50 s, and an inherited W&B key would hang a run). Hydra and OmegaConf are imported only where a
config is composed (`helpers.compose`): the TRL-parity tests run in a separate venv without them (`make parity`).
Shared code lives in the `helpers` package; no test module imports this file.
"""

from __future__ import annotations

import logging
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

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.compose import compose_cfg  # noqa: E402

if TYPE_CHECKING:
    from omegaconf import DictConfig


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


@pytest.fixture(autouse=True)
def _hydra_logging_undone():
    """An in-process `cory.train` lets Hydra configure the root logger: a file handler in that test's run folder
    (removed again when the run is refused) and a console handler on that test's captured stdout. Left in place,
    a later test's log line (a transformers warning) reaches them once some library has closed them, and the
    handler reopens a file in a folder that no longer exists. Each test ends with the root logger as it found it
    (pytest's own capture handlers come and go by themselves)."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in before and not type(h).__module__.startswith("_pytest")]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
