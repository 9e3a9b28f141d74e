"""Numeric answers of math word problems: extraction, comparison and pass@k (docs/method.md §3.2, §7).

- `extract_answer(text)`: the **last** optionally signed integer or decimal in the text, the paper's "final set of
  numbers" rule (docs/method.md §3.2). Thousands separators and currency signs are dropped, a trailing period is not
  part of the number, and a minus sign counts only where it cannot be a subtraction or a range ("5-3", "10-20").
  `boxed=True` first looks for the last `\\boxed{...}`, then for the last `#### ...`, and falls back to the last number
  (the order Multiagent Finetuning uses, docs/method.md §7). The whole text is parsed by default, so a run-on answer
  that starts a new "Question:" is judged on its last number (the failure mode of paper App. D);
  `stop_at_question=True` cuts the text at the first "\\nQuestion:" first.
- `parse_ground_truth(answer)`: the number after `####` in a GSM8K answer field.
- `answers_equal(pred, truth)`: exact numeric equality ("3.50" equals "3.5"); a missing prediction is wrong.
- `pass_at_k(n, c, k)`: the unbiased estimator 1 − C(n−c, k)/C(n, k), computed as a product (docs/method.md §3.2).

Nothing here raises on malformed text: anything without a number extracts to None and scores 0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# sign (only where it cannot be a binary minus), optional currency, digits with or without thousands groups, decimals
_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)\]}])[-−])?"
    r"[$£€]?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?P<frac>\.\d+)?"
)
_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = "####"


def _numbers(text: str) -> list[str]:
    out = []
    for m in _NUMBER.finditer(text):
        sign = "-" if m.group("sign") else ""
        out.append(sign + m.group("int").replace(",", "") + (m.group("frac") or ""))
    return out


def _last_number(text: str) -> str | None:
    numbers = _numbers(text)
    return _normalise(numbers[-1]) if numbers else None


def _normalise(number: str) -> str:
    """'-0012.500' → '-12.5'; '7.0' → '7': one spelling per value, so answers can be counted in a vote."""
    value = Decimal(number)
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _boxed_content(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, braces balanced; None when there is none (or it never closes)."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def extract_answer(text: str | None, *, boxed: bool = False, stop_at_question: bool = False) -> str | None:
    """The answer of a response as a normalised number string ('-1234.5'), or None when it has no number.

    Args:
        text: the response (None or non-text gives None).
        boxed: look for `\\boxed{...}`, then `#### ...`, before the last number of the whole text.
        stop_at_question: drop everything from the first "\\nQuestion:" on (a run-on answer is not penalised).
    """
    if not isinstance(text, str):
        return None
    if stop_at_question:
        text = text.split("\nQuestion:", 1)[0]
    if boxed:
        content = _boxed_content(text)
        if content is not None and (number := _last_number(content)) is not None:
            return number
        if _HASHES in text and (numbers := _numbers(text.rsplit(_HASHES, 1)[1])):
            return _normalise(numbers[0])
    return _last_number(text)


def parse_ground_truth(answer: str) -> str:
    """The GSM8K answer field's final number: the text after `####` (commas removed), normalised.

    Raises:
        ValueError: the field has no number after `####` (a malformed dataset row, not a model output).
    """
    tail = answer.rsplit(_HASHES, 1)[-1]
    numbers = _numbers(tail)
    if not numbers:
        raise ValueError(f"no number after '####' in the answer field {answer[-80:]!r}")
    return _normalise(numbers[0])


def answers_equal(pred: str | None, truth: str) -> bool:
    """Exact numeric equality of two number strings; None or unparsable never equals anything."""
    if pred is None:
        return False
    try:
        return Decimal(pred) == Decimal(truth)
    except (InvalidOperation, ValueError):
        return False


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with c correct samples out of n (docs/method.md §3.2).

    1 − C(n−c, k)/C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i), which is 1 when n − c < k.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product
