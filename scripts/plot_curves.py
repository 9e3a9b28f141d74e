"""The paper's curve figures (Figs. 3, 4, 6) from local run folders: mean over seeds with a min–max seed band.

    python scripts/plot_curves.py SWEEP_DIR [MORE_DIRS ...] [--out PREFIX] [--last 5] [--where KEY=VALUE ...]

Every folder below the given ones that holds a `metrics.jsonl` is a run (`--where KEY=VALUE` keeps only the runs
with that setting). Runs are grouped by everything but the seed: their command-line overrides
(`.hydra/overrides.yaml`) without `seed` and without the keys that do not change what is learned (`sweep`,
`logger`, `hardware`, `progress`, `cache_dir`, `resume`, `hydra.*`); a run without Hydra's record is grouped by
its resolved `run_config.yaml` instead. A group is labelled by the settings that differ between groups (e.g.
`algorithm=cory`); the settings they share go in the title.

Three panels against the training iteration, as in the paper: task reward, KL_seq to π0 and the combined reward
r − η_eval·KL_seq. One line per (group, agent) from the training rollouts (`train/<agent>/...`, each agent in its
current role, docs/method.md §1.6), the mean over seeds with a shaded band from the lowest to the highest seed
(min–max: with 2–3 seeds a standard deviation says little); the held-out evaluations (`eval/<agent>/...`) are
markers with min–max error bars. Writes PREFIX.png, PREFIX.pdf and PREFIX.json (every plotted array), and prints
each curve's final held-out value and its training mean over the last `--last` iterations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python scripts/plot_curves.py` runs from the checkout

from cory.loggers import read_metrics  # noqa: E402
from cory.plotting import discover_agents, series  # noqa: E402

PANELS = (("task_reward", "task reward"), ("kl", "KL per sequence (vs π0)"), ("combined_reward", "r − η_eval·KL"))
# Overrides that say how or where a run ran, not what it learns (hardware never changes the result).
NOT_SETTINGS = ("seed", "sweep", "logger", "hardware", "progress", "cache_dir", "resume", "hydra")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def _is_setting(key: str) -> bool:
    return key.split(".")[0].split("/")[0] not in NOT_SETTINGS


def _flatten(node, prefix: str = "") -> dict[str, str]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: json.dumps(node) if isinstance(node, list) else str(node)}


def run_settings(run_dir: Path) -> dict[str, str]:
    """What a run is, minus its seed: its overrides (`key=value`) or, without them, its flattened resolved config."""
    import yaml

    overrides = run_dir / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        items = (str(o).lstrip("+~").split("=", 1) for o in yaml.safe_load(overrides.read_text()) or [])
        settings = {k: v for k, v in (i if len(i) == 2 else (i[0], "") for i in items)}
    else:
        config = (
            yaml.safe_load((run_dir / "run_config.yaml").read_text())
            if (run_dir / "run_config.yaml").is_file()
            else {}
        )
        settings = _flatten(config or {})
        target = settings.pop("algorithm._target_", None)
        if target is not None:  # the algorithm by name; its other keys differ with it
            settings = {k: v for k, v in settings.items() if not k.startswith("algorithm.") or "agent." in k}
            settings["algorithm"] = target.rsplit(".", 1)[-1].lower()
    return {k: v for k, v in settings.items() if _is_setting(k)}


def discover_runs(dirs: Iterable[str | Path]) -> list[Path]:
    """Every folder under `dirs` (or one of them) holding a `metrics.jsonl`, sorted, each once."""
    return sorted({p.parent.resolve() for d in map(Path, dirs) for p in d.rglob("metrics.jsonl")})


def group_runs(runs: list[Path]) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Runs grouped by their settings; returns ({label: runs}, the settings every group shares)."""
    settings = {run: run_settings(run) for run in runs}
    groups: dict[tuple, list[Path]] = {}
    for run, s in settings.items():
        groups.setdefault(tuple(sorted(s.items())), []).append(run)
    shared = dict(set.intersection(*(set(k) for k in groups))) if groups else {}
    labels = {}
    for key, members in groups.items():
        label = " ".join(f"{k}={v}" for k, v in key if shared.get(k) != v) or "all runs"
        labels[label] = members
    return labels, shared


def band(per_seed: list[tuple[list[int], list[float]]]) -> dict[str, list]:
    """Mean, min and max over seeds at every iteration that any seed logged; `seeds` = how many did."""
    by_step: dict[int, list[float]] = {}
    for steps, values in per_seed:
        for step, value in zip(steps, values):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return {
        "iterations": steps,
        "mean": [statistics.fmean(by_step[s]) for s in steps],
        "low": [min(by_step[s]) for s in steps],
        "high": [max(by_step[s]) for s in steps],
        "seeds": [len(by_step[s]) for s in steps],
    }


def curves(groups: dict[str, list[Path]]) -> list[dict]:
    """Every (group, agent, split, metric) curve: `band` over the group's seeds, plus its identifiers."""
    out = []
    for label, runs in groups.items():
        data = [series(read_metrics(run / "metrics.jsonl")) for run in runs]
        for agent in discover_agents({k for d in data for k in d}):
            for split in ("train", "eval"):
                for metric, _ in PANELS:
                    key = f"{split}/{agent}/{metric}"
                    per_seed = [d[key] for d in data if key in d]
                    if per_seed:
                        out.append(
                            {"label": label, "agent": agent, "split": split, "metric": metric, "runs": len(runs)}
                            | band(per_seed)
                        )
    return out


def plot(curve_list: list[dict], out_prefix: Path, title: str = "") -> dict:
    """Draw the three panels; returns {"axes": {metric: Axes}, "files": [png, pdf]} (the test reads the axes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(dict.fromkeys(c["label"] for c in curve_list))
    agents = list(dict.fromkeys(c["agent"] for c in curve_list))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    styles = {agent: LINESTYLES[i % len(LINESTYLES)] for i, agent in enumerate(agents)}
    markers = {agent: MARKERS[i % len(MARKERS)] for i, agent in enumerate(agents)}

    fig = Figure(figsize=(15, 4.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = dict(zip((m for m, _ in PANELS), fig.subplots(1, len(PANELS))))
    for (metric, name), ax in zip(PANELS, axes.values()):
        for c in (c for c in curve_list if c["metric"] == metric):
            color, name_ = colors[c["label"]], f"{c['label']} · {c['agent']}"
            if c["split"] == "train":
                ax.plot(c["iterations"], c["mean"], color=color, ls=styles[c["agent"]], lw=1.5, label=name_)
                ax.fill_between(c["iterations"], c["low"], c["high"], color=color, alpha=0.2, lw=0)
            else:
                err = [[m - lo for m, lo in zip(c["mean"], c["low"])], [hi - m for m, hi in zip(c["mean"], c["high"])]]
                ax.errorbar(
                    c["iterations"],
                    c["mean"],
                    yerr=err,
                    color=color,
                    marker=markers[c["agent"]],
                    mec="k",
                    ms=5,
                    ls="none",
                    capsize=2,
                    label=f"{name_} (held-out)",
                )
        ax.set_title(name)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[PANELS[0][0]].legend(fontsize=7)
    fig.suptitle((title + "  " if title else "") + "(mean over seeds; band and bars: min–max)", fontsize=10)
    files = [Path(f"{out_prefix}.png"), Path(f"{out_prefix}.pdf")]
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    for path in files:
        fig.savefig(path, dpi=110)
    return {"axes": axes, "files": files}


def final_table(curve_list: list[dict], last: int) -> str:
    """Per curve: the final held-out value (min–max over seeds) and the training mean over the last iterations."""
    rows = [("group", "agent", "metric", "final held-out", f"train, last {last} it.", "seeds")]
    train_curves = {(t["label"], t["agent"], t["metric"]): t for t in curve_list if t["split"] == "train"}
    for c in curve_list:
        if c["split"] == "eval":
            train = train_curves.get((c["label"], c["agent"], c["metric"]))
            tail = f"{statistics.fmean(train['mean'][-last:]):.4g}" if train else "-"
            final = f"{c['mean'][-1]:.4g} [{c['low'][-1]:.4g}, {c['high'][-1]:.4g}]"
            rows.append((c["label"], c["agent"], c["metric"], final, tail, str(c["seeds"][-1])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run folders searched for metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="output prefix (default: <first dir>/sweep_curves)")
    parser.add_argument("--last", type=int, default=5, help="iterations averaged for the printed training value")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE", help="keep runs with this setting (repeatable)"
    )
    args = parser.parse_args(argv)

    wanted = dict(w.split("=", 1) for w in args.where)
    runs = [r for r in discover_runs(args.dirs) if all(run_settings(r).get(k) == v for k, v in wanted.items())]
    if not runs:
        print(f"no run (metrics.jsonl) under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    groups, shared = group_runs(runs)
    curve_list = curves(groups)
    out = args.out or args.dirs[0] / "sweep_curves"
    title = args.title if args.title is not None else " ".join(f"{k}={v}" for k, v in sorted(shared.items()))
    result = plot(curve_list, out, title)
    Path(f"{out}.json").write_text(json.dumps({"shared": shared, "curves": curve_list}, indent=1))
    print(final_table(curve_list, args.last))
    print(f"{len(runs)} runs in {len(groups)} groups → {', '.join(map(str, result['files']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
