"""Sweep identity in W&B and the end-of-sweep frontier (registered in `cory/conf/train.yaml` under `hydra.callbacks`).

- `run_identity`, `wandb_group`, `wandb_tags`: every run of a sweep lands in one W&B group named after the sweep
  (`sweep.name`, set by each `cory/conf/sweep/*.yaml`; else the experiment), tagged with its config-group choices and
  its overrides. The identity is read from the run's own `.hydra/hydra.yaml` (written at its first start), so a
  resumed run keeps its group and tags.
- `FrontierCallback.on_multirun_end`: after the last job of any `-m` sweep, collect the runs' `summary.json`,
  write `frontier.{png,csv,json}` into the sweep folder and, with `logger=wandb` (any mode but disabled), log
  them to a summary run in the sweep's group (`job_type="summary"`): the per-point table, a scatter chart of
  −KL against task reward and the PNG. Offline, the summary run sits in `<sweep dir>/wandb/` beside the
  sweep's other runs and `wandb sync` uploads it later. A failure here never fails the sweep: one warning line.
- `SweepSignals`: Ctrl-C or SIGTERM to a `-m` sweep on the joblib launcher stops every running job at a checkpoint
  and starts no new one (below); the same command with the sweep's folder continues it (`cory.cli`, `cory.train`).
- `SweepConsole`: in a joblib sweep, each job's console lines start with its name, `[job 3 algorithm=cory/seed=1]`
  (its number and its folder in the sweep), and W&B prints nothing there (below).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import shlex
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cory import frontier
from cory.loggers import resolve_wandb_mode

TAG_MAX_CHARS = 64  # W&B rejects longer tags
# Overrides that say where or how a run ran, not what it is: left out of the tags.
UNTAGGED = ("hydra", "progress", "cache_dir", "resume")


def run_identity(run_dir: str | Path) -> tuple[dict[str, str], list[str]]:
    """The run's config-group choices and command-line overrides, as Hydra recorded them at its first start.

    Read from `run_dir/.hydra/hydra.yaml` (a resumed start writes its own under `.hydra/resumed/`); without that
    file, from the live Hydra config; outside Hydra (the compose API in tests), nothing.
    """
    saved = Path(run_dir) / ".hydra" / "hydra.yaml"
    if saved.is_file():
        hydra_cfg = OmegaConf.load(saved).hydra
    else:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return {}, []
        hydra_cfg = HydraConfig.get()
    choices = {str(k): str(v) for k, v in hydra_cfg.runtime.choices.items() if v is not None}
    return choices, [str(o) for o in hydra_cfg.overrides.task]


def wandb_group(cfg: DictConfig, choices: Mapping[str, str]) -> str | None:
    """The W&B group: `logger.group` when set, else the sweep's name (`sweep.name`), else the experiment."""
    return cfg.logger.get("group") or OmegaConf.select(cfg, "sweep.name") or choices.get("experiment")


def wandb_tags(choices: Mapping[str, str], overrides: list[str], extra: list[str] = ()) -> list[str]:
    """`group=choice` for every config group (Hydra's own `hydra/*` left out), then the overrides that define the
    run (`seed=1`, `algorithm.agent.init_kl_coef=0.01`), then `extra`; unique, each cut to W&B's 64 characters."""
    tags = [f"{group}={choice}" for group, choice in sorted(choices.items()) if not group.startswith("hydra")]
    tags += [o.lstrip("+~") for o in overrides if not o.lstrip("+~").startswith(UNTAGGED)]
    return list(dict.fromkeys(tag[:TAG_MAX_CHARS] for tag in [*tags, *extra]))


def _warn(message: str) -> None:
    print(f"[cory] WARNING: {message}", file=sys.stderr, flush=True)


class FrontierCallback(Callback):
    """Hydra callback: the frontier of a finished multirun, on disk and in W&B (see the module docstring)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if sweep_stopped_by() is not None:  # its runs are unfinished: the frontier comes when the sweep completes
            return
        try:
            summarise_sweep(Path(str(config.hydra.sweep.dir)), config)
        except Exception as exc:  # noqa: BLE001 - the runs are done and intact; the summary is a convenience
            first = (str(exc).strip().splitlines() or [""])[0]
            _warn(f"sweep summary failed ({type(exc).__name__}: {first}); draw it with `cory-plot frontier`")


def summarise_sweep(sweep_dir: Path, cfg: DictConfig) -> dict | None:
    """Write `frontier.{png,csv,json}` into `sweep_dir` and, with `logger=wandb`, log them to a W&B summary run.

    Returns the `cory.frontier.write_frontier` result, or None when no run finished with a final evaluation.
    """
    points = frontier.collect([sweep_dir])
    if not points:
        _warn(f"no finished run with a summary.json under {sweep_dir}; no frontier written")
        return None
    group = wandb_group(cfg, cfg.hydra.runtime.choices)
    result = frontier.write_frontier(points, sweep_dir, title=f"KL-reward frontier: {group or sweep_dir.name}")
    print(frontier.format_table(result["aggregated"], result["fronts"]))
    print(f"[cory] sweep frontier: {', '.join(str(p) for p in result['files'].values())}", flush=True)
    if str(cfg.logger.get("_target_", "")).endswith("WandbLogger"):
        log_frontier_to_wandb(points, result, sweep_dir, cfg.logger, group)
    return result


def log_frontier_to_wandb(
    points: list[dict], result: dict, sweep_dir: Path, logger_cfg: DictConfig, group: str | None
) -> None:
    """A `job_type="summary"` run in the sweep's group holding the per-point table, the scatter chart of
    (task reward, −KL) over it, the seed-mean table and the frontier PNG. Skipped when W&B is disabled."""
    mode = resolve_wandb_mode(logger_cfg.get("mode"))
    if mode == "disabled":
        return
    import wandb

    run = wandb.init(
        dir=str(sweep_dir),
        project=logger_cfg.get("project"),
        entity=logger_cfg.get("entity"),
        group=group,
        job_type="summary",
        name=f"{group}-frontier" if group else "frontier",
        tags=["summary"],
        config={"sweep_dir": str(sweep_dir.resolve()), "runs": len({p["run"] for p in points})},
        mode=mode,
        reinit="finish_previous",
        settings=wandb.Settings(init_timeout=20.0),
    )
    try:
        table = wandb.Table(columns=list(frontier.COLUMNS), data=frontier.table_rows(points))
        columns = ["algorithm", "kl_coef", "agent", "n", *frontier.METRICS, *(f"{m}_std" for m in frontier.METRICS)]
        means = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in result["aggregated"]])
        run.log(
            {
                "frontier/points": table,
                "frontier/scatter": wandb.plot.scatter(table, "task_reward", "neg_kl", title="−KL vs task reward"),
                "frontier/seed_means": means,
                "frontier/png": wandb.Image(str(result["files"]["png"])),
            }
        )
    finally:
        run.finish()


# ---------------------------------------------------------------------------------------- stopping a joblib sweep
# The joblib launcher runs a sweep's jobs in worker processes (loky) that it starts itself, in the terminal's process
# group: Ctrl-C reaches the master and every worker, and SIGTERM sent to the master alone reaches no worker. Left to
# themselves, the master raises KeyboardInterrupt inside joblib, which kills the workers before their runs save,
# and a master that SIGTERM kills leaves its workers running. So, for the joblib launcher:
# - the master (`SweepSignals.on_multirun_start`) takes SIGINT and SIGTERM: the first passes SIGTERM to every worker
#   and waits for the jobs, which return once saved; the same signal again kills the workers and exits (code 130);
# - every worker holds `_WorkerStop` for the stop signals from its start (joblib's `loky` backend is registered again
#   for the sweep, with it as the workers' initializer): outside a run it records the signal; a run
#   being built then stops as its trainer starts (`cory.trainer` reads `stop_signal`), a running one stops through
#   the trainer's own handler (which hands the signal on here once saved), and the worker starts no further job
#   (`worker_stopped`, checked by `cory.train`).
_LOKY_WORKER = "joblib.externals.loky.backend.popen_loky_posix"  # the module a loky worker process runs


class _WorkerStop:
    """A sweep worker's handler for the stop signals while no run of it has its own; remembers the first."""

    stop_signal: str | None = None

    def __call__(self, signum: int, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(signum).name


_worker_stop: _WorkerStop | None = None


def in_sweep_worker() -> bool:
    """Whether this process is a joblib launcher's (loky) worker."""
    return multiprocessing.current_process().name.startswith("LokyProcess")


def install_worker_signals() -> None:
    """In a joblib worker: hold the stop signals with `_WorkerStop` from now on (idempotent)."""
    global _worker_stop
    if _worker_stop is not None or not in_sweep_worker():
        return
    _worker_stop = _WorkerStop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, _worker_stop)


def worker_stopped() -> str | None:
    """The stop signal this joblib worker received (it starts no further job), or None."""
    return _worker_stop.stop_signal if _worker_stop is not None else None


def _workers() -> list:
    """This process's joblib (loky) worker processes; not their resource trackers."""
    import psutil  # a dependency of accelerate

    found = []
    for child in psutil.Process().children():
        try:
            if _LOKY_WORKER in child.cmdline():
                found.append(child)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def _register_loky(**backend_kwargs: Any) -> None:
    """joblib's `loky` backend, its workers started with `backend_kwargs` (e.g. an `initializer`), or as it ships."""
    from joblib import register_parallel_backend
    from joblib.parallel import LokyBackend

    factory = functools.partial(LokyBackend, **backend_kwargs) if backend_kwargs else LokyBackend
    register_parallel_backend("loky", factory)


_stopped_by: str | None = None  # the signal that stopped this master's sweep


def sweep_stopped_by() -> str | None:
    return _stopped_by


def continue_command(config: DictConfig) -> str:
    """The command that continues this sweep: its own, with its folder named (`hydra.sweep.dir`)."""
    hydra_cfg = config.hydra
    internal = ("hydra.sweep.dir=", "hydra.output_subdir=", "hydra.mode=", "hydra.job.config.override_dirname.")
    hydra_args = [o for o in hydra_cfg.overrides.hydra if not str(o).startswith(internal)]
    args = ["-m", *map(str, hydra_cfg.overrides.task), *map(str, hydra_args), f"hydra.sweep.dir={hydra_cfg.sweep.dir}"]
    return shlex.join(["python", "-m", "cory.train", *args])


class SweepSignals(Callback):
    """Hydra callback: SIGINT / SIGTERM stop a joblib sweep at its jobs' checkpoints (see the comment above)."""

    def __init__(self) -> None:
        self._previous: dict = {}
        self._continue = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _stopped_by
        _stopped_by = None
        if not str(config.hydra.launcher.get("_target_", "")).endswith("JoblibLauncher"):
            return  # the basic launcher runs jobs in this process (the trainer handles signals); submitit: its own
        self._continue = continue_command(config)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._stop)
        _register_loky(initializer=install_worker_signals)  # the launcher asks joblib for "loky" by name

    def _stop(self, signum: int, _frame) -> None:
        global _stopped_by
        name = signal.Signals(signum).name
        if _stopped_by is None:
            _stopped_by = name
            os.write(
                2,
                f"\n[cory] {name} received: stopping the sweep; each running job saves its last completed iteration, "
                f"no new job starts; send it again to abort\n".encode(),
            )
            for worker in _workers():  # Ctrl-C reached them too (the trainer ignores a second, different signal)
                worker.send_signal(signal.SIGTERM)
        elif name == _stopped_by:
            for worker in _workers():
                worker.kill()
            os.write(
                2,
                f"error: sweep aborted ({name} again); each job keeps its last complete checkpoint; continue it "
                f"with: {self._continue}\n".encode(),
            )
            os._exit(130)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_worker_signals()  # in a joblib worker (also done as it starts, by `cory.train`)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._previous:
            _register_loky()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if _stopped_by is not None:
            print(
                f"[cory] the sweep stopped on {_stopped_by}: its running jobs saved their last completed iteration "
                f"and the others were not started. Continue it with: {self._continue}",
                flush=True,
            )


# ------------------------------------------------------------------------------------------- a joblib sweep's console
# The joblib launcher's workers write to the terminal the sweep was started from, every job's lines mixed with the
# others'. In a worker, file descriptors 1 and 2 become pipes, each read by a thread that writes every line on to
# the real stream with the running job's name in front: what Python prints, a library's logging, a child process's
# output and a signal handler's `os.write` alike. The job's name travels in-band (a marker line written when the
# job starts), so each line gets the name of the job that wrote it; when the job ends, a second marker is awaited,
# so its last lines are out before the worker takes the next job. W&B's banners (four lines per run start, a
# summary of some twenty at its end) are left out in workers (`WANDB_SILENT`, unless set): the runs' W&B data are
# in their folders, and the sweep's group in the UI.
_MARK = b"\x00cory-console:"  # starts a control line: "job <prefix>" or "sync"


class _Relay:
    """One stream (fd 1 or 2) of a worker, relayed through a pipe with the job's prefix on every line."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.out = os.dup(fd)  # the real stream
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.synced = threading.Event()
        threading.Thread(target=self._pump, args=(read,), daemon=True, name=f"cory-console-{fd}").start()

    def control(self, text: str) -> None:
        os.write(self.fd, _MARK + text.encode() + b"\n")

    def _pump(self, read: int) -> None:
        prefix, pending = b"", b""
        try:
            while chunk := os.read(read, 1 << 16):
                pending += chunk
                while (end := _line_end(pending)) >= 0:
                    line, pending = pending[: end + 1], pending[end + 1 :]
                    text, mark, command = line.partition(_MARK)
                    if text.strip(b"\r\n"):
                        os.write(self.out, prefix + text + (b"\n" if mark else b""))
                    elif text:
                        os.write(self.out, text)
                    if command.startswith(b"job "):
                        prefix = command[4:].rstrip(b"\n") + b" "
                    elif command.startswith(b"sync"):
                        if pending:  # a line the job left unfinished
                            os.write(self.out, prefix + pending + b"\n")
                            pending = b""
                        self.synced.set()
        except Exception:  # noqa: BLE001 - never block the job: relay the rest as it comes, unprefixed
            os.write(self.out, pending)
            while chunk := os.read(read, 1 << 16):
                os.write(self.out, chunk)


def _line_end(data: bytes) -> int:
    """The index of the first line end (\\n, or \\r: a progress bar redrawing its line), or -1."""
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return min(ends) if ends else -1


_relays: list[_Relay] = []


def job_name(config: DictConfig) -> str:
    """`[job <n> <folder in the sweep>]`, e.g. `[job 3 algorithm=cory/seed=1]`."""
    num = OmegaConf.select(config, "hydra.job.num")
    output, sweep = (OmegaConf.select(config, k) for k in ("hydra.runtime.output_dir", "hydra.sweep.dir"))
    try:
        where = os.path.relpath(str(output), os.path.abspath(str(sweep)))
    except (TypeError, ValueError):
        where = str(OmegaConf.select(config, "hydra.job.override_dirname") or "")
    return f"[job {num} {where}]" if where and where != "." else f"[job {num}]"


class SweepConsole(Callback):
    """Hydra callback: a joblib sweep job's console lines carry its name; W&B is silent in its worker."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not in_sweep_worker():
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        _flush()
        if not _relays:  # once per worker process: it runs job after job
            _relays.extend(_Relay(fd) for fd in (1, 2))
        for relay in _relays:
            relay.control(f"job {job_name(config)}")

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if not _relays:
            return
        _flush()
        for relay in _relays:
            relay.synced.clear()
            relay.control("sync")
        for relay in _relays:
            relay.synced.wait(timeout=5.0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
