"""What the KL-regularised optimum would gain on a run's held-out prompts, measured on the initial model.

    cory-measure kl-optimum --samples 16 experiment=quickstart algorithm=ppo [--out optimum.json]

Builds the run exactly as `cory-train <overrides>` would (model, task, seed, held-out prompts and their length
draws), then, without any update, samples `--samples` answers to each held-out prompt from the first agent's initial
policy π0, as its evaluation samples them, and scores them. Per prompt it forms the policy that maximises
E[r] − η·KL(π‖π0) at the task's η_eval, π* ∝ π0·exp(r/η), restricted to those samples (weights w_i ∝ exp(r_i/η)
on K answers drawn from π0), and reports over the prompts:
- the within-prompt standard deviation of the task reward (what any learner can exploit: the spread between
  answers to one prompt);
- the optimum's task-reward gain Σ w_i r_i − mean r, its KL Σ w_i log(K·w_i) and its combined-reward gain, the
  difference of the two, which equals η·log mean exp(r/η) − mean r.

The combined-reward gain is never negative (π0 itself is a candidate) and, by Jensen's inequality on the log of a
sample mean, its expectation lies below the exact optimum's η·log E exp(r/η) − E r: a lower bound, which tightens as
K grows; the KL is at most log K. Read against a run's held-out numbers, it says whether the task leaves room for a
rise in the combined reward and how far a learner's reward-for-KL is from the best possible one.

Overrides that do not compose or validate, `--samples` under 2, a reward that is NaN or an unwritable `--out` are
one line and exit code 2. The same command: `python -m cory.studies.kl_optimum`.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command
from cory.studies.command import StudyError


def tilted(rewards: Sequence[float], eta: float) -> dict[str, float]:
    """The KL-regularised optimum over K answers to one prompt, each drawn from π0 (K = len(rewards) ≥ 1).

    Weights w_i = exp(r_i/η) / Σ_j exp(r_j/η) (shifted by max r for stability); returns the task-reward gain
    Σ w_i r_i − mean r, the KL of w to the uniform weights 1/K, Σ w_i log(K·w_i), and the combined gain
    (reward gain − η·KL = η·log mean exp(r/η) − mean r), all floats.
    """
    top = max(rewards)
    weights = [math.exp((r - top) / eta) for r in rewards]
    total = sum(weights)
    weights = [w / total for w in weights]
    k = len(rewards)
    gain = sum(w * r for w, r in zip(weights, rewards)) - statistics.fmean(rewards)
    kl = sum(w * math.log(k * w) for w in weights if w > 0)
    return {"reward_gain": gain, "kl": kl, "combined_gain": gain - eta * kl}


def _mean_se(values: list[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.fmean(values), se


def run(argv: Sequence[str] | None = None, prog: str = "cory-measure kl-optimum") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument(
        "--samples", type=command.positive_int, default=16, help="answers sampled per held-out prompt (default 16)"
    )
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of a run")
    args = parser.parse_args(argv)
    if args.samples < 2:
        raise StudyError(f"--samples {args.samples}: the optimum over one answer is π0 itself; give 2 or more")

    import torch

    from cory.build import build_algorithm, build_context
    from cory.tasks.base import SafeScorer

    cfg = command.compose(args.overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        algorithm = build_algorithm(cfg, build_context(cfg, Path(run_dir)))
        team, task = getattr(algorithm, "team", None), getattr(algorithm, "task", None)
        if team is None or task is None or not getattr(team, "eval_queries", None):
            raise StudyError(f"{type(algorithm).__name__} has no agents evaluated on held-out prompts to measure")
        actor = next(iter(team.agents.values())).actor
        queries, lengths = team.eval_queries, team.eval_lengths
        k = args.samples
        repeated = [q for q in queries for _ in range(k)]
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            rollout = actor.act(
                [task.pioneer_prompt(q) for q in repeated],
                max(lengths),
                task.generation_kwargs,
                team.eval_batch_size,
                lengths=[n for n in lengths for _ in range(k)],
                evaluation=True,
            )
        scores, _failed = SafeScorer(task)(repeated, rollout.responses)
    if not all(math.isfinite(s) for s in scores):
        raise StudyError("the reward scored NaN or infinity on some answer; check the task's reward")
    eta = float(task.eval_kl_coef)
    groups = [scores[i * k : (i + 1) * k] for i in range(len(queries))]
    optima = [tilted(g, eta) for g in groups]
    result: dict = {"overrides": args.overrides, "prompts": len(queries), "samples": k, "eta": eta}
    result["initial_task_reward"] = _mean_se(scores)[0]
    result["within_prompt_sd"] = statistics.fmean(statistics.stdev(g) for g in groups)
    for key in ("reward_gain", "kl", "combined_gain"):
        result[key], result[f"{key}_se"] = _mean_se([o[key] for o in optima])
    command.emit_json(result, args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
