"""Per-problem outcomes of MAFT's held-out evaluations, and the paired test that compares two of them.

Every held-out evaluation of a run (after k fine-tuning rounds; k = 0: the base agents) scores the same problems with
the same seed, and so does the single-agent FT baseline's with the same seed and task: two evaluations differ only
through the agents, so their accuracies are compared problem by problem (a paired test), which aggregate accuracies
cannot give. Each evaluation therefore appends one row per problem to `run_dir/eval_outcomes.jsonl`:

    {"iteration": 1, "problem": 0, "n": 64, "id": "9f2c...", "truth": "5", "vote": 1, "round1_majority": 0,
     "single_sample": 0.333, "gen1": 1, "gen2": 0, "gen3": 0, "critic1": 1, "critic2": 1, "critic3": 0}

- `iteration`: the rounds done, as in the `maft/eval/...` row of metrics.jsonl; `problem`: the index in the held-out
  set of `n` problems; `id`: the first 16 hex digits of sha256(question, gold answer), so that two files can be
  checked to hold the same problems in the same order; `truth`: the gold answer.
- 0/1 correctness: `vote` (the final-round majority vote, MAFT's answer: `maft/eval/accuracy`), `round1_majority`
  (the vote over round-1 answers), `gen<n>` (generation agent n's round-1 answer: one sample), `critic<n>` (critic
  n's last-round answer); `single_sample` is the mean of the `gen<n>` over agents. The mean of a column over the n
  rows is the logged accuracy.

One writer (the evaluation, on rank 0), append only. A resumed run evaluates again what its killed start evaluated
after the checkpoint, reading the debate back from `rounds/`, so it finds the same outcomes: a row whose
(iteration, problem) is in the file already is not written again, and a last line cut by a kill is dropped before
anything is appended after it. The file holds each evaluation once and whole however often the run was resumed.

The paired test of two evaluations A and B on the same n problems, with x_i, y_i their outcomes on problem i:
the difference of accuracies is the mean of d_i = x_i − y_i, with standard error √(Var(d)/n) (population variance,
as the logged √(p(1−p)/n)) and the normal 95 % interval ± 1.96 s.e.; for 0/1 outcomes with b problems right in A
only and c right in B only, that is (b − c)/n ± 1.96 · √((b + c − (b − c)²/n)/n²). McNemar's exact test (McNemar
1947, in its exact binomial form): under equal accuracy each discordant problem is A's or B's with probability 1/2,
so b ~ Binomial(b + c, 1/2) and the two-sided p = min(1, 2 · P(X ≤ min(b, c))). The concordant problems carry no
information on the difference, which is why the paired test is sharper than comparing two unpaired standard errors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cory.errors import writing
from cory.maft.debate import DebateRecord
from cory.tasks.answers import answers_equal

OUTCOMES_FILE = "eval_outcomes.jsonl"
KEYS = ("iteration", "problem", "n", "id", "truth")  # what identifies a row; every other field is an outcome
Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


class OutcomesError(ValueError):
    """Two evaluations that cannot be compared, or one that is not in the file whole: said in one line."""


def problem_id(question: str, truth: str) -> str:
    """The first 16 hex digits of sha256 over the question and the gold answer."""
    return hashlib.sha256(f"{question}\x00{truth}".encode()).hexdigest()[:16]


def outcome_rows(
    iteration: int, records: Sequence[DebateRecord], votes: Sequence[str | None], round1_votes: Sequence[str | None]
) -> list[dict]:
    """One row per problem of a held-out debate (see the module docstring); `votes` over the final round."""
    rows = []
    for i, (record, vote, round1) in enumerate(zip(records, votes, round1_votes, strict=True)):
        gens = [int(answers_equal(a, record.truth)) for a in record.answers[0]]
        row = {"iteration": iteration, "problem": i, "n": len(records)}
        row |= {"id": problem_id(record.question, record.truth), "truth": record.truth}
        row |= {"vote": int(answers_equal(vote, record.truth))}
        row |= {"round1_majority": int(answers_equal(round1, record.truth)), "single_sample": sum(gens) / len(gens)}
        row |= {f"gen{a + 1}": right for a, right in enumerate(gens)}
        if len(record.answers) > 1:
            row |= {f"critic{a + 1}": int(answers_equal(x, record.truth)) for a, x in enumerate(record.answers[-1])}
        rows.append(row)
    return rows


def read_outcomes(path: Path) -> list[dict]:
    """The well-formed rows of an outcomes file, in order; a malformed line (a tail cut by a kill, a row without its
    keys) is skipped, and of two rows with one (iteration, problem) the first is kept."""
    rows, seen = [], set()
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            key = (int(row["iteration"]), int(row["problem"]))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            continue
        if key not in seen and all(k in row for k in KEYS):
            seen.add(key)
            rows.append(row)
    return rows


def append_outcomes(path: Path, rows: list[dict]) -> int:
    """Append the rows the file lacks (by (iteration, problem)); returns how many rows of the file were replaced.

    A row already there equal to the new one is kept: a resumed run writes each evaluation once. One that differs
    (a resume that changed the held-out set) cannot stand beside the new ones: the file is rewritten without that
    iteration's old rows (atomically), and the caller says so.
    """
    path = Path(path)
    have = {(r["iteration"], r["problem"]): r for r in read_outcomes(path)}
    iterations = {row["iteration"] for row in rows}
    stale = [r for r in have.values() if r["iteration"] in iterations]
    replaced = 0
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        if any(have.get((r["iteration"], r["problem"]), r) != r for r in rows):
            kept = [r for r in have.values() if r["iteration"] not in iterations]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(_line(r) for r in kept), encoding="utf-8")
            os.replace(tmp, path)
            replaced, have = len(stale), {}
        elif path.exists():
            _drop_cut_tail(path)
        new = [r for r in rows if (r["iteration"], r["problem"]) not in have]
        with path.open("a", encoding="utf-8") as handle:
            handle.write("".join(_line(r) for r in new))
    return replaced


def _line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"


def _drop_cut_tail(path: Path) -> None:
    """A kill while appending can leave a last line without its newline: cut it, or the next row would join it."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


# ------------------------------------------------------------------------------------------------- the paired test
def evaluation(rows: list[dict], iteration: int | None, where: str) -> tuple[int, list[dict]]:
    """The rows of the evaluation at `iteration` (None: the last one in the file), ordered by problem; refused in one
    line (`OutcomesError`, `where` names the file) when there is none or it is not whole."""
    done = sorted({int(r["iteration"]) for r in rows})
    if not done:
        raise OutcomesError(f"{where} holds no evaluation")
    k = done[-1] if iteration is None else iteration
    if k not in done:
        raise OutcomesError(f"{where} has no evaluation at iteration {k} (it has {', '.join(map(str, done))})")
    chosen = sorted((r for r in rows if int(r["iteration"]) == k), key=lambda r: int(r["problem"]))
    n = int(chosen[0]["n"])
    if [int(r["problem"]) for r in chosen] != list(range(n)) or any(int(r["n"]) != n for r in chosen):
        raise OutcomesError(f"{where}: the evaluation at iteration {k} is not whole ({len(chosen)} of {n} problems)")
    return k, chosen


def stats(rows: list[dict]) -> list[str]:
    """The outcome columns of an evaluation's rows (`vote`, `round1_majority`, `single_sample`, `gen1`, ...)."""
    return [key for key in rows[0] if key not in KEYS]


@dataclass(frozen=True)
class PairedTest:
    """Two evaluations of one statistic on the same n problems (A − B); `p` is None unless both are 0/1."""

    n: int
    mean_a: float
    mean_b: float
    difference: float
    se: float
    low: float  # the normal 95 % interval of the difference
    high: float
    b: int | None  # problems right in A only (0/1 outcomes)
    c: int | None  # problems right in B only
    p: float | None  # McNemar's exact two-sided p


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: min(1, 2 · P(X ≤ min(b, c))), X ~ Binomial(b + c, 1/2); 1 when b = c = 0."""
    m = b + c
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**m)  # integers until the one division: exact for any number of problems


def paired_test(x: Sequence[float], y: Sequence[float]) -> PairedTest:
    """Paired comparison of outcomes x (A) and y (B) on the same problems, in the same order (module docstring)."""
    if len(x) != len(y) or not x:
        raise ValueError(f"paired outcomes need equal, non-zero lengths (got {len(x)} and {len(y)})")
    n = len(x)
    d = [a - b for a, b in zip(x, y)]
    diff = sum(d) / n
    se = math.sqrt(max(0.0, sum(v * v for v in d) / n - diff * diff) / n)
    binary = all(v in (0, 1) for v in (*x, *y))
    b = sum(1 for u, v in zip(x, y) if u == 1 and v == 0) if binary else None
    c = sum(1 for u, v in zip(x, y) if u == 0 and v == 1) if binary else None
    p = mcnemar_exact(b, c) if b is not None and c is not None else None
    return PairedTest(n, sum(x) / n, sum(y) / n, diff, se, diff - Z95 * se, diff + Z95 * se, b, c, p)
