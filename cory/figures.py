"""What every figure of the project shares, in one place: titles, axis units, legends, tick labels, swap marks.

- Titles say what the figure shows from the runs themselves (`RunInfo`, read from a run folder's
  `run_config.yaml`, `summary.json` and Hydra's `overrides.yaml`): algorithm, task, experiment, η (the initial
  KL coefficient `algorithm.agent.init_kl_coef`) and seed(s). What all runs share goes in the title; what differs
  is left to the legend (`title`).
- Axis units come from the task's reward (`reward_unit`, keyed by the reward's class in the run config): the
  offline IMDB reward is a TF-IDF logistic-regression logit, the paper's a DistilBERT logit, GSM8K and arithmetic
  a 0/1 correctness whose mean is a fraction. KL_seq is a sum of log-ratios in nats.
- Legends sit outside the axes (`outside_legend`), so they never cover data, and list only labelled artists that
  were drawn.
- Tick labels never carry an additive offset ("1e-5 + 0.3"): `save` turns it off on every axis.
- CORY's role exchanges (Eq. 5) are vertical lines between the last iteration in the old roles and the first in
  the new (`swap_iterations` reads the logged `cory/swaps` counter; `mark_swaps` draws them).
- `moving_mean` is the optional smoothing of training curves (the raw curve stays, faint).
- Iterations are whole numbers: an iteration axis has integer ticks only (`iteration_axis`), never 0.25.
- A quantity that barely moves is drawn as barely moving: `keep_span` gives an axis a minimum span relative to the
  values (a 0.01 % drift of β is a flat line, not a full-height zigzag).
- Settings in a legend are words (`setting_label`: `algorithm=cory seed=1` → `CORY, seed 1`), not overrides.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cory.naming import team_name

# Written by the trainer / its run folder (cory.runs.RUN_CONFIG; a lower layer cannot import cory.runs).
RUN_CONFIG, SUMMARY, OVERRIDES = "run_config.yaml", "summary.json", ".hydra/overrides.yaml"
# A team's cumulative role-exchange counter (cory.algorithms.team.TEAM_METRICS), logged every training iteration.
SWAPS_KEY = "cory/swaps"
KL_UNIT = "nats"
# The unit of a task's reward, keyed by the class name of the reward (`task.reward._target_`) or, for tasks that
# score answers themselves, of the task (`task._target_`). An unknown class gets no unit rather than a wrong one.
# The toy task's `CharacterShare` is named by its characters (`reward_unit`).
REWARD_UNITS = {
    "TfidfSentimentReward": "TF-IDF logit",  # logistic-regression decision function (cory/tasks/rewards.py)
    "ClassifierReward": "classifier logit",  # raw POSITIVE logit, e.g. lvwerra/distilbert-imdb
    "gsm8k_task": "fraction correct",  # 0/1 last-number match, averaged over a batch
    "arithmetic_task": "fraction correct",
    "GSM8KTask": "fraction correct",  # the same tasks in run folders written before they were functions
    "ArithmeticTask": "fraction correct",
    "ToyTask": "fraction of vowels",  # run folders written before the toy task's reward was a part
    "MAFT": "fraction correct",
}
ALGORITHM_NAMES = {  # how figures name each `algorithm=` option (the config's file name otherwise)
    "ppo": "PPO",
    "cory": "CORY",
    "maft": "MAFT",
    "grpo": "GRPO",
    "rloo": "RLOO",
    "cory_cc": "CORY + centralised critic",
    "cory_interleaved": "CORY interleaved",
    "cory_shared": "CORY shared policy",
    "cory_shared_per_role": "CORY shared policy, per-role advantages",
    "cory_lora_roles": "CORY LoRA per role",
    "cory_grpo": "CORY with GRPO",
    "cory_rloo": "CORY with RLOO",
    "cory_simultaneous": "CORY w/o REx",
    "cory_ccpo": "CORY counterfactual credit",  # the config; `cory_counterfactual` is the name its runs report
    "cory_counterfactual": "CORY counterfactual credit",
    "cory_chain3": "CORY three-role chain",
    "cory_teamtr": "CORY sequential updates",
    "cory_sequential": "CORY sequential updates",
    "mappo3": "MAPPO-style team of 3",
    "team3_cc": "MAPPO-style team of 3",
}


@dataclass(frozen=True)
class RunInfo:
    """What identifies a run in a figure; None where the run's files do not say."""

    algorithm: str | None = None
    task: str | None = None
    experiment: str | None = None
    kl_coef: float | None = None  # η: the initial KL coefficient β₀ (`algorithm.agent.init_kl_coef`)
    seed: int | None = None
    eval_kl_coef: float | None = None  # η_eval of the combined reward (`task.eval_kl_coef`)
    reward_unit: str | None = None


def _target_name(node: Any) -> str | None:
    target = node.get("_target_") if isinstance(node, Mapping) else None
    return str(target).rsplit(".", 1)[-1] if target else None


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def reward_unit(config: Mapping | None) -> str | None:
    """The unit of the task reward of a resolved run config (None when the reward's class is not known)."""
    config = config or {}
    task = config.get("task") or {}
    reward = task.get("reward") if isinstance(task, Mapping) else None
    if isinstance(reward, Mapping) and reward.get("bound") in ("probability", "sigmoid"):
        return "P(positive)"  # a bounded reward (docs/method.md §3.8) is a probability, whatever its classifier
    if _target_name(reward) == "CharacterShare":  # the toy task's reward: the share of a set of characters
        characters = str(reward.get("characters", ""))
        return "fraction of vowels" if set(characters) == set("aeiou") else f"fraction of {characters!r}"
    # the reward's class when the task has a reward part (an unknown one gets no unit, not its task's), else the task's
    name = _target_name(reward) if isinstance(reward, Mapping) else _target_name(task)
    if name in REWARD_UNITS:
        return REWARD_UNITS[name]
    return REWARD_UNITS.get(_target_name(config.get("algorithm")) or "")


def algorithm_name(config: Mapping | None, summary: Mapping | None = None) -> str | None:
    """The algorithm as a figure names it (`CORY`, `PPO`, `MAFT`), with the ablation or variant the run is."""
    config, summary = config or {}, summary or {}
    algorithm = config.get("algorithm") or {}
    name = (summary.get("algorithm") or _team_name(algorithm) or _target_name(algorithm) or "").lower()
    if not name:
        return None
    label = ALGORITHM_NAMES.get(name, name)
    variants = []
    episode = algorithm.get("episode") if isinstance(algorithm, Mapping) else None
    if (
        isinstance(episode, Mapping)
        and len(episode.get("roles") or ()) > 1
        and episode.get("knowledge_transfer") is False
    ):
        variants.append("w/o KT")
    if isinstance(algorithm, Mapping):  # run folders written before the parts (flat CORY switches)
        variants += [f"w/o {what}" for key, what in (("knowledge_transfer", "KT"), ("role_exchange", "REx"))
                     if algorithm.get(key) is False]  # fmt: skip
    single = algorithm.get("single_agent_ft") if isinstance(algorithm, Mapping) else None
    if single or (single is None and summary.get("single_agent_ft")):
        variants.append("single-agent FT")
    return " ".join([label, *variants])


def _option(node: Any) -> str:
    """A part's option name from its class name (`RoleSwap` → `role_swap`, `CentralizedCritic` → `centralized`)."""
    name = re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", _target_name(node) or "").lower()
    return {"per_agent_critic": "per_agent", "no_critic": "none", "centralized_critic": "centralized"}.get(name, name)


def _team_name(algorithm: Any) -> str | None:
    """The name `Team.describe` gives the policy-gradient team a config composes (`cory.naming.team_name`)."""
    episode = algorithm.get("episode") if isinstance(algorithm, Mapping) else None
    if not isinstance(episode, Mapping) or not episode.get("name"):
        return None
    parts = {k: _option(algorithm.get(k)) for k in ("critic", "advantage", "schedule", "layout", "credit")}
    advantage = algorithm.get("advantage")
    per_role = bool(advantage.get("per_role", False)) if isinstance(advantage, Mapping) else False
    sees = episode.get("sees", "latest") if episode.get("knowledge_transfer", True) else None
    return team_name(episode["name"], len(episode.get("roles") or ()), **parts, per_role=per_role, sees=sees)


def run_info(config: Mapping | None = None, summary: Mapping | None = None, overrides: Iterable[str] = ()) -> RunInfo:
    """A `RunInfo` from a resolved run config, a `summary.json` and Hydra overrides (any may be missing)."""
    config, summary = dict(config or {}), dict(summary or {})
    task = config.get("task") if isinstance(config.get("task"), Mapping) else {}
    agent = (config.get("algorithm") or {}).get("agent") if isinstance(config.get("algorithm"), Mapping) else None
    given = dict(str(o).lstrip("+~").split("=", 1) for o in overrides if "=" in str(o))
    seed = config.get("seed", summary.get("seed"))
    return RunInfo(
        algorithm=algorithm_name(config, summary),
        task=task.get("name") or summary.get("task"),
        experiment=given.get("experiment"),
        kl_coef=_number((agent or {}).get("init_kl_coef") if isinstance(agent, Mapping) else summary.get("kl_coef")),
        seed=int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None,
        eval_kl_coef=_number(task.get("eval_kl_coef")),
        reward_unit=reward_unit(config),
    )


def read_run_info(run_dir: str | Path, config_file: str | Path | None = None, summary_file: str | Path | None = None):
    """`run_info` of a run folder; `config_file` / `summary_file` replace its `run_config.yaml` / `summary.json`
    (e.g. copies kept beside a committed figure). Missing or unreadable files are skipped."""
    import yaml

    run_dir = Path(run_dir)

    def load(path: Path, parse) -> Any:
        try:
            return parse(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError, yaml.YAMLError):
            return None

    config = load(Path(config_file) if config_file else run_dir / RUN_CONFIG, yaml.safe_load)
    summary = load(Path(summary_file) if summary_file else run_dir / SUMMARY, json.loads)
    # a run folder's Hydra record, or the copy beside a run's results (`cory-sweep --results`)
    overrides = load(run_dir / OVERRIDES, yaml.safe_load) or load(run_dir / Path(OVERRIDES).name, yaml.safe_load)
    return run_info(
        config if isinstance(config, Mapping) else None,
        summary if isinstance(summary, Mapping) else None,
        [str(o) for o in overrides] if isinstance(overrides, list) else (),
    )


def _join(values: Sequence) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def describe(infos: Sequence[RunInfo]) -> str:
    """The runs in one line: algorithm(s), task, experiment, η and seed(s); fields no run knows are left out."""

    def values(field: str) -> list:
        return list(dict.fromkeys(getattr(i, field) for i in infos if getattr(i, field) is not None))

    parts = []
    if algorithms := values("algorithm"):
        parts.append(" vs ".join(algorithms))
    if tasks := values("task"):
        parts.append(f"task {_join(tasks)}")
    if experiments := values("experiment"):
        parts.append(f"experiment {_join(experiments)}")
    if etas := values("kl_coef"):
        parts.append(f"η={_join(sorted(etas))}")
    if seeds := values("seed"):
        parts.append(f"seed{'s' if len(seeds) > 1 else ''} {_join(sorted(seeds))}")
    return " · ".join(parts)


TITLE_WIDTH = 100  # characters per title line: a longer one runs past the edges of a 10-inch figure


def title(
    infos: Sequence[RunInfo], heading: str = "", note: str = "", fallback: str = "", width: int = TITLE_WIDTH
) -> str:
    """`heading`, then what the runs are (`describe`, or `fallback` when their files say nothing), then `note`,
    wrapped at the " · " between facts into lines of at most `width` characters (six algorithms' names and the run
    facts do not fit on one)."""
    parts = [p for p in (describe(infos) or fallback, note) if p]
    lines: list[str] = []
    for part in " · ".join(parts).split(" · ") if parts else []:
        for piece in textwrap.wrap(part, width, break_on_hyphens=False) or [part]:
            if lines and len(lines[-1]) + 3 + len(piece) <= width:
                lines[-1] += " · " + piece
            else:
                lines.append(piece)
    return "\n".join(p for p in (heading, *lines) if p)


# how a setting reads in a legend: the algorithm by its figure name, η as in the titles, groups by name and value
SETTING_WORDS = {"algorithm.agent.init_kl_coef": "η=", "task.eval_kl_coef": "η_eval=", "seed": "seed "}


def setting_label(label: str) -> str:
    """A group's settings in words: `algorithm=cory seed=1` (or comma-separated, as a sweep's folders name them)
    → `CORY, seed 1`; `algorithm.agent.learning_rate=1e-05` → `learning rate 1e-05`. Text without `=` is kept."""
    if "=" not in label:
        return label
    words = []
    for part in re.split(r"[ ,](?=[\w.+~/-]+=)", label.strip()):
        key, _, value = part.lstrip("+~").partition("=")
        if key == "algorithm":
            words.append(ALGORITHM_NAMES.get(value, value))
        elif key in SETTING_WORDS:
            words.append(f"{SETTING_WORDS[key]}{value}")
        else:
            words.append(f"{key.rsplit('.', 1)[-1].replace('_', ' ')} {value}")
    return ", ".join(words)


def shared(infos: Sequence[RunInfo], field: str) -> Any:
    """The value of `field` if every run that knows it agrees, else None."""
    values = {getattr(i, field) for i in infos if getattr(i, field) is not None}
    return values.pop() if len(values) == 1 else None


def with_unit(quantity: str, unit: str | None) -> str:
    return f"{quantity} ({unit})" if unit else quantity


def seeds_note(counts: Iterable[int]) -> str:
    """What a curve or point is over its seeds: "one seed" (nothing to spread), else the mean and its band."""
    counts = sorted(set(counts))
    if not counts or counts == [1]:
        return "one seed"
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"mean over {n} seeds"


# -------------------------------------------------------------------------------------------- drawing helpers
def outside_legend(ax, *, fontsize: float = 8, **kwargs):
    """The axes' legend to the right of it, outside the data area; None when nothing labelled was drawn."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    options = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "fontsize": fontsize}
    return ax.legend(handles, labels, **(options | kwargs))


def figure_legend(fig, axes: Iterable, *, fontsize: float = 8, ncols: int = 4, **kwargs):
    """One legend for several panels, below them: each label once, in the order first drawn."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if not entries:
        return None
    options = {"loc": "outside lower center", "fontsize": fontsize, "ncols": min(ncols, len(entries))}
    return fig.legend(list(entries.values()), list(entries), **(options | kwargs))


def iteration_axis(ax) -> None:
    """Integer ticks on the x-axis: iterations are whole numbers (2 iterations do not get 0.25 steps)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def keep_span(ax, fraction: float = 0.2) -> None:
    """A y-axis at least `fraction` of the data's magnitude tall, centred on the data: a value that drifts by 0.01 %
    (β under an adaptive controller in a short run) is drawn flat, not stretched to the panel's full height."""
    low, high = ax.dataLim.intervaly
    if not (math.isfinite(low) and math.isfinite(high)):
        return
    need = fraction * max(abs(low), abs(high))
    if need > 0 and high - low < need:
        middle = (low + high) / 2
        ax.set_ylim(middle - need / 2, middle + need / 2)


def no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="0.5")


def plain_ticks(fig) -> None:
    """No additive offset on any axis of `fig` (ticks read 0.30001, not "+0.3" in a corner)."""
    from matplotlib.ticker import ScalarFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ScalarFormatter):
                formatter.set_useOffset(False)


def save(fig, paths: Path | Iterable[Path], dpi: int = 110) -> list[Path]:
    """`plain_ticks`, then write `fig` to each path (folders created). OSError propagates: callers report it."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    plain_ticks(fig)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    return paths


def write_error(err: OSError, what: str = "--out") -> str:
    """One line for a figure or table that could not be written."""
    where = f" {err.filename}" if err.filename else ""
    return f"error: cannot write{where} ({err.strerror or type(err).__name__}); choose a writable {what}"


def swap_iterations(steps: Sequence[int], swaps: Sequence[float]) -> list[int]:
    """The first iteration in new roles after each role exchange: where the logged `cory/swaps` counter grew.

    `steps`, `swaps`: the iterations and values of `cory/swaps` (sorted by iteration, as `cory.plotting.series`
    returns them). The counter at iteration k counts the exchanges made before k, so an exchange after
    iteration k − 1 shows as a larger value at k.
    """
    return [int(k) for k, prev, now in zip(steps[1:], swaps, swaps[1:]) if now > prev]


SWAP_STYLE = {"color": "tab:purple", "ls": "-.", "lw": 1.0, "alpha": 0.6}


def mark_swaps(ax, iterations: Iterable[int], label: str = "role swap") -> list:
    """A vertical line half-way between the last iteration in the old roles and the first in the new; only the
    first line carries `label`, so a legend lists the swaps once."""
    return [ax.axvline(k - 0.5, **SWAP_STYLE, label=label if i == 0 else "_swap") for i, k in enumerate(iterations)]


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start); `window` ≤ 1 returns the values."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
