"""Pure PPO maths, matching TRL 0.11.4's `PPOTrainer` function by function (docs/method.md §2).

Every tensor here is response-aligned: `[B, T]` holds one row per sample and one column per response token,
right-padded, with `response_mask` 1 on the T_i real tokens (EOS included). TRL keeps the prompt columns too,
masked out; since masked positions carry zero reward and zero value, the results are identical.

No function reads config objects or module state: floats and tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

KL_ESTIMATORS = ("kl", "abs", "mse", "full")


# ---------------------------------------------------------------------------------------------------------------------
# masked statistics (TRL `core.masked_mean/var/whiten`)
# ---------------------------------------------------------------------------------------------------------------------
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1; over all dims unless `dim` is given."""
    if dim is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim) / mask.sum(dim)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked positions, with Bessel's correction by default (docs/method.md §2.5)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"masked_var needs at least 2 unmasked elements, got {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean)/sqrt(var + 1e-8) over masked positions; `shift_mean=False` adds the mean back."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


# ---------------------------------------------------------------------------------------------------------------------
# log-probs, entropy, KL (docs/method.md §1.4, §2.4)
# ---------------------------------------------------------------------------------------------------------------------
def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(token) from logits. logits [B, T, V], tokens [B, T] → [B, T]."""
    return gather(F.log_softmax(logits, dim=-1), tokens)


def gather(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log π(token) from a log-softmax already taken. log_probs [B, T, V], tokens [B, T] → [B, T]."""
    return torch.gather(log_probs, -1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary entropy H(π(·|s_t)). [B, T, V] → [B, T]."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """H(π(·|s_t)) = −Σ_v π(v)·log π(v) from a log-softmax already taken (no second pass over the vocabulary's
    exponentials). [B, T, V] → [B, T]."""
    return -(log_probs.exp() * log_probs).sum(-1)


def full_kl(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """kl_t = Σ_v π(v|s_t)·[log π(v|s_t) − log π0(v|s_t)] (docs/method.md §1.4, TRL `kl_penalty="full"`).

    logits, ref_logits [B, T, V] → [B, T].
    """
    return full_kl_of(F.log_softmax(logits, dim=-1), F.log_softmax(ref_logits, dim=-1))


def full_kl_of(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """`full_kl` from both log-softmaxes already taken. [B, T, V] twice → [B, T]."""
    return F.kl_div(ref_log_probs, log_probs, log_target=True, reduction="none").sum(-1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token sampled KL estimator of docs/method.md §2.4. [B, T] → [B, T].

    `full` needs whole distributions and is computed by `full_kl` instead.
    """
    diff = logprobs - ref_logprobs
    if estimator == "kl":
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator == "mse":
        return 0.5 * diff.square()
    raise ValueError(f"kl_penalty estimator must be one of kl, abs, mse here (full uses full_kl), got {estimator!r}")


def penalized_rewards(
    scores: torch.Tensor, kls: torch.Tensor, kl_coef: float, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """r̂_t = −β·kl_t + 1[t = T]·score (paper Eq. 2 / Eq. 8; TRL `compute_rewards`).

    Args:
        scores: [B] sequence-level (collective, possibly scaled) rewards.
        kls: [B, T] per-token KL.
        kl_coef: β.
        response_mask: [B, T].
    Returns:
        rewards [B, T] (masked), non_score_rewards [B, T] = −β·kl (masked).
    """
    non_score = -kl_coef * kls * response_mask
    last = response_mask.sum(-1).long() - 1  # index of the last response token (EOS if generated)
    rewards = non_score.clone()
    rewards[torch.arange(len(scores)), last] += scores.to(rewards.dtype)
    return rewards, non_score


# ---------------------------------------------------------------------------------------------------------------------
# advantages and losses (docs/method.md §2.5, §2.6)
# ---------------------------------------------------------------------------------------------------------------------
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten_rewards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation with V_{T+1} = 0, then advantage whitening (TRL `compute_advantages`).

    Args:
        rewards: [B, T] per-token rewards.
        values: [B, T] V_t, the value of the state before token t.
        response_mask: [B, T].
    Returns:
        advantages [B, T] (whitened over all masked tokens of the batch), returns [B, T] = A + V (unwhitened A).
    """
    advantages, returns = gae_unwhitened(rewards, values, response_mask, gamma, lam, whiten_rewards)
    return masked_whiten(advantages, response_mask).detach(), returns


def gae_unwhitened(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten_rewards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gae` before the advantages are whitened: (A [B, T], returns [B, T] = A + V), both detached."""
    values = values * response_mask
    rewards = rewards * response_mask
    if whiten_rewards:
        rewards = masked_whiten(rewards, response_mask, shift_mean=False) * response_mask  # keep padding at 0
    T = rewards.shape[-1]
    last_gae = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t < T - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = delta + gamma * lam * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns.detach()


def whiten_by_group(values: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """`masked_whiten` within each group of rows separately: rows with the same `groups` id [B] share one mean and
    one variance over their masked positions. values, mask [B, T] (or [B] with mask [B]) → the same shape, masked."""
    out = torch.zeros_like(values)
    for g in torch.unique(groups):
        rows = (groups == g).to(mask.dtype)
        in_group = mask * (rows.view(-1, *([1] * (mask.dim() - 1))))
        out = out + masked_whiten(values, in_group) * in_group
    return out


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased, non-negative estimator of KL(π_θ ‖ π0) on sampled tokens (Schulman's k3, the GRPO paper's
    KL term): exp(log π0 − log π_θ) − (log π0 − log π_θ) − 1. [B, T] → [B, T]."""
    diff = ref_logprobs - logprobs
    return torch.exp(diff) - diff - 1


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped surrogate L_pg = mean_t max(−Â·ρ, −Â·clip(ρ, 1±ε)) (docs/method.md §2.6).

    All inputs [B, T]. Returns (loss [], clipfrac [], mean ratio []).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    losses = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.max(losses, losses_clipped), response_mask)
    clipfrac = masked_mean(torch.gt(losses_clipped, losses).float(), response_mask)
    return loss, clipfrac, masked_mean(ratio, response_mask)


def value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ½·mean_t max((V−G)², (clip(V, V_old±ε)−G)²) (docs/method.md §2.6).

    All inputs [B, T]. Returns (loss [], clipfrac []).
    """
    vpreds_clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    losses = (vpreds - returns) ** 2
    losses_clipped = (vpreds_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(losses, losses_clipped), response_mask)
    clipfrac = masked_mean(torch.gt(losses_clipped, losses).float(), response_mask)
    return loss, clipfrac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """1 − Var(G − V)/Var(G) over masked tokens; 1 is a perfect critic, ≤ 0 a useless one."""
    return 1 - masked_var(returns - values, response_mask) / masked_var(returns, response_mask)


# ---------------------------------------------------------------------------------------------------------------------
# score scaling (docs/method.md §2.3) and KL control (§2.8)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class RunningMoments:
    """Running mean/std of every score seen, merged batch by batch (TRL `RunningMoments`)."""

    mean: float = 0.0
    std: float = 1.0
    var: float = 1.0
    count: float = 1e-24

    def update(self, xs: torch.Tensor) -> None:
        """Merge a batch [B] by parallel Welford (biased batch variance); `std` carries Bessel's correction."""
        xs_count = xs.numel()
        xs_var, xs_mean = torch.var_mean(xs.double(), unbiased=False)
        xs_mean, xs_var = xs_mean.item(), xs_var.item()
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        new_sum = xs_var * xs_count
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / tot_count
        tot_sum = old_sum + new_sum
        self.mean += delta * xs_count / tot_count
        self.var = tot_sum / tot_count
        self.std = (self.var * tot_count / (tot_count - 1)) ** 0.5
        self.count = tot_count


def scale_scores(scores: torch.Tensor, moments: RunningMoments, norm: bool, clip: float | None) -> torch.Tensor:
    """R̃ = (R − μ)/(σ + ε) with `norm`, else R/(σ + ε); then optional clip to ±clip. [B] → [B].

    `moments` must already include this batch (TRL updates them before use).
    """
    eps = torch.finfo(scores.dtype).eps
    if norm:
        scores = (scores - moments.mean) / (moments.std + eps)
    else:
        scores = scores / (moments.std + eps)
    return scores if clip is None else torch.clamp(scores, -clip, clip)


@dataclass
class KLController:
    """β with TRL's adaptive rule, or fixed (docs/method.md §2.8).

    Adaptive: e = clip(KL/target − 1, ±0.2); β ← β·(1 + e·n/horizon), run after the PPO epochs. No defaults: the
    values come from the learner block of the YAML (`PPOConfig`).
    """

    value: float
    adaptive: bool
    target: float
    horizon: float

    def update(self, current_kl: float, n_steps: int) -> None:
        if not self.adaptive:
            return
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon
