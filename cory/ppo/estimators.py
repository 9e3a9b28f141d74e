"""Advantage estimators: the parts that turn KL-shaped token rewards (and values) into advantages and returns.

Each estimator is a small frozen dataclass, picked by `_target_` in `cory/conf/algorithm/advantage/<name>.yaml`
(`algorithm/advantage=grpo` on the command line), its hyperparameters its fields; calling it is a pure function of
its inputs, the maths living in `cory/ppo/core.py` and `cory/ppo/advantages.py`. What an estimator declares:
- `uses_values`: whether it needs V_old from a critic (GAE) or ignores values (the group baselines: no critic);
- `group_size`: how many samples of one prompt it compares (1: none); the query schedule repeats each query that
  many times, contiguously (`cory.algorithms.agents.QuerySchedule`).

`per_role` (every estimator): normalise the advantages within each role of the batch instead of over the whole
batch (docs/method.md §12.1): with one learner playing several roles (a shared policy), pioneer and observer samples
then get advantages of the same scale, as per-agent normalisation (Dr. MAS) and SPIRAL's role-conditioned
advantages argue. With one learner per role every batch holds one role, and the option changes nothing.

A new estimator is a class with these attributes and `__call__(inputs) -> Estimate` in any installed package, and a
YAML file naming it (docs/extending.md, "An advantage estimator").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch

from cory.errors import ConfigError
from cory.ppo import advantages as group_core
from cory.ppo import core as ppo_core


@dataclass
class EstimatorInputs:
    """What every estimator sees of one update's batch of B samples.

    rewards: [B, T] KL-shaped token rewards (`cory.ppo.core.penalized_rewards`: −β·kl_t, plus the score on the last
        response token); values: [B, T] V_old on response tokens (zero on padding), or None without a critic;
    mask: [B, T] response mask; roles: [B] the role index each sample was played in (0 = the first role).
    """

    rewards: torch.Tensor
    values: torch.Tensor | None
    mask: torch.Tensor
    roles: torch.Tensor


@dataclass
class Estimate:
    """advantages [B, T] (zero on padding where the estimator says so), returns [B, T] (the value targets), and
    statistics to log under `ppo/<agent>/...`."""

    advantages: torch.Tensor
    returns: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


class AdvantageEstimator(Protocol):
    uses_values: ClassVar[bool]
    group_size: int

    def __call__(self, inputs: EstimatorInputs) -> Estimate: ...

    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class GAE:
    """Generalised advantage estimation with V_{T+1} = 0, advantages whitened over the batch's masked tokens, or
    within each role with `per_role` (TRL 0.11.4 `compute_advantages`; docs/method.md §2.5)."""

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES: ClassVar[dict[str, str]] = {"gamma": "[0, 1]", "lam": "[0, 1]"}

    gamma: float
    lam: float
    whiten_rewards: bool
    per_role: bool

    uses_values: ClassVar[bool] = True
    group_size: ClassVar[int] = 1

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):  # discount and GAE λ
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"algorithm.advantage.{name}={value}: must be in [0, 1]")

    def __call__(self, inputs: EstimatorInputs) -> Estimate:
        if inputs.values is None:
            raise ValueError("GAE needs values: run it with a critic (algorithm/critic=per_agent or centralized)")
        if not self.per_role:
            advantages, returns = ppo_core.gae(
                inputs.rewards, inputs.values, inputs.mask, self.gamma, self.lam, self.whiten_rewards
            )
            return Estimate(advantages, returns)
        raw, returns = ppo_core.gae_unwhitened(
            inputs.rewards, inputs.values, inputs.mask, self.gamma, self.lam, self.whiten_rewards
        )
        return Estimate(ppo_core.whiten_by_group(raw, inputs.mask, inputs.roles), returns)

    def describe(self) -> dict[str, object]:
        return {"advantage": "gae"} | ({"per_role": True} if self.per_role else {})


def _group_estimate(inputs: EstimatorInputs, group_size: int, kind: str, per_role: bool) -> Estimate:
    """The sequence return R_i − β·Σ_t kl_{i,t} of every sample against the other samples of its prompt (a group of
    G contiguous samples), broadcast to every response token; `per_role` whitens the sequence advantages within
    each role afterwards."""
    returns = group_core.sequence_returns(inputs.rewards, inputs.mask)
    advantages = group_core.group_advantages(returns, group_size, kind)
    if per_role:
        advantages = ppo_core.whiten_by_group(advantages, torch.ones_like(advantages), inputs.roles)
    stats = {"zero_spread_groups": group_core.zero_spread_groups(returns, group_size).item()}
    return Estimate(group_core.broadcast(advantages, inputs.mask), group_core.broadcast(returns, inputs.mask), stats)


def _check_group_size(group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ConfigError(f"algorithm.advantage.group_size={group_size}: must be an integer >= 2 (a group baseline)")


# the group estimators' value range, checked before any model loads (cory/config.py `check_ranges`)
GROUP_RANGES = {"group_size": "[2, inf); a group baseline"}


@dataclass(frozen=True)
class GRPO:
    """A_i = (R_i − mean_group R)/(std_group R + ε) over the G samples of one prompt (DeepSeekMath, arXiv
    2402.03300, outcome supervision; docs/method.md §9). No critic: values are ignored."""

    RANGES: ClassVar[dict[str, str]] = GROUP_RANGES

    group_size: int
    per_role: bool

    uses_values: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)

    def __call__(self, inputs: EstimatorInputs) -> Estimate:
        return _group_estimate(inputs, self.group_size, "grpo", self.per_role)

    def describe(self) -> dict[str, object]:
        return {"advantage": "grpo", "group_size": self.group_size} | ({"per_role": True} if self.per_role else {})


@dataclass(frozen=True)
class RLOO:
    """A_i = R_i − mean of the other G − 1 samples' R of its prompt, the leave-one-out baseline (Ahmadian et al.,
    arXiv 2402.14740; docs/method.md §9). No critic: values are ignored."""

    RANGES: ClassVar[dict[str, str]] = GROUP_RANGES

    group_size: int
    per_role: bool

    uses_values: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)

    def __call__(self, inputs: EstimatorInputs) -> Estimate:
        return _group_estimate(inputs, self.group_size, "rloo", self.per_role)

    def describe(self) -> dict[str, object]:
        return {"advantage": "rloo", "group_size": self.group_size} | ({"per_role": True} if self.per_role else {})
