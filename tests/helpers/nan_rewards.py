"""The toy reward with NaN scores on one data-parallel process at one of its calls: a reward source that fails on one
process only. Swapped in with `task.reward._target_=helpers.nan_rewards.NanOnOneProcess` and tests/ on PYTHONPATH
(a reward is a part, nothing is patched)."""

from __future__ import annotations

from cory import distributed
from cory.tasks.toy import CharacterShare


class NanOnOneProcess:
    def __init__(self, characters: str, nan_rank: int, nan_call: int) -> None:
        self.share = CharacterShare(characters)
        self.nan_rank, self.nan_call, self.calls = int(nan_rank), int(nan_call), 0

    def __call__(self, texts: list[str]) -> list[float]:
        scores = self.share(texts)
        if distributed.rank() != self.nan_rank:
            return scores
        self.calls += 1
        return [float("nan")] * len(scores) if self.calls == self.nan_call else scores
