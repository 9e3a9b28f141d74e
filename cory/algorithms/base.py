"""What an algorithm is to the trainer: agents plus one `step` per iteration (STYLE.md §3.3).

`Algorithm` is a Protocol with no shared implementation; `agent_metrics` is the one helper both PPO and CORY
use, so their logged quantities are the same by construction (REFERENCE.md §6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from cory.agent import Agent
from cory.rollout import Rollout


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
    """`train/<agent>/*` and `ppo/<agent>/*` for one agent's rollout and update (REFERENCE.md §6)."""
    r = torch.tensor(task_rewards, dtype=torch.float32)
    kl_seq = rollout.kls.sum(-1)
    beta = learn_stats.get("kl_coef", float("nan"))
    m = {
        "task_reward": r.mean().item(),
        "collective_reward": float(torch.tensor(collective).mean()),
        "kl": kl_seq.mean().item(),
        "kl_per_token": (kl_seq.sum() / rollout.response_mask.sum()).item(),
        "kl_coef": beta,
        "combined_reward": (r - eval_kl_coef * kl_seq).mean().item(),
        "combined_reward_current_beta": (r - beta * kl_seq).mean().item(),
        "response_length": rollout.response_mask.sum(-1).float().mean().item(),
        "tokens": float(rollout.prompt_mask.sum() + rollout.response_mask.sum()),
        "hit_max_tokens": rollout.hit_max_tokens.float().mean().item(),
        "entropy": learn_stats.get("entropy", float("nan")),
        "sampled_entropy": learn_stats.get("sampled_entropy", float("nan")),
    }
    out = {f"train/{agent_id}/{k}": v for k, v in m.items()}
    ppo_keys = (
        "policy_loss",
        "value_loss",
        "clipfrac",
        "value_clipfrac",
        "approx_kl",
        "ratio",
        "ratio_threshold_hits",
        "explained_variance",
        "mean_non_score_reward",
        "nonfinite_skipped",
        "nonfinite_steps",
    )
    out.update({f"ppo/{agent_id}/{k}": learn_stats[k] for k in ppo_keys if k in learn_stats})
    if "train_entropy" in learn_stats:
        out[f"ppo/{agent_id}/entropy"] = learn_stats["train_entropy"]
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
