"""Critic-free learners: GRPO and RLOO advantages on PPO's clipped objective and KL penalty (docs/method.md §9).

The agent is PPO's (`cory.ppo.learner.Agent`) with two changes: the advantage of every response token is its
sequence's advantage against the other samples of its prompt (a group of G), and there is no value term (the value
head is neither trained nor stepped). Score scaling, the KL-shaped reward with its adaptive β, the clipped surrogate,
epochs, minibatches and checkpoints are PPO's, unchanged.

G samples per prompt come from the agent team: it reads `group_size` from the learner node and repeats each query G
times contiguously (`cory.algorithms.team.QuerySchedule`), so PPO's and CORY's orchestration need no change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cory.errors import ConfigError
from cory.ppo import advantages as group_core
from cory.ppo.learner import Agent, PPOConfig


@dataclass(frozen=True)
class CriticFreeConfig(PPOConfig):
    """PPO's learner block plus the group baseline (`cory/conf/algorithm/grpo.yaml`, `rloo.yaml`).

    `gamma`, `lam`, `whiten_rewards`, `vf_coef` and `cliprange_value` are accepted (the block is PPO's) and unused:
    the completion is one action, its advantage comes from the group, and there is no value loss.
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "group_size": "[2, inf); a group baseline",
    }

    advantage: str  # `grpo`: (R − mean)/(std + ε) over the group; `rloo`: R − mean of the other G − 1
    group_size: int  # G samples per prompt; `batch_size` samples per iteration hold batch_size / G prompts

    def __post_init__(self) -> None:
        super().__post_init__()
        key = "algorithm.agent."
        if self.advantage not in group_core.ADVANTAGES:
            raise ConfigError(f"{key}advantage={self.advantage!r}: allowed {group_core.ADVANTAGES}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ConfigError(f"{key}group_size={self.group_size}: must be an integer >= 2 (a group baseline)")

    def check_batch(self, batch_size: int) -> None:
        """Whole groups in every batch, and PPO's minibatch rule."""
        if batch_size % self.group_size:
            raise ConfigError(
                f"algorithm.agent.group_size={self.group_size} must divide batch_size={batch_size} "
                "(batch_size counts samples: batch_size / group_size prompts per iteration)"
            )
        super().check_batch(batch_size)

    def describe(self) -> dict[str, object]:
        return {"advantage": self.advantage, "group_size": self.group_size}

    def build(self, name: str, model, ref_model, tokenizer, **placement) -> CriticFreeAgent:
        return CriticFreeAgent(name, model, ref_model, tokenizer, self, **placement)


class CriticFreeAgent(Agent):
    """PPO's agent with group advantages and no value term (docs/method.md §9)."""

    trains_value = False

    def advantages(
        self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Â_{i,t} = A_i on every response token of sample i, A from the group baseline of the KL-shaped sequence
        returns R_i − β·Σ_t kl_{i,t}; `values` are ignored. Returns (advantages [B, T], returns [B, T]: the sequence
        return on every token, for the record)."""
        cfg = self.config
        returns = group_core.sequence_returns(rewards, mask)
        advantages = group_core.group_advantages(returns, cfg.group_size, cfg.advantage)
        self.advantage_stats = {"zero_spread_groups": group_core.zero_spread_groups(returns, cfg.group_size).item()}
        return group_core.broadcast(advantages, mask), group_core.broadcast(returns, mask)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's parameters without its value head: no value loss trains it, so no optimiser holds it."""
        own = {id(p) for p in self.policy.trainable_parameters()}
        return [p for n, p in self.policy.named_parameters() if id(p) in own and not n.startswith("v_head.")]
