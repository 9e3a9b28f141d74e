"""Validation of the composed config, in one place, before any model or dataset loads.

Each failure is one line naming the key, its value and what is allowed (`python -m cory.train` prints it as
`error: ...` and exits with code 2). In order:

1. every number anywhere in the config is finite (no `inf`, no `nan`);
2. types, derived from the code rather than restated here: the run-level keys against `RunSettings`, the hardware
   keys against `HardwareSettings`, and every `_target_`'s keys (the algorithm's, its learner's, the task's, ...)
   against its signature's annotations, so a new learner or task needs no edit here;
3. ranges: the run-level ones here; a component's own ranges are checked by its constructor when the algorithm
   node is built (cheaply: `_partial_` nodes and dataclasses, no model), e.g. `PPOConfig.__post_init__`;
4. local inputs: a local model folder, data files (present, not empty, with the columns their reader needs),
   observer templates (only `{query}` and `{response}`).

A combination that needs the run (the learner's minibatches dividing `batch_size`) is checked by the algorithm's
constructor before it asks for the model.
"""

from __future__ import annotations

import collections.abc
import csv
import dataclasses
import importlib.util
import inspect
import math
import string
import types
import typing
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cory.errors import USER_ERRORS, ConfigError, one_line
from cory.settings import HardwareSettings, RunSettings

# Columns each CSV reader needs, by the target that reads `data_files` (shown in the message with the optional ones).
CSV_COLUMNS = {
    "cory.tasks.imdb.IMDBTask": (("text",), "text,label[,source]"),
    "cory.tasks.rewards.TfidfSentimentReward": (("text", "label"), "text,label[,source]"),
}
TEMPLATE_FIELDS = ("query", "response")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Raise `ConfigError` on the first invalid value or combination."""
    _check_finite(_resolved(cfg))
    _check_run(cfg)
    from cory.policy import HANDLE_KEYS  # the model keys read by `Backbone`, not by the loader

    # the algorithm's keys first: an experiment written for another algorithm (MAFT's keys under algorithm=ppo)
    # is named as such, not reported through a value check its keys were never meant for
    _check_target(cfg.algorithm, "algorithm")
    _check_task_and_hardware(cfg)
    _check_model(cfg)
    if cfg.logger.get("_target_", "").endswith("WandbLogger"):
        _check(importlib.util.find_spec("wandb") is not None, "logger=wandb but wandb is not installed")
    # a typo'd key, a wrong `_target_` or a value of the wrong type would otherwise fail after the model loads
    for group, skip in (("model", HANDLE_KEYS), ("task", ()), ("logger", ())):
        _check_target(cfg[group], group, skip=skip)
    _check_local_inputs(cfg)
    _build_algorithm_node(cfg)


def _build_algorithm_node(cfg: DictConfig) -> None:
    """Build the algorithm's partial (its learner and settings objects, never a model): their constructors check
    their own ranges, and a failure is one line here, before anything loads."""
    try:
        instantiate_target(cfg.algorithm, _convert_="all")
    except InstantiationException as err:
        if isinstance(err.__cause__, TypeError):  # a key the constructor does not take
            raise ConfigError(f"algorithm ({cfg.algorithm._target_}): {one_line(err.__cause__)}") from None
        raise


def instantiate_target(node: DictConfig | dict, *args, **kwargs):
    """`hydra.utils.instantiate`, re-raising our one-line user errors that Hydra wraps in its own exception. A
    constructor's ValueError is its verdict on an input (too few reviews for the held-out slice, ...): one line
    naming the target."""
    try:
        return instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, USER_ERRORS):
            raise err.__cause__ from None
        if isinstance(err.__cause__, ValueError):
            raise ConfigError(f"{node['_target_']}: {one_line(err.__cause__)}") from None
        raise


def _resolved(cfg: DictConfig) -> Any:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        first = str(err).strip().splitlines()[0]
        key = getattr(err, "full_key", None)
        raise ConfigError(f"{key}: {first}" if key else first) from None


def _check_finite(node: Any, key: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_finite(v, f"{key}[{i}]")
    elif isinstance(node, float):
        _check(math.isfinite(node), f"{key}={node}: must be a finite number")


# ---------------------------------------------------------------------------------------------------------- types
def type_problem(value: Any, hint: Any) -> str | None:
    """None when `value` fits the annotation `hint`; otherwise what was expected ("an integer", ...).

    Plain types, literals, unions, sequences and mappings are checked; anything else (classes, callables, `Any`)
    passes.
    Booleans are not numbers here, and an integer is a valid float.
    """
    origin = typing.get_origin(hint)
    if origin is typing.Literal:  # a closed set of values, e.g. a reward's `bound`
        allowed = typing.get_args(hint)
        return None if value in allowed else "one of " + ", ".join(str(a) for a in allowed)
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(value, arm) for arm in typing.get_args(hint)]
        return None if None in problems else " or ".join(dict.fromkeys(p for p in problems if p))
    if hint is type(None):
        return None if value is None else "null"
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if hint in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        return _sequence_problem(value, hint)
    if hint is dict or origin in (dict, collections.abc.Mapping):
        return None if isinstance(value, (dict, DictConfig)) else "a mapping"
    return None


def _sequence_problem(value: Any, hint: Any) -> str | None:
    if not isinstance(value, (list, tuple, ListConfig)):
        return "a list"
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            return f"a list of {len(args)} values"
        problems = [type_problem(v, a) for v, a in zip(value, args, strict=True)]
    else:
        problems = [type_problem(v, args[0]) for v in value] if args else []
    problem = next((p for p in problems if p), None)
    return f"a list whose items are each {problem}" if problem else None


def _check_types(values: Any, hints: dict[str, Any], key: str) -> None:
    for name, hint in hints.items():
        if name in values:
            problem = type_problem(values[name], hint)
            _check(problem is None, f"{key}{name}={_show(values[name])}: expected {problem}")


def _hints(obj: Any) -> dict[str, Any]:
    """Evaluated annotations of a class's `__init__` (or a dataclass's fields) or a function; {} if unresolvable."""
    try:
        if dataclasses.is_dataclass(obj) or not inspect.isclass(obj):
            return typing.get_type_hints(obj)
        return typing.get_type_hints(obj.__init__)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate is simply not checked
        return {}


def _show(value: Any) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    return str(value)


# ---------------------------------------------------------------------------------------------------------- ranges
def _check_run(cfg: DictConfig) -> None:
    _check_types(cfg, _hints(RunSettings), "")
    _check(0 <= cfg.seed < 2**32, f"seed={cfg.seed}: must be in [0, 2^32) (numpy's seed range)")
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


def _check_task_and_hardware(cfg: DictConfig) -> None:
    if "max_new_tokens" in cfg.task:  # [min, max] of the per-iteration draw (MAFT's length is its own key)
        span = cfg.task.get("max_new_tokens")
        _check(
            isinstance(span, ListConfig) and len(span) == 2 and all(type_problem(v, int) is None for v in span),
            f"task.max_new_tokens={_show(span)}: expected [min, max], two integers",
        )
        lo, hi = span
        _check(1 <= lo <= hi, f"task.max_new_tokens=[{lo}, {hi}]: need 1 <= min <= max")
    if "source" in cfg.task:  # each task class lists its data sources (`SOURCES`)
        try:
            sources = get_object(cfg.task._target_).SOURCES
        except Exception:  # noqa: BLE001 - a wrong `_target_` is reported by `_check_target`
            sources = None
        if sources is not None:
            allowed = ", ".join(sources)
            _check(cfg.task.source in sources, f"task.source={cfg.task.source!r}: allowed {allowed}")
    hw = cfg.hardware
    _check_types(hw, _hints(HardwareSettings), "hardware.")
    _check(hw.precision in ("fp32", "bf16", "fp16"), f"hardware.precision={hw.precision!r}: allowed fp32, bf16, fp16")
    if hw.device != "auto":
        try:
            torch.device(hw.device)
        except RuntimeError:
            raise ConfigError(f"hardware.device={hw.device}: not a device; use cpu, cuda, cuda:<n> or auto") from None
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

        _check_keys(lora, "model.lora", [f.name for f in dataclasses.fields(LoraSettings)], "the LoRA settings")
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


# ---------------------------------------------------------------------------------------------------------- targets
def _check_target(node: DictConfig, key: str, skip: tuple[str, ...] = ()) -> None:
    """`node._target_` imports, every key of `node` is one of its parameters with a value of the annotated type;
    nested targets too."""
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
    hints = {k: v for k, v in _hints(obj).items() if k in node and k not in skip}
    _check_types(node, {k: v for k, v in hints.items() if not isinstance(node[k], DictConfig)}, f"{key}.")
    for k, child in node.items():
        if isinstance(child, DictConfig) and "_target_" in child:
            _check_target(child, f"{key}.{k}")


def _check_keys(node: DictConfig, key: str, allowed: list[str], what: str, skip: tuple[str, ...] = ()) -> None:
    for k in node:
        if not str(k).startswith("_") and k not in skip:
            _check(k in allowed, f"{key}.{k}: unknown key for {what}; allowed: {', '.join(allowed)}")


# ---------------------------------------------------------------------------------------------------------- inputs
def _check_local_inputs(cfg: DictConfig) -> None:
    for key, node in (("task", cfg.task), ("task.reward", cfg.task.get("reward"))):
        if not isinstance(node, DictConfig):
            continue
        if node.get("data_files"):
            columns = CSV_COLUMNS.get(node.get("_target_", ""))
            check_data_file(node.data_files, f"{key}.data_files", *(columns or ((), "")))
        if isinstance(node.get("observer_template"), str):
            check_template(node.observer_template, f"{key}.observer_template")


def check_data_file(path: str, key: str, required: tuple[str, ...] = (), expected: str = "") -> None:
    """A local data file exists and, for a CSV, has a header with the `required` columns and at least one row."""
    file = Path(str(path)).expanduser()
    expect = f"; expected a CSV with columns {expected}" if expected else ""
    _check(file.exists(), f"{key}={path}: no such file{expect}")
    if file.is_dir() or file.suffix.lower() != ".csv":
        return
    try:
        with file.open(newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            header, first_row = next(reader, None), next(reader, None)
    except (OSError, csv.Error) as err:
        raise ConfigError(f"{key}={path}: unreadable ({err}){expect}") from None
    _check(header is not None, f"{key}={path}: the file is empty{expect}")
    missing = [c for c in required if c not in [h.strip() for h in header]]
    _check(not missing, f"{key}={path}: no column {', '.join(missing)} (header: {','.join(header)}){expect}")
    _check(first_row is not None, f"{key}={path}: a header but no rows{expect}")


def check_template(template: str, key: str) -> None:
    """A `str.format` template may use only `{query}` and `{response}`."""
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise ConfigError(f"{key}={template!r}: not a valid template ({err})") from None
    unknown = sorted(used - set(TEMPLATE_FIELDS))
    _check(
        not unknown,
        f"{key}={template!r}: unknown field {', '.join('{' + u + '}' for u in unknown)}; "
        f"use {{query}} and {{response}}",
    )
