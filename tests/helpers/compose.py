"""Configs composed as the command line composes them: `compose_cfg(overrides)` and a sweep's jobs.

Hydra and OmegaConf are imported only when a config is composed: conftest.py imports this module, and the
TRL-parity tests run in a separate venv without them (`make parity`).
"""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONF_DIR = str(Path(__file__).resolve().parents[2] / "cory" / "conf")


def compose_cfg(overrides: list[str] | None = None, return_hydra_config: bool = False) -> DictConfig:
    """The config `python -m cory.train <overrides>` would run with (Hydra compose API)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        return compose("train", overrides=overrides or [], return_hydra_config=return_hydra_config)


@cache
def _compose(overrides: tuple[str, ...], hydra: bool = False):
    """`compose_cfg`, once per distinct override list (the pages and the scripts print the same jobs)."""
    return compose_cfg(list(overrides), return_hydra_config=hydra)


def _jobs(overrides: list[str]) -> tuple[list[list[str]], int]:
    """Every job's overrides: command-line sweeps, and a `sweep=` file's `hydra.sweeper.params` beneath them,
    and the number of seeds. Jobs that differ only in their seed are one job here: the seed changes no key's
    type or range."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    sweeps = {o.key_or_group: list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()}
    params = _compose(tuple(fixed), hydra=True).hydra.sweeper.get("params") or {}
    for key, value in params.items():
        (o,) = OverridesParser.create().parse_overrides([f"{key}={value}"])
        if key not in sweeps and key not in {p.key_or_group for p in parsed}:
            sweeps[key] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(value)]
    seeds = len(sweeps.get("seed", [None]))
    sweeps = {k: v[:1] if k == "seed" else v for k, v in sweeps.items()}
    keys = list(sweeps)
    jobs = [fixed + [f"{k}={v}" for k, v in zip(keys, values)] for values in itertools.product(*sweeps.values())]
    return jobs, seeds
