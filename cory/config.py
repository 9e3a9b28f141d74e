"""Cross-field validation of the composed config, run before any model or dataset loads (issue 2, issue 4).

Each failure is one line naming the key, its value and what is allowed.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import fields
from pathlib import Path

import torch
from hydra.utils import get_object
from omegaconf import DictConfig

from cory.ppo_core import KL_ESTIMATORS


class ConfigError(ValueError):
    """An invalid configuration; the message is one line meant for the user."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Raise `ConfigError` on the first invalid value or combination."""
    _check_run(cfg)
    _check_agent(cfg)
    _check_task_and_hardware(cfg)
    _check_model(cfg)
    if cfg.logger.get("_target_", "").endswith("WandbLogger"):
        _check(importlib.util.find_spec("wandb") is not None, "logger=wandb but wandb is not installed")
    # a typo'd key or a wrong `_target_` would otherwise fail inside Hydra's instantiate, after the model loads
    from cory.policy import HANDLE_KEYS  # the model keys read by `Backbone`, not by the loader

    skips = {"algorithm": ("agent",), "model": HANDLE_KEYS}
    for group in ("model", "task", "algorithm", "logger"):
        _check_target(cfg[group], group, skip=skips.get(group, ()))
    from cory.agent import PPOConfig  # here, not at import: `cory.agent` pulls in transformers

    _check_keys(cfg.algorithm.agent, "algorithm.agent", [f.name for f in fields(PPOConfig)], "the PPO learner")


def _check_run(cfg: DictConfig) -> None:
    _check(cfg.iterations >= 1, f"iterations={cfg.iterations}: must be >= 1")
    _check(cfg.batch_size >= 2, f"batch_size={cfg.batch_size}: must be >= 2 (advantages are whitened)")
    for key in ("eval_every", "save_every"):
        _check(cfg[key] >= 0, f"{key}={cfg[key]}: must be >= 0 (0: only at the end)")
    _check(cfg.keep_checkpoints >= 1, f"keep_checkpoints={cfg.keep_checkpoints}: must be >= 1")
    _check(cfg.max_bad_iterations >= 1, f"max_bad_iterations={cfg.max_bad_iterations}: must be >= 1")
    _check(cfg.num_eval is None or cfg.num_eval >= 1, f"num_eval={cfg.num_eval}: must be >= 1 or null")
    final = cfg.get("num_eval_final")
    _check(final is None or final >= 1, f"num_eval_final={final}: must be >= 1 or null")
    _check(cfg.eval_batch_size >= 1, f"eval_batch_size={cfg.eval_batch_size}: must be >= 1")
    if cfg.get("resume"):
        _check(Path(cfg.resume).is_dir(), f"resume={cfg.resume}: no such run folder")


def _check_agent(cfg: DictConfig) -> None:
    a = cfg.algorithm.agent
    _check(a.learning_rate > 0, f"algorithm.agent.learning_rate={a.learning_rate}: must be > 0")
    _check(a.init_kl_coef >= 0, f"algorithm.agent.init_kl_coef={a.init_kl_coef}: must be >= 0")
    _check(a.kl_penalty in KL_ESTIMATORS, f"algorithm.agent.kl_penalty={a.kl_penalty!r}: allowed {KL_ESTIMATORS}")
    _check(a.ppo_epochs >= 1, f"algorithm.agent.ppo_epochs={a.ppo_epochs}: must be >= 1")
    _check(
        a.mini_batch_size >= 1 and a.gradient_accumulation_steps >= 1,
        "algorithm.agent.mini_batch_size and gradient_accumulation_steps must be >= 1",
    )
    backward = a.mini_batch_size * a.gradient_accumulation_steps
    _check(
        cfg.batch_size % backward == 0,
        f"algorithm.agent.mini_batch_size × gradient_accumulation_steps = {backward} must divide "
        f"batch_size={cfg.batch_size}",
    )
    _check(0 <= a.cliprange and 0 <= a.cliprange_value, "algorithm.agent.cliprange(_value) must be >= 0")
    _check(a.kl_target > 0 and a.kl_horizon > 0, "algorithm.agent.kl_target and kl_horizon must be > 0")
    if "swap_period" in cfg.algorithm:
        _check(cfg.algorithm.swap_period >= 1, f"algorithm.swap_period={cfg.algorithm.swap_period}: must be >= 1")


def _check_task_and_hardware(cfg: DictConfig) -> None:
    lo, hi = cfg.task.max_new_tokens
    _check(1 <= lo <= hi, f"task.max_new_tokens=[{lo}, {hi}]: need 1 <= min <= max")
    num_train = cfg.task.get("num_train")
    _check(
        num_train is None or num_train >= cfg.batch_size,
        f"task.num_train={num_train}: must be >= batch_size={cfg.batch_size} (one batch per iteration)",
    )
    if "source" in cfg.task:  # each task class lists its data sources (`SOURCES`)
        try:
            sources = get_object(cfg.task._target_).SOURCES
        except Exception:  # noqa: BLE001 - a wrong `_target_` is reported by `_check_target`
            sources = None
        if sources is not None:
            allowed = ", ".join(sources)
            _check(cfg.task.source in sources, f"task.source={cfg.task.source!r}: allowed {allowed}")
    hw = cfg.hardware
    _check(hw.precision in ("fp32", "bf16", "fp16"), f"hardware.precision={hw.precision!r}: allowed fp32, bf16, fp16")
    if str(hw.device).startswith("cuda"):
        _check(torch.cuda.is_available(), f"hardware.device={hw.device} but CUDA is not available; use hardware=cpu")
    _check(
        hw.forward_batch_size >= 1 and hw.generation_batch_size >= 1,
        "hardware.forward_batch_size and hardware.generation_batch_size must be >= 1",
    )


def _check_model(cfg: DictConfig) -> None:
    lora = cfg.model.get("lora")
    if lora is not None:
        from cory.policy import LoraSettings

        _check_keys(lora, "model.lora", [f.name for f in fields(LoraSettings)], "the LoRA settings")
        if lora.enabled:
            _check(
                lora.r >= 1 and lora.alpha > 0, f"model.lora.r={lora.r}, alpha={lora.alpha}: need r >= 1, alpha > 0"
            )
            _check(0 <= lora.dropout < 1, f"model.lora.dropout={lora.dropout}: must be in [0, 1)")
    if cfg.model.get("load_in_4bit"):
        _check(
            torch.cuda.is_available(),
            "model.load_in_4bit=true needs CUDA (bitsandbytes 4-bit has no CPU "
            "kernels); use hardware=gpu on a GPU machine or load_in_4bit=false",
        )
        _check(
            lora is not None and lora.enabled and lora.share_base,
            "model.load_in_4bit=true trains through LoRA adapters on one shared base: set model.lora.enabled=true "
            "and model.lora.share_base=true (4-bit weights cannot be fine-tuned or copied)",
        )
    path = cfg.model.get("name_or_path")
    if path and (str(path).startswith(("/", "./", "../", "~"))):
        _check(Path(path).expanduser().is_dir(), f"model.name_or_path={path}: no such local folder")


def _check_target(node: DictConfig, key: str, skip: tuple[str, ...] = ()) -> None:
    """`node._target_` imports and every key of `node` is one of its parameters; nested targets too."""
    target = node.get("_target_")
    _check(isinstance(target, str), f"{key}._target_ is missing")
    try:
        obj = get_object(target)
    except Exception as err:  # noqa: BLE001 - ImportError, AttributeError, ValueError from Hydra's locate
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}._target_={target}: cannot be imported ({first})") from None
    params = inspect.signature(obj).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        _check_keys(node, key, names, target, skip)
    for k, child in node.items():
        if isinstance(child, DictConfig) and "_target_" in child:
            _check_target(child, f"{key}.{k}")


def _check_keys(node: DictConfig, key: str, allowed: list[str], what: str, skip: tuple[str, ...] = ()) -> None:
    for k in node:
        if not str(k).startswith("_") and k not in skip:
            _check(k in allowed, f"{key}.{k}: unknown key for {what}; allowed: {', '.join(allowed)}")
