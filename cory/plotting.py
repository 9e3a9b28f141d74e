"""Training curves from a run's `metrics.jsonl` (written by `cory.loggers.JsonlLogger`) as one PNG.

`plot_curves(metrics_jsonl, out_png)` draws four panels against the training iteration:

1. task reward: `train/<agent>/task_reward` lines per agent, `eval/<agent>/task_reward` as markers, and the
   by-role CORY curves `train/{pioneer,observer}/task_reward` dashed;
2. KL per sequence: `train/<agent>/kl` (plus `eval/<agent>/kl` markers and the by-role curves);
3. combined reward r − η_eval·KL_seq: `train/<agent>/combined_reward` lines, `eval/<agent>/combined_reward` markers;
4. KL coefficient β: `train/<agent>/kl_coef`.

Agents are discovered from the keys, so the same function serves PPO (one agent) and CORY (llm1, llm2). Missing
keys, `null` values, malformed lines and single-row files are all tolerated; an empty panel says "no data".
Uses matplotlib's Agg canvas directly (no pyplot state, no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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


def plot_curves(metrics_jsonl: Path, out_png: Path) -> None:
    """Write the four-panel training-curve figure of `metrics_jsonl` to `out_png`."""
    data = series(read_metrics(metrics_jsonl))
    agents = discover_agents(data)
    colors = {agent: f"C{i % 10}" for i, agent in enumerate(agents)}
    role_styles = {"pioneer": ("k", "--"), "observer": ("0.5", ":")}

    fig = Figure(figsize=(12, 8), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, sharex=True)
    panels = [
        (axes[0, 0], "task_reward", "task reward", True, True),
        (axes[0, 1], "kl", "KL per sequence (vs π0)", True, True),
        (axes[1, 0], "combined_reward", "combined reward r − η_eval·KL", True, False),
        (axes[1, 1], "kl_coef", "KL coefficient β", False, False),
    ]
    for ax, name, title, with_eval, with_roles in panels:
        drawn = False
        for agent in agents:
            key = train_key(agent, name)
            if key in data:
                xs, ys = data[key]
                ax.plot(xs, ys, color=colors[agent], marker="." if len(xs) < 3 else None, label=f"{agent} train")
                drawn = True
            if with_eval and eval_key(agent, name) in data:
                xs, ys = data[eval_key(agent, name)]
                ax.plot(xs, ys, color=colors[agent], marker="o", linestyle="none", mec="k", label=f"{agent} eval")
                drawn = True
        if with_roles:
            for role in ROLES:
                key = role_key(role, name)
                if key in data:
                    xs, ys = data[key]
                    color, style = role_styles[role]
                    ax.plot(xs, ys, color=color, linestyle=style, lw=1, alpha=0.8, label=f"{role} (by role)")
                    drawn = True
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="0.5")
    for ax in axes[1]:
        ax.set_xlabel("iteration")
    fig.suptitle(Path(metrics_jsonl).parent.name or str(metrics_jsonl))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
