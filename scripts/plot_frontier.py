"""KL-vs-reward frontier (paper Fig. 2c; docs/method.md §3.4) from local run folders or from a W&B group.

    python scripts/plot_frontier.py RUN_OR_SWEEP_DIR [...] --out frontier.png [--json frontier.json] [--csv f.csv]
    python scripts/plot_frontier.py --wandb ENTITY/PROJECT/GROUP --out frontier.png
    python scripts/plot_frontier.py --from-json frontier.json --out frontier.png      # redraw saved points

Local: every `summary.json` below the given folders is one run (its agents' final held-out evaluation, each agent
alone in the query-only role; docs/method.md §1.6). W&B: the finished runs of the group, read through the W&B
public API (needs network and an API key: without one, or with WANDB_MODE=disabled/offline, it says so in one
line and exits); a sweep's group is named after the sweep (`sweep.name`). `--from-json`: the points of a JSON
this script (or the end-of-sweep callback) wrote.

- One point per (run, agent) at x = eval task reward, y = −eval KL_seq; colour = algorithm, marker = agent.
- Points are averaged over seeds per (algorithm, η = `init_kl_coef`, agent), drawn as mean ± std error bars
  when there are several seeds (the single-seed points faintly behind).
- Each algorithm's upper-right Pareto front (higher reward, lower KL) is drawn through its averaged points, which
  are ringed; the joint front over all algorithms' averaged points is a grey band behind them.
- Title (task, experiment, seeds), axis units (the task's reward unit, KL in nats) and the legend follow
  `cory.figures`. No point to plot, or an output that cannot be written, is one line and a non-zero exit.
- A table of the averaged points is printed; `--json` also writes points, averages and fronts, `--csv` the
  per-point table. The maths lives in `cory/frontier.py`, shared with the end-of-sweep callback.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python scripts/plot_frontier.py` runs from the checkout

from cory import figures, frontier  # noqa: E402


def wandb_unavailable() -> str | None:
    """Why the W&B public API cannot be read here, in one line; None when it can be tried."""
    import os

    from cory.loggers import _api_key_configured

    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("disabled", "offline", "dryrun"):
        return (
            f"error: --wandb reads runs from the W&B servers, but WANDB_MODE={mode} here; "
            "unset WANDB_MODE (with an API key) or plot the local run folders instead"
        )
    if not _api_key_configured():
        return (
            "error: --wandb needs a W&B API key (set WANDB_API_KEY or run `wandb login`); "
            "or plot the local run folders instead"
        )
    return None


def load_points(args, api) -> tuple[list[dict], str | None, int]:
    """(the points to plot, None, 0), or ([], one line saying what was searched and what to do, the exit status:
    1 when nothing was found, 2 when the source cannot be read as given)."""
    if args.from_json:
        try:
            return list(json.loads(args.from_json.read_text(encoding="utf-8"))["points"]), None, 0
        except (OSError, ValueError, KeyError, TypeError) as err:
            return [], f"error: cannot read points from {args.from_json} ({type(err).__name__}: {err})", 2
    if args.wandb:
        if api is None and (why := wandb_unavailable()):
            return [], why, 2
        try:
            points = frontier.collect_wandb(args.wandb, api=api)
        except ValueError as err:
            return [], f"error: {err}", 2
        except Exception as err:  # the W&B client's network and auth errors have no common base
            first = (str(err).strip().splitlines() or [""])[0]
            return [], f"error: cannot read W&B group {args.wandb} ({type(err).__name__}: {first})", 2
        if not points:
            why = f"error: no finished run with a final evaluation in W&B group {args.wandb}; check the group name"
            return [], why, 1
        return points, None, 0
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        return [], f"error: no such folder: {', '.join(missing)}", 1
    points = frontier.collect(args.dirs)
    if not points:
        searched = ", ".join(map(str, args.dirs))
        found = sum(1 for d in args.dirs for _ in (d.rglob("summary.json") if d.is_dir() else [d]))
        why = f"{found} summary.json found, none usable (see above)" if found else "no summary.json found"
        problem = (
            f"error: no finished run with a final evaluation under {searched} ({why}); pass the folders that "
            "`python -m cory.train` or a sweep wrote, after their runs finished"
        )
        return [], problem, 1
    return points, None, 0


def main(argv: Sequence[str] | None = None, api=None) -> int:
    """The CLI; `api` replaces `wandb.Api()` (tests pass a fake)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", type=Path, help="run or sweep folders searched for summary.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT/GROUP", help="read the runs of a W&B group instead")
    parser.add_argument("--from-json", type=Path, default=None, help="redraw the points of a frontier JSON")
    parser.add_argument("--out", type=Path, default=Path("frontier.png"), help="output PNG (default frontier.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write points, averages and fronts as JSON")
    parser.add_argument("--csv", type=Path, default=None, help="also write the per-point table as CSV")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    if sum(map(bool, (args.dirs, args.wandb, args.from_json))) != 1:
        parser.error("give run/sweep folders, --wandb ENTITY/PROJECT/GROUP or --from-json FILE (one of the three)")

    points, problem, status = load_points(args, api)
    if problem:
        print(problem, file=sys.stderr)
        return status
    try:
        result = frontier.plot_frontier(points, args.out, title=args.title)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"points": points, **result}, indent=2))
        if args.csv is not None:
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            with args.csv.open("w", newline="") as f:
                csv.writer(f).writerows([frontier.COLUMNS, *frontier.table_rows(points)])
    except OSError as err:
        print(figures.write_error(err), file=sys.stderr)
        return 2
    print(frontier.format_table(result["aggregated"], result["fronts"]))
    print(f"{len(points)} points from {len({p['run'] for p in points})} runs → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
