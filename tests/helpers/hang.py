"""A run whose reward hangs in one training iteration, to signal it at a known point of that iteration.

`main_with_a_hanging_reward()` is `python -m cory.train` (the real entry point, `cory.train.main`) in which the toy
task's reward, in training iteration `HANG_ITERATION` (0-based), writes the file `HANG_MARKER` and then never returns:
only a signal ends the wait. An iteration that had to finish before the run could stop would never stop. Run as
`python -c "from helpers.hang import main_with_a_hanging_reward; main_with_a_hanging_reward()" <overrides>` with
tests/ on PYTHONPATH (`start_hanging`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.runners import REPO, env

CODE = "from helpers.hang import main_with_a_hanging_reward; main_with_a_hanging_reward()"


def main_with_a_hanging_reward() -> None:
    import cory.train
    from cory.algorithms.team import Team
    from cory.tasks.toy import ToyTask

    hang_at, marker = int(os.environ["HANG_ITERATION"]), Path(os.environ["HANG_MARKER"])
    current: dict[str, int | None] = {"iteration": None}

    def step(self, iteration, _step=Team.step):
        current["iteration"] = iteration
        try:
            return _step(self, iteration)
        finally:
            current["iteration"] = None

    Team.step = step
    real_score = ToyTask.score

    def score(self, queries, responses):
        if current["iteration"] == hang_at:  # after generation: the iteration has drawn its samples
            marker.write_text(str(os.getpid()))
            while True:
                time.sleep(0.05)
        return real_score(self, queries, responses)

    ToyTask.score = score
    cory.train.main()


def start_hanging(run_dir: Path, iteration: int, *args: str, **extra_env: str) -> tuple[subprocess.Popen, Path]:
    """`python -m cory.train experiment=smoke ... <args>` in `run_dir`, hanging in `iteration`'s reward; returns once
    it hangs there (the process, and the file holding its stdout)."""
    marker = run_dir.parent / f"{run_dir.name}.hang"
    out, err = (run_dir.parent / f"{run_dir.name}.{s}" for s in ("out", "err"))
    extra = {"HANG_ITERATION": str(iteration), "HANG_MARKER": str(marker), "PYTHONPATH": str(REPO / "tests")}
    cmd = [
        sys.executable,
        "-c",
        CODE,
        "experiment=smoke",
        "progress=false",
        f"hydra.run.dir={run_dir}",
        f"cache_dir={run_dir.parent / 'cache'}",
        *args,
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(**extra, **extra_env), stdout=out.open("w"), stderr=err.open("w"))
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not reach iteration {iteration} (rc {proc.poll()}): {err.read_text()}")
        time.sleep(0.02)
    return proc, out
