"""KL-vs-reward frontier (paper Fig. 2c; docs/method.md §3.4) from local run folders or from a W&B group.

    python scripts/plot_frontier.py RUN_OR_SWEEP_DIR [...] --out frontier.png [--json frontier.json] [--csv f.csv]
    python scripts/plot_frontier.py --wandb ENTITY/PROJECT/GROUP --out frontier.png

Local: every `summary.json` below the given folders is one run (its agents' final held-out evaluation, each agent
alone in the query-only role; docs/method.md §1.6). W&B: the finished runs of the group, read through the W&B
public API (needs network and an API key); a sweep's group is named after the sweep (`sweep.name`).

- One point per (run, agent) at x = eval task reward, y = −eval KL_seq; colour = algorithm, marker = agent.
- Points are averaged over seeds per (algorithm, η = `init_kl_coef`, agent), drawn as mean ± std error bars
  when there are several seeds (the single-seed points faintly behind).
- Each algorithm's upper-right Pareto front (higher reward, lower KL) is drawn through its averaged points.
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

from cory import frontier  # noqa: E402


def main(argv: Sequence[str] | None = None, api=None) -> int:
    """The CLI; `api` replaces `wandb.Api()` (tests pass a fake)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", type=Path, help="run or sweep folders searched for summary.json")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT/GROUP", help="read the runs of a W&B group instead")
    parser.add_argument("--out", type=Path, default=Path("frontier.png"), help="output PNG (default frontier.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write points, averages and fronts as JSON")
    parser.add_argument("--csv", type=Path, default=None, help="also write the per-point table as CSV")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    if bool(args.dirs) == bool(args.wandb):
        parser.error("give run/sweep folders or --wandb ENTITY/PROJECT/GROUP (one of the two)")

    if args.wandb:
        try:
            points = frontier.collect_wandb(args.wandb, api=api)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        source = f"W&B group {args.wandb}"
    else:
        points = frontier.collect(args.dirs)
        source = ", ".join(map(str, args.dirs))
    if not points:
        print(f"no finished run with a final evaluation in {source}", file=sys.stderr)
        return 1
    result = frontier.plot_frontier(points, args.out, title=args.title)
    print(frontier.format_table(result["aggregated"], result["fronts"]))
    print(f"{len(points)} points from {len({p['run'] for p in points})} runs → {args.out}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"points": points, **result}, indent=2))
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            csv.writer(f).writerows([frontier.COLUMNS, *frontier.table_rows(points)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
