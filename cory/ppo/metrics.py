"""What the PPO learner's agents log: the catalogue of names (`PPO_METRICS`) and the functions that fill it.

PPO and CORY both report every agent through `agent_metrics`, so their logged quantities are the same by
construction (docs/method.md §6). `<agent>` in a name is the agent id (`llm1`, `llm2`); the docs' metric table is
generated from `PPO_METRICS` (`cory.metrics.markdown_table`).
"""

from __future__ import annotations

import math

import torch

from cory.metrics import AGENT_PLACEHOLDER, eval_key, ppo_key, train_key
from cory.ppo.rollout import Rollout

_A = AGENT_PLACEHOLDER
# Every name PPO and CORY log per agent (a pattern: `<agent>` is llm1/llm2), with its one-line definition.
PPO_METRICS: dict[str, str] = {
    # Training rollouts, per agent, in the agent's current role and prompt (batch means).
    train_key(_A, "task_reward"): "Task reward r(q, a) of the agent's own response, before any score scaling.",
    train_key(_A, "kl"): (
        "KL_seq: per-token KL to π0 on the agent's own prompt (the penalty's estimator, `full` by default: "
        "Σ_v π_θ log π_θ/π0), summed over response tokens (EOS included)."
    ),
    train_key(_A, "kl_per_token"): "KL_seq / T per response, batch mean.",
    train_key(_A, "kl_coef"): "β used for this iteration's KL-shaped rewards (before the adaptive controller update).",
    train_key(_A, "combined_reward"): (
        "r − η_eval·KL_seq with the task's fixed η_eval (IMDB 0.3, GSM8K 0.01), the same for every algorithm."
    ),
    train_key(_A, "combined_reward_current_beta"): (
        "r − β·KL_seq with the agent's current β (secondary; the official code's `LLM*_index`)."
    ),
    train_key(_A, "response_length"): "T: response tokens, EOS included if generated.",
    train_key(_A, "tokens"): (
        "Prompt + response tokens of the batch, padding excluded: the work of each forward and backward pass."
    ),
    train_key(_A, "hit_max_tokens"): "Fraction of responses that reached `max_new_tokens`.",
    train_key(_A, "entropy"): (
        "Mean over response tokens of the full-vocabulary entropy H(π_θ(·|s_t)), from rollout-time logits."
    ),
    train_key(_A, "sampled_entropy"): "Σ_t −log π_θ(a_t|s_t) per response, batch mean (TRL's `objective/entropy`).",
    train_key(_A, "collective_reward"): (
        "R_i = w_self·r_i + w_other·r_{−i}, the reward PPO optimises (before score scaling); equals r for PPO."
    ),
    train_key(_A, "scaled_collective_reward"): (
        "R̃_i: R_i as it enters the last token's reward, after score scaling, normalisation and clipping "
        "(`use_score_scaling`, `use_score_norm`, `score_clip`); equals `collective_reward` when they are off."
    ),
    # PPO internals, per agent (means over epochs and minibatches).
    ppo_key(_A, "policy_loss"): "Clipped surrogate policy loss.",
    ppo_key(_A, "value_loss"): (
        "Clipped value-function loss (with `critic: centralized`, the shared critic's on this agent's tokens)."
    ),
    ppo_key(_A, "clipfrac"): "Fraction of response tokens where the clipped policy term is the active one.",
    ppo_key(_A, "value_clipfrac"): "Fraction of response tokens where the clipped value term is the active one.",
    ppo_key(_A, "approx_kl"): "½·mean((log π_θ − log π_old)²) over response tokens (TRL's `policy/approxkl`).",
    ppo_key(_A, "policy_kl"): (
        "mean(log π_old − log π_θ) over response tokens (TRL's `policy/policykl`), the early-stopping statistic."
    ),
    ppo_key(
        _A, "entropy"
    ): "Mean full-vocabulary token entropy in the training forward pass (TRL's `policy/entropy`).",
    ppo_key(_A, "ratio"): "Mean probability ratio π_θ / π_old over response tokens.",
    ppo_key(
        _A, "ratio_threshold_hits"
    ): "Minibatches whose mean ratio exceeded `ratio_threshold` (loss zeroed, as TRL).",
    ppo_key(_A, "explained_variance"): (
        "1 − Var(returns − values) / Var(returns) over response tokens (learners with a critic: not GRPO, RLOO; "
        "with `critic: centralized`, the shared critic's values)."
    ),
    ppo_key(_A, "zero_spread_groups"): (
        "GRPO and RLOO: fraction of prompt groups whose G KL-shaped returns are all equal (advantage 0: no signal)."
    ),
    ppo_key(_A, "mean_non_score_reward"): "Masked token mean of −β·kl_t (TRL's `ppo/mean_non_score_reward`).",
    ppo_key(_A, "kl_loss"): (
        "`algorithm/loss=ppo_kl_in_loss`: mean over response tokens of the k3 KL estimate the loss adds β times "
        "(the token rewards then carry no KL penalty)."
    ),
    ppo_key(_A, "early_stopped"): (
        "1 when the early-stopping test (policy_kl > 1.5·target_kl, checked after each epoch as TRL does) fired "
        "and ended the epochs; always 0 with `early_stopping=false`."
    ),
    ppo_key(_A, "nonfinite_skipped"): "1 when the whole update was skipped for a non-finite reward, KL or value.",
    ppo_key(_A, "nonfinite_steps"): "Optimiser steps skipped because a gradient was non-finite.",
    "train/reward_failures": "Samples whose reward function raised this iteration (given the task's failure reward).",
    # Evaluation: each agent alone, query-only (pioneer) prompt, held-out queries, dropout off (docs/method.md §1.6).
    eval_key(_A, "task_reward"): "Task reward of the agent alone on held-out queries (frontier x-axis).",
    eval_key(_A, "kl"): "KL_seq on the query-only prompt against π0 on held-out queries (frontier y-axis is −KL_seq).",
    eval_key(_A, "combined_reward"): "r − η_eval·KL_seq on held-out queries, fixed η_eval shared by all algorithms.",
    eval_key(_A, "task_reward_se"): "Standard error of the held-out task reward: sample std / √n over the n prompts.",
    eval_key(_A, "kl_se"): "Standard error of the held-out KL_seq: sample std / √n over the n prompts.",
    eval_key(_A, "combined_reward_se"): "Standard error of the held-out combined reward: sample std / √n.",
    eval_key(_A, "response_length"): "T on held-out queries, EOS included if generated.",
    eval_key(_A, "reward_failures"): "Held-out samples whose reward raised (given the task's failure reward).",
    eval_key(_A, "no_answer_rate"): "GSM8K and arithmetic: share of held-out responses with no number (reward 0).",
    # Cost.
    "time/generate_s": "Seconds spent generating responses this iteration (all agents).",
    "time/learn_s": "Seconds spent in PPO updates this iteration (all agents).",
}
del _A


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
        learn_stats: what the learner's update returned (`Update.stats`) for this rollout.
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
    # update statistics → logged names (the learner keeps TRL's key names for the parity script)
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
        "zero_spread_groups": "zero_spread_groups",
        "mean_non_score_reward": "mean_non_score_reward",
        "kl_loss": "kl_loss",
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


# The per-agent values whose non-finiteness makes an iteration "bad" (its update skipped, `nonfinite`).
_WATCHED = ("task_reward", "kl", "policy_loss", "value_loss")


def nonfinite(metrics: dict[str, float]) -> bool:
    """Whether an iteration's metrics show a non-finite reward, KL or loss, or a skipped update."""
    skipped = any(v > 0 for k, v in metrics.items() if k.endswith("/nonfinite_skipped"))
    watched = [v for k, v in metrics.items() if k.split("/")[-1] in _WATCHED]
    return skipped or not all(math.isfinite(v) for v in watched)


def headline(metrics: dict[str, float], agents: list[str]) -> dict[str, float]:
    """Reward, KL and β of each agent: the progress bar and the per-iteration log line."""
    out = {}
    for agent in agents:
        for name, short in (("task_reward", "r"), ("kl", "kl"), ("kl_coef", "beta")):
            out[f"{agent}_{short}"] = metrics.get(train_key(agent, name), float("nan"))
    return out
