"""The multi-agent family's table (docs/results.md, "The multi-agent family on arithmetic"), from committed results.

    cory-report family outputs/family/results --out outputs/family

Reads each finished run's small files under `RESULTS/algorithm=<name>/seed=<n>/` (what `cory-sweep --results`
copies: `summary.json`, `metrics.jsonl`, and with `--evaluate` also `passk.json`) and writes
`family.md` (the table) and `family.json` (every number) into `--out`. Per algorithm and agent, over its seeds:
- held-out accuracy: the task reward of the run's last evaluation (`summary.json`, `agents.<id>.task_reward`);
- KL_seq to π0 at that evaluation (`agents.<id>.kl`);
- pass@1, pass@4, pass@16 and greedy accuracy of the final weights (`passk.json`, `python -m cory.evaluate`), when
  the run has one; the base model's are reported once per seed;
- seconds per iteration: the median over seeds of each run's median `time/iteration_s` (which costs more, not what
  a run costs alone when several share a machine).
Each value is `mean ± s.d. [min–max]` over the seeds (s.d. with n − 1; one seed: the value alone). A run that has
not finished (`completed` not true) is left out and counted.

Then two comparisons, each the difference of the means over seeds with its 95 % Welch t interval: every agent against
PPO's llm1 (the sweep's baseline), and each CORY variant's agents against plain CORY's same agent (what the variant
changes: the critic, the schedule, the sharing; the shared policy's one agent against CORY's llm1). The seeds of two
algorithms are independent runs (seed n of PPO and of CORY share no training randomness that would pair them), so
the unpaired interval with Welch–Satterthwaite degrees of freedom is the one that does not claim more than the seeds
give; it needs two seeds on each side (`cory.studies.stats.welch`).
The files are read by `cory.studies.results`: a corrupt, partial or non-numeric result (a finished run's summary
without its agents, a pass@k file without pass@16, NaN), no finished run, or an unwritable `--out` is one line and
exit code 2. The same command: `python -m cory.studies.family_report`.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command, results
from cory.studies.command import StudyError
from cory.studies.stats import spread, welch

# The sweep's order and display names (`cory/conf/sweep/family_arithmetic.yaml`); others follow, sorted.
NAMES = {
    "ppo": "PPO",
    "grpo": "GRPO",
    "cory": "CORY",
    "cory_cc": "CORY + centralised critic",
    "cory_interleaved": "CORY, interleaved updates",
    "cory_shared": "CORY, one shared policy",
}
PASSK = ("pass@1", "pass@4", "pass@16", "greedy_accuracy")
# (reference algorithm, its agent or None for "the same agent", the algorithms compared with it or None for all)
COMPARISONS = (("ppo", "llm1", None), ("cory", None, ("cory_cc", "cory_interleaved", "cory_shared")))
COMPARED = ("accuracy", "pass@1", "pass@16", "kl")  # the columns of the difference table


def _read(folder: Path) -> dict | None:
    """One run's final evaluation, pass@k (or None) and median seconds per iteration; None when it has not
    finished (no summary, or `completed` not true)."""
    summary = results.summary(folder)
    if summary is None or summary.get("completed") is not True:
        return None
    finals = results.final_evaluation(summary, folder)
    initial = (summary.get("initial") or {}).get("llm1") or {}  # the base model, evaluated before training
    base = initial.get("task_reward") if isinstance(initial, dict) else None
    passk = results.passk(folder, PASSK)
    times = []
    if (folder / results.METRICS).is_file():
        times = results.column(results.metrics(folder / results.METRICS), "time/iteration_s", folder / results.METRICS)
    return {
        "agents": finals,
        "initial": None if base is None else results.number(base, f"{folder / results.SUMMARY}: initial.llm1"),
        "passk": passk,
        "time": statistics.median(times) if times else None,
    }


def family(kept: Path) -> dict:
    """Every algorithm's per-agent spreads over its finished seeds (module docstring)."""
    found = results.kept_runs(kept, "algorithm=*")
    present = {name for name, _, _ in found}
    names = [a for a in NAMES if a in present] + sorted(present - set(NAMES))
    out: dict = {"algorithms": {}, "base": {}, "unfinished": []}
    for name in names:
        runs = {}
        for _, seed, folder in results.kept_runs(kept, f"algorithm={name}"):
            run = _read(folder)
            if run is None:
                out["unfinished"].append(f"{folder.parent.name}/{folder.name}")
            else:
                runs[seed] = run
        if not runs:
            continue
        agents = {}
        first = next(iter(runs.values()))["agents"]
        for seed, run in runs.items():
            if set(run["agents"]) != set(first):
                raise StudyError(
                    f"{kept}/algorithm={name}/seed={seed}: agents {', '.join(run['agents'])}, but its other seeds "
                    f"have {', '.join(first)}; one algorithm's runs must come from one configuration"
                )
        for agent_id in first:
            finals = [r["agents"][agent_id] for r in runs.values()]
            row = {
                "accuracy": spread([f["task_reward"] for f in finals]),
                "kl": spread([f["kl"] for f in finals]),
            }
            for key in PASSK:
                scored = [r["passk"][agent_id] for r in runs.values() if agent_id in (r["passk"] or {})]
                row[key] = spread([p[key] for p in scored])
            agents[agent_id] = row
        times = [r["time"] for r in runs.values() if r["time"] is not None]
        out["algorithms"][name] = {
            "seeds": sorted(runs),
            "agents": agents,
            "seconds_per_iteration": statistics.median(times) if times else None,
        }
        for seed, run in runs.items():  # the base model's numbers depend on the seed (its sampling), not the method
            base = out["base"].setdefault(seed, {"accuracy": run["initial"]})
            if run["passk"] and "base" in run["passk"]:
                base.update({key: run["passk"]["base"][key] for key in PASSK})
    out["differences"] = {
        f"{name}/{agent_id or 'same agent'}": differences(out["algorithms"], name, agent_id, compared)
        for name, agent_id, compared in COMPARISONS
        if name in out["algorithms"]
    }
    return out


def differences(algorithms: dict, name: str, agent_id: str | None, compared: tuple | None) -> dict:
    """Agents of the `compared` algorithms (all others when None) minus `name`'s agent `agent_id` (None: the same
    agent id), per compared column (`welch`; module docstring)."""
    out: dict = {}
    for other, algo in algorithms.items():
        if other == name or (compared is not None and other not in compared):
            continue
        for agent, row in algo["agents"].items():
            ref = algorithms[name]["agents"].get(agent_id or agent)
            if ref is None:
                continue
            out.setdefault(other, {})[agent] = {
                key: welch(row[key]["values"], ref[key]["values"]) if row[key] and ref[key] else None
                for key in COMPARED
            }
    return out


def _cell(s: dict | None, digits: int = 3) -> str:
    if s is None:
        return "—"
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f} (1 seed)"
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def _diff(d: dict | None, digits: int) -> str:
    if d is None:
        return "—"
    low, high = d["ci95"]
    return f"{d['diff']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def markdown(report: dict) -> str:
    lines = [
        "| algorithm | agent | seeds | held-out accuracy | KL_seq (nats) | pass@1 | pass@4 | pass@16 | greedy "
        "| s/iteration |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, algo in report["algorithms"].items():
        for i, (agent_id, row) in enumerate(algo["agents"].items()):
            first = i == 0
            seconds = algo["seconds_per_iteration"]
            lines.append(
                f"| {NAMES.get(name, name) if first else ''} | {agent_id} | {len(algo['seeds']) if first else ''} | "
                f"{_cell(row['accuracy'])} | {_cell(row['kl'], 2)} | "
                + " | ".join(_cell(row[key]) for key in PASSK)
                + f" | {f'{seconds:.1f}' if first and seconds is not None else ''} |"
            )
    if report["base"]:
        lines += [
            "",
            "| base model, seed | held-out accuracy | pass@1 | pass@4 | pass@16 | greedy |",
            "|---|---|---|---|---|---|",
        ]
        for seed, base in sorted(report["base"].items()):
            values = [base.get("accuracy"), *(base.get(key) for key in PASSK)]
            lines.append(f"| {seed} | " + " | ".join("—" if v is None else f"{v:.3f}" for v in values) + " |")
    for reference, rows in report["differences"].items():
        if not rows:
            continue
        name, agent_id = reference.split("/")
        lines += [
            "",
            f"Difference to {NAMES.get(name, name)}, {agent_id} (mean over seeds, 95 % Welch t interval; — where "
            "a side has fewer than two seeds):",
            "",
            "| algorithm | agent | held-out accuracy | pass@1 | pass@16 | KL_seq (nats) |",
            "|---|---|---|---|---|---|",
        ]
        for other, agents in rows.items():
            for i, (agent, row) in enumerate(agents.items()):
                label = NAMES.get(other, other) if i == 0 else ""
                cells = [_diff(row[key], 2 if key == "kl" else 3) for key in COMPARED]
                lines.append(f"| {label} | {agent} | " + " | ".join(cells) + " |")
    if report["unfinished"]:
        lines += ["", f"Not finished (left out): {', '.join(report['unfinished'])}."]
    return "\n".join(lines) + "\n"


def run(argv: Sequence[str] | None = None, prog: str = "cory-report family") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument("results", type=Path, help="the sweep's --results folder (algorithm=<name>/seed=<n>/)")
    parser.add_argument("--out", type=Path, required=True, help="where family.md and family.json go")
    args = parser.parse_args(argv)
    report = family(args.results)
    if not report["algorithms"]:
        raise StudyError(
            f"no finished run results under {args.results} (expected algorithm=<name>/seed=<n>/summary.json "
            "with completed: true)"
        )
    with command.output(args.out):
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "family.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "family.md").write_text(markdown(report))
    print(markdown(report), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
