"""KL-vs-reward frontier (paper §3.2, Fig. 2c; docs/method.md §3.4) from the `summary.json` files of runs or sweeps.

    python scripts/plot_frontier.py RUN_OR_SWEEP_DIR [...] --out frontier.png [--json frontier.json]

Every `summary.json` below the given directories is one run:
`{"algorithm", "kl_coef", "seed", "iterations", "agents": {"llm1": {"task_reward", "kl", "combined_reward"}, ...}}`,
with the agents' final held-out evaluation (each agent alone, query-only prompt; docs/method.md §1.6).

- One point per (run, agent) at x = eval task reward, y = −eval KL_seq; colour = algorithm, marker = agent.
- Points are averaged over seeds per (algorithm, kl_coef, agent), shown as mean ± std error bars when there are
  several seeds (the single-seed points are drawn faintly behind).
- Each algorithm's upper-right Pareto frontier (higher reward, lower KL) is drawn through its averaged points.
- A table of the averaged points is printed; `--json` also writes points, averages and fronts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def collect(dirs: Iterable[str | Path]) -> list[dict]:
    """One point per (run, agent) from every `summary.json` under `dirs` (a dir may itself be a run dir).

    Each point: run, algorithm, kl_coef, seed, iterations, agent, task_reward, kl, combined_reward, x, y (= −kl).
    Unreadable summaries and agents without a finite task reward and KL are skipped with a note on stderr.
    """
    paths: set[Path] = set()
    for d in dirs:
        d = Path(d)
        if d.is_file() and d.name == "summary.json":
            paths.add(d)
        elif d.is_dir():
            paths.update(d.rglob("summary.json"))
    points = []
    for path in sorted(paths):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
            agents = summary["agents"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"skipping {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for agent, m in sorted(agents.items()):
            reward, kl = _num(m.get("task_reward")), _num(m.get("kl"))
            if reward is None or kl is None:
                print(f"skipping {path} agent {agent}: no finite task_reward/kl", file=sys.stderr)
                continue
            points.append(
                {
                    "run": str(path.parent),
                    "algorithm": str(summary.get("algorithm", "?")),
                    "kl_coef": _num(summary.get("kl_coef")),
                    "seed": summary.get("seed"),
                    "iterations": summary.get("iterations"),
                    "agent": agent,
                    "task_reward": reward,
                    "kl": kl,
                    "combined_reward": _num(m.get("combined_reward")),
                    "x": reward,
                    "y": -kl,
                }
            )
    return points


def _num(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _xy(point) -> tuple[float, float]:
    if isinstance(point, dict):
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
        dominated = False
        for q in points:
            qx, qy = _xy(q)
            if qx >= px and qy >= py and (qx > px or qy > py):
                dominated = True
                break
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: (_xy(p)[0], -_xy(p)[1]))


def aggregate(points: list[dict]) -> list[dict]:
    """Mean and std (population std; 0 for one seed) over seeds per (algorithm, kl_coef, agent)."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault((p["algorithm"], p["kl_coef"], p["agent"]), []).append(p)
    out = []
    for (algorithm, kl_coef, agent), group in sorted(groups.items(), key=lambda kv: _sort_key(kv[0])):
        row = {"algorithm": algorithm, "kl_coef": kl_coef, "agent": agent, "n": len(group)}
        for name in ("task_reward", "kl", "combined_reward"):
            values = [p[name] for p in group if p[name] is not None]
            row[name] = statistics.fmean(values) if values else None
            row[f"{name}_std"] = statistics.pstdev(values) if len(values) > 1 else 0.0
        row["x"], row["y"] = row["task_reward"], -row["kl"]
        out.append(row)
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


def format_table(aggregated: list[dict], front: dict[str, list[dict]]) -> str:
    """A plain-text table of the averaged points; `*` marks points on their algorithm's front."""

    def fmt(mean, std, n):
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
                str(row["n"]),
                fmt(row["task_reward"], row["task_reward_std"], row["n"]),
                fmt(row["kl"], row["kl_std"], row["n"]),
                fmt(row["combined_reward"], row["combined_reward_std"], row["n"]),
                "*" if id(row) in on_front else "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def plot_frontier(points: list[dict], out_png: str | Path, title: str | None = None) -> dict:
    """Draw the frontier figure; returns {"aggregated": ..., "fronts": ...}."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    aggregated = aggregate(points)
    front = fronts(aggregated)
    algorithms = sorted({p["algorithm"] for p in points})
    agents = sorted({p["agent"] for p in points})
    colors = {a: f"C{i % 10}" for i, a in enumerate(algorithms)}
    markers = {a: MARKERS[i % len(MARKERS)] for i, a in enumerate(agents)}

    fig = Figure(figsize=(7, 5.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    several_seeds = any(row["n"] > 1 for row in aggregated)
    if several_seeds:
        for p in points:
            ax.scatter(p["x"], p["y"], color=colors[p["algorithm"]], marker=markers[p["agent"]], alpha=0.25, s=18)
    for row in aggregated:
        ax.errorbar(
            row["x"],
            row["y"],
            xerr=row["task_reward_std"] if row["n"] > 1 else None,
            yerr=row["kl_std"] if row["n"] > 1 else None,
            color=colors[row["algorithm"]],
            marker=markers[row["agent"]],
            mec="k",
            ms=7,
            capsize=3,
            linestyle="none",
        )
        if row["kl_coef"] is not None:
            ax.annotate(
                f"{row['kl_coef']:g}",
                (row["x"], row["y"]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
                color=colors[row["algorithm"]],
            )
    for algorithm, rows in front.items():
        ax.plot([r["x"] for r in rows], [r["y"] for r in rows], color=colors[algorithm], lw=1.5, alpha=0.8)
    # Legend: colour = algorithm (front line), marker = agent.
    for algorithm in algorithms:
        ax.plot([], [], color=colors[algorithm], lw=1.5, label=f"{algorithm} front")
    for agent in agents:
        ax.plot([], [], color="0.4", marker=markers[agent], linestyle="none", label=agent)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_xlabel("eval task reward")
    ax.set_ylabel("− eval KL per sequence")
    ax.grid(alpha=0.3)
    ax.set_title(title or ("KL-reward frontier" + (" (mean ± std over seeds)" if several_seeds else "")))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    return {"aggregated": aggregated, "fronts": front}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories searched for summary.json")
    parser.add_argument("--out", type=Path, default=Path("frontier.png"), help="output PNG (default frontier.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write points, averages and fronts as JSON")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)

    points = collect(args.dirs)
    if not points:
        print(f"no usable summary.json under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    result = plot_frontier(points, args.out, title=args.title)
    print(format_table(result["aggregated"], result["fronts"]))
    print(f"{len(points)} points from {len({p['run'] for p in points})} runs → {args.out}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"points": points, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
