"""Validation of the composed config, in one place, before any model or dataset loads.

Each failure is one line naming the key, its value and what is allowed (`python -m cory.train` prints it as
`error: ...` and exits with code 2). In order:

1. every number anywhere in the config is finite (no `inf`, no `nan`), and no top-level key is one nothing reads
   (`+algoritm=ppo`);
2. types, derived from the code rather than restated here: the run-level keys against `RunSettings`, the hardware
   keys against `HardwareSettings`, and every `_target_`'s keys (the algorithm's, its learner's, the task's, ...)
   against its signature's annotations, so a new learner or task needs no edit here; a `_target_` must fit its
   place (a Python class or function, not a builtin like `builtins.dict`; a task that has the `Task` methods; a
   callable where the parent's annotation asks for one, e.g. a task's reward);
3. ranges, declared beside the parameter they limit (`declared_ranges`: a class's `RANGES` mapping, or
   `typing.Annotated[float, "(0, 1]"]`) and checked here for the run-level keys, the hardware, LoRA and every
   `_target_`'s keys; the sampling settings a task passes to Hugging Face `generate` against `SAMPLING`. A
   component's constructor still checks its combinations when the algorithm node is built (cheaply: `_partial_`
   nodes and dataclasses, no model), e.g. `PPOConfig.__post_init__`;
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
import re
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

from cory.errors import USER_ERRORS, ConfigError, did_you_mean, one_line
from cory.settings import HardwareSettings, RunSettings

# Columns each CSV reader needs, by the target that reads `data_files` (shown in the message with the optional ones).
CSV_COLUMNS = {
    "cory.tasks.imdb.IMDBTask": (("text",), "text,label[,source]"),
    "cory.tasks.rewards.TfidfSentimentReward": (("text", "label"), "text,label[,source]"),
}
TEMPLATE_FIELDS = ("query", "response")
TRAIN_YAML = Path(__file__).resolve().parent / "conf" / "train.yaml"
PROBLEMS = ("train_problems", "eval_problems")  # a task that only provides problems (MAFT needs no more)

# Hugging Face `generate`'s sampling settings a task may set in its `generation_kwargs` (the `Task` protocol): the
# type and the range outside which `generate` fails deep in a run (a zero temperature or repetition penalty, a
# negative top_k, zero beams) or ignores the value without a word (top_p above 1). Other `GenerationConfig` fields
# and `generate`'s own arguments pass unchecked; anything else is a typo.
SAMPLING: dict[str, tuple[Any, str | None]] = {
    "do_sample": (bool, None),
    "temperature": (float, "(0, inf)"),
    "top_k": (int | None, "[0, inf); 0: no top-k filter"),
    "top_p": (float | None, "(0, 1]"),
    "typical_p": (float | None, "(0, 1]"),
    "min_p": (float | None, "[0, 1]"),
    "epsilon_cutoff": (float, "[0, 1)"),
    "eta_cutoff": (float, "[0, 1)"),
    "repetition_penalty": (float, "(0, inf); 1: none"),
    "no_repeat_ngram_size": (int, "[0, inf)"),
    "num_beams": (int, "[1, inf)"),
}
# `generate` arguments the run sets itself: a task may not (a second value is a TypeError in `generate`)
SET_BY_THE_RUN = {
    "max_new_tokens": "the task's max_new_tokens=[min, max] sets it",
    "min_new_tokens": "a response may be just EOS (docs/method.md §2.9)",
    "max_length": "the task's max_new_tokens=[min, max] sets the length",
    "min_length": "a response may be just EOS (docs/method.md §2.9)",
    "num_return_sequences": "one response per prompt; the algorithm repeats prompts itself (group_size)",
    "pad_token_id": "the tokenizer's",
    "eos_token_id": "the tokenizer's",
    "bos_token_id": "the tokenizer's",
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: DictConfig) -> None:
    """Raise `ConfigError` on the first invalid value or combination."""
    _check_finite(_resolved(cfg))
    _check_top_level(cfg)
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
    if isinstance(cfg.task.get("generation_kwargs"), DictConfig):
        check_sampling(cfg.task.generation_kwargs, "task.generation_kwargs")
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
# A range is interval text: "[0, 1]", "(0, inf)", "[0, 2^32)", with an optional "; note" that the message repeats.
_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,]+?)\s*,\s*([^\])]+?)\s*([\])])\s*(?:;\s*(.*?)\s*)?$")


def _bound(text: str) -> float:
    if "^" in text:
        base, power = text.split("^")
        return float(base) ** float(power)
    return float(text)


def range_problem(value: Any, spec: str, nullable: bool = False) -> str | None:
    """None when the number `value` lies in the interval `spec`; otherwise what it must be ("in [0, 1]",
    ">= 1", "> 0"; "or null" when `nullable`; then the spec's note)."""
    match = _INTERVAL.match(spec)
    if match is None:
        raise ValueError(f"not a range: {spec!r} (write it as [lo, hi], (lo, hi), [lo, inf), ...)")
    left, lo_text, hi_text, right, note = match.groups()
    lo, hi = _bound(lo_text), _bound(hi_text)
    above = value >= lo if left == "[" else value > lo
    below = value <= hi if right == "]" else value < hi
    if above and below:
        return None
    if math.isinf(hi):
        what = f"{'>=' if left == '[' else '>'} {lo_text}"
    elif math.isinf(lo):
        what = f"{'<=' if right == ']' else '<'} {hi_text}"
    else:
        what = f"in {left}{lo_text}, {hi_text}{right}"
    return what + (" or null" if nullable else "") + (f" ({note})" if note else "")


def declared_ranges(obj: Any) -> dict[str, str]:
    """The ranges a class or function declares for its parameters: `RANGES = {"gamma": "[0, 1]"}` on a class
    (merged along its bases, a subclass's entry winning), or interval text in a parameter's `typing.Annotated`
    metadata (`learning_rate: Annotated[float, "(0, inf)"]`)."""
    ranges: dict[str, str] = {}
    for cls in reversed(getattr(obj, "__mro__", ())):
        ranges |= dict(vars(cls).get("RANGES", {}))
    if not inspect.isclass(obj):
        ranges |= dict(getattr(obj, "RANGES", {}))
    try:
        function = obj.__init__ if inspect.isclass(obj) and not dataclasses.is_dataclass(obj) else obj
        annotated = typing.get_type_hints(function, include_extras=True)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate declares nothing
        annotated = {}
    for name, hint in annotated.items():
        if typing.get_origin(hint) is typing.Annotated:
            specs = [spec for spec in hint.__metadata__ if isinstance(spec, str) and _INTERVAL.match(spec)]
            if specs:
                ranges[name] = specs[-1]
    return ranges


def check_ranges(values: Any, obj: Any, key: str, skip: tuple[str, ...] = ()) -> None:
    """Each value of `values` (a config node) whose parameter `obj` declares a range lies in it; null passes where
    the annotation allows it (the message then says "or null"), and each number of a list value is checked."""
    hints = _hints(obj)
    for name, spec in declared_ranges(obj).items():
        if name not in values or name in skip:
            continue
        value = values[name]
        many = isinstance(value, (list, tuple, ListConfig))
        for number in value if many else [value]:
            if number is None or isinstance(number, bool) or not isinstance(number, (int, float)):
                continue  # null, or a type `_check_types` has answered
            nullable = name in hints and type_problem(None, hints[name]) is None
            problem = range_problem(number, spec, nullable)
            _check(problem is None, f"{key}{name}={_show(value)}: {'each value ' if many else ''}must be {problem}")


def check_sampling(kwargs: DictConfig | dict, key: str) -> None:
    """A task's `generation_kwargs`: known to Hugging Face `generate`, not one the run sets itself, and of the type
    and in the range of `SAMPLING`."""
    from transformers import GenerationConfig, GenerationMixin

    known = set(GenerationConfig().to_dict()) | set(inspect.signature(GenerationMixin.generate).parameters)
    for name, value in kwargs.items():
        name = str(name)
        if name in SET_BY_THE_RUN:
            raise ConfigError(f"{key}.{name}: set by the run, not by a task ({SET_BY_THE_RUN[name]}); remove it")
        if name not in known:
            guess = did_you_mean(name, [*SAMPLING, *known])
            raise ConfigError(
                f"{key}.{name}: not a setting of Hugging Face generate"
                + (f"; did you mean {key}.{guess}?" if guess else f" (sampling settings: {', '.join(SAMPLING)})")
            )
        if name not in SAMPLING:
            continue
        hint, spec = SAMPLING[name]
        problem = type_problem(value, hint)
        _check(problem is None, f"{key}.{name}={_show(value)}: expected {problem}")
        if spec is not None and value is not None:
            problem = range_problem(value, spec)
            _check(problem is None, f"{key}.{name}={_show(value)}: must be {problem}")


def _check_run(cfg: DictConfig) -> None:
    _check_types(cfg, _hints(RunSettings), "")
    check_ranges(cfg, RunSettings, "")
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
    for key, listed in (("source", "SOURCES"), ("scored", "SCORED")):  # a task class lists each key's values
        if key not in cfg.task:
            continue
        try:
            allowed = getattr(get_object(cfg.task._target_), listed, None)
        except Exception:  # noqa: BLE001 - a wrong `_target_` is reported by `_check_target`
            allowed = None
        if allowed is not None:
            value = cfg.task[key]
            _check(value in allowed, f"task.{key}={value!r}: allowed {', '.join(allowed)}")
    hw = cfg.hardware
    _check_types(hw, _hints(HardwareSettings), "hardware.")
    check_ranges(hw, HardwareSettings, "hardware.")
    _check(hw.precision in ("fp32", "bf16", "fp16"), f"hardware.precision={hw.precision!r}: allowed fp32, bf16, fp16")
    if hw.device != "auto":
        try:
            torch.device(hw.device)
        except RuntimeError:
            raise ConfigError(f"hardware.device={hw.device}: not a device; use cpu, cuda, cuda:<n> or auto") from None
    if str(hw.device).startswith("cuda"):
        _check(torch.cuda.is_available(), f"hardware.device={hw.device} but CUDA is not available; use hardware=cpu")


def _check_model(cfg: DictConfig) -> None:
    lora = cfg.model.get("lora")
    if lora is not None:
        from cory.policy import LoraSettings

        _check_keys(lora, "model.lora", [f.name for f in dataclasses.fields(LoraSettings)], "the LoRA settings")
        if lora.enabled:
            check_ranges(lora, LoraSettings, "model.lora.")
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
def _check_target(node: DictConfig, key: str, skip: tuple[str, ...] = (), slot: Any = None) -> None:
    """`node._target_` imports and fits its place (`_check_fits`; `slot`: the parent's annotation of this key),
    every key of `node` is one of its parameters with a value of the annotated type and in the declared range;
    nested targets too."""
    target = node.get("_target_")
    _check(isinstance(target, str), f"{key}._target_ is missing")
    try:
        obj = get_object(target)
    except Exception as err:  # noqa: BLE001 - ImportError, AttributeError, ValueError from Hydra's locate
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}._target_={target}: cannot be imported ({first})") from None
    params = _check_fits(obj, target, key, None if node.get("_partial_") else slot)  # a partial is callable
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        _check_keys(node, key, names, target, skip)
    all_hints = _hints(obj)
    hints = {k: v for k, v in all_hints.items() if k in node and k not in skip}
    _check_types(node, {k: v for k, v in hints.items() if not isinstance(node[k], DictConfig)}, f"{key}.")
    check_ranges(node, obj, f"{key}.", skip)
    for k, child in node.items():
        if isinstance(child, DictConfig) and "_target_" in child:
            _check_target(child, f"{key}.{k}", slot=all_hints.get(k))


def _check_fits(obj: Any, target: str, key: str, slot: Any) -> types.MappingProxyType:
    """`obj` (what `key._target_` names) can stand where it is put; returns its parameters.

    A builtin (`builtins.dict`, `builtins.int`) takes no keys of ours (most have no signature to check them against)
    and building it fails far from the config; a class at `task` must have the `Task` protocol's methods or provide
    problems (`PROBLEMS`); where the parent's annotation asks for a callable (a task's `reward`), a class must make
    callable instances.
    """
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a type or function written in C: no signature to check the keys against
        params = None
    if params is None or getattr(obj, "__module__", None) == "builtins":
        raise ConfigError(
            f"{key}._target_={target}: a Python builtin; {key} needs a class or function whose parameters are its "
            "keys (one cory/conf names, or your own: docs/extending.md)"
        )
    if key == "task" and inspect.isclass(obj):
        from cory.tasks.base import Task

        needed = [n for n, v in vars(Task).items() if inspect.isfunction(v) and not n.startswith("_")]
        missing = [n for n in needed if not callable(getattr(obj, n, None))]
        problems = all(callable(getattr(obj, n, None)) for n in PROBLEMS)  # enough for MAFT
        _check(
            not missing or problems,
            f"task._target_={target}: not a task; it lacks {', '.join(missing)} (the Task protocol, "
            f"cory/tasks/base.py) and does not provide problems ({', '.join(PROBLEMS)})",
        )
    callable_slot = slot is collections.abc.Callable or typing.get_origin(slot) is collections.abc.Callable
    if callable_slot and inspect.isclass(obj):
        calls = any("__call__" in vars(k) for k in obj.__mro__ if k is not object)
        _check(calls, f"{key}._target_={target}: its instances cannot be called, and {key} must be callable")
    return params


def _check_keys(node: DictConfig, key: str, allowed: list[str], what: str, skip: tuple[str, ...] = ()) -> None:
    for k in node:
        if not str(k).startswith("_") and k not in skip:
            guess = did_you_mean(str(k), allowed)
            _check(
                k in allowed,
                f"{key}.{k}: unknown key for {what}"
                + (f"; did you mean {key}.{guess}?" if guess else "")
                + f" (allowed: {', '.join(allowed)})",
            )


def _check_top_level(cfg: DictConfig) -> None:
    """Every top-level key is one `cory/conf/train.yaml` declares or chooses: a key added with `+` at the top
    (`+algoritm=ppo`) would be read by nothing."""
    train = OmegaConf.load(TRAIN_YAML)
    groups = [str(next(iter(e))).split()[-1] for e in train.get("defaults", []) if isinstance(e, DictConfig)]
    allowed = sorted({str(k) for k in train if k not in ("defaults", "hydra")} | set(groups))
    for k in cfg:
        if str(k) not in allowed:
            guess = did_you_mean(str(k), allowed)
            raise ConfigError(
                f"{k}: not a key of the config, nothing would read it"
                + (f"; did you mean {guess}?" if guess else f" (top-level keys: {', '.join(allowed)})")
            )


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
