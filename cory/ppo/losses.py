"""Losses: the parts that turn one minibatch's new log-probs and values into the loss a learner back-propagates.

Each loss is a small frozen dataclass picked by `_target_` in `cory/conf/algorithm/loss/<name>.yaml`
(`algorithm/loss=ppo_kl_in_loss` on the command line), its hyperparameters its fields, the maths in
`cory/ppo/core.py`. What a loss declares:
- `kl_in_reward`: whether the learner puts −β·kl_t into the token rewards (TRL's PPO, docs/method.md §1.4) or the
  loss adds β·KL itself (then the rewards hold the score alone).

`ClippedPPO` is TRL 0.11.4's loss (§2.6); `ClippedPPOKLInLoss` moves the KL penalty from the reward into the loss as
the GRPO paper does (β·mean_t k3_t, k3 = exp(log π0 − log π_θ) − (log π0 − log π_θ) − 1 on the sampled tokens,
docs/method.md §12.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from cory.errors import ConfigError
from cory.ppo import core as ppo_core


@dataclass
class LossInputs:
    """One minibatch, all [b, T] on the learner's device: log π_θ (with gradient), log π_old and log π0 of the sampled
    tokens, the advantages, the response mask; the value head's predictions (None when the learner trains no value
    head), V_old and the returns; `kl_coef` is the β of this update."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    vpreds: torch.Tensor | None
    old_values: torch.Tensor
    returns: torch.Tensor
    kl_coef: float


@dataclass
class LossTerms:
    """The loss to back-propagate and its parts (scalars): `ratio` is the mean probability ratio (the learner's
    ratio threshold reads it); `value`, `value_clipfrac` and `kl` are None where the loss has no such term."""

    total: torch.Tensor
    policy: torch.Tensor
    clipfrac: torch.Tensor
    ratio: torch.Tensor
    value: torch.Tensor | None = None
    value_clipfrac: torch.Tensor | None = None
    kl: torch.Tensor | None = None


class Loss(Protocol):
    kl_in_reward: ClassVar[bool]

    def __call__(self, inputs: LossInputs) -> LossTerms: ...


def _check_clip(cliprange: float, cliprange_value: float, vf_coef: float) -> None:
    if not (cliprange >= 0 and cliprange_value >= 0):
        raise ConfigError("algorithm.loss.cliprange and algorithm.loss.cliprange_value must be >= 0")
    if vf_coef < 0:
        raise ConfigError(f"algorithm.loss.vf_coef={vf_coef}: must be >= 0")


def _clipped(inputs: LossInputs, cliprange: float, cliprange_value: float, vf_coef: float) -> LossTerms:
    """L = L_pg + vf_coef·L_vf (the value term only with value predictions), docs/method.md §2.6."""
    pg_loss, clipfrac, ratio = ppo_core.policy_loss(
        inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask, cliprange
    )
    if inputs.vpreds is None:  # no value term: the value head gets no gradient
        return LossTerms(pg_loss, pg_loss, clipfrac, ratio)
    vf_loss, vf_clipfrac = ppo_core.value_loss(
        inputs.vpreds, inputs.old_values, inputs.returns, inputs.mask, cliprange_value
    )
    return LossTerms(pg_loss + vf_coef * vf_loss, pg_loss, clipfrac, ratio, vf_loss, vf_clipfrac)


# value ranges of both clipped losses, checked before any model loads (cory/config.py `check_ranges`)
CLIP_RANGES = {
    "cliprange": "(0, 1]; the ratio is clipped to [1 - cliprange, 1 + cliprange]",
    "cliprange_value": "(0, inf)",
    "vf_coef": "[0, inf)",
}


@dataclass(frozen=True)
class ClippedPPO:
    """TRL's clipped surrogate plus the clipped value loss; the KL penalty lives in the token rewards (§1.4, §2.6)."""

    RANGES: ClassVar[dict[str, str]] = CLIP_RANGES

    cliprange: float
    cliprange_value: float
    vf_coef: float

    kl_in_reward: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_clip(self.cliprange, self.cliprange_value, self.vf_coef)

    def __call__(self, inputs: LossInputs) -> LossTerms:
        return _clipped(inputs, self.cliprange, self.cliprange_value, self.vf_coef)


@dataclass(frozen=True)
class ClippedPPOKLInLoss:
    """The clipped surrogate (and value loss) plus β·mean_t k3_t: the KL penalty in the loss, not in the rewards
    (the GRPO paper's placement, docs/method.md §12.2). The adaptive controller still moves β on the batch KL."""

    RANGES: ClassVar[dict[str, str]] = CLIP_RANGES

    cliprange: float
    cliprange_value: float
    vf_coef: float

    kl_in_reward: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_clip(self.cliprange, self.cliprange_value, self.vf_coef)

    def __call__(self, inputs: LossInputs) -> LossTerms:
        terms = _clipped(inputs, self.cliprange, self.cliprange_value, self.vf_coef)
        kl = ppo_core.masked_mean(ppo_core.k3_kl(inputs.logprobs, inputs.ref_logprobs), inputs.mask)
        terms.total = terms.total + inputs.kl_coef * kl
        terms.kl = kl
        return terms
