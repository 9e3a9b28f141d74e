"""How a run stops on a signal: the handlers, the processes' agreement, the RNGs of dropped work, and snapshots.

The trainer (`cory/trainer.py`) asks three things of this module, and reads as its loop because it asks nothing
more:
- `StopSignals`: the stop signals (SIGTERM or SIGUSR1 from a cluster's pre-emption, a scheduler's own signal such as
  submitit's SIGUSR2, SIGINT from Ctrl-C) set a flag and interrupt the work an algorithm marked as droppable
  (`cory.preemption`); `should_stop()` is the flag, agreed by every process of a data-parallel run; once the run has
  saved, `pass_on()` hands the signal to the handler it replaced (submitit's requeue);
- `restore_rng_if_abandoned()`: dropped work leaves the global python, numpy and torch RNGs as it found them;
- `Snapshots`: with `snapshot_updates=true`, the state after the completed iterations, written aside before each
  iteration (RAM by default), so that a signal in the middle of an update can drop the whole iteration at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from cory import distributed, preemption, runtime

# Signals that stop a run: SLURM's pre-emption (SIGTERM, and SIGUSR1 or SIGUSR2 as `--signal` asks), Ctrl-C
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class StopSignals:
    """The run's stop signals, while `installed()`: the first one asks the run to stop (and interrupts droppable
    work), the same one again aborts (the handler it replaced takes it).

    Args:
        in_progress: what the message on a signal says of the iteration in progress.
    """

    def __init__(self, in_progress: str) -> None:
        self.in_progress = in_progress
        self.requested = False  # a signal reached this process
        self.stopped_by: str | None = None  # its name (SIGTERM, SIGINT, SIGUSR1, ...), or another process's
        self._previous: dict = {}  # the handlers ours replaced

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Our handlers for the duration; outside the main thread (a launcher's worker thread) handlers cannot be
        set and signals are left alone. On exit the replaced handlers are back and `cory.preemption` is reset."""
        previous = {}
        try:
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, self._handler)
        except ValueError:  # not the main thread (e.g. inside some launchers): leave signals alone
            pass
        self._previous = dict(previous)
        preemption.reset()
        # a handler ours replaced may hold a stop signal that came while the run was being built (a joblib sweep
        # worker's, `cory.callbacks`): the run stops as if it came now, before its first iteration
        early = next((h.stop_signal for h in previous.values() if getattr(h, "stop_signal", None)), None)
        if early is not None:
            self._handler(signal.Signals[early], None)
        try:
            yield
        finally:
            for sig, h in previous.items():
                try:
                    signal.signal(sig, h)
                except (ValueError, TypeError):
                    pass
            preemption.reset()

    def _handler(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if not self.requested:
            self.requested, self.stopped_by = True, name
            # os.write, not print: the handler may interrupt a print to the same stream (a reentrant write fails)
            os.write(
                2,
                f"\n[cory] {name} received: saving the last completed iteration now ({self.in_progress}); send it "
                f"again to abort\n".encode(),
            )  # a second, different stop signal (a sweep master's SIGTERM after Ctrl-C) says nothing
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        preemption.request_stop()  # inside generation, scoring or evaluation: raises `Abandoned` there

    def should_stop(self) -> bool:
        """Whether the run stops here on a stop signal. With several processes, whether any process got one: they
        must all take the same branch (a checkpoint and the next iteration are collective), and a signal reaches
        each process at its own moment, not at the same point of the loop. Collective then: every process calls it
        at the same points."""
        if distributed.world_size() == 1:
            return self.requested
        # the agreed answer, not this process's flag read again: a signal landing during the exchange is seen by
        # every process at the next decision point
        agreed = next(
            (n for n in distributed.every((self.stopped_by or "signal") if self.requested else None) if n), None
        )
        if agreed is None:
            return False
        if not self.requested:  # another process's signal stops this one too
            self.requested, self.stopped_by = True, agreed
            preemption.request_stop()
        return True

    def pass_on(self) -> None:
        """Once the run has stopped on a signal and saved: hand the signal to the Python handler ours replaced,
        if any (submitit's, which checkpoints the job's call, requeues the job and exits). Ctrl-C's default
        handler is not called (it would raise KeyboardInterrupt after a clean stop)."""
        if self.stopped_by is None:
            return
        signum = signal.Signals[self.stopped_by]
        previous = self._previous.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:
            runtime.say(f"[cory] passing {self.stopped_by} on to the handler that was installed before the run")
            previous(signum, None)


class Outcome:
    happened = False


@contextlib.contextmanager
def restore_rng_if_abandoned() -> Iterator[Outcome]:
    """Catch `preemption.Abandoned` from the block and put the global python, numpy and torch RNGs back as they
    were when it began: the dropped work leaves nothing a checkpoint would hold. `.happened` says whether it was."""
    python_numpy, torch_states = runtime.rng_state(), runtime.torch_rng_states()
    outcome = Outcome()
    try:
        yield outcome
    except preemption.Abandoned:
        runtime.set_rng_state(python_numpy)
        runtime.set_torch_rng_states(torch_states)
        outcome.happened = True


class Snapshots:
    """One copy of the state after the completed iterations, replaced before each iteration (`snapshot_updates`).

    Args:
        folder: where the copy goes (None: /dev/shm if present and writable, else `fallback`).
        fallback: the run's checkpoints folder.
    """

    def __init__(self, folder: str | None, fallback: Path) -> None:
        self.folder, self.fallback = folder, fallback
        self.path: Path | None = None  # the copy of the state before the iteration in progress

    def take(self, write: Callable[[Path], None]) -> None:
        """`write(path)` writes the state (a checkpoint without checksums) to the snapshot path, replacing the
        previous copy. The first call makes the folder and removes what killed runs of this user left there."""
        if self.path is None:
            shm = Path("/dev/shm")
            default = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.fallback
            parent = Path(self.folder or default).expanduser()
            parent.mkdir(parents=True, exist_ok=True)
            for stale in parent.glob("cory-snapshot-*-*"):  # a killed run's (SIGKILL): RAM is not freed otherwise
                pid = stale.name.split("-")[2]  # this user's, of a process gone from this machine
                if pid.isdigit() and not psutil.pid_exists(int(pid)) and stale.stat().st_uid == os.getuid():
                    shutil.rmtree(stale, ignore_errors=True)
            self.path = Path(tempfile.mkdtemp(prefix=f"cory-snapshot-{os.getpid()}-", dir=parent)) / "iter"
        shutil.rmtree(self.path, ignore_errors=True)  # one copy at a time: a model's worth of memory
        write(self.path)

    def clear(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)
            self.path = None
