"""Paired test of two MAFT held-out evaluations that scored the same problems (`cory.maft.outcomes`).

    cory-report paired RUN_A [--iteration K] RUN_B [--iteration K'] [--stat vote]
    cory-report paired RUN --iteration 0 --iteration 2          # two rounds of one run

Each evaluation is a run folder (or its `eval_outcomes.jsonl`) and an iteration, the number of fine-tuning rounds
before it (by default the folder's last evaluation); an `--iteration` belongs to the folder before it, and a second
one after the same folder names a second evaluation of that run. `--stat` is an outcome column: `vote` (MAFT's
answer, the default), `round1_majority`, `single_sample`, `gen<n>`, `critic<n>`. Printed: both accuracies, the
difference A − B ± its paired standard error with a 95 % interval, and for 0/1 outcomes the discordant pairs and
McNemar's exact p (`cory.studies.stats.paired_test`). Two evaluations that do not score the same problems in the
same order (the ids of question and gold answer) are refused in one line, as is a missing or corrupt file, an
iteration or statistic it does not hold, or an outcome that is not a number (exit code 2). The same command:
`python -m cory.studies.paired_test`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cory.maft.outcomes import OUTCOMES_FILE
from cory.studies import command, results
from cory.studies.command import StudyError
from cory.studies.stats import PairedTest, paired_test

USAGE = "RUN_A [--iteration K] RUN_B [--iteration K'] [--stat vote]"


def parse(argv: Sequence[str], prog: str = "cory-report paired") -> tuple[list[tuple[Path, int | None]], str]:
    """The two evaluations (file, iteration or None) and the statistic; `StudyError` on a malformed line."""
    evaluations: list[list] = []
    stat = "vote"
    args = iter(argv)
    for arg in args:
        if arg in ("--iteration", "--stat"):
            value = next(args, None)
            if value is None:
                raise StudyError(f"{arg} needs a value")
            if arg == "--stat":
                stat = value
                continue
            if not evaluations:
                raise StudyError("--iteration comes after the run folder it belongs to")
            if not value.lstrip("-").isdigit():
                raise StudyError(f"--iteration {value}: not an integer")
            if evaluations[-1][1] is not None:  # a second iteration of the same run
                evaluations.append([evaluations[-1][0], None])
            evaluations[-1][1] = int(value)
        elif arg.startswith("-"):
            raise StudyError(f"unknown option {arg}")
        else:
            path = Path(arg)
            evaluations.append([path / OUTCOMES_FILE if path.is_dir() else path, None])
    if len(evaluations) != 2:
        raise StudyError(f"two evaluations are compared, {len(evaluations)} given; usage: {prog} {USAGE}")
    return [(path, k) for path, k in evaluations], stat


def compare(a: tuple[Path, int | None], b: tuple[Path, int | None], stat: str) -> tuple[PairedTest, str, str]:
    """The paired test of `stat` between evaluations a and b, and their names; refused in one line if they do not
    score the same problems."""
    chosen = []
    for path, k in (a, b):
        if not path.is_file():
            raise StudyError(
                f"{path} does not exist: not a MAFT run folder, or one made before per-problem outcomes were written"
            )
        k, rows = results.outcomes_at(results.outcomes(path), k, str(path))
        if stat not in results.outcome_columns(rows):
            raise StudyError(f"{path}: no statistic {stat!r} (it has {', '.join(results.outcome_columns(rows))})")
        chosen.append((f"{path.parent if path.name == OUTCOMES_FILE else path} (iteration {k})", rows))
    (name_a, rows_a), (name_b, rows_b) = chosen
    if [r["id"] for r in rows_a] != [r["id"] for r in rows_b]:
        if len(rows_a) != len(rows_b):
            why = f"{len(rows_a)} vs {len(rows_b)} problems"
        else:
            why = f"problem {next(i for i, (x, y) in enumerate(zip(rows_a, rows_b)) if x['id'] != y['id'])} differs"
        raise StudyError(f"{name_a} and {name_b} do not score the same problems ({why}); a paired test needs them")
    a_values, b_values = ([results.number(r[stat], f"{name} problem {r['problem']}: {stat}") for r in rows]
                          for name, rows in ((name_a, rows_a), (name_b, rows_b)))  # fmt: skip
    return paired_test(a_values, b_values), name_a, name_b


def report(test: PairedTest, name_a: str, name_b: str, stat: str) -> str:
    lines = [
        f"A: {name_a}",
        f"B: {name_b}",
        f"{stat} on the same n = {test.n} problems: A {test.mean_a:.3f}, B {test.mean_b:.3f}",
        f"difference A − B {test.difference:+.3f} ± {test.se:.3f} (paired s.e.), 95 % interval "
        f"[{test.low:+.3f}, {test.high:+.3f}]",
    ]
    if test.p is None:
        lines.append(f"McNemar's test: not applicable ({stat} is not a 0/1 outcome)")
    else:
        lines.append(
            f"discordant problems: right in A only b = {test.b}, right in B only c = {test.c}; "
            f"McNemar's exact two-sided p = {test.p:.4g}"
        )
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None, prog: str = "cory-report paired") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: {prog} {USAGE}\n\n{__doc__}")
        return 0
    (a, b), stat = parse(argv, prog)
    test, name_a, name_b = compare(a, b, stat)
    print(report(test, name_a, name_b, stat))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
