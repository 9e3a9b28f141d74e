"""Run folders: unique names, one owner per folder, and a resume that says what it changes.

- Names (`cory.naming`): a random suffix per start, so two starts in the same second never share a folder.
- Ownership. A new run refuses a folder that already holds a run (`RUN_MARKERS`) and points at `resume=`; a
  live run holds an exclusive `flock` on `run.lock` (pid and host written inside), so a second process is refused
  while it runs. The kernel releases the lock when its owner dies, so a lock left by a killed run is stale by
  construction and is taken over.
- Resume. `resume=<folder>` continues the run with its own `run_config.yaml`. Overrides given on the resume
  command line are compared with the run's config key by key: cadence, logging and some hardware keys may
  change (`RESUMABLE_KEYS`: printed and recorded in `starts.jsonl`); anything that changes the experiment is
  refused in one line naming the keys.
- Requeue. A SLURM job that is requeued (pre-empted, timed out under submitit, or its node failed) runs the same
  command again. When that command names a folder holding a run (`hydra.run.dir=`, or a sweep job's fixed folder)
  and this process is such a restart (`SLURM_RESTART_COUNT` ≥ 1) of the very job that last held the folder (its
  `SLURM_JOB_ID`, recorded in `run.lock` and `starts.jsonl`), the run is resumed as `resume=<folder>` would; any
  other new run is still refused there (`requeue_of`).
- Trust. A run folder is input from others (a shared filesystem, downloaded results): nothing it sets is ever
  built unless the installed configs or this command line set it. What it may set is an allow-list of values,
  checked on the resolved config (what will be built, not its text): every `_target_` one that cory's own config
  tree (or an installed Hydra search-path plugin's) writes, every code-loading switch (`SAFE_VALUES`:
  `trust_remote_code`) at its safe value; its recorded overrides touch no key of Hydra's own node and choose only
  installed config-group options. The same value typed on this command line is trusted (`typed`). Otherwise the
  resume or the evaluation is refused in one line before anything is imported or called.
- A folder as found. Before a resume writes anything (Hydra's record of the command included), the folder is
  checked whole (`check_resume`): no link (a run never follows one out of its folder), files and folders where a run
  keeps them, writable, and every record it reads back (`starts.jsonl`, `run.lock`, `summary.json`, the latest
  checkpoint's `trainer.json` by type and range, the logs its counts cut back) of the shape a run writes; otherwise
  one line naming the folder, and the folder is left as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cory import runtime
from cory.checkpoints import CHECKPOINT_NAME, check_listed, count_lines, latest_checkpoint, read_state
from cory.errors import CheckpointError, ConfigError, one_line

RUN_CONFIG = "run_config.yaml"  # the resolved config of the first start; a resumed run reuses it
STARTS = "starts.jsonl"  # one line per start of the run: overrides typed, changes accepted, iteration
LOCK = "run.lock"
SUMMARY = "summary.json"
HYDRA_OVERRIDES = ".hydra/overrides.yaml"  # Hydra's record of the first start's overrides (runs before starts.jsonl)
# A folder holding any of these holds a run: a new run there would overwrite its config and checkpoints.
RUN_MARKERS = (RUN_CONFIG, "metrics.jsonl", "checkpoints", SUMMARY)
# What cory writes in a run folder, by kind: a folder given to a run must hold each as such (`check_layout`)
RUN_FILES = (RUN_CONFIG, STARTS, LOCK, SUMMARY, "metrics.jsonl", "samples.jsonl", "train.log")
RUN_FOLDERS = ("checkpoints", ".hydra", "evaluation")
LOGS = ("metrics.jsonl", "samples.jsonl")  # what a resume cuts back to its checkpoint's line counts
# W&B's folder (of a run, or of an evaluation in it): W&B keeps links of its own in there (latest-run, debug.log, a
# run's debug-core.log into ~/.cache/wandb) and replaces them rather than writing through them; cory never reads or
# writes anything below it. The folder itself must not be a link: W&B writes each start's files into it.
_LINKS_OF_OTHERS = "wandb"
_LEFT_AS_IT_WAS = "nothing in the run folder was changed"
# Keys that may change on resume (a key matches itself and everything below it). They change how a run is
# driven, logged or batched, not what it learns: `iterations` extends (or shortens) the run; the hardware
# batch sizes let a run continue on a smaller machine (generation_batch_size changes which samples are drawn,
# not their distribution). `seed`, the model, the task, the algorithm and its learner are never among them.
RESUMABLE_KEYS = (
    "iterations",
    "eval_every",
    "save_every",
    "save_final",
    "keep_checkpoints",
    "snapshot_updates",
    "snapshot_dir",
    "max_bad_iterations",
    "progress",
    "cache_dir",
    "logger",
    "hardware.forward_batch_size",
    "hardware.generation_batch_size",
    "hardware.threads",  # said at the resume when it is not the checkpoint's (cory.runtime.match_threads)
    "rollout",  # which engine samples the responses: the samples' distribution is the policy's either way
)
_NOT_COMPARED = ("resume",)  # the resume key itself names the folder, it does not change the run


# ------------------------------------------------------------------------------------------------ ownership
def holds_run(folder: Path) -> str | None:
    """The first file or folder that shows `folder` holds a run, or None."""
    for name in RUN_MARKERS:
        if (Path(folder) / name).exists():
            return name
    return None


def refuse_if_taken(folder: Path, key: str) -> None:
    """Raise `ConfigError` when `folder` already holds a run (a new run there would overwrite it), or holds what a run
    could not use (`check_layout`: a link, a folder where a run writes a file, ...)."""
    if Path(folder).is_dir():
        check_layout(folder, f"{key}={folder}", writes=False, whole=False)
    marker = holds_run(folder)
    if marker:
        raise ConfigError(
            f"{key}={folder} already holds a run ({marker}); continue it with `python -m cory.train "
            f"resume={folder}` or choose a new folder"
        )


class RunLock:
    """An exclusive, non-blocking `flock` on `<run folder>/run.lock`, held for the whole run.

    The file records the owner's pid and host for the refusal message. The kernel drops the lock when its
    owner exits or is killed, so a stale lock is simply a file nobody holds: it is taken over.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        for _ in range(5):  # the file can be replaced between open and flock; retry on the new one
            try:  # never through a link: a run's lock file is its own
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                if err.errno != errno.ELOOP:
                    raise
                raise ConfigError(
                    f"{self.path} is a symbolic link; a run never follows one out of its folder"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError(self._busy_message()) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:
                os.close(fd)
                continue
            previous = self._read(fd)
            if previous:
                who = f"pid {previous.get('pid')} on {previous.get('host')}"
                runtime.say(f"[cory] {self.path}: taking over the lock left by {who}, which is gone")
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now(), "slurm_job": slurm_job()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
            self._fd = fd
            return
        raise ConfigError(f"{self.path}: could not be locked (it keeps being replaced); is another run starting?")

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # an empty lock file: nobody to report
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            owner = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except ValueError:
            return {}
        return owner if isinstance(owner, dict) else {}

    def _busy_message(self) -> str:
        owner = _json_or(self.path, {})
        owner = owner if isinstance(owner, dict) else {}
        who = f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} (since {owner.get('since', '?')})"
        return (
            f"run folder {self.path.parent} is in use by {who}: one process per run folder. Wait for it to "
            f"finish (or stop it), then resume with `python -m cory.train resume={self.path.parent}`"
        )


@contextlib.contextmanager
def own(folder: Path, resuming: bool, primary: bool = True) -> Iterator[None]:
    """Hold `folder` for one run: locked for the duration, and, for a new run, refused if it holds one already.

    A new run that fails before it logged anything (a model that does not load, ...) leaves nothing behind:
    its config, start record and lock file are removed while the lock is still held. `primary=False`
    (data-parallel processes other than rank 0) neither locks nor checks: rank 0 owns the folder.
    """
    folder = Path(folder)
    if not primary:
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the run folder {folder}: {err.strerror or err}") from None
    # before the lock file is opened; a resume has checked the whole folder already (`check_resume`)
    check_layout(folder, f"run folder {folder}", writes=not resuming, whole=False)
    lock = RunLock(folder)
    lock.acquire()
    if not resuming:
        try:
            refuse_if_taken(folder, "run folder")
        except ConfigError:
            lock.release()
            raise
    try:
        yield
    except BaseException:
        if not resuming and not any((folder / m).exists() for m in RUN_MARKERS if m != RUN_CONFIG):
            for name in (RUN_CONFIG, STARTS, LOCK):  # ours: written by this start, which never got going
                (folder / name).unlink(missing_ok=True)
        raise
    finally:
        lock.release()


def remove_if_unused(folder: Path, hydra_files: Sequence[str]) -> None:
    """Remove the folder a refused start created: only when it holds no run and no other process's lock, and
    only Hydra's own files in it (the folder itself goes only if that leaves it empty)."""
    folder = Path(folder)
    if not folder.is_dir() or holds_run(folder) or (folder / LOCK).exists():
        return
    for name in hydra_files:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


# ------------------------------------------------------------------------------------------------ requeue
def slurm_job() -> str | None:
    """The SLURM job this process belongs to (`<array job>_<task>` for an array task, as submitit's sweeps are), or
    None outside SLURM. A requeued job keeps it."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def slurm_restart() -> int:
    """How many times SLURM has restarted (requeued) this job: `SLURM_RESTART_COUNT`, 0 when unset."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def last_holder_job(folder: Path) -> str | None:
    """The SLURM job of the last process that held `folder`: the lock's owner when a killed one left it there
    (a clean exit empties the lock), else the last recorded start's."""
    owner = _json_or(Path(folder) / LOCK, {})
    if isinstance(owner, dict) and owner:
        return owner.get("slurm_job")
    last = None
    for line in _text(Path(folder) / STARTS).splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            last = row.get("slurm_job") if isinstance(row, dict) else last
    return last


def requeue_of(folder: Path) -> bool:
    """Whether this process is a SLURM restart of the job that last held the run in `folder`: then the new start
    resumes that run. Never true outside SLURM, for a job's first run, or for another job's folder."""
    job = slurm_job()
    return bool(job) and slurm_restart() >= 1 and holds_run(folder) is not None and last_holder_job(folder) == job


def requeued_run_under(root: Path) -> Path | None:
    """For a restarted SLURM job whose command names no folder: its run among the default run folders under `root`
    (`<task>/<algorithm>/<time>-<suffix>`, `cory/conf/train.yaml`), when exactly one is this job's; else None."""
    if not (slurm_job() and slurm_restart() >= 1) or not Path(root).is_dir():
        return None
    found = [lock.parent for lock in sorted(Path(root).glob(f"*/*/*/{LOCK}")) if requeue_of(lock.parent)]
    return found[0] if len(found) == 1 else None


# ------------------------------------------------------------------------------------------------ resume
def load_run_config(folder: Path, trusted: Typed | None = None) -> DictConfig:
    """The run's `run_config.yaml`, resolved into plain values, refused in one line when it is missing, unreadable,
    or sets what a run folder may not (`plain_config`: a `_target_` or a code-loading switch that neither the
    installed configs nor `trusted`, this command line, set)."""
    path = Path(folder) / RUN_CONFIG
    if not path.is_file():
        raise ConfigError(f"resume={folder}: no {RUN_CONFIG} there; is it a cory run folder?")
    try:
        saved = OmegaConf.load(path)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"resume={folder}: {path} is unreadable ({first}); this run cannot be resumed") from None
    if not isinstance(saved, DictConfig) or "algorithm" not in saved:
        raise ConfigError(f"resume={folder}: {path} is not a cory run config; this run cannot be resumed")
    return plain_config(saved, str(path), trusted or Typed())


# Settings that make a library import and run code shipped beside a model (a `config.json` whose `auto_map` names a
# Python file next to it): a run folder may hold them only at the value that runs nothing (or not at all); another
# value must be typed on this command line, at that very key (`model.trust_remote_code=true`).
SAFE_VALUES: dict[str, tuple[Any, ...]] = {"trust_remote_code": (False, None)}


@dataclasses.dataclass(frozen=True)
class Typed:
    """What this command line sets itself, and so trusts: the `_target_`s it names (anywhere), the values it gives
    `SAFE_VALUES` keys (at their dotted keys) and its overrides as typed (a run's recorded override typed again)."""

    targets: frozenset[str] = frozenset()
    values: frozenset[tuple[str, Any]] = frozenset()
    overrides: frozenset[str] = frozenset()


def typed(overrides: Iterable[str]) -> Typed:
    """What `overrides` (this command line's) set, read by Hydra's own override parser: `model._target_=a.B` and
    `+task.reward={_target_: a.B, trust_remote_code: true}` both name `a.B`; the second also sets
    `task.reward.trust_remote_code` to true."""
    targets, values = set(), set()
    for override in map(str, overrides):
        parsed = _parse_override(override)
        if parsed is None or parsed.is_sweep_override():
            continue
        for key, name, value in _leaves(parsed.value(), parsed.key_or_group.replace("/", ".")):
            if name == "_target_" and isinstance(value, str):
                targets.add(value)
            elif name in SAFE_VALUES and _scalar(value):
                values.add((key, value))
    return Typed(frozenset(targets), frozenset(values), frozenset(map(str, overrides)))


def _parse_override(override: str):
    """Hydra's reading of one override (`Override`), or None when it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override)
    except HydraException:
        return None


def _leaves(node: Any, key: str) -> Iterator[tuple[str, str, Any]]:
    """(dotted key, last part of the key, value) of every leaf of a plain nested config below `key`; the value of a
    `_target_` or `SAFE_VALUES` key is one leaf whatever it holds (a list or a mapping there is a value to refuse)."""
    name = key.rsplit(".", 1)[-1]
    if isinstance(node, dict) and name not in ("_target_", *SAFE_VALUES):
        for k, v in node.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list) and name not in ("_target_", *SAFE_VALUES):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, name, node


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


@functools.cache
def known_targets() -> frozenset[str]:
    """Every `_target_` written in a config file Hydra can compose here: cory's `conf/` tree and the folders that
    installed search-path plugins add (installed code the user chose, unlike a run folder)."""
    found: set[str] = set()
    for folder in [Path(__file__).resolve().parent / "conf", *_plugin_config_folders()]:
        for path in sorted(folder.rglob("*.yaml")):
            with contextlib.suppress(OSError, yaml.YAMLError):
                found |= {
                    t
                    for _, name, t in _leaves(yaml.safe_load(path.read_text(encoding="utf-8")), "")
                    if name == "_target_"
                }
    return frozenset(t for t in found if isinstance(t, str))


def _plugin_config_folders() -> list[Path]:
    """The `pkg://` and `file://` folders that Hydra's installed search-path plugins add."""
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    search_path = ConfigSearchPathImpl()
    for plugin in Plugins.instance().discover(SearchPathPlugin):
        with contextlib.suppress(Exception):  # a broken plugin adds nothing here (Hydra reports it itself)
            plugin().manipulate_search_path(search_path)
    folders = []
    for element in search_path.get_path():
        path = str(element.path)
        if path.startswith("pkg://"):
            with contextlib.suppress(ImportError, ValueError, AttributeError):
                spec = importlib.util.find_spec(path.removeprefix("pkg://").replace("/", "."))
                folders += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        elif path.startswith("file://"):
            folders.append(Path(path.removeprefix("file://")))
    return [f for f in folders if f.is_dir()]


def refuse_untrusted(config: Any, source: str, trusted: Typed = Typed()) -> None:
    """Refuse, in one line, what a run folder's config (`source`) may not set: a `_target_` that neither the installed
    configs nor this command line name, or a `SAFE_VALUES` key at another value than a safe one that this command
    line did not give it. `config` is plain (resolved: what will be built), so an interpolation cannot hide a value.
    A run folder never makes cory import or call anything."""
    known = known_targets() | trusted.targets
    container = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
    for key, name, value in _leaves(container, ""):
        if name == "_target_" and not (isinstance(value, str) and value in known):
            raise ConfigError(
                f"{source} names {key}: {value}, which no installed config names; a run folder never runs code "
                f"it names, so nothing was built (if you trust it, pass {key}={value} on the command line)"
            )
        if (
            name in SAFE_VALUES
            and value not in SAFE_VALUES[name]
            and not (_scalar(value) and (key, value) in trusted.values)
        ):
            raise ConfigError(
                f"{source} sets {key}: {_show(value)}, which lets a library import and run code shipped with a "
                f"model; a run folder never turns it on, so nothing was built (if you trust it, pass "
                f"{key}={json.dumps(value) if not isinstance(value, str) else value} on the command line)"
            )


def plain_config(config: DictConfig, source: str, trusted: Typed = Typed()) -> DictConfig:
    """`config` resolved once into plain values, checked (`refuse_untrusted`) and returned as such: what is built is
    what was checked. An interpolation left after resolving (an escaped one) is refused: resolving it later could
    give another value than the one checked."""
    try:
        container = OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{source}: cannot be resolved ({one_line(err)})") from None
    refuse_untrusted(container, source, trusted)
    plain = OmegaConf.create(container)
    if (key := _interpolation_in(plain)) is not None:
        raise ConfigError(
            f"{source} holds an interpolation at {key} once resolved (an escaped one); a run's config holds plain "
            f"values, so nothing was built"
        )
    return plain


def _interpolation_in(node: Any, key: str = "") -> str | None:
    """The dotted key of the first interpolation in `node` (a DictConfig or ListConfig), or None."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for k in keys:
        child_key = f"{key}.{k}" if key else str(k)
        if OmegaConf.is_interpolation(node, k):
            return child_key
        child = node[k]
        if isinstance(child, (DictConfig, ListConfig)) and (found := _interpolation_in(child, child_key)):
            return found
    return None


def refuse_untrusted_overrides(overrides: Sequence[str], source: str, trusted: Typed = Typed()) -> None:
    """Refuse, in one line, what a run's recorded overrides (`source`: its `starts.jsonl`, `.hydra/overrides.yaml`) may
    not set. Read by Hydra's parser, as Hydra will read them when it composes the resume: no key of Hydra's own
    node (callbacks, logging, launcher: Hydra records a command's own ones apart, so a run's never holds one), a
    config group only at an installed option (a name such as `../../elsewhere/file` would compose a file from
    anywhere), and values checked as `refuse_untrusted` checks a config. An override typed again on this command
    line is the user's own."""
    for override in map(str, overrides):
        if override in trusted.overrides:
            continue
        parsed = _parse_override(override)
        if parsed is None:
            raise ConfigError(f"{source} hold {override!r}, which does not parse as an override; nothing was run")
        key, package = parsed.key_or_group, (parsed.package or "").removeprefix("_global_").lstrip(".")
        if "hydra" in (key.split(".")[0].split("/")[0], package.split(".")[0]):
            raise ConfigError(
                f"{source} set {key}, one of Hydra's own settings, which a run's recorded overrides never hold; "
                f"nothing was run (if you trust it, pass {override} on the command line)"
            )
        options = _group_options(key)
        if options is not None:
            chosen = parsed.value() if isinstance(parsed.value(), list) else [parsed.value()]
            foreign = [c for c in chosen if c is not None and c not in options]
            if foreign:
                raise ConfigError(
                    f"{source} choose {key}={foreign[0]}, which is no installed option of {key} "
                    f"({', '.join(sorted(options))}); nothing was run (if you trust it, pass {override} on the "
                    f"command line)"
                )
        elif not parsed.is_sweep_override():
            value: Any = parsed.value()
            for part in reversed(key.split(".")):
                value = {part: value}
            refuse_untrusted(value, source, trusted)


@functools.cache
def _group_options(group: str) -> frozenset[str] | None:
    """The options of config group `group` on Hydra's search path here (cory's configs, installed plugins'), or None
    when `group` is no config group."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def options() -> frozenset[str] | None:
        loader = GlobalHydra.instance().config_loader()
        return frozenset(loader.get_group_options(group)) if loader.repository.group_exists(group) else None

    if GlobalHydra.instance().is_initialized():
        return options()
    with initialize_config_dir(version_base="1.3", config_dir=str(Path(__file__).resolve().parent / "conf")):
        return options()


def original_overrides(folder: Path) -> list[str]:
    """The overrides of the run's first start (`starts.jsonl`, else Hydra's `.hydra/overrides.yaml`); a record of
    another shape gives none here (`check_run_folder` refuses it where a run folder is used)."""
    starts = Path(folder) / STARTS
    if starts.is_file():
        for line in _text(starts).splitlines():
            with contextlib.suppress(ValueError):
                first = json.loads(line)
                return _strings(first.get("overrides", [])) if isinstance(first, dict) else []
    hydra_overrides = Path(folder) / HYDRA_OVERRIDES
    if hydra_overrides.is_file():
        with contextlib.suppress(OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
            return _strings(OmegaConf.to_container(OmegaConf.load(hydra_overrides)))
    return []


def _strings(value: Any) -> list[str]:
    return [str(o) for o in value] if isinstance(value, list) and all(isinstance(o, str) for o in value) else []


def _text(path: Path) -> str:
    """A run folder's text file, as text whatever its bytes (a record of another shape is refused by its reader)."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_summary(folder: Path, where: str | None = None) -> dict:
    """The run's `summary.json` ({} when there is none), refused in one line when it is not a JSON object (or its
    `completed` not true or false). `where`: how the message names the folder (default: the file's path)."""
    path = Path(folder) / SUMMARY
    named = f"{where}: {SUMMARY}" if where else str(path)
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{named} is unreadable ({one_line(err)}); {_LEFT_AS_IT_WAS}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("completed", False), bool):
        raise ConfigError(
            f"{named} is not a run summary (a JSON object with completed: true/false); {_LEFT_AS_IT_WAS}"
        )
    return summary


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts → {"a.b.c": leaf}; lists are leaves (compared whole)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out |= flatten(v, f"{prefix}{k}.")
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def resume_changes(saved: dict, base: dict, requested: dict, named: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """What a resume command changes: the keys its overrides move (`base` → `requested`, both composed from the
    run's original overrides, without and with the new ones) or name explicitly (`named`, e.g. `iterations`),
    whose requested value differs from the run's own.

    Comparing only the keys the new overrides move keeps everything else the run's: a default that changed in
    the repository since the run started, or an environment variable, never counts as a change.

    Args:
        saved: the run's resolved config (`run_config.yaml`) as plain containers.
        base: the config of the original overrides, resolved.
        requested: the config of the original plus the new overrides, resolved.
        named: the keys (or groups) the new overrides name.

    Returns:
        {dotted key: (run's value, requested value)}, sorted by key.
    """
    flat_saved, flat_base, flat_req = flatten(saved), flatten(base), flatten(requested)
    keys = flat_base.keys() | flat_req.keys()
    moved = {k for k in keys if flat_base.get(k, _MISSING) != flat_req.get(k, _MISSING)}
    moved |= {k for k in keys | flat_saved.keys() for n in named if k == n or k.startswith(n + ".")}
    changes = {}
    for key in sorted(moved):
        if key.split(".")[0] in _NOT_COMPARED:
            continue
        old, new = flat_saved.get(key, _MISSING), flat_req.get(key, _MISSING)
        if old != new:
            changes[key] = (old, new)
    return changes


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING = _Missing()


def resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


def apply_resume_changes(saved: DictConfig, requested: dict, changes: dict, folder: Path) -> DictConfig:
    """`saved` with the allowed `changes` applied (whole subtrees, e.g. `logger`, taken from the resolved
    `requested` config); any other change is refused in one line naming the keys."""
    refused = [k for k in changes if not resumable(k)]
    if refused:
        shown = ", ".join(f"{k} ({_show(changes[k][0])} → {_show(changes[k][1])})" for k in refused)
        raise ConfigError(
            f"resume={folder}: a resumed run keeps its experiment, and these overrides would change it: {shown}. "
            f"Start a new run for that; on resume only {', '.join(RESUMABLE_KEYS)} may change"
        )
    out = OmegaConf.create(OmegaConf.to_container(saved))
    for key in changes:
        top = next(k for k in RESUMABLE_KEYS if key == k or key.startswith(k + "."))
        value = requested
        for part in top.split("."):
            value = value[part]
        OmegaConf.update(out, top, value, merge=False, force_add=True)
    return out


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def check_extension(folder: Path, iterations: int, done: int | None, pending_eval: bool, completed: bool) -> str:
    """What resuming does given the latest checkpoint: "continue", or "finished" (nothing left to do).

    Args:
        folder: the run folder (for messages).
        iterations: the (possibly extended) number of iterations the resumed run asks for.
        done: iterations completed by the latest checkpoint (None: no checkpoint).
        pending_eval: the checkpoint was written on a signal before an evaluation it still owes.
        completed: the run completed earlier (its summary.json says so).

    Raises:
        ConfigError: fewer iterations than already done, or a completed run without a checkpoint to extend.
    """
    if done is None:
        if completed:
            raise ConfigError(
                f"resume={folder}: the run completed but saved no checkpoint (save_every=0 and save_final=false), "
                f"so it cannot be continued; start a new run with save_final=true to extend runs later"
            )
        return "continue"  # stopped before its first checkpoint: it starts over, in the same folder
    if iterations < done:
        raise ConfigError(f"iterations={iterations}: the run at {folder} has already done {done} iterations")
    if iterations == done and (completed or not pending_eval):  # a completed run did its pending evaluation
        return "finished"
    return "continue"


def record_start(folder: Path, overrides: Sequence[str], changes: dict, iteration: int | None) -> None:
    """Append this start (overrides typed, changes accepted, starting iteration) to `starts.jsonl`."""
    row = {
        "time": _now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": slurm_job(),  # a requeued job finds its own folder by it (`requeue_of`)
        "overrides": list(overrides),
        "changes": {k: [_jsonable(a), _jsonable(b)] for k, (a, b) in changes.items()},
        "from_iteration": iteration,
    }
    with (Path(folder) / STARTS).open("a") as f:
        f.write(json.dumps(row) + "\n")


def _jsonable(value: Any) -> Any:
    return None if value is _MISSING else value


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------------ a folder as found
def check_resume(folder: Path, trusted: Typed | None = None) -> DictConfig:
    """The run in `folder`, checked whole before a resume reads anything else or writes anything there; returns its
    config (`load_run_config`). Refused in one line naming the folder, leaving it as it was: its layout
    (`check_layout`: links, kinds, writability), what its config and recorded overrides set
    (`load_run_config`, `refuse_untrusted_overrides`) and its records (`check_records`)."""
    where = f"resume={folder}"
    check_layout(folder, where, writes=True)
    saved = load_run_config(folder, trusted)
    refuse_untrusted_overrides(original_overrides(folder), f"{where}: its recorded overrides", trusted or Typed())
    check_records(folder, where)
    return saved


def check_layout(folder: Path, where: str, writes: bool, whole: bool = True) -> None:
    """Refuse in one line a folder a run could not use as it is, before anything in it is read or written. `whole`:
    every entry of a run's folder; else (a new run's folder, which may be any existing folder) its own entries only,
    those at its top and in `.hydra/`, and writability of the folder itself.

    - A symbolic link anywhere in it: a run never follows one out of its folder (a linked `checkpoints/` would have
      pruning delete the folders it points at, a linked log would take the run's writes). W&B's own links inside a
      `wandb/` folder are W&B's (`_LINKS_OF_OTHERS`).
    - Anything but files and folders (a pipe would block the read), a file where cory keeps a folder
      (`RUN_FOLDERS`, `checkpoints/iter_<k>`) or a folder where it writes a file (`RUN_FILES`).
    - With `writes`: a folder or file in it that cannot be written (a read-only filesystem, no permission).
    """
    folder = Path(folder)
    if whole:
        entries = [Path(top) / name for top, dirs, files in os.walk(folder) for name in [*dirs, *files]]
    else:
        hydra = folder / ".hydra"
        inside = [] if hydra.is_symlink() else [Path(t) / n for t, d, f in os.walk(hydra) for n in [*d, *f]]
        entries = [*folder.iterdir(), *inside]
    for path in entries:
        rel = path.relative_to(folder)
        if path.is_symlink():
            if _LINKS_OF_OTHERS in rel.parts[:-1]:
                continue
            raise ConfigError(
                f"{where}: {rel} is a symbolic link (to {os.readlink(path)}); a run never follows a link out of its "
                f"folder, so {_LEFT_AS_IT_WAS}. Replace the link by what it points to (`cp -rL` copies a folder so)"
            )
        if not (path.is_file() or path.is_dir()):
            raise ConfigError(f"{where}: {rel} is neither a file nor a folder; {_LEFT_AS_IT_WAS}. Remove it")
    for name in RUN_FILES:
        if (folder / name).is_dir():
            raise ConfigError(f"{where}: {name} is a folder, where a run writes a file; {_LEFT_AS_IT_WAS}")
    checkpoints = folder / "checkpoints"
    iterations = (
        [p for p in checkpoints.glob("iter_*") if CHECKPOINT_NAME.fullmatch(p.name)] if checkpoints.is_dir() else []
    )
    for path in [*(folder / name for name in RUN_FOLDERS), *iterations]:
        if path.is_file():
            rel = path.relative_to(folder)
            raise ConfigError(f"{where}: {rel} is a file, where a run keeps a folder; {_LEFT_AS_IT_WAS}")
    if writes:
        for path in [folder, *(entries if whole else [])]:
            if not path.is_symlink() and not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
                reason = "read-only filesystem" if _read_only(path) else "no write permission"
                raise ConfigError(
                    f"{where}: cannot write {path} ({reason}), and a run writes into its folder; "
                    f"{_LEFT_AS_IT_WAS}. Make it writable, or copy the folder elsewhere and resume the copy"
                )


def check_records(folder: Path, where: str) -> None:
    """Refuse in one line a run folder whose records do not read back as a run writes them, before a resume changes
    anything: `starts.jsonl` (one JSON object per start, its overrides a list of strings), `.hydra/overrides.yaml`,
    `run.lock` (empty, or its owner as a JSON object), `summary.json` (`read_summary`), `metrics.jsonl` (UTF-8 text:
    the run's report reads it back), and the latest checkpoint's `trainer.json` (`cory.checkpoints.read_state`: every
    value of its type and range; `check_listed`: a checksum for every file), whose line counts the logs must hold: a
    resume cuts the logs back to them. (The files' checksums themselves are verified where they are loaded.)"""
    folder = Path(folder)
    starts = folder / STARTS
    if starts.is_file():
        lines = _text(starts).split("\n")[:-1]  # the last piece: "" after a complete line, or a line a kill cut
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not (isinstance(row, dict) and _strings(row.get("overrides", [])) == row.get("overrides", [])):
                raise ConfigError(
                    f"{where}: {STARTS} line {number} is not a start record (a JSON object whose overrides are a list "
                    f"of strings); {_LEFT_AS_IT_WAS}"
                )
    elif (folder / HYDRA_OVERRIDES).is_file():
        try:
            recorded = OmegaConf.to_container(OmegaConf.load(folder / HYDRA_OVERRIDES))
        except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
            recorded = None
        if not (isinstance(recorded, list) and _strings(recorded) == recorded):
            raise ConfigError(f"{where}: {HYDRA_OVERRIDES} is not a list of overrides; {_LEFT_AS_IT_WAS}")
    lock = folder / LOCK
    if lock.is_file() and not isinstance(_json_or(lock, {}), dict):
        raise ConfigError(f"{where}: {LOCK} holds neither nothing nor a lock owner (a JSON object); {_LEFT_AS_IT_WAS}")
    read_summary(folder, where)
    try:
        (folder / "metrics.jsonl").read_bytes().decode("utf-8") if (folder / "metrics.jsonl").is_file() else ""
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: metrics.jsonl is not UTF-8 text ({one_line(err)}); {_LEFT_AS_IT_WAS}") from None
    checkpoint = latest_checkpoint(folder)
    if checkpoint is None:
        return
    try:
        state = read_state(checkpoint)
        check_listed(checkpoint, state)
    except CheckpointError as err:  # before Hydra runs, where a configuration error is what is reported in one line
        raise ConfigError(str(err)) from None
    for name, key in zip(LOGS, ("metrics_lines", "samples_lines")):
        have = count_lines(folder / name)
        if state[key] > have:
            raise ConfigError(
                f"checkpoint {checkpoint} counts {state[key]} lines of {name}, which holds {have}: the log was cut "
                f"or replaced since, so the run cannot continue as it was; {_LEFT_AS_IT_WAS}. Restore the log, or "
                f"delete that checkpoint folder to continue from the one before it"
            )


def _json_or(path: Path, empty: Any) -> Any:
    """A small JSON file's value, `empty` when the file is empty, None when it does not parse."""
    try:
        text = path.read_bytes().decode("utf-8")
        return json.loads(text) if text.strip() else empty
    except (OSError, ValueError):
        return None


def check_resume_value(value: Any) -> None:
    """`resume=` given without a folder is refused: it would start a new run instead of continuing one."""
    if value is not None and not str(value).strip():
        raise ConfigError("resume= names no run folder; pass resume=<run folder> (or leave resume out for a new run)")


# ------------------------------------------------------------------------------------------------ writability
def check_writable(folder: Path, key: str) -> None:
    """Refuse a run folder that cannot be created or written (before Hydra writes into it).

    The nearest existing ancestor must be a writable folder; `os.access` also reports a read-only filesystem.
    """
    folder = Path(folder).expanduser().absolute()
    probe = folder
    while not (probe.exists() or probe.is_symlink()) and probe != probe.parent:
        probe = probe.parent
    if not probe.exists():  # a link to nothing: a folder cannot be created there
        raise ConfigError(f"{key}={folder}: cannot create the run folder, {probe} is a link to nothing")
    if not probe.is_dir():
        raise ConfigError(f"{key}={folder}: cannot create the run folder, {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        reason = "read-only filesystem" if _read_only(probe) else "no write permission"
        raise ConfigError(f"{key}={folder}: cannot write there ({probe}: {reason}); choose another folder")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EFBIG}


def write_error_message(err: OSError, run_dir: Path) -> str:
    """One line for a failed write (disk full, read-only or unwritable folder): what, where, and what is kept."""
    what = err.strerror or type(err).__name__
    where = f" {err.filename}" if err.filename else ""
    then = f"resume with `python -m cory.train resume={run_dir}`" if holds_run(run_dir) else "start the run again"
    fix = "raise the file-size limit (`ulimit -f`)" if err.errno == errno.EFBIG else "free space or fix permissions"
    return (
        f"cannot write{where} ({what}); the run folder {run_dir} keeps everything written before this point "
        f"(the last complete checkpoint included). {fix[0].upper()}{fix[1:]}, then {then}"
    )
