"""Stopping at once on a pre-emption signal: the iteration in progress is dropped, or, in its update, finished.

A cluster gives a pre-empted job a short grace period (SLURM: `KillWait`, 30 s by default, between SIGTERM and
SIGKILL), often shorter than one iteration of a real model. So the trainer does not wait for the iteration to end.
An algorithm marks the parts of its work that change nothing a checkpoint holds (generation, scoring, held-out
evaluation) with `abandonable()`. A stop signal that arrives inside such a part, or before the next one begins,
raises `Abandoned` there and then, from the signal handler (`request_stop`); the trainer puts the global RNGs back
as they were when the iteration (or evaluation) began and saves the last completed iteration. The resumed run
redoes the dropped work from the same state and draws the same numbers. A signal that arrives anywhere else (in the
update, which changes weights, optimiser and controllers) only sets the stop flag: that iteration finishes and is
saved, as before. With `snapshot_updates=true` the trainer writes the state after the completed iterations aside
before each iteration and marks the whole step abandonable: a signal in the update then drops the iteration too,
and the copy, not the half-updated weights, becomes the checkpoint (`cory.trainer.Trainer._take_snapshot`).

`abandonable()` is optional for an algorithm: one that never calls it finishes every iteration it began. Processes
of a data-parallel run (more than one) never abandon: each would stop at its own point and the others would wait
for it in the next collective, so they all finish the iteration.

The state is process-wide because signals are: one trainer runs per process, and it calls `reset()` when its loop
starts and ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cory import distributed


class Abandoned(BaseException):
    """Raised inside `abandonable()` by a stop signal. A `BaseException`, like `KeyboardInterrupt`, so that no
    `except Exception` on the way (a reward's per-sample fallback, a library's retry) can swallow it."""


_stop_requested = False
_depth = 0  # how many `abandonable()` blocks the main thread is inside


def reset() -> None:
    """No stop requested, no abandonable block open (the trainer, when its loop starts and ends)."""
    global _stop_requested, _depth
    _stop_requested, _depth = False, 0


def stop_requested() -> bool:
    return _stop_requested


def request_stop() -> None:
    """Ask the run to stop: at once (`Abandoned`) inside an abandonable block, else when the iteration ends.

    Called from the trainer's signal handler, which Python runs in the main thread between two bytecodes of the
    code it interrupts, so the exception surfaces exactly there (a running torch kernel completes first)."""
    global _stop_requested
    _stop_requested = True
    if _depth > 0:
        raise Abandoned


@contextlib.contextmanager
def abandonable() -> Iterator[None]:
    """Mark a block that may be dropped at once by a stop signal.

    The block must change nothing that a checkpoint holds or that the rest of the iteration has already changed
    (weights, optimiser, controllers, counters, the algorithm's own RNG streams); the global python, numpy and
    torch RNGs it draws from are restored by the trainer. Files it writes must be ones the resumed run would
    write identically (e.g. stage results seeded by their stage). Entering it after a stop was requested raises
    `Abandoned` at once."""
    global _depth
    if distributed.world_size() > 1:
        yield
        return
    if _stop_requested:
        raise Abandoned
    try:  # counted inside the `try`: a signal landing between the two can only leave the count low (never abandons)
        _depth += 1
        yield
    finally:
        _depth -= 1
