"""MAFT's per-problem held-out outcomes and the paired test (`cory/maft/outcomes.py`, `cory/studies/stats.py`,
`cory-report paired`).

- McNemar's exact test and the paired difference ± s.e. against hand-computed values (and scipy's binomial test);
- the rows of a hand-made debate reproduce `debate_metrics`' accuracies;
- the writer: append only, a cut last line dropped, rows already there not written again, rows of another held-out
  set replaced;
- the command line: two runs, two iterations of one run, and one-line refusals (other problems, a missing file,
  iteration or statistic, an evaluation that is not whole).
Writing the file during a real run and across kills and resumes: `test_maft_debate.py` and `test_maft.py`.
Run: `pytest tests/test_maft_outcomes.py` (a second).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy.stats import binomtest

from cory.maft.debate import DebateRecord
from cory.maft.metrics import debate_metrics
from cory.maft.outcomes import OUTCOMES_FILE, append_outcomes, outcome_rows, problem_id, read_outcomes
from cory.studies import paired_test as cli
from cory.studies.results import outcome_columns as stats
from cory.studies.stats import mcnemar_exact, paired_test

# 64 problems: 30 right in both, 7 right in A only, 2 right in B only, 25 wrong in both
A = [1] * 30 + [1] * 7 + [0] * 2 + [0] * 25
B = [1] * 30 + [0] * 7 + [1] * 2 + [0] * 25


def test_mcnemar_and_the_paired_difference_against_hand_computed_values():
    """b = 7, c = 2, n = 64.

    McNemar: b + c = 9 discordant problems; P(X ≤ 2), X ~ Bin(9, 1/2) = (C(9,0) + C(9,1) + C(9,2)) / 2⁹
    = (1 + 9 + 36) / 512 = 46/512, so p = 2 · 46/512 = 92/512 = 0.1796875.
    Difference: p_A − p_B = 37/64 − 32/64 = (b − c)/n = 5/64 = 0.078125.
    s.e. = √((b + c − (b − c)²/n)/n²) = √((9 − 25/64)/4096) = √(551/64)/64 = √551/512 ≈ 0.0458466.
    95 % interval: 5/64 ± 1.96 · √551/512 ≈ [−0.0117, +0.1680].
    """
    t = paired_test(A, B)
    assert (t.n, t.b, t.c) == (64, 7, 2)
    assert t.p == 92 / 512 == mcnemar_exact(7, 2) == mcnemar_exact(2, 7)
    assert (t.mean_a, t.mean_b, t.difference) == (37 / 64, 32 / 64, 5 / 64)
    assert t.se == pytest.approx(math.sqrt(551) / 512, rel=1e-12)
    assert (t.low, t.high) == (pytest.approx(-0.01173, abs=1e-5), pytest.approx(0.16798, abs=1e-5))
    # the other way round: the difference changes sign, the test does not
    back = paired_test(B, A)
    assert (back.difference, back.se, back.b, back.c, back.p) == (-t.difference, t.se, 2, 7, t.p)


def test_mcnemar_small_cases_by_hand_and_against_scipys_binomial_test():
    assert mcnemar_exact(0, 0) == 1.0  # no discordant problem: no evidence
    assert mcnemar_exact(5, 0) == 2 / 32  # 2 · P(X = 0), X ~ Bin(5, 1/2)
    assert mcnemar_exact(3, 3) == 1.0  # 2 · (1 + 6 + 15 + 20)/64 = 84/64, capped at 1
    for b, c in [(1, 0), (4, 1), (10, 3), (12, 12), (40, 25), (700, 619)]:  # up to GSM8K's 1,319 problems
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9), (b, c)


def test_a_non_binary_outcome_gets_the_paired_difference_but_no_mcnemar():
    """Single-sample accuracy is a mean over agents: d = (1/3 − 0, 1 − 1/3) = (1/3, 2/3), mean 1/2,
    Var(d) = (1/9 + 4/9)/2 − 1/4 = 1/36, s.e. = √(1/36 / 2) = 1/(6√2)."""
    t = paired_test([1 / 3, 1.0], [0.0, 1 / 3])
    assert t.difference == pytest.approx(0.5) and t.se == pytest.approx(1 / (6 * math.sqrt(2)))
    assert (t.b, t.c, t.p) == (None, None, None)
    with pytest.raises(ValueError, match="equal, non-zero lengths"):
        paired_test([1, 0], [1])


def record(truth: str, round1: list[str | None], round2: list[str | None], question: str = "q") -> DebateRecord:
    return DebateRecord(question, truth, answers=[round1, round2])


def test_the_rows_of_a_hand_made_debate_reproduce_the_logged_accuracies():
    records = [
        record("5", ["5", "4", "5"], ["5", "5", "5"], "a"),
        record("8", ["8", "9", "1"], ["8", "9", "8"], "b"),
        record("3", ["2", "2", "2"], ["2", "2", "3"], "c"),
        record("1", ["7", "6", None], ["6", "6", "6"], "d"),
    ]
    votes, round1 = ["5", "8", "2", "6"], ["5", "8", "2", "6"]
    rows = outcome_rows(3, records, votes, round1)
    assert rows[1] == {
        "iteration": 3,
        "problem": 1,
        "n": 4,
        "id": problem_id("b", "8"),
        "truth": "8",
        "vote": 1,
        "round1_majority": 1,
        "single_sample": 1 / 3,
        "gen1": 1,
        "gen2": 0,
        "gen3": 0,
        "critic1": 1,
        "critic2": 0,
        "critic3": 1,
    }
    assert [r["vote"] for r in rows] == [1, 1, 0, 0] and [r["critic3"] for r in rows] == [1, 1, 1, 0]
    m = debate_metrics(records, votes, round1, "eval")
    mean = {key: sum(r[key] for r in rows) / 4 for key in stats(rows)}
    assert mean["vote"] == m["maft/eval/accuracy"]
    assert mean["round1_majority"] == m["maft/eval/round1_majority_accuracy"]
    assert mean["single_sample"] == pytest.approx(m["maft/eval/single_sample_accuracy"])
    assert all(mean[f"{a}{n}"] == m[f"maft/eval/{a}{n}/accuracy"] for a in ("gen", "critic") for n in (1, 2, 3))
    assert problem_id("b", "8") != problem_id("b", "9") and len(problem_id("b", "8")) == 16


def rows_of(iteration: int, outcomes: list[int], questions: str = "q", stat: str = "vote") -> list[dict]:
    n = len(outcomes)
    return [
        {"iteration": iteration, "problem": i, "n": n, "id": problem_id(f"{questions}{i}", "1"), "truth": "1"}
        | {stat: x, "gen1": x}
        for i, x in enumerate(outcomes)
    ]


def test_the_writer_appends_once_drops_a_cut_tail_and_replaces_another_held_out_set(tmp_path):
    path = tmp_path / OUTCOMES_FILE
    first, second = rows_of(0, [1, 0, 1]), rows_of(1, [1, 1, 0])
    assert append_outcomes(path, first) == 0 and append_outcomes(path, second) == 0
    whole = path.read_bytes()
    assert read_outcomes(path) == first + second
    # a resumed start evaluates round 1 again: nothing is written twice
    assert append_outcomes(path, second) == 0 and path.read_bytes() == whole
    # killed while appending round 1's last row: the cut line is dropped and the row written whole
    path.write_bytes(whole[:-9])
    assert read_outcomes(path) == first + second[:2]
    assert append_outcomes(path, second) == 0 and path.read_bytes() == whole
    # killed before its last row was written at all: only that row is added
    path.write_bytes(whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 1])
    append_outcomes(path, second)
    assert path.read_bytes() == whole
    # a resume whose held-out set changed: round 1's rows are replaced, round 0's kept
    other = rows_of(1, [0, 0], questions="other")
    assert append_outcomes(path, other) == 3
    assert read_outcomes(path) == first + other
    # a reader skips malformed lines and keeps the first of two rows for one problem
    with path.open("a") as handle:
        handle.write('{"iteration": 0, "problem": 1, "n": 3, "id": "x", "truth": "1", "vote": 1}\nnot json\n')
    assert read_outcomes(path) == first + other


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    """Run A evaluated at iterations 0 (B's outcomes) and 1 (A's), run B at iteration 1 (B's)."""
    a, b = tmp_path / "a", tmp_path / "b"
    append_outcomes(a / OUTCOMES_FILE, rows_of(0, B) + rows_of(1, A))
    append_outcomes(b / OUTCOMES_FILE, rows_of(1, B))
    return a, b


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(x) for x in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_command_compares_two_runs_or_two_iterations_of_one(runs, capsys):
    a, b = runs
    code, out, err = run_cli(capsys, a, b, "--stat", "vote")  # the last evaluation of each by default
    assert code == 0 and not err
    assert out.splitlines() == [
        f"A: {a} (iteration 1)",
        f"B: {b} (iteration 1)",
        "vote on the same n = 64 problems: A 0.578, B 0.500",
        "difference A − B +0.078 ± 0.046 (paired s.e.), 95 % interval [-0.012, +0.168]",
        "discordant problems: right in A only b = 7, right in B only c = 2; McNemar's exact two-sided p = 0.1797",
    ]
    same = run_cli(capsys, a, "--iteration", "1", a, "--iteration", "0")  # within one run: rounds 1 and 0
    assert same[0] == 0 and same[1].splitlines()[2:] == out.splitlines()[2:]
    assert run_cli(capsys, a, "--iteration", "1", "--iteration", "0")[1] == same[1]  # the run named once
    code, out, _ = run_cli(capsys, b / OUTCOMES_FILE, a / OUTCOMES_FILE, "--iteration", "0")  # files, B ≡ A at 0
    assert code == 0 and "difference A − B +0.000 ± 0.000" in out and "b = 0, right in B only c = 0" in out
    assert "p = 1" in out


def test_the_command_refuses_in_one_line(runs, capsys, tmp_path):
    a, b = runs
    other, short, cut = tmp_path / "other", tmp_path / "short", tmp_path / "cut"
    append_outcomes(other / OUTCOMES_FILE, rows_of(1, B, questions="x"))
    append_outcomes(short / OUTCOMES_FILE, rows_of(1, B[:32]))
    append_outcomes(cut / OUTCOMES_FILE, rows_of(1, B))
    lines = (cut / OUTCOMES_FILE).read_text().splitlines(keepends=True)
    (cut / OUTCOMES_FILE).write_text("".join(lines[:10] + lines[11:]))
    cases = [
        ((a, other), f"error: {a} (iteration 1) and {other} (iteration 1) do not score the same problems "
                     f"(problem 0 differs); a paired test needs them"),
        ((a, short), f"error: {a} (iteration 1) and {short} (iteration 1) do not score the same problems "
                     f"(64 vs 32 problems); a paired test needs them"),
        ((a, tmp_path), f"error: {tmp_path / OUTCOMES_FILE} does not exist: not a MAFT run folder, or one made "
                        f"before per-problem outcomes were written"),
        ((a, b, "--iteration", "4"), f"error: {b / OUTCOMES_FILE} has no evaluation at iteration 4 (it has 1)"),
        ((a, cut), f"error: {cut / OUTCOMES_FILE}: the evaluation at iteration 1 is not whole (63 of 64 problems)"),
        ((a, b, "--stat", "critic1"), f"error: {a / OUTCOMES_FILE}: no statistic 'critic1' (it has vote, gen1)"),
        ((a, b, a), "error: two evaluations are compared, 3 given; usage:"),
        (("--iteration", "1", a, b), "error: --iteration comes after the run folder it belongs to"),
        ((a, "--iteration", "one", b), "error: --iteration one: not an integer"),
    ]  # fmt: skip
    for argv, message in cases:
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and not out and err.startswith(message) and err.count("\n") == 1, (argv, err)
    assert json.loads((a / OUTCOMES_FILE).read_text().splitlines()[0])["iteration"] == 0  # nothing was changed


def test_the_sweep_runners_results_keep_the_outcomes(runs, tmp_path):
    from cory.studies import run_sweep

    a, _ = runs
    run_sweep.collect(a, tmp_path / "results")  # what `cory-sweep --results` does with a finished run
    assert (tmp_path / "results" / OUTCOMES_FILE).read_bytes() == (a / OUTCOMES_FILE).read_bytes()
