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
- Trust. A run folder is input from others (a shared filesystem, downloaded results): nothing it names is ever
  built unless the installed configs name it too. Every `_target_` of its `run_config.yaml` and of its recorded
  overrides must be one that cory's own config tree (or an installed Hydra search-path plugin's) writes, or one
  the user typed on this command line (`known_targets`, `refuse_unknown_targets`); otherwise the resume or the
  evaluation is refused in one line before anything is instantiated.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import functools
import importlib.util
import json
import os
import re
import shutil
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cory import runtime
from cory.errors import ConfigError

RUN_CONFIG = "run_config.yaml"  # the resolved config of the first start; a resumed run reuses it
STARTS = "starts.jsonl"  # one line per start of the run: overrides typed, changes accepted, iteration
LOCK = "run.lock"
# A folder holding any of these holds a run: a new run there would overwrite its config and checkpoints.
RUN_MARKERS = (RUN_CONFIG, "metrics.jsonl", "checkpoints", "summary.json")
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
    """Raise `ConfigError` when `folder` already holds a run (a new run there would overwrite it)."""
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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
            return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except ValueError:
            return {}

    def _busy_message(self) -> str:
        try:
            owner = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            owner = {}
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
    with contextlib.suppress(OSError, ValueError):
        owner = json.loads((Path(folder) / LOCK).read_text() or "{}")
        if owner:
            return owner.get("slurm_job")
    last = None
    with contextlib.suppress(OSError):
        for line in (Path(folder) / STARTS).read_text().splitlines():
            with contextlib.suppress(ValueError):
                last = json.loads(line).get("slurm_job")
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
def load_run_config(folder: Path, allowed_targets: Iterable[str] = ()) -> DictConfig:
    """The run's `run_config.yaml`, refused in one line when it is missing, unreadable, or names a `_target_` that
    neither the installed configs nor `allowed_targets` (this command line's) name."""
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
    refuse_unknown_targets(saved, str(path), allowed_targets)
    return saved


# `_target_=x` in an override, `_target_: x` inside a dict value written on the command line
_TARGET_IN_TEXT = re.compile(r"_target_['\"]?\s*[:=]\s*['\"]?([A-Za-z_][\w.]*)")


def targets_in(overrides: Iterable[str]) -> set[str]:
    """The `_target_` values that command-line overrides write."""
    return {m for o in overrides for m in _TARGET_IN_TEXT.findall(str(o))}


@functools.cache
def known_targets() -> frozenset[str]:
    """Every `_target_` written in a config file Hydra can compose here: cory's `conf/` tree and the folders that
    installed search-path plugins add (installed code the user chose, unlike a run folder)."""
    found: set[str] = set()
    for folder in [Path(__file__).resolve().parent / "conf", *_plugin_config_folders()]:
        for path in sorted(folder.rglob("*.yaml")):
            with contextlib.suppress(OSError, yaml.YAMLError):
                found |= {target for _, target in _targets(yaml.safe_load(path.read_text(encoding="utf-8")))}
    return frozenset(found)


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


def _targets(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, target) of every `_target_` in a plain nested config."""
    if isinstance(node, dict):
        for k, v in node.items():
            child = f"{key}.{k}" if key else str(k)
            if k == "_target_" and isinstance(v, str):
                yield child, v
            else:
                yield from _targets(v, child)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _targets(v, f"{key}[{i}]")


def refuse_unknown_targets(config: Any, source: str, allowed: Iterable[str] = ()) -> None:
    """Refuse, in one line, a `_target_` that `source` (a run folder's file) names and that neither the installed
    configs nor this command line (`allowed`) name: a run folder never makes cory import or call anything."""
    known = known_targets() | set(allowed)
    if isinstance(config, list):  # overrides: `key=value` strings
        pairs = [(str(o).split("=", 1)[0].lstrip("+~"), t) for o in config for t in _TARGET_IN_TEXT.findall(str(o))]
    else:
        container = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else config
        pairs = list(_targets(container))
    for key, target in pairs:
        if target not in known:
            raise ConfigError(
                f"{source} names {key}: {target}, which no installed config names; a run folder never runs code "
                f"it names, so nothing was built (if you trust it, pass {key}={target} on the command line)"
            )


def original_overrides(folder: Path) -> list[str]:
    """The overrides of the run's first start (`starts.jsonl`, else Hydra's `.hydra/overrides.yaml`)."""
    starts = Path(folder) / STARTS
    if starts.is_file():
        for line in starts.read_text().splitlines():
            with contextlib.suppress(ValueError):
                return [str(o) for o in json.loads(line).get("overrides", [])]
    hydra_overrides = Path(folder) / ".hydra" / "overrides.yaml"
    if hydra_overrides.is_file():
        with contextlib.suppress(OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
            return [str(o) for o in OmegaConf.load(hydra_overrides)]
    return []


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


# ------------------------------------------------------------------------------------------------ writability
def check_writable(folder: Path, key: str) -> None:
    """Refuse a run folder that cannot be created or written (before Hydra writes into it).

    The nearest existing ancestor must be a writable folder; `os.access` also reports a read-only filesystem.
    """
    folder = Path(folder).expanduser().absolute()
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
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
    return (
        f"cannot write{where} ({what}); the run folder {run_dir} keeps everything written before this point "
        f"(the last complete checkpoint included). Free space or fix permissions, then {then}"
    )
