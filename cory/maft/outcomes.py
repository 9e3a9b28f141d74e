"""Per-problem outcomes of MAFT's held-out evaluations: the rows, their writer and their reader.

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

The paired test that compares two evaluations problem by problem (with McNemar's exact test) reads this file:
`cory.studies.stats.paired_test`, run by `cory-report paired`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cory.errors import writing
from cory.maft.debate import DebateRecord
from cory.tasks.answers import answers_equal

OUTCOMES_FILE = "eval_outcomes.jsonl"
KEYS = ("iteration", "problem", "n", "id", "truth")  # what identifies a row; every other field is an outcome


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
