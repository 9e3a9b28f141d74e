"""Seconds from a stop signal in the middle of a PPO update to the checkpoint on disk, with and without snapshots.

    cory-measure stop-latency                                   # experiment=smoke, snapshot_updates=true
    cory-measure stop-latency --no-snapshot experiment=smoke    # the update finishes first
    cory-measure stop-latency experiment=quickstart batch_size=4 algorithm.agent.mini_batch_size=4 num_eval=4

Trains `iterations=2` in-process in a temporary run folder (deleted afterwards) and sends SIGTERM to itself right
after the first optimiser step of the second iteration, as a pre-empting scheduler would mid-update. Prints one
JSON object: `snapshot_s` (the seconds each pre-iteration snapshot took: the price of `snapshot_updates=true` per
iteration), `signal_to_checkpoint_s` (SIGTERM → the checkpoint of the last completed iteration is on disk),
`signal_to_return_s` (→ training returned: the snapshot reloaded into memory, or the update finished and saved),
`optimizer_steps_after_signal` and `checkpoint_mb`. Hydra overrides as for `cory-train`; overrides that do not
compose or validate, a run that takes no optimiser step in its second iteration, or no writable temporary folder is
one line and exit code 2. The same command: `python -m cory.studies.stop_latency`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command
from cory.studies.command import StudyError


def measure(overrides: list[str], snapshot: bool) -> dict:
    """Train 2 iterations with a SIGTERM after the first optimiser step of the second; the timings."""
    import cory.engines
    import cory.stopping
    import cory.trainer
    from cory.train import train

    args = [*overrides, "iterations=2", "save_every=0", "progress=false", f"snapshot_updates={str(snapshot).lower()}"]
    cfg = command.compose(args)  # a mistyped override is refused before anything is patched or trained
    seen: dict = {"iteration": None, "snapshot_s": [], "steps": 0, "signal": None, "checkpoint": None}
    trainer, engines, snapshots = cory.trainer.Trainer, cory.engines, cory.stopping.Snapshots
    real_iteration, real_snapshot, real_save = trainer._iteration, snapshots.take, trainer.save_checkpoint
    real_step, real_install = engines.optimizer_step, cory.trainer.install_checkpoint

    def iteration(self, k, bar):
        seen["iteration"] = k
        return real_iteration(self, k, bar)

    def step(*args, **kwargs):
        done = real_step(*args, **kwargs)
        seen["steps"] += 1
        if seen["iteration"] == 1 and seen["signal"] is None:
            seen["signal"], seen["steps_at_signal"] = time.perf_counter(), seen["steps"]
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        return done

    def take_snapshot(self, write):
        t0 = time.perf_counter()
        real_snapshot(self, write)
        seen["snapshot_s"].append(time.perf_counter() - t0)

    def install(*args, **kwargs):
        real_install(*args, **kwargs)
        seen["checkpoint"] = time.perf_counter()

    def save(self):
        path = real_save(self)
        if seen["signal"] is not None:
            seen["checkpoint"] = time.perf_counter()
        return path

    trainer._iteration, snapshots.take, trainer.save_checkpoint = iteration, take_snapshot, save
    engines.optimizer_step, cory.trainer.install_checkpoint = step, install
    try:
        tmp_dir = tempfile.TemporaryDirectory(prefix="stop-latency-")
    except OSError as err:
        raise StudyError(f"no writable temporary folder ({err.strerror}); set TMPDIR to a writable folder") from None
    with tmp_dir as tmp:
        with contextlib.redirect_stdout(sys.stderr):  # the run's console lines: stdout is the JSON alone
            summary = train(cfg, Path(tmp) / "run", args)
        returned = time.perf_counter()
        files = [f for f in (Path(tmp) / "run" / "checkpoints").rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files) / 2**20
    if seen["signal"] is None:
        raise StudyError(
            "the run took no optimiser step in its second iteration, so no stop could land mid-update; "
            "measure a PPO-family run whose batch gives at least one update (experiment=smoke)"
        )
    return {
        "overrides": overrides,
        "snapshot_updates": snapshot,
        "stopped_by": summary["stopped_by"],
        "iterations_completed": summary["iterations"],
        "snapshot_s": seen["snapshot_s"],
        "signal_to_checkpoint_s": None if seen["checkpoint"] is None else seen["checkpoint"] - seen["signal"],
        "signal_to_return_s": returned - seen["signal"],
        "optimizer_steps_after_signal": seen["steps"] - seen["steps_at_signal"],
        "checkpoint_mb": size,
    }


def run(argv: Sequence[str] | None = None, prog: str = "cory-measure stop-latency") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument("--no-snapshot", action="store_true", help="snapshot_updates=false: the update finishes")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=smoke)")
    args = parser.parse_args(argv)
    for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("WANDB_MODE", "disabled")
    print(json.dumps(measure(args.overrides or ["experiment=smoke"], not args.no_snapshot), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
