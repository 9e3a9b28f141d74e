"""KL-vs-reward frontier (paper Fig. 2c; docs/method.md §3.4) from local run folders or from a W&B group.

    cory-plot frontier RUN_OR_SWEEP_DIR [...] --out frontier.png [--json frontier.json] [--csv frontier.csv]
    cory-plot frontier --wandb ENTITY/PROJECT/GROUP --out frontier.png
    cory-plot frontier --from-json frontier.json --out frontier.png      # redraw saved points

Local: every `summary.json` below the given folders is one run (its agents' final held-out evaluation, each agent
alone in the query-only role; docs/method.md §1.6). W&B: the finished runs of the group, read through the W&B
public API (needs network and an API key: without one, or with WANDB_MODE=disabled/offline, it says so in one
line); each summary value is the run's last logged value (`cory.studies.results.wandb_summary`). A sweep's group is
named after the sweep (`sweep.name`). `--from-json`: the points of a JSON this command (or the end-of-sweep
callback) wrote.

- One figure is one study: runs of different tasks, experiments or numbers of iterations are not points of one
  front. Given such a mix, the command names the studies it found and stops; choose one with `--task`,
  `--experiment` and `--iterations`, or draw each into its own file with `--split` (`frontier-<study>.png`).
- One point per (run, agent) at x = eval task reward, y = −eval KL_seq; colour = algorithm, marker = agent.
- Points are averaged over distinct seeds per (algorithm, η = `init_kl_coef`, agent), drawn as mean ± std error
  bars when there are several seeds (the single-seed points faintly behind); two runs of one seed count as one seed.
- Each algorithm's upper-right Pareto front (higher reward, lower KL) is drawn through its averaged points, which
  are ringed; the joint front over all algorithms' averaged points is a grey band behind them.
- Title (task, experiment, seeds), axis units (the task's reward unit, KL in nats) and the legend follow
  `cory.figures`. No point to plot, an input that cannot be read or an output that cannot be written is one line
  and exit code 2 (`cory.studies.command`).
- A table of the averaged points is printed; `--json` also writes points, averages and fronts, `--csv` the
  per-point table. The maths lives in `cory/frontier.py`, shared with the end-of-sweep callback.
The same command: `python -m cory.studies.plot_frontier`.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cory import figures, frontier
from cory.studies import command, results
from cory.studies.command import StudyError


def wandb_unavailable() -> str | None:
    """Why the W&B public API cannot be read here, in one line; None when it can be tried."""
    from cory.loggers import _api_key_configured

    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("disabled", "offline", "dryrun"):
        return (
            f"--wandb reads runs from the W&B servers, but WANDB_MODE={mode} here; "
            "unset WANDB_MODE (with an API key) or plot the local run folders instead"
        )
    if not _api_key_configured():
        return (
            "--wandb needs a W&B API key (set WANDB_API_KEY or run `wandb login`); "
            "or plot the local run folders instead"
        )
    return None


def collect_wandb(path: str, api: Any = None) -> list[dict]:
    """One point per (run, agent) from the finished runs of a W&B group, `path` = "entity/project/group".

    Reads each run's config (`algorithm._target_`, `algorithm.agent.init_kl_coef`, `seed`, `iterations`) and
    summary (the last logged `eval/<agent>/{task_reward,kl,combined_reward}`, i.e. the final evaluation when the
    summary's `_step` equals `iterations`; a value summarised as `{last, max}` counts by its `last`). Sweep summary
    runs (`job_type="summary"`) and runs that did not finish are skipped with a note. `api`: a `wandb.Api()`-like
    object (tests pass one holding real offline run summaries; None builds the real one).
    """
    parts = path.strip("/").split("/")
    if len(parts) != 3 or not all(parts):
        raise StudyError(f"--wandb {path}: expected entity/project/group")
    entity, project, group = parts
    if api is None:
        import wandb

        api = wandb.Api()
    points = []
    for run in api.runs(f"{entity}/{project}", filters={"group": group}):
        name = "/".join(getattr(run, "path", None) or [entity, project, str(getattr(run, "id", "?"))])
        if getattr(run, "job_type", None) == "summary":
            continue
        config, summary = dict(run.config), results.wandb_summary(run.summary)
        iterations = config.get("iterations")
        state = getattr(run, "state", "finished")
        if state != "finished" or summary.get("_step") != iterations:
            why = f"state {state}" if state != "finished" else f"stopped at iteration {summary.get('_step')}"
            print(f"skipping {name}: no final evaluation ({why} of {iterations})", file=sys.stderr)
            continue
        algorithm_cfg = config.get("algorithm") or {}
        algorithm = str(algorithm_cfg.get("_target_", "?")).rsplit(".", 1)[-1].lower()
        kl_coef = (algorithm_cfg.get("agent") or {}).get("init_kl_coef")
        agents = sorted({key.split("/")[1] for key in summary if key.startswith("eval/") and key.count("/") == 2})
        info = figures.run_info(config)
        for agent in agents:
            metrics = {m: summary.get(f"eval/{agent}/{m}") for m in frontier.METRICS}
            point = frontier.make_point(name, algorithm, kl_coef, config.get("seed"), agent, metrics, info, iterations)
            if point is not None:
                points.append(point)
    return points


POINT_KEYS = ("run", "algorithm", "kl_coef", "seed", "agent", "task_reward", "kl", "x", "y")


def _saved_points(path: Path) -> list[dict]:
    """The points of a frontier JSON, each checked (`POINT_KEYS`, finite coordinates)."""
    points = results.field(results.read_json(path), "points", str(path))
    if not isinstance(points, list):
        raise StudyError(f"{path}: 'points' is not a list; pass a frontier.json that `cory-plot frontier` wrote")
    for i, p in enumerate(points):
        for key in POINT_KEYS:
            results.field(p, key, f"{path} point {i}")
        for key in ("task_reward", "kl", "x", "y"):
            results.number(p[key], f"{path} point {i}: {key}")
    return points


def load_points(args, api) -> list[dict]:
    """The points to plot; a `StudyError` saying what was searched and what to do when there are none."""
    if args.from_json:
        points = _saved_points(args.from_json)
        if not points:
            raise StudyError(f"{args.from_json} holds no point; draw the frontier from the run folders instead")
        return points
    if args.wandb:
        if api is None and (why := wandb_unavailable()):
            raise StudyError(why)
        try:
            points = collect_wandb(args.wandb, api=api)
        except StudyError:
            raise
        except Exception as err:  # the W&B client's network and auth errors have no common base
            first = (str(err).strip().splitlines() or [""])[0]
            raise StudyError(f"cannot read W&B group {args.wandb} ({type(err).__name__}: {first})") from None
        if not points:
            raise StudyError(
                f"no finished run with a final evaluation in W&B group {args.wandb}; check the group name"
            )
        return points
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        raise StudyError(f"no such folder: {', '.join(missing)}")
    skipped: list[str] = []
    points = frontier.collect(args.dirs, skipped)
    if not points:
        searched = ", ".join(map(str, args.dirs))
        found = sum(1 for d in args.dirs for _ in (d.rglob("summary.json") if d.is_dir() else [d]))
        why = f"{found} summary.json found, none usable: {skipped[0]}" if found else "no summary.json found"
        raise StudyError(
            f"no finished run with a final evaluation under {searched} ({why}); pass the folders that "
            "`cory-train` or a sweep wrote, after their runs finished"
        )
    for note in skipped:
        print(f"skipping {note}", file=sys.stderr)
    return points


def select(points: list[dict], args) -> dict[tuple, list[dict]]:
    """The studies to draw (`cory.frontier.studies`), after `--task`, `--experiment`, `--iterations`; several only
    with `--split`, else refused in one line naming each study and how to choose one."""
    wanted = {"task": args.task, "experiment": args.experiment, "iterations": args.iterations}
    kept = [p for p in points if all(v is None or p.get(k) == v for k, v in wanted.items())]
    found = frontier.studies(points)
    if not kept:
        given = " ".join(f"--{k} {v}" for k, v in wanted.items() if v is not None)
        have = "; ".join(frontier.describe_study(key) for key in found)
        raise StudyError(f"no run matches {given} (the runs are: {have}); choose one of these")
    chosen = frontier.studies(kept)
    if len(chosen) > 1 and not args.split:
        have = "; ".join(f"{frontier.describe_study(key)} ({len({p['run'] for p in pts})} runs)"
                         for key, pts in chosen.items())  # fmt: skip
        raise StudyError(
            f"the runs are {len(chosen)} studies, and one front across them compares nothing: {have}; "
            "choose one with --task, --experiment and --iterations, or draw each with --split"
        )
    return chosen


def _suffix(key: tuple) -> str:
    task, experiment, iterations = key
    name = "-".join(str(v) for v in (task, experiment, None if iterations is None else f"{iterations}it") if v)
    return re.sub(r"[^\w.-]+", "_", name) or "unknown"


def _with_suffix(path: Path | None, key: tuple, several: bool) -> Path | None:
    if path is None or not several:
        return path
    return path.with_name(f"{path.stem}-{_suffix(key)}{path.suffix}")


def draw(points: list[dict], out: Path, json_path: Path | None, csv_path: Path | None, title: str | None) -> dict:
    """One study's figure, JSON and CSV; returns `cory.frontier.plot_frontier`'s result."""
    with command.output(out):
        result = frontier.plot_frontier(points, out, title=title)
    if json_path is not None:
        with command.output(json_path, "--json"):
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps({"points": points, **result}, indent=2))
    if csv_path is not None:
        with command.output(csv_path, "--csv"):
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            with csv_path.open("w", newline="") as f:
                csv.writer(f).writerows([frontier.COLUMNS, *frontier.table_rows(points)])
    return result


def run(argv: Sequence[str] | None = None, prog: str = "cory-plot frontier", api=None) -> int:
    """The command; `api` replaces `wandb.Api()` (tests pass one)."""
    parser = command.parser(prog, __doc__)
    parser.add_argument("dirs", nargs="*", type=Path, help="run or sweep folders searched for summary.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT/GROUP", help="read the runs of a W&B group instead")
    parser.add_argument("--from-json", type=Path, default=None, help="redraw the points of a frontier JSON")
    parser.add_argument("--out", type=Path, default=Path("frontier.png"), help="output PNG (default frontier.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write points, averages and fronts as JSON")
    parser.add_argument("--csv", type=Path, default=None, help="also write the per-point table as CSV")
    parser.add_argument("--title", default=None)
    parser.add_argument("--task", default=None, help="only the runs of this task (e.g. imdb)")
    parser.add_argument("--experiment", default=None, help="only the runs of this experiment (e.g. cpu_imdb)")
    parser.add_argument("--iterations", type=int, default=None, help="only the runs that trained this long")
    parser.add_argument("--split", action="store_true", help="one figure per study (task, experiment, iterations)")
    args = parser.parse_args(argv)
    if sum(map(bool, (args.dirs, args.wandb, args.from_json))) != 1:
        parser.error("give run/sweep folders, --wandb ENTITY/PROJECT/GROUP or --from-json FILE (one of the three)")

    chosen = select(load_points(args, api), args)
    several = len(chosen) > 1
    for key, points in chosen.items():
        out = _with_suffix(args.out, key, several)
        result = draw(points, out, _with_suffix(args.json, key, several), _with_suffix(args.csv, key, several),
                      args.title)  # fmt: skip
        if several:
            print(f"== {frontier.describe_study(key)}")
        print(frontier.format_table(result["aggregated"], result["fronts"]))
        print(f"{len(points)} points from {len({p['run'] for p in points})} runs → {out}")
    return 0


def main(argv: Sequence[str] | None = None, api=None) -> int:
    return command.guard(run, argv, api=api)


if __name__ == "__main__":
    sys.exit(main())
