"""The paper's curve figures (Figs. 3, 4, 6) from local run folders: mean over seeds with a min–max seed band.

    cory-plot curves SWEEP_DIR [MORE_DIRS ...] [--out PREFIX] [--last 5] [--where KEY=VALUE ...]
    cory-plot curves --from-json PREFIX.json [--out PREFIX]      # redraw from the saved arrays

Every folder below the given ones that holds a `metrics.jsonl` is a run (`--where KEY=VALUE` keeps only the runs
with that setting). Runs are grouped by everything but the seed: their command-line overrides
(`.hydra/overrides.yaml`) without `seed` and without the keys that do not change what is learned (`sweep`,
`logger`, `hardware`, `progress`, `cache_dir`, `resume`, `hydra.*`); a run without Hydra's record is grouped by
its resolved `run_config.yaml` instead. A group is named by the settings that differ between groups, in words
(`algorithm=cory seed=1` reads "CORY, seed 1": `cory.figures.setting_label`); the settings they share go in the
title.

Three panels against the training iteration, as in the paper: task reward, KL_seq to π0 and the combined reward
r − η_eval·KL_seq. One line per (group, agent) from the training rollouts (`train/<agent>/...`, each agent in its
current role, docs/method.md §1.6), the mean over seeds with a shaded band from the lowest to the highest seed
(min–max: with 2–3 seeds a standard deviation says little; a single seed has no band and the title says "one
seed"); the held-out evaluations (`eval/<agent>/...`) are markers with min–max error bars. CORY's role swaps (the
logged `cory/swaps`) are vertical lines; `--smooth N` draws a moving mean over N iterations, the raw mean faint.
Title, units (from the task of the runs' `run_config.yaml`) and legend follow `cory.figures`. Writes PREFIX.png,
PREFIX.pdf and PREFIX.json (every plotted array, with what the runs are and their swaps, so `--from-json`
redraws the figure), and prints each curve's final held-out value and its training mean over the last `--last`
iterations. Nothing to plot, an input that cannot be read, or an output that cannot be written is one line on
stderr and exit code 2 (`cory.studies.command`). The same command: `python -m cory.studies.plot_curves`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from cory import figures
from cory.plotting import discover_agents, panel_labels, series, swaps
from cory.studies import command, results
from cory.studies.command import StudyError

PANELS = ("task_reward", "kl", "combined_reward")
# Overrides that say how or where a run ran, not what it learns (hardware never changes the result).
NOT_SETTINGS = ("seed", "sweep", "logger", "hardware", "progress", "cache_dir", "resume", "hydra")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def _is_setting(key: str) -> bool:
    return key.split(".")[0].split("/")[0] not in NOT_SETTINGS


def run_settings(run_dir: Path) -> dict[str, str]:
    """What a run is, minus its seed and how it ran (`cory.studies.results.settings`)."""
    return {k: v for k, v in results.settings(run_dir).items() if _is_setting(k)}


discover_runs = results.discover_runs


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
        data = [series(results.metrics(run / results.METRICS)) for run in runs]
        for agent in discover_agents({k for d in data for k in d}):
            for split in ("train", "eval"):
                for metric in PANELS:
                    key = f"{split}/{agent}/{metric}"
                    per_seed = [d[key] for d in data if key in d]
                    if per_seed:
                        out.append(
                            {"label": label, "agent": agent, "split": split, "metric": metric, "runs": len(runs)}
                            | band(per_seed)
                        )
    return out


def describe_groups(groups: dict[str, list[Path]]) -> dict[str, dict]:
    """label → {"runs": what each run is (`cory.figures.RunInfo` as a dict), "swaps": the iterations that start in
    new roles, from the runs' logged `cory/swaps` (their union; the seeds of a group share the swap period)}."""
    out = {}
    for label, runs in groups.items():
        steps = sorted({k for run in runs for k in swaps(series(results.metrics(run / results.METRICS)))})
        out[label] = {"runs": [dataclasses.asdict(figures.read_run_info(run)) for run in runs], "swaps": steps}
    return out


def plot(curve_list: list[dict], out_prefix: Path, title: str = "", groups: dict | None = None, smooth: int = 0):
    """Draw the three panels; returns {"axes": {metric: Axes}, "files": [png, pdf], "figure"} (tests read them).

    `groups`: `describe_groups`' output (title, units, η_eval and swap marks); `title` replaces the heading.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = groups or {}
    infos = [figures.RunInfo(**run) for g in groups.values() for run in g["runs"]]
    info = figures.RunInfo(**{f.name: figures.shared(infos, f.name) for f in dataclasses.fields(figures.RunInfo)})
    labels = list(dict.fromkeys(c["label"] for c in curve_list))
    agents = list(dict.fromkeys(c["agent"] for c in curve_list))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    styles = {agent: LINESTYLES[i % len(LINESTYLES)] for i, agent in enumerate(agents)}
    markers = {agent: MARKERS[i % len(MARKERS)] for i, agent in enumerate(agents)}
    names = panel_labels(info)
    swapping = {label: g["swaps"] for label, g in groups.items() if g.get("swaps")}

    fig = Figure(figsize=(15, 5.2), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = dict(zip(PANELS, fig.subplots(1, len(PANELS))))
    for metric, ax in axes.items():
        for c in (c for c in curve_list if c["metric"] == metric):
            color, name = colors[c["label"]], f"{figures.setting_label(c['label'])} · {c['agent']}"
            several = [n > 1 for n in c["seeds"]]
            if c["split"] == "train":
                mean = c["mean"]
                if smooth > 1 and len(mean) > 1:
                    ax.plot(c["iterations"], mean, color=color, ls=styles[c["agent"]], lw=0.8, alpha=0.3)
                    mean = figures.moving_mean(mean, smooth)
                ax.plot(c["iterations"], mean, color=color, ls=styles[c["agent"]], lw=1.5, label=name)
                if any(several):  # a band only where two or more seeds logged the iteration
                    ax.fill_between(c["iterations"], c["low"], c["high"], where=several, color=color, alpha=0.2,
                                    lw=0, interpolate=False)  # fmt: skip
            else:
                err = [[m - lo for m, lo in zip(c["mean"], c["low"])], [hi - m for m, hi in zip(c["mean"], c["high"])]]
                ax.errorbar(
                    c["iterations"],
                    c["mean"],
                    yerr=err if any(several) else None,
                    color=color,
                    marker=markers[c["agent"]],
                    mec="k",
                    ms=5,
                    ls="none",
                    capsize=2,
                    label=f"{name} (held-out)",
                )
        for label, steps in swapping.items():
            named = f"role swap ({figures.setting_label(label)})" if len(labels) > 1 else "role swap"
            figures.mark_swaps(ax, steps, label=named)
        figures.iteration_axis(ax)
        ax.set_title(names[metric][0])
        ax.set_ylabel(names[metric][1])
        ax.set_xlabel("training iteration")
        ax.grid(alpha=0.3)
    figures.figure_legend(fig, axes.values(), fontsize=7)
    counts = [max(c["seeds"]) for c in curve_list if c["seeds"]]
    note = figures.seeds_note(counts)
    if note != "one seed":
        note += "; band and bars: min–max over seeds"
    if smooth > 1:
        note += f"; lines: moving mean over {smooth} iterations (raw faint)"
    fig.suptitle(figures.title(infos, heading=title, note=note), fontsize=10)
    files = figures.save(fig, [Path(f"{out_prefix}.png"), Path(f"{out_prefix}.pdf")], dpi=110)
    return {"axes": axes, "files": files, "figure": fig}


def final_table(curve_list: list[dict], last: int) -> str:
    """Per curve: the final held-out value (min–max over seeds) and the training mean over the last iterations."""
    rows = [("group", "agent", "metric", "final held-out", f"train, last {last} it.", "seeds")]
    train_curves = {(t["label"], t["agent"], t["metric"]): t for t in curve_list if t["split"] == "train"}
    for c in curve_list:
        if c["split"] == "eval":
            train = train_curves.get((c["label"], c["agent"], c["metric"]))
            tail = f"{statistics.fmean(train['mean'][-last:]):.4g}" if train else "-"
            final = f"{c['mean'][-1]:.4g} [{c['low'][-1]:.4g}, {c['high'][-1]:.4g}]"
            rows.append((figures.setting_label(c["label"]), c["agent"], c["metric"], final, tail, str(c["seeds"][-1])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def select_runs(dirs: Sequence[Path], where: Sequence[str]) -> list[Path]:
    """The runs under `dirs` with every `--where` setting; `StudyError` saying what was searched and why nothing
    matched."""
    missing = [str(d) for d in dirs if not Path(d).exists()]
    if missing:
        raise StudyError(f"no such folder: {', '.join(missing)}")
    found = discover_runs(dirs)
    searched = ", ".join(map(str, dirs))
    if not found:
        raise StudyError(
            f"no run (a folder holding metrics.jsonl) under {searched}; "
            "pass the folders that `cory-train` or `cory-sweep` wrote"
        )
    wanted = dict(w.split("=", 1) for w in where)
    settings = {run: run_settings(run) for run in found}
    runs = [r for r in found if all(settings[r].get(k) == v for k, v in wanted.items())]
    if not runs:
        seen = {k: sorted({s.get(k, "(unset)") for s in settings.values()}) for k in wanted}
        have = "; ".join(f"{k} is {', '.join(v)}" for k, v in seen.items())
        raise StudyError(
            f"{len(found)} runs under {searched}, none with {' '.join(where)} ({have}); "
            "change --where to one of these values"
        )
    return runs


CURVE_KEYS = ("label", "agent", "split", "metric", "iterations", "mean", "low", "high", "seeds")


def _saved(path: Path) -> tuple[dict, list[dict], dict]:
    """(shared settings, curves, groups) of a PREFIX.json this command wrote, each curve checked."""
    saved = results.read_json(path)
    shared, curve_list, groups = saved.get("shared"), saved.get("curves"), saved.get("groups", {})
    if not isinstance(shared, dict) or not isinstance(curve_list, list) or not isinstance(groups, dict):
        raise StudyError(
            f"{path} is not a curves JSON of `cory-plot curves` (shared, curves, groups); pass its PREFIX.json"
        )
    for i, c in enumerate(curve_list):
        where = f"{path} curve {i}"
        for key in CURVE_KEYS:
            results.field(c, key, where)
        for key in ("iterations", "mean", "low", "high", "seeds"):
            if not isinstance(c[key], list) or len(c[key]) != len(c["iterations"]):
                raise StudyError(f"{where}: {key} is not a list as long as its iterations; the file is corrupt")
            for v in c[key]:
                results.number(v, f"{where}: {key}")
    for label, g in groups.items():
        results.field(g, "runs", f"{path} group {label}")
    return shared, curve_list, groups


def run(argv: Sequence[str] | None = None, prog: str = "cory-plot curves") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run folders searched for metrics.jsonl")
    parser.add_argument("--from-json", type=Path, default=None, help="redraw from a PREFIX.json this command wrote")
    parser.add_argument("--out", type=Path, default=None, help="output prefix (default: <first dir>/sweep_curves)")
    parser.add_argument(
        "--last", type=command.positive_int, default=5, help="iterations averaged for the printed value"
    )
    parser.add_argument("--smooth", type=int, default=0, help="moving mean over N iterations (raw kept faint)")
    parser.add_argument("--title", default=None, help="heading above the description of the runs")
    parser.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE", help="keep runs with this setting (repeatable)"
    )
    args = parser.parse_args(argv)
    if bool(args.dirs) == bool(args.from_json):
        parser.error("give run/sweep folders or --from-json PREFIX.json (one of the two)")
    if any("=" not in w for w in args.where):
        parser.error("--where takes KEY=VALUE")

    if args.from_json:
        shared, curve_list, groups = _saved(args.from_json)
        out = args.out or args.from_json.with_suffix("")
        n_runs = sum(len(g["runs"]) for g in groups.values())
    else:
        runs = select_runs(args.dirs, args.where)
        run_groups, shared = group_runs(runs)
        curve_list, groups = curves(run_groups), describe_groups(run_groups)
        out, n_runs = args.out or args.dirs[0] / "sweep_curves", len(runs)
    if not curve_list:
        raise StudyError("the runs logged no task_reward, kl or combined_reward to plot; are they cory runs?")
    with command.output(out):
        result = plot(curve_list, out, args.title or "", groups, args.smooth)
        payload = {"shared": shared, "curves": curve_list, "groups": groups}
        Path(f"{out}.json").write_text(json.dumps(payload, indent=1))
    print(final_table(curve_list, args.last))
    print(f"{n_runs} runs in {len(groups) or len({c['label'] for c in curve_list})} groups → "
          f"{', '.join(map(str, result['files']))}")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
