"""Pure maths of the critic-free learners (docs/method.md §9): group baselines over G samples of one prompt.

A batch of B = N·G samples holds N prompts, each repeated G times contiguously (`cory.algorithms.team.QuerySchedule`
with `group_size=G`): samples g·G … g·G + G − 1 share prompt g. Floats and tensors in, tensors out.
"""

from __future__ import annotations

import torch

ADVANTAGES = ("grpo", "rloo")
# Added to the group standard deviation before dividing (GRPO): TRL 1.16's `GRPOTrainer` value, so that a group whose
# rewards are all equal gets advantage 0 rather than 0/0, and our numbers equal TRL's (tests/test_critic_free.py).
GRPO_STD_EPS = 1e-4


def sequence_returns(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """R_i − β·Σ_t kl_{i,t}: the undiscounted return of each response from its first token. [B, T] → [B].

    `rewards` are the KL-shaped token rewards of `cory.ppo.core.penalized_rewards` (score on the last token, −β·kl_t
    on every token), so this is the sequence reward with the KL penalty inside it, as RLOO (Ahmadian et al., arXiv
    2402.14740) defines its reward.
    """
    return (rewards * response_mask).sum(-1)


def group_advantages(returns: torch.Tensor, group_size: int, kind: str) -> torch.Tensor:
    """Sequence-level advantages of B = N·G samples from their returns [B] → [B].

    - `grpo` (DeepSeekMath, arXiv 2402.03300, §4.1.2 outcome supervision):
      A_i = (R_i − mean_group(R)) / (std_group(R) + ε), std with Bessel's correction (as TRL), ε = `GRPO_STD_EPS`.
      Sums to zero over each group.
    - `rloo` (Ahmadian et al., arXiv 2402.14740, the RLOO estimator): A_i = R_i − 1/(G−1)·Σ_{j≠i} R_j, the
      leave-one-out baseline; equivalently G/(G−1)·(R_i − mean_group(R)), so it sums to zero over each group too.
    """
    if group_size < 2:
        raise ValueError(f"a group baseline needs group_size >= 2, got {group_size}")
    if returns.ndim != 1 or returns.numel() % group_size:
        raise ValueError(f"returns must be [N·G] with G={group_size}, got shape {tuple(returns.shape)}")
    grouped = returns.view(-1, group_size)  # [N, G]
    if kind == "grpo":
        mean = grouped.mean(dim=1, keepdim=True)
        std = grouped.std(dim=1, keepdim=True)  # unbiased
        return ((grouped - mean) / (std + GRPO_STD_EPS)).reshape(-1)
    if kind == "rloo":
        baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
        return (grouped - baseline).reshape(-1)
    raise ValueError(f"advantage must be one of {ADVANTAGES}, got {kind!r}")


def zero_spread_groups(returns: torch.Tensor, group_size: int) -> torch.Tensor:
    """Fraction [] of groups whose G returns are all equal: their advantages are 0, they teach nothing."""
    grouped = returns.view(-1, group_size)
    return (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean()


def broadcast(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The sequence advantage on every response token (one action per completion), zero on padding. [B] → [B, T]."""
    return advantages.unsqueeze(-1) * response_mask
