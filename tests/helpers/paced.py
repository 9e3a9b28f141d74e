"""The toy reward, paced: a sweep's jobs train side by side, each iteration long enough to be signalled.

A test that signals a sweep while "every job is training" needs its jobs to overlap: on a fast machine a smoke job
trains 12 iterations in about a second, and a worker that started a few seconds before its partner can finish before
the signal comes (a completed job writes no checkpoint with `save_every=0`). `PacedReward` is `cory.tasks.toy`'s
reward with two waits: at its first call it waits until `jobs` runs have reached theirs (one file each in
`barrier_dir`; after `timeout` seconds it goes on), and every call then waits `pause` seconds. Swapped in with
`task.reward._target_=helpers.paced.PacedReward` and tests/ on PYTHONPATH: a reward is a part, nothing is patched.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cory.tasks.toy import CharacterShare


class PacedReward:
    def __init__(self, characters: str, barrier_dir: str, jobs: int, pause: float, timeout: float = 120.0) -> None:
        self.share = CharacterShare(characters)
        self.barrier, self.jobs, self.pause, self.timeout = Path(barrier_dir), int(jobs), float(pause), timeout
        self._waited = False

    def __call__(self, texts: list[str]) -> list[float]:
        if not self._waited:
            self.barrier.mkdir(parents=True, exist_ok=True)
            (self.barrier / str(os.getpid())).touch()
            deadline = time.monotonic() + self.timeout
            while len(list(self.barrier.iterdir())) < self.jobs and time.monotonic() < deadline:
                time.sleep(0.05)
            self._waited = True
        time.sleep(self.pause)
        return self.share(texts)
