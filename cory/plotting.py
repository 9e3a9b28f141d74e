"""Training curves of one run's `metrics.jsonl` (written by `cory.loggers.JsonlLogger`) as one PNG.

`plot_curves(metrics_jsonl, out_png)` draws four panels against the training iteration:

1. task reward: `train/<agent>/task_reward` lines per agent, `eval/<agent>/task_reward` as markers, and the
   by-role CORY curves `train/{pioneer,observer}/task_reward` dashed;
2. KL_seq to π0 in nats: `train/<agent>/kl` (plus `eval/<agent>/kl` markers and the by-role curves);
3. combined reward r − η_eval·KL_seq, with the run's η_eval: `train/<agent>/combined_reward` lines,
   `eval/<agent>/combined_reward` markers;
4. KL coefficient β: `train/<agent>/kl_coef`, on an axis at least ±10 % of β tall (`cory.figures.keep_span`), so
   an adaptive controller's 0.01 % drift reads as the flat line it is.

The by-role curves are wide faint strokes drawn under the agents' lines: in CORY the pioneer's curve is, iteration by
iteration, one agent's own curve, and a line drawn on top of it would hide that agent.

Title, axis units, integer iteration ticks, the legend (below the panels) and the role-swap marks (CORY's logged
`cory/swaps`) follow `cory.figures`, reading the run's `run_config.yaml` / `summary.json` beside the metrics.
`smooth` > 1 draws a trailing moving mean over that many iterations with the raw curve faint behind. Agents are
discovered from the keys, so the same function serves PPO (one agent) and CORY (llm1, llm2). Missing keys, `null`
values, malformed lines and single-row files are all tolerated; an empty panel says "no data". Uses matplotlib's Agg
canvas directly (no pyplot state, no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cory import figures
from cory.loggers import read_metrics
from cory.metrics import ROLES, eval_key, role_key, train_key

Series = dict[str, tuple[list[int], list[float]]]


def series(rows: list[dict]) -> Series:
    """key → (iterations, values), keeping only finite numeric values, sorted by iteration."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        step = row["iteration"]
        for key, value in row.items():
            if key == "iteration" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                out.setdefault(key, []).append((step, float(value)))
    result: Series = {}
    for key, points in out.items():
        points.sort(key=lambda p: p[0])
        result[key] = ([p[0] for p in points], [p[1] for p in points])
    return result


def discover_agents(keys) -> list[str]:
    """Agent names from `train/<agent>/...` and `eval/<agent>/...` keys, excluding the role names."""
    agents = set()
    for key in keys:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] in ("train", "eval", "ppo") and parts[1] not in ROLES:
            agents.add(parts[1])
    return sorted(agents)


def swaps(data: Series) -> list[int]:
    """The iterations that start in new roles, from the logged `cory/swaps` counter (none for other algorithms)."""
    return figures.swap_iterations(*data[figures.SWAPS_KEY]) if figures.SWAPS_KEY in data else []


def panel_labels(info: figures.RunInfo) -> dict[str, tuple[str, str]]:
    """metric → (panel title, y label with its unit) for a run."""
    unit, eta = info.reward_unit, info.eval_kl_coef
    per_nat = f"{unit} per nat" if unit else None
    return {
        "task_reward": ("task reward", figures.with_unit("task reward", unit)),
        "kl": ("KL_seq to π0", figures.with_unit("KL_seq", figures.KL_UNIT)),
        "combined_reward": (
            "combined reward r − η_eval·KL_seq" + (f", η_eval = {eta:g}" if eta is not None else ""),
            figures.with_unit("r − η_eval·KL_seq", unit),
        ),
        "kl_coef": ("KL coefficient β", figures.with_unit("β", per_nat)),
    }


def draw_line(ax, xs, ys, smooth: int, **style) -> None:
    """A training curve; with `smooth` > 1 its moving mean, the raw values faint and unlabelled behind it."""
    if smooth > 1 and len(ys) > 1:
        ax.plot(xs, ys, color=style.get("color"), ls=style.get("ls", "-"), lw=0.8, alpha=0.25)
        ys = figures.moving_mean(ys, smooth)
    ax.plot(xs, ys, marker="." if len(xs) < 3 else None, **style)


def draw_curves(metrics_jsonl: Path, smooth: int = 0, info: figures.RunInfo | None = None) -> Figure:
    """The four-panel figure of `metrics_jsonl` (`info`: what the run is; default: read beside the metrics)."""
    metrics_jsonl = Path(metrics_jsonl)
    data = series(read_metrics(metrics_jsonl))
    info = info or figures.read_run_info(metrics_jsonl.parent)
    agents = discover_agents(data)
    colors = {agent: f"C{i % 10}" for i, agent in enumerate(agents)}
    # under the agents' lines (zorder 1 < 2), wide and faint: the agent holding the role shows through; a chain's
    # third role and a team's actors take the colours after these
    role_styles = {"pioneer": {"color": "k"}, "observer": {"color": "tab:olive"}}
    swap_steps = swaps(data)
    labels = panel_labels(info)

    fig = Figure(figsize=(12, 8.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, sharex=True)
    panels = [(axes[0, 0], "task_reward", True, True), (axes[0, 1], "kl", True, True),
              (axes[1, 0], "combined_reward", True, False), (axes[1, 1], "kl_coef", False, False)]  # fmt: skip
    for ax, name, with_eval, with_roles in panels:
        drawn, first_with = False, {}  # a series already drawn → the agent that drew it
        for agent in agents:
            if train_key(agent, name) in data:
                xs, ys = data[train_key(agent, name)]
                same = first_with.setdefault((tuple(xs), tuple(ys)), agent)
                if same == agent:
                    draw_line(ax, xs, ys, smooth, color=colors[agent], label=f"{agent} train")
                else:  # the same values (β fixed alike for both agents): dashed, so the line beneath shows through
                    draw_line(ax, xs, ys, smooth, color=colors[agent], ls="--", label=f"{agent} train (= {same})")
                drawn = True
            if with_eval and eval_key(agent, name) in data:
                xs, ys = data[eval_key(agent, name)]
                ax.plot(xs, ys, color=colors[agent], marker="o", linestyle="none", mec="k", label=f"{agent} held-out")
                drawn = True
        for role in ROLES if with_roles else ():
            if role_key(role, name) in data:
                xs, ys = data[role_key(role, name)]
                ys = figures.moving_mean(ys, smooth) if smooth > 1 else ys  # smoothed as the agents' lines are
                others = ("tab:purple", "tab:brown", "tab:pink", "tab:cyan")
                style = role_styles.get(role, {"color": others[ROLES.index(role) % len(others)]})
                ax.plot(xs, ys, **style, lw=6, alpha=0.22, zorder=1, solid_capstyle="round",
                        label=f"{role} (by role)")  # fmt: skip
                drawn = True
        if drawn:
            figures.mark_swaps(ax, swap_steps)
        else:
            figures.no_data(ax)
        if name == "kl_coef":
            figures.keep_span(ax, 0.2)
        figures.iteration_axis(ax)
        ax.set_title(labels[name][0])
        ax.set_ylabel(labels[name][1])
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("training iteration")
    figures.figure_legend(fig, axes.flat)
    note = f"lines: moving mean over {smooth} iterations (raw faint)" if smooth > 1 else ""
    fig.suptitle(figures.title([info], note=note, fallback=metrics_jsonl.parent.name or str(metrics_jsonl)))
    return fig


def plot_curves(metrics_jsonl: Path, out_png: Path, smooth: int = 0, info: figures.RunInfo | None = None) -> None:
    """Write the four-panel training-curve figure of `metrics_jsonl` to `out_png` (see `draw_curves`)."""
    figures.save(draw_curves(metrics_jsonl, smooth, info), out_png, dpi=100)
