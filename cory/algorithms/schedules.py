"""Schedules: which agent plays which role in iteration k, and who takes an update (docs/method.md §1.5, §11, §12.5).

A schedule is a small frozen dataclass picked by `_target_` in `cory/conf/algorithm/schedule/<name>.yaml`
(`algorithm/schedule=interleaved`). Everything it answers is a function of the iteration alone, so a resumed run
plays the same roles without any saved state:
- `players(k, agents)`: the agent of each role (role order), agents listed llm1 first;
- `phases(k, agents)`: the agents that take an update, in groups; each group is one phase of the iteration, played on
  a fresh episode with everyone's current weights (one phase: every learner updates on the same episode, the order
  does not matter; several: sequential updates, each on the answers of the partners it just updated against);
- `resets_after(k)`: the official code's swap side effects after iteration k (docs/method.md §1.5);
- `kl_budget`: a trust region per update (early stopping on the policy KL), or None.

| schedule | roles | who learns |
|---|---|---|
| `RoleSwap` (CORY, Alg. 1, Eq. 5) | rotate every `period` iterations (two agents: swap) | all, every iteration |
| `Simultaneous` ("CORY w/o REx") | fixed: llm1 plays the first role | all, every iteration |
| `Interleaved` (SWIRL's staged updates) | fixed | one agent per block of `period` iterations, llm1 first |
| `Sequential` (TeamTR-style) | fixed | all, one after another, each on a fresh episode, within `kl_budget` |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from cory.errors import ConfigError


class Schedule(Protocol):
    name: ClassVar[str]
    exchanges_roles: ClassVar[bool]
    kl_budget: float | None

    def swaps(self, k: int) -> int: ...

    def players(self, k: int, agents: list[str]) -> list[str]: ...

    def phases(self, k: int, agents: list[str]) -> list[list[str]]: ...

    def resets_after(self, k: int) -> bool: ...


def _check_period(key: str, period: int) -> None:
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigError(f"algorithm.schedule.{key}={period}: must be an integer >= 1")


@dataclass(frozen=True)
class RoleSwap:
    """Every agent learns every iteration; the role map rotates after iteration k when (k + 1) mod `period` = 0
    (T_REx, Eq. 5: the weights stay, the roles move). `faithful_official_swap` adds the released code's disk-swap
    side effects at each rotation: fresh optimisers, KL controllers and score moments, every RNG reseeded."""

    RANGES: ClassVar[dict[str, str]] = {"period": "[1, inf)"}  # checked before any model loads (cory/config.py)

    period: int
    faithful_official_swap: bool

    name: ClassVar[str] = "role_swap"
    exchanges_roles: ClassVar[bool] = True
    kl_budget: ClassVar[None] = None

    def __post_init__(self) -> None:
        _check_period("period", self.period)

    def swaps(self, k: int) -> int:
        """Rotations made before iteration k."""
        return k // self.period

    def players(self, k: int, agents: list[str]) -> list[str]:
        s = self.swaps(k) % len(agents)
        return agents[s:] + agents[:s]  # two agents: llm1 pioneer in iterations 0-4, 10-14, …; llm2 in 5-9, …

    def phases(self, k: int, agents: list[str]) -> list[list[str]]:
        return [list(agents)]

    def resets_after(self, k: int) -> bool:
        return self.faithful_official_swap and (k + 1) % self.period == 0


@dataclass(frozen=True)
class Simultaneous:
    """Fixed roles (llm1 the first role, llm2 the second, …), every agent learns every iteration."""

    name: ClassVar[str] = "simultaneous"
    exchanges_roles: ClassVar[bool] = False
    kl_budget: ClassVar[None] = None

    def swaps(self, k: int) -> int:
        return 0

    def players(self, k: int, agents: list[str]) -> list[str]:
        return list(agents)

    def phases(self, k: int, agents: list[str]) -> list[list[str]]:
        return [list(agents)]

    def resets_after(self, k: int) -> bool:
        return False


@dataclass(frozen=True)
class Interleaved:
    """Fixed roles; one agent learns per block of `period` iterations, in agent order (llm1 in [0, K), llm2 in
    [K, 2K), …). The others are frozen: they act in their roles and are scored, their rewards enter the collective
    reward, but they take no optimiser step and their KL controller, score statistics and RNG do not move (SWIRL's
    staged interleaved updates; ReMA's and MARFT's alternating agent updates)."""

    RANGES: ClassVar[dict[str, str]] = {"period": "[1, inf)"}  # checked before any model loads (cory/config.py)

    period: int

    name: ClassVar[str] = "interleaved"
    exchanges_roles: ClassVar[bool] = False
    kl_budget: ClassVar[None] = None

    def __post_init__(self) -> None:
        _check_period("period", self.period)

    def swaps(self, k: int) -> int:
        return 0

    def players(self, k: int, agents: list[str]) -> list[str]:
        return list(agents)

    def phases(self, k: int, agents: list[str]) -> list[list[str]]:
        return [[agents[(k // self.period) % len(agents)]]]

    def resets_after(self, k: int) -> bool:
        return False


@dataclass(frozen=True)
class Sequential:
    """Fixed roles; within every iteration the agents update one after another, each on a fresh episode played with
    everyone's current weights, so each update is taken against partners that have already moved (TeamTR-style
    sequential trust-region updates). `kl_budget`: each update stops its epochs once ½·mean (Δ log π)² of the
    epoch's last minibatch exceeds it (a per-agent trust region); null: no budget (the learner's own early stopping,
    if on, still applies)."""

    RANGES: ClassVar[dict[str, str]] = {"kl_budget": "(0, inf)"}  # checked before any model loads (cory/config.py)

    kl_budget: float | None

    name: ClassVar[str] = "sequential"
    exchanges_roles: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.kl_budget is not None and not self.kl_budget > 0:
            raise ConfigError(f"algorithm.schedule.kl_budget={self.kl_budget}: must be > 0 (or null)")

    def swaps(self, k: int) -> int:
        return 0

    def players(self, k: int, agents: list[str]) -> list[str]:
        return list(agents)

    def phases(self, k: int, agents: list[str]) -> list[list[str]]:
        return [[agent] for agent in agents]

    def resets_after(self, k: int) -> bool:
        return False
