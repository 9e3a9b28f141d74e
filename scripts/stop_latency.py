"""Seconds from a stop signal in the middle of a PPO update to the checkpoint on disk, with and without snapshots.

    python scripts/stop_latency.py                                   # experiment=smoke, snapshot_updates=true
    python scripts/stop_latency.py --no-snapshot experiment=smoke    # the update finishes first
    python scripts/stop_latency.py experiment=quickstart batch_size=4 algorithm.agent.mini_batch_size=4 num_eval=4

Trains `iterations=2` in-process in a temporary run folder (deleted afterwards) and sends SIGTERM to itself right
after the first optimiser step of the second iteration, as a pre-empting scheduler would mid-update. Prints one
JSON object: `snapshot_s` (the seconds each pre-iteration snapshot took: the price of `snapshot_updates=true` per
iteration), `signal_to_checkpoint_s` (SIGTERM → the checkpoint of the last completed iteration is on disk),
`signal_to_return_s` (→ training returned: the snapshot reloaded into memory, or the update finished and saved),
`optimizer_steps_after_signal` and `checkpoint_mb`. Hydra overrides as for `python -m cory.train`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(overrides: list[str], snapshot: bool) -> dict:
    """Train 2 iterations with a SIGTERM after the first optimiser step of the second; the timings."""
    sys.path.insert(0, str(ROOT))
    import cory.engines
    import cory.trainer
    from cory.cli import compose
    from cory.train import train

    seen: dict = {"iteration": None, "snapshot_s": [], "steps": 0, "signal": None, "checkpoint": None}
    trainer, engines = cory.trainer.Trainer, cory.engines
    real_iteration, real_snapshot, real_save = trainer._iteration, trainer._take_snapshot, trainer.save_checkpoint
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

    def take_snapshot(self):
        t0 = time.perf_counter()
        took = real_snapshot(self)
        if took:
            seen["snapshot_s"].append(time.perf_counter() - t0)
        return took

    def install(*args, **kwargs):
        real_install(*args, **kwargs)
        seen["checkpoint"] = time.perf_counter()

    def save(self):
        path = real_save(self)
        if seen["signal"] is not None:
            seen["checkpoint"] = time.perf_counter()
        return path

    trainer._iteration, trainer._take_snapshot, trainer.save_checkpoint = iteration, take_snapshot, save
    engines.optimizer_step, cory.trainer.install_checkpoint = step, install
    args = [*overrides, "iterations=2", "save_every=0", "progress=false", f"snapshot_updates={str(snapshot).lower()}"]
    with tempfile.TemporaryDirectory(prefix="stop-latency-") as tmp:
        with contextlib.redirect_stdout(sys.stderr):  # the run's console lines: stdout is the JSON alone
            summary = train(compose(args), Path(tmp) / "run", args)
        returned = time.perf_counter()
        files = [f for f in (Path(tmp) / "run" / "checkpoints").rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files) / 2**20
    if seen["signal"] is None:
        raise SystemExit("stop_latency: the run took no optimiser step in its second iteration")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-snapshot", action="store_true", help="snapshot_updates=false: the update finishes")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=smoke)")
    args = parser.parse_args(argv)
    for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("WANDB_MODE", "disabled")
    print(json.dumps(measure(args.overrides or ["experiment=smoke"], not args.no_snapshot), indent=2))


if __name__ == "__main__":
    main()
