"""Metric names: the key helpers every algorithm uses, the trainer's own metrics, and the markdown tables of docs.

Each algorithm (or learner) keeps the catalogue of the names it emits beside its code, one line of definition per
name: `cory.ppo.metrics.PPO_METRICS` (PPO and CORY's per-agent metrics), `cory.algorithms.team.TEAM_METRICS` (the
role map and schedule of a team, with `role_metrics` for its by-role views), `cory.maft.metrics.MAFT_METRICS`;
`RUN_METRICS` below holds what the trainer adds to every iteration. docs/metrics.md is generated from them
(`markdown_table`), and a run emits no name its catalogues do not define (tests/test_meaning.py).
"""

from __future__ import annotations

from collections.abc import Mapping

AGENT_PLACEHOLDER = "<agent>"
# Role names an episode may declare (`cory/algorithms/episodes.py`), used in place of an agent name for the by-role
# training curves (`train/pioneer/...`): CORY's two, a chain's third, a team's parallel actors.
ROLES = ("pioneer", "observer", "second_observer", "actor1", "actor2", "actor3")

TIME_ITERATION = "time/iteration_s"
MEMORY_PEAK_MB = "memory/peak_mb"
NONFINITE_ITERATIONS = "train/nonfinite_iterations"


def train_key(agent: str, name: str) -> str:
    """Training-rollout metric of one agent in its current role, e.g. `train/llm1/task_reward`."""
    return f"train/{agent}/{name}"


def ppo_key(agent: str, name: str) -> str:
    """PPO-update internal of one agent, e.g. `ppo/llm1/clipfrac`."""
    return f"ppo/{agent}/{name}"


def eval_key(agent: str, name: str) -> str:
    """Held-out evaluation metric of one agent alone in the query-only role, e.g. `eval/llm1/kl`."""
    return f"eval/{agent}/{name}"


def role_key(role: str, name: str) -> str:
    """Training metric of whichever agent holds `role` (one of `ROLES`), e.g. `train/pioneer/kl`."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return f"train/{role}/{name}"


# The metrics that have a better direction ("max" or "min"), whatever the algorithm: W&B keeps their best value so far
# beside the last (`best/<name>`, `best_iteration/<name>`; `cory.loggers.WandbLogger`). Held-out rewards and
# accuracies only: not KL (less is not better on its own), standard errors, lengths, counts or failure rates, nor
# training-batch numbers (noisy, and from the policy being changed). `<agent>` stands for any agent.
BEST: dict[str, str] = {
    "eval/<agent>/task_reward": "max",
    "eval/<agent>/combined_reward": "max",
    "maft/eval/accuracy": "max",
    "maft/eval/single_sample_accuracy": "max",
    "maft/eval/round1_majority_accuracy": "max",
}

# What the trainer adds to every training iteration, whatever the algorithm.
RUN_METRICS: dict[str, str] = {
    NONFINITE_ITERATIONS: "Cumulative iterations with a non-finite loss, reward or KL (update skipped).",
    TIME_ITERATION: "Wall-clock seconds of the whole training iteration.",
    MEMORY_PEAK_MB: "Peak memory in MB: CUDA max allocated on GPU, process peak RSS on CPU.",
}


def is_known_metric(name: str, catalogue: Mapping[str, str]) -> bool:
    """Whether `name` matches a pattern of `catalogue` (any agent name but a role name in place of `<agent>`)."""
    if name in catalogue:
        return True
    parts = name.split("/")
    if len(parts) == 3 and parts[1] not in ROLES:  # the by-role views are defined one by one
        return "/".join((parts[0], AGENT_PLACEHOLDER, parts[2])) in catalogue
    return False


def best_table(best: Mapping[str, str] = BEST) -> str:
    """The docs table of the metrics with a direction (`BEST`): which value W&B keeps as the best."""
    kept = {"max": "the highest (higher is better)", "min": "the lowest (lower is better)"}
    lines = ["| metric | best value kept |", "|---|---|"]
    lines += [f"| `{name}` | {kept[direction]} |" for name, direction in best.items()]
    return "\n".join(lines) + "\n"


def markdown_table(catalogue: Mapping[str, str]) -> str:
    """A docs table of logged metrics, one row per entry of `catalogue`."""
    lines = ["| metric | definition |", "|---|---|"]
    for name, description in catalogue.items():
        escaped = description.replace("|", "\\|")
        lines.append(f"| `{name}` | {escaped} |")
    return "\n".join(lines) + "\n"
