"""The toy task with NaN rewards on one data-parallel process at one of its scoring calls: a reward source that fails
on one process only. Swapped in with `task._target_=helpers.nan_rewards.NanOnOneProcess` and tests/ on PYTHONPATH
(a task is a `_target_`, nothing is patched)."""

from __future__ import annotations

from cory import distributed
from cory.tasks.toy import ToyTask


class NanOnOneProcess(ToyTask):
    def __init__(self, *args, nan_rank: int, nan_call: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_rank, self.nan_call, self.calls = int(nan_rank), int(nan_call), 0

    def score(self, queries: list[str], responses: list[str]) -> list[float]:
        scores = super().score(queries, responses)
        if distributed.rank() != self.nan_rank:
            return scores
        self.calls += 1
        return [float("nan")] * len(scores) if self.calls == self.nan_call else scores
