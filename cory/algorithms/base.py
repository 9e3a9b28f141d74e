"""What an algorithm is to the trainer: agents plus one `step` per iteration.

`Algorithm` is a Protocol with no shared implementation; `agent_metrics` is the one helper both PPO and CORY
use, so their logged quantities are the same by construction (docs/method.md §6). Every name it emits is
defined in `cory.loggers.METRICS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from cory.ppo.learner import Agent
from cory.ppo.rollout import Rollout


@dataclass
class StepOutput:
    """One iteration's metrics, a few sample rows, and whether the run must reseed its RNGs (official swap)."""

    metrics: dict[str, float]
    samples: list[dict] = field(default_factory=list)
    reseed: bool = False


class Algorithm(Protocol):
    agents: dict[str, Agent]

    def step(self, queries: list[str], max_new_tokens: int, iteration: int) -> StepOutput: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def agent_metrics(
    agent_id: str,
    rollout: Rollout,
    task_rewards: list[float],
    collective: list[float],
    learn_stats: dict[str, float],
    eval_kl_coef: float,
) -> dict[str, float]:
    """`train/<agent>/*` and `ppo/<agent>/*` for one agent's rollout and update (docs/method.md §6).

    Args:
        rollout: the agent's rollout; `kls` [B, T] is zero on padding.
        task_rewards: r(q, a_i) per sample [B]; collective: R_i per sample [B], both before score scaling.
        learn_stats: what `Agent.learn` returned for this rollout.
        eval_kl_coef: the task's fixed η_eval.
    """
    r = torch.tensor(task_rewards, dtype=torch.float32)
    kl_seq = rollout.kls.sum(-1)  # [B]
    lengths = rollout.response_mask.sum(-1).float()  # [B] T_i, EOS included
    beta = learn_stats["kl_coef"]
    m = {
        "task_reward": r.mean().item(),
        "collective_reward": float(torch.tensor(collective).mean()),
        "scaled_collective_reward": learn_stats.get("scaled_score", float("nan")),
        "kl": kl_seq.mean().item(),
        "kl_per_token": (kl_seq / lengths).mean().item(),
        "kl_coef": beta,
        "combined_reward": (r - eval_kl_coef * kl_seq).mean().item(),
        "combined_reward_current_beta": (r - beta * kl_seq).mean().item(),
        "response_length": lengths.mean().item(),
        "tokens": float(rollout.prompt_mask.sum() + rollout.response_mask.sum()),
        "hit_max_tokens": rollout.hit_max_tokens.float().mean().item(),
        "entropy": learn_stats.get("entropy", float("nan")),
        "sampled_entropy": learn_stats.get("sampled_entropy", float("nan")),
    }
    out = {f"train/{agent_id}/{k}": v for k, v in m.items()}
    # `Agent.learn` keys → logged names (the learner keeps TRL's key names for the parity script)
    ppo_keys = {
        "policy_loss": "policy_loss",
        "value_loss": "value_loss",
        "clipfrac": "clipfrac",
        "value_clipfrac": "value_clipfrac",
        "approx_kl": "approx_kl",
        "policykl": "policy_kl",
        "train_entropy": "entropy",
        "ratio": "ratio",
        "ratio_threshold_hits": "ratio_threshold_hits",
        "explained_variance": "explained_variance",
        "mean_non_score_reward": "mean_non_score_reward",
        "early_stopped": "early_stopped",
        "nonfinite_skipped": "nonfinite_skipped",
        "nonfinite_steps": "nonfinite_steps",
    }
    out.update({f"ppo/{agent_id}/{name}": learn_stats[k] for k, name in ppo_keys.items() if k in learn_stats})
    return out


def sample_rows(queries: list[str], rollouts: dict[str, Rollout], rewards: dict[str, list[float]], n: int) -> list:
    """The first `n` samples of the batch as table rows: query, each role's prompt/response and reward."""
    rows = []
    for i in range(min(n, len(queries))):
        row = {"query": queries[i]}
        for role, ro in rollouts.items():
            row |= {
                f"{role}_prompt": ro.prompts[i],
                f"{role}_response": ro.responses[i],
                f"{role}_reward": rewards[role][i],
                f"{role}_kl": ro.kls[i].sum().item(),
            }
        rows.append(row)
    return rows
