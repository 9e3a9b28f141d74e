"""The KL-vs-reward frontier (paper §3.2, Fig. 2c; docs/method.md §3.4): points, seed means, Pareto fronts, plot.

Shared by `cory-plot frontier` (`cory.studies.plot_frontier`) and the multirun callback (`cory/callbacks.py`). A
point is one (run, agent): x = the agent's final held-out task reward, y = −its final held-out KL_seq (each agent
alone in the query-only role, docs/method.md §1.6), labelled by algorithm, KL coefficient η
(`algorithm.agent.init_kl_coef`), seed, and what the run is: task, experiment and number of iterations.

Points come from the `summary.json` of local run folders (`collect`) or, through `cory-plot frontier --wandb`, from
the runs of a W&B group. One figure is one study: points of several (task, experiment, iterations) say nothing
against each other (`studies` separates them). Points are averaged over distinct seeds per (algorithm, η, agent):
two runs of one seed are one seed, their mean (`aggregate`); each algorithm's upper-right Pareto front (higher
reward, lower KL) is drawn through its averaged points.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cory import figures

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# The per-point table (frontier.csv, the W&B table); `neg_kl` is the frontier's y-axis.
COLUMNS = ("algorithm", "kl_coef", "seed", "agent", "task_reward", "kl", "combined_reward", "neg_kl", "run")
METRICS = ("task_reward", "kl", "combined_reward")


def _num(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def make_point(
    run: str,
    algorithm: str,
    kl_coef: Any,
    seed: Any,
    agent: str,
    metrics: Mapping,
    info: Any = None,
    iterations: Any = None,
) -> dict | None:
    """One frontier point, or None when the agent has no finite task reward and KL.

    `info`: the run's `cory.figures.RunInfo` (task, experiment and reward unit, for the figure's title and axes);
    `iterations`: how long the run trained (runs of different lengths are different studies).
    """
    reward, kl = _num(metrics.get("task_reward")), _num(metrics.get("kl"))
    if reward is None or kl is None:
        return None
    info = info or figures.RunInfo()
    return {
        "run": run,
        "algorithm": str(algorithm),
        "kl_coef": _num(kl_coef),
        "seed": seed,
        "agent": agent,
        "task_reward": reward,
        "kl": kl,
        "combined_reward": _num(metrics.get("combined_reward")),
        "x": reward,
        "y": -kl,
        "task": info.task,
        "experiment": info.experiment,
        "reward_unit": info.reward_unit,
        "iterations": int(iterations) if isinstance(iterations, int) and not isinstance(iterations, bool) else None,
    }


def collect(dirs: Iterable[str | Path], skipped: list[str] | None = None) -> list[dict]:
    """One point per (run, agent) from every `summary.json` under `dirs` (a dir may itself be a run folder).

    A summary holds `algorithm`, `kl_coef`, `seed`, `iterations` and `agents: {id: {task_reward, kl,
    combined_reward}}` (written by `cory.trainer.Trainer`). Unreadable summaries, unfinished runs
    (`completed: false`) and agents without a finite task reward and KL are skipped, each with a note: appended to
    `skipped` when a list is given, else printed on stderr.
    """

    def skip(note: str) -> None:
        if skipped is None:
            print(f"skipping {note}", file=sys.stderr)
        else:
            skipped.append(note)

    paths: set[Path] = set()
    for d in map(Path, dirs):
        if d.is_file() and d.name == "summary.json":
            paths.add(d.resolve())
        elif d.is_dir():
            paths.update(p.resolve() for p in d.rglob("summary.json"))
    points = []
    for path in sorted(paths):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
            agents = dict(summary["agents"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            skip(f"{path}: {type(exc).__name__}: {' '.join(str(exc).split())}")
            continue
        if summary.get("completed") is False:
            skip(f"{path}: the run stopped early (completed: false)")
            continue
        info = figures.read_run_info(path.parent)
        for agent, metrics in sorted(agents.items()):
            point = make_point(
                str(path.parent),
                summary.get("algorithm", "?"),
                summary.get("kl_coef"),
                summary.get("seed"),
                agent,
                metrics if isinstance(metrics, Mapping) else {},
                info,
                summary.get("iterations"),
            )
            if point is None:
                skip(f"{path} agent {agent}: no finite task_reward/kl")
            else:
                points.append(point)
    return points


def _xy(point: Any) -> tuple[float, float]:
    if isinstance(point, Mapping):
        return float(point["x"]), float(point["y"])
    return float(point[0]), float(point[1])


def pareto_front(points: Sequence) -> list:
    """The non-dominated points when maximising both x and y, sorted by increasing x (so decreasing y).

    Points are dicts with "x" and "y" or (x, y) pairs; the same objects are returned. A point is dominated when
    another is at least as good on both axes and better on one; exact duplicates are both kept.
    """
    front = []
    for p in points:
        px, py = _xy(p)
        if not any(qx >= px and qy >= py and (qx > px or qy > py) for qx, qy in map(_xy, points)):
            front.append(p)
    return sorted(front, key=lambda p: (_xy(p)[0], -_xy(p)[1]))


def aggregate(points: list[dict]) -> list[dict]:
    """Mean and population std (0 for one seed) over distinct seeds per (algorithm, kl_coef, agent); `n` = the
    distinct seeds, `runs` = the runs behind them. Runs of one seed (a rerun, a second copy) are one seed: their
    mean is that seed's value, so they neither count twice nor narrow the spread."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault((p["algorithm"], p["kl_coef"], p["agent"]), []).append(p)
    out = []
    for (algorithm, kl_coef, agent), group in sorted(groups.items(), key=lambda kv: _sort_key(kv[0])):
        by_seed: dict[str, list[dict]] = {}
        for p in group:
            by_seed.setdefault(json.dumps(p["seed"]), []).append(p)
        row = {"algorithm": algorithm, "kl_coef": kl_coef, "agent": agent, "n": len(by_seed), "runs": len(group)}
        for name in METRICS:
            seeds = [[p[name] for p in runs if p[name] is not None] for runs in by_seed.values()]
            values = [statistics.fmean(v) for v in seeds if v]
            row[name] = statistics.fmean(values) if values else None
            row[f"{name}_std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
        row["x"], row["y"] = row["task_reward"], -row["kl"]
        out.append(row)
    return out


def study(point: Mapping) -> tuple:
    """What a point's run is, beyond its method and seed: (task, experiment, iterations); None where unknown."""
    return (point.get("task"), point.get("experiment"), point.get("iterations"))


def describe_study(key: tuple) -> str:
    task, experiment, iterations = key
    return " · ".join(
        [f"task {task or '?'}", f"experiment {experiment or '?'}", f"{'?' if iterations is None else iterations} it."]
    )


def studies(points: list[dict]) -> dict[tuple, list[dict]]:
    """The points of each study (`study`), in order of first appearance."""
    out: dict[tuple, list[dict]] = {}
    for p in points:
        out.setdefault(study(p), []).append(p)
    return out


def _sort_key(key: tuple) -> tuple:
    algorithm, kl_coef, agent = key
    return (algorithm, math.inf if kl_coef is None else kl_coef, agent)


def fronts(aggregated: list[dict]) -> dict[str, list[dict]]:
    """Each algorithm's Pareto front over its averaged points."""
    by_algorithm: dict[str, list[dict]] = {}
    for row in aggregated:
        by_algorithm.setdefault(row["algorithm"], []).append(row)
    return {algorithm: pareto_front(rows) for algorithm, rows in sorted(by_algorithm.items())}


def table_rows(points: list[dict]) -> list[list]:
    """The per-point table, one row per (run, agent), columns `COLUMNS`."""
    return [[-p["kl"] if c == "neg_kl" else p[c] for c in COLUMNS] for p in points]


def format_table(aggregated: list[dict], front: dict[str, list[dict]]) -> str:
    """A plain-text table of the averaged points; `*` marks points on their algorithm's front."""

    def fmt(mean: float | None, std: float, n: int) -> str:
        if mean is None:
            return "-"
        return f"{mean:.4g} ± {std:.2g}" if n > 1 else f"{mean:.4g}"

    on_front = {id(row) for rows in front.values() for row in rows}
    header = ("algorithm", "kl_coef", "agent", "seeds", "task_reward", "kl", "combined", "front")
    lines = [header]
    for row in aggregated:
        lines.append(
            (
                row["algorithm"],
                "-" if row["kl_coef"] is None else f"{row['kl_coef']:g}",
                row["agent"],
                str(row["n"]) if row.get("runs", row["n"]) == row["n"] else f"{row['n']} ({row['runs']} runs)",
                *(fmt(row[m], row[f"{m}_std"], row["n"]) for m in METRICS),
                "*" if id(row) in on_front else "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def draw_frontier(points: list[dict], title: str | None = None) -> tuple[Any, dict]:
    """The frontier figure: colour = algorithm, marker = agent, a label = η; error bars = std over seeds; methods
    whose means fall on the same place are drawn as nested markers and rings (`_nested_sizes`), none hidden.

    Each method's Pareto front over its seed means is a line through rings around its front points (a ring alone
    when the front is one point); the joint front over every method's means is the wide grey band behind them.
    With several seeds the single-seed points are drawn faintly behind their means. The title says what the runs
    are (`cory.figures.title`); `title` replaces its heading. The legend lists exactly what is drawn, outside the
    axes.

    Returns:
        (the matplotlib Figure, {"aggregated": the seed means, "fronts": each algorithm's front over them,
        "joint_front": the front over all of them}).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    aggregated = aggregate(points)
    front = fronts(aggregated)
    joint = pareto_front(aggregated)
    algorithms = sorted({p["algorithm"] for p in points})
    agents = sorted({p["agent"] for p in points})
    colors = {a: f"C{i % 10}" for i, a in enumerate(algorithms)}
    markers = {a: MARKERS[i % len(MARKERS)] for i, a in enumerate(agents)}
    sizes = _nested_sizes(aggregated, algorithms)

    fig = Figure(figsize=(8.5, 5.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    several_seeds = any(row["n"] > 1 for row in aggregated)
    if len(joint) > 0:
        ax.plot([r["x"] for r in joint], [r["y"] for r in joint], color="0.6", lw=7, alpha=0.35, marker="o", ms=16,
                solid_capstyle="round", zorder=0, label="joint front (all methods)")  # fmt: skip
    if several_seeds:  # the single-seed points, faintly, behind their means
        xs, ys = [p["x"] for p in points], [p["y"] for p in points]
        ax.scatter(xs, ys, color=[colors[p["algorithm"]] for p in points], alpha=0.25, s=18, label="single seeds")
    for algorithm in algorithms:
        for agent in agents:
            rows = [r for r in aggregated if r["algorithm"] == algorithm and r["agent"] == agent]
            if not rows:
                continue
            spread = any(r["n"] > 1 for r in rows)
            ax.errorbar(
                [r["x"] for r in rows],
                [r["y"] for r in rows],
                xerr=[r["task_reward_std"] for r in rows] if spread else None,
                yerr=[r["kl_std"] for r in rows] if spread else None,
                color=colors[algorithm],
                marker=markers[agent],
                mec="k",
                ms=7 + 5 * sizes[algorithm],
                capsize=3,
                linestyle="none",
                label=f"{figures.ALGORITHM_NAMES.get(algorithm, algorithm)} · {agent}",
            )
    for algorithm, rows in front.items():
        name = figures.ALGORITHM_NAMES.get(algorithm, algorithm)
        ax.plot([r["x"] for r in rows], [r["y"] for r in rows], color=colors[algorithm], lw=1.5, alpha=0.8, marker="o",
                ms=14 + 5 * sizes[algorithm], mfc="none", mew=1.2, label=f"{name} front (ringed)")  # fmt: skip
    eta_title = _eta_labels(ax, aggregated, colors)
    figures.outside_legend(ax, title=eta_title, title_fontsize=8)
    unit = figures.shared([figures.RunInfo(reward_unit=p.get("reward_unit")) for p in points], "reward_unit")
    ax.set_xlabel(figures.with_unit("held-out task reward", unit))
    ax.set_ylabel(figures.with_unit("− held-out KL_seq", figures.KL_UNIT))
    ax.grid(alpha=0.3)
    infos = [
        figures.RunInfo(algorithm=figures.ALGORITHM_NAMES.get(p["algorithm"], p["algorithm"]), task=p.get("task"),
                        experiment=p.get("experiment"), seed=p["seed"] if isinstance(p["seed"], int) else None)
        for p in points
    ]  # fmt: skip
    note = figures.seeds_note(row["n"] for row in aggregated) + (" ± std" if several_seeds else "")
    heading = title or "KL–reward frontier"  # lines of 80 characters: the axes leave the legend a third of the width
    ax.set_title(figures.title(infos, heading=heading, note=note, width=80), fontsize=10)
    return fig, {"aggregated": aggregated, "fronts": front, "joint_front": joint}


ETA_STEP = 9  # points between two η labels stacked at one place (7-point text)


def _eta_labels(ax, aggregated: list[dict], colors: dict[str, str]) -> str | None:
    """η next to each mean, in its method's colour, none written over another; returns the legend's title.

    One η for every point: no label at all, the title says it. Otherwise each label goes up-right of its point,
    raised by `ETA_STEP` points above any label already written there (two methods' means at one place); the same
    η in the same colour at one place is written once.
    """
    rows = [r for r in aggregated if r["kl_coef"] is not None]
    etas = {r["kl_coef"] for r in rows}
    if not etas:
        return None
    if len(etas) == 1 and len(rows) == len(aggregated):
        return f"η = {etas.pop():g} at every point"
    ax.autoscale_view()  # the final data limits: where each label lands in the axes
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    placed: list[tuple[float, float, str, str]] = []  # (x, y of the label's corner in points, text, colour)
    for row in rows:
        text, color = f"{row['kl_coef']:g}", colors[row["algorithm"]]
        x = (row["x"] - x0) / ((x1 - x0) or 1.0) * width_pt
        y = (row["y"] - y0) / ((y1 - y0) or 1.0) * height_pt
        if any(abs(x - px) < 1 and abs(y - py) < 1 and (text, color) == (pt, pc) for px, py, pt, pc in placed):
            continue  # already written here
        level = 0
        while any(abs(x - px) < 5 * len(text) and abs(y + level * ETA_STEP - py) < ETA_STEP for px, py, *_ in placed):
            level += 1
        placed.append((x, y + level * ETA_STEP, text, color))
        ax.annotate(text, (row["x"], row["y"]), textcoords="offset points", xytext=(6, 5 + level * ETA_STEP),
                    fontsize=7, color=color)  # fmt: skip
    return "η next to each point"


def _nested_sizes(aggregated: list[dict], algorithms: list[str], near: float = 0.02) -> dict[str, int]:
    """How many earlier-drawn methods (in `algorithms` order) have a mean within `near` of the axes' ranges of one of
    this method's means, counted from the last method drawn: 0 for most, so that markers keep their size, and one
    step larger for each method a later-drawn one would cover (the larger drawn first, the smaller on top)."""
    xs, ys = [r["x"] for r in aggregated], [r["y"] for r in aggregated]
    span_x, span_y = (max(v) - min(v) or 1.0 for v in (xs, ys))

    def close(a: dict, b: dict) -> bool:
        return abs(a["x"] - b["x"]) <= near * span_x and abs(a["y"] - b["y"]) <= near * span_y

    level = dict.fromkeys(algorithms, 0)
    for i in reversed(range(len(algorithms))):  # the last drawn is on top at its own size
        mine = [r for r in aggregated if r["algorithm"] == algorithms[i]]
        covering = {o["algorithm"] for o in aggregated if any(close(r, o) for r in mine)}
        later = [a for a in algorithms[i + 1 :] if a in covering]
        level[algorithms[i]] = max((level[a] + 1 for a in later), default=0)
    return level


def plot_frontier(points: list[dict], out_png: str | Path, title: str | None = None) -> dict:
    """`draw_frontier` saved to `out_png`; returns its seed means and fronts."""
    fig, result = draw_frontier(points, title)
    figures.save(fig, out_png, dpi=120)
    return result


def write_frontier(points: list[dict], out_dir: str | Path, title: str | None = None) -> dict:
    """`frontier.png`, `frontier.csv` (one row per point, `COLUMNS`) and `frontier.json` (points, seed means,
    fronts) in `out_dir`; returns the `plot_frontier` result plus the paths under "files"."""
    out_dir = Path(out_dir)
    files = {name: out_dir / f"frontier.{name}" for name in ("png", "csv", "json")}
    result = plot_frontier(points, files["png"], title=title)
    with files["csv"].open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(table_rows(points))
    files["json"].write_text(json.dumps({"points": points, **result}, indent=2), encoding="utf-8")
    return result | {"files": files}
