"""Held-out evaluation of one agent alone in the query-only (pioneer) role (docs/method.md §1.6).

PPO's agent and each CORY agent are evaluated identically, so their numbers are the same quantity:
task reward r(q, a), KL_seq = Σ_t full-vocabulary KL to π0 on the query-only prompt, and the combined reward
r − η_eval·KL_seq with η_eval fixed per task and shared by all algorithms, plus what the task defines
(`eval_metrics(queries, responses)`, optional). pass@k with n samples per problem is `cory.evaluate`'s job.

Evaluation always samples in eval mode (dropout off), whatever `generate_in_train_mode` says: that option
reproduces TRL's training-time sampling (docs/method.md §2.1) and would otherwise make the evaluation at
iteration 0 (eval mode, no update yet) and the later ones differ by dropout as well as by the policy.
"""

from __future__ import annotations

import torch

from cory.ppo.actor import Actor
from cory.tasks.base import SafeScorer, Task


def eval_lengths(num: int, max_new_tokens: tuple[int, int], seed: int) -> list[int]:
    """One fixed `max_new_tokens` draw per held-out prompt, the same for every method and checkpoint."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = max_new_tokens
    return torch.randint(lo, hi + 1, (num,), generator=g).tolist()


def standard_error(values: torch.Tensor) -> float:
    """Sample standard deviation / √n of a 1-D tensor [n]; NaN for n < 2."""
    n = values.numel()
    return (values.float().std(unbiased=True) / n**0.5).item() if n > 1 else float("nan")


def evaluate(
    actor: Actor, task: Task, queries: list[str], lengths: list[int], batch_size: int, seed: int
) -> tuple[dict[str, float], list[dict]]:
    """Mean eval metrics for the agent `actor` answers for, and a few sample rows. Sampling uses its own seeded RNG,
    so evaluating never changes the training run's random stream."""
    with torch.random.fork_rng(devices=[actor.device] if actor.device.type == "cuda" else []):
        torch.manual_seed(seed)
        rollout = actor.act(
            [task.pioneer_prompt(q) for q in queries],
            max(lengths),
            task.generation_kwargs,
            batch_size,
            lengths=lengths,
            kl_estimator="full",
            evaluation=True,
        )
    scores, failed = SafeScorer(task)(queries, rollout.responses)
    r = torch.tensor(scores)
    kl_seq = rollout.kls.sum(-1)
    combined = r - task.eval_kl_coef * kl_seq
    metrics = {
        "task_reward": r.mean().item(),
        "kl": kl_seq.mean().item(),
        "combined_reward": combined.mean().item(),
        # standard errors of the three means over the held-out prompts (sample std / √n): how far apart two
        # evaluations must be to tell them apart; with one prompt there is no spread to estimate (NaN)
        "task_reward_se": standard_error(r),
        "kl_se": standard_error(kl_seq),
        "combined_reward_se": standard_error(combined),
        "response_length": rollout.response_mask.sum(-1).float().mean().item(),
        "reward_failures": float(failed),
    }
    if hasattr(task, "eval_metrics"):  # what a task adds (GSM8K: the share of responses with no number)
        metrics |= task.eval_metrics(queries, rollout.responses)
    samples = [
        {"query": q, "response": a, "reward": s, "kl": k}
        for q, a, s, k in zip(queries[:4], rollout.responses, scores, kl_seq.tolist())
    ]
    return metrics, samples
