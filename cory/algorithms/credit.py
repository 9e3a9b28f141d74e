"""Credit rules: what reward each role is trained on, given every role's task reward (docs/method.md §1.2, §12.4).

A credit rule is a small frozen dataclass picked by `_target_` in `cory/conf/algorithm/credit/<name>.yaml`
(`algorithm/credit=counterfactual`). It is called with every role's task rewards r_k (lists of B floats, role order)
and `without(k)`: every role's task rewards had role k said nothing (the episode replays the roles after k; a
rule that never calls it costs no generation). It returns one list of B sequence rewards per role, the R_k that
role's learner optimises.

A new rule is a class with `name` and `__call__` in any installed package and a YAML file naming it
(docs/extending.md, "A credit rule").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

Rewards = list[list[float]]  # one list of B floats per role, in role order


class Credit(Protocol):
    name: ClassVar[str]

    def __call__(self, rewards: Rewards, without: Callable[[int], list[list[float] | None]]) -> Rewards: ...


@dataclass(frozen=True)
class Collective:
    """R_k = w_self·r_k + w_other·Σ_{j≠k} r_j: CORY's collective reward (Eq. 4) with its default weights (1, 1);
    w_other = 0 trains each role on its own reward (independent), w_other < 0 is competitive ([v2]). With one role,
    R = w_self·r."""

    w_self: float
    w_other: float

    name: ClassVar[str] = "collective"

    def __call__(self, rewards: Rewards, without: Callable[[int], list[list[float] | None]]) -> Rewards:
        if len(rewards) == 1:
            return [[self.w_self * r for r in rewards[0]]] if self.w_self != 1.0 else [list(rewards[0])]
        out = []
        for k, own in enumerate(rewards):
            others = [sum(r[i] for j, r in enumerate(rewards) if j != k) for i in range(len(own))]
            out.append([self.w_self * a + self.w_other * b for a, b in zip(own, others)])
        return out


@dataclass(frozen=True)
class Counterfactual:
    """Each role's marginal contribution to the team's reward (difference rewards; CCPO's counterfactual credit on a
    sequential pair): R_k = T − T_{−k}, with T = Σ_j r_j the team's reward and T_{−k} the team's reward had role k
    said nothing — the roles after k answer again without its message (one extra generation per later role that saw
    it), the roles before k keep theirs, role k contributes nothing.

    For CORY's pioneer → observer pair: R_P = r_1 + r_2 − r_2', where r_2' is the observer's reward answering the
    query alone, so the pioneer is credited with its own reward plus what its answer added to the observer's;
    R_O = r_2, since nothing follows the observer."""

    name: ClassVar[str] = "counterfactual"

    def __call__(self, rewards: Rewards, without: Callable[[int], list[list[float] | None]]) -> Rewards:
        team = [sum(r[i] for r in rewards) for i in range(len(rewards[0]))]
        out = []
        for k in range(len(rewards)):
            rest = [r for r in without(k) if r is not None]  # every other role's rewards without role k
            out.append([t - sum(r[i] for r in rest) for i, t in enumerate(team)])
        return out
