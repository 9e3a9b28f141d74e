"""Answer extraction, comparison and pass@k (`cory/tasks/answers.py`) on hand-written cases, and the problem sources
(`cory/tasks/problems.py`) on generated and hand-written data. Run: `pytest tests/test_answers.py` (a few seconds)."""

from __future__ import annotations

import json
import math
from itertools import combinations

import pytest

from cory.errors import AssetUnavailableError
from cory.tasks.answers import answers_equal, extract_answer, parse_ground_truth, pass_at_k
from cory.tasks.problems import arithmetic_problems, gsm8k_problems, gsm_symbolic_problems, split_disjoint

# (response, expected extraction) — the last number rule of docs/method.md §3.2
LAST_NUMBER_CASES = [
    ("Shawn has 5 toys, gets 4 more, so 5 + 4 = 9.", "9"),  # trailing period is not a decimal point
    ("The total is 1,234 dollars.", "1234"),  # thousands separator
    ("She pays $1,234,567.50 in all", "1234567.5"),  # currency, two groups, decimals normalised
    ("It costs £12.", "12"),
    ("The temperature fell to -5 degrees", "-5"),  # a negative answer
    ("The change is −3", "-3"),  # unicode minus
    ("Compute 5-3 which gives", "3"),  # a binary minus is not a sign
    ("between 10-20 apples", "20"),  # nor is a range
    ("(-7)", "-7"),
    ("He ran 3.75 miles", "3.75"),
    ("7.0", "7"),  # one spelling per value
    ("0.50", "0.5"),
    ("No idea, sorry.", None),  # no number
    ("", None),
    ("I count 3 cats, 4 dogs and 12 birds", "12"),  # several numbers: the last
    ("1,2,3", "3"),  # not a thousands group
    ("Answer: 18\nQuestion: Tom has 4 apples and buys 2 more", "2"),  # run-on question: judged on its last number
    ("50% of them", "50"),
]


@pytest.mark.parametrize("text, expected", LAST_NUMBER_CASES)
def test_extract_answer_takes_the_last_number(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_run_on_question_can_be_cut_off() -> None:
    text = "Answer: 18\nQuestion: Tom has 4 apples and buys 2 more"
    assert extract_answer(text, stop_at_question=True) == "18"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{42}. Also 7", "42"),
        (r"\boxed{\$1,250} then 3", "1250"),
        (r"\boxed{\frac{1}{2}} then \boxed{17}", "17"),  # the last box
        ("work... #### 56\nextra 9", "56"),  # `####` when there is no box
        (r"\boxed{x} and 8", "8"),  # a box without a number falls back to the last number
        (r"\boxed{12", "12"),  # an unclosed box: last number
    ],
)
def test_boxed_then_hashes_then_last_number(text: str, expected: str) -> None:
    assert extract_answer(text, boxed=True) == expected


@pytest.mark.parametrize("bad", [None, 17, b"12", object()])
def test_malformed_inputs_never_raise(bad) -> None:
    assert extract_answer(bad) is None
    assert answers_equal(None, "3") is False


def test_answers_compare_numerically() -> None:
    assert answers_equal("3.50", "3.5") and answers_equal("-0", "0") and answers_equal("1234", "1234.0")
    assert not answers_equal("12", "21") and not answers_equal("not a number", "1")


def test_ground_truth_is_the_number_after_hashes() -> None:
    assert parse_ground_truth("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72") == "72"
    assert parse_ground_truth("...\n#### 1,000") == "1000"
    with pytest.raises(ValueError, match="no number"):
        parse_ground_truth("#### none")


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """The definition: the share of k-subsets of the n samples that contain at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k", [(5, 0, 1), (5, 1, 1), (5, 2, 2), (6, 3, 4), (8, 1, 8), (4, 4, 2), (7, 5, 3)])
def test_pass_at_k_equals_the_subset_definition(n: int, c: int, k: int) -> None:
    assert math.isclose(pass_at_k(n, c, k), _pass_at_k_by_enumeration(n, c, k), rel_tol=1e-12, abs_tol=1e-12)


def test_pass_at_k_hand_computed_values() -> None:
    assert math.isclose(pass_at_k(16, 4, 1), 4 / 16)  # pass@1 is the fraction correct
    assert math.isclose(pass_at_k(4, 1, 2), 1 - (3 * 2) / (4 * 3))  # 1 − C(3,2)/C(4,2) = 1/2
    assert pass_at_k(10, 8, 3) == 1.0  # n − c = 2 < k: every 3-subset has a correct sample
    assert pass_at_k(10, 0, 10) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_arithmetic_problems_have_exact_answers() -> None:
    problems = arithmetic_problems(200, seed=0, terms=(2, 4), digits=(1, 2), operators="+-*")
    assert len(problems) == 200
    for p in problems:
        expression = p.question.removeprefix("What is the result of ").removesuffix("?")
        assert set(expression) <= set("0123456789+-*")
        assert int(p.answer) == eval(expression)  # noqa: S307 - our own digits and operators only
    assert problems == arithmetic_problems(200, seed=0, terms=(2, 4), digits=(1, 2), operators="+-*")
    assert problems != arithmetic_problems(200, seed=1, terms=(2, 4), digits=(1, 2), operators="+-*")
    with pytest.raises(ValueError):
        arithmetic_problems(1, seed=0, terms=(2, 2), digits=(1, 1), operators="/")


def test_gsm_symbolic_problems_are_offline_and_deterministic() -> None:
    problems = gsm_symbolic_problems(5, seed=3)
    assert problems == gsm_symbolic_problems(5, seed=3)
    for p in problems:
        assert p.question and "final answer" not in p.question
        assert extract_answer(p.answer) == p.answer
        assert p.solution  # reasoning-gym ships a worked solution per problem


def test_gsm8k_from_a_local_file_and_fail_fast_from_the_hub(tmp_path) -> None:
    rows = [
        {"question": "Ann has 3 pens and buys 2. How many?", "answer": "3 + 2 = 5\n#### 5"},
        {"question": "Bo had 1,200 and spent 200. Left?", "answer": "1200 - 200 = 1000\n#### 1,000"},
    ]
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    # one file: a fixed fifth (here one row) is the test split, the rest the training split; answers parsed
    problems = gsm8k_problems("test", str(path)) + gsm8k_problems("train", str(path))
    assert sorted((p.answer, p.solution) for p in problems) == [("1000", "1200 - 200 = 1000"), ("5", "3 + 2 = 5")]
    with pytest.raises(AssetUnavailableError, match="task.dataset_name"):
        gsm8k_problems("test", "openai/gsm8k")  # the Hub is off in tests: fails within seconds, with the way out


def test_split_disjoint_removes_overlap_and_duplicates() -> None:
    a, b, c = (arithmetic_problems(1, seed=s, terms=(2, 2), digits=(2, 2), operators="+")[0] for s in (0, 1, 2))
    train, evaluation = split_disjoint([a, b, a], [b, c, c])
    assert train == [a, b] and evaluation == [c]
