"""Cross-field validation of the composed config, run before any model or dataset loads (issue 2, issue 4).

Each failure is one line naming the key, its value and what is allowed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from omegaconf import DictConfig

from cory.ppo_core import KL_ESTIMATORS


class ConfigError(ValueError):
    """An invalid configuration; the message is one line meant for the user."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Raise `ConfigError` on the first invalid value or combination."""
    a = cfg.algorithm.agent
    _check(cfg.iterations >= 1, f"iterations={cfg.iterations}: must be >= 1")
    _check(cfg.batch_size >= 2, f"batch_size={cfg.batch_size}: must be >= 2 (advantages are whitened)")
    _check(a.learning_rate > 0, f"algorithm.agent.learning_rate={a.learning_rate}: must be > 0")
    _check(a.init_kl_coef >= 0, f"algorithm.agent.init_kl_coef={a.init_kl_coef}: must be >= 0")
    _check(a.kl_penalty in KL_ESTIMATORS, f"algorithm.agent.kl_penalty={a.kl_penalty!r}: allowed {KL_ESTIMATORS}")
    _check(a.ppo_epochs >= 1, f"algorithm.agent.ppo_epochs={a.ppo_epochs}: must be >= 1")
    _check(a.mini_batch_size >= 1 and a.gradient_accumulation_steps >= 1,
           "algorithm.agent.mini_batch_size and gradient_accumulation_steps must be >= 1")
    backward = a.mini_batch_size * a.gradient_accumulation_steps
    _check(cfg.batch_size % backward == 0,
           f"algorithm.agent.mini_batch_size × gradient_accumulation_steps = {backward} must divide "
           f"batch_size={cfg.batch_size}")
    _check(0 <= a.cliprange and 0 <= a.cliprange_value, "algorithm.agent.cliprange(_value) must be >= 0")
    _check(a.kl_target > 0 and a.kl_horizon > 0, "algorithm.agent.kl_target and kl_horizon must be > 0")
    if "swap_period" in cfg.algorithm:
        _check(cfg.algorithm.swap_period >= 1, f"algorithm.swap_period={cfg.algorithm.swap_period}: must be >= 1")
    lo, hi = cfg.task.max_new_tokens
    _check(1 <= lo <= hi, f"task.max_new_tokens=[{lo}, {hi}]: need 1 <= min <= max")
    hw = cfg.hardware
    _check(hw.precision in ("fp32", "bf16", "fp16"), f"hardware.precision={hw.precision!r}: allowed fp32, bf16, fp16")
    if str(hw.device).startswith("cuda"):
        _check(torch.cuda.is_available(), f"hardware.device={hw.device} but CUDA is not available; use hardware=cpu")
    if cfg.model.get("load_in_4bit"):
        _check(torch.cuda.is_available(), "model.load_in_4bit=true needs CUDA (bitsandbytes 4-bit has no CPU "
                                          "kernels); use hardware=gpu on a GPU machine or load_in_4bit=false")
    path = cfg.model.get("name_or_path")
    if path and (str(path).startswith(("/", "./", "../", "~"))):
        _check(Path(path).expanduser().is_dir(), f"model.name_or_path={path}: no such local folder")
    _check(cfg.keep_checkpoints >= 1, f"keep_checkpoints={cfg.keep_checkpoints}: must be >= 1")
    if cfg.logger.get("_target_", "").endswith("WandbLogger"):
        _check(importlib.util.find_spec("wandb") is not None, "logger=wandb but wandb is not installed")
    if cfg.get("resume"):
        _check(Path(cfg.resume).is_dir(), f"resume={cfg.resume}: no such run folder")
