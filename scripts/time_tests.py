"""Time the test suite as the README runs it and append one row to a committed file of timings.

    python scripts/time_tests.py                        # `make test`, one row in outputs/tests/timings.jsonl
    python scripts/time_tests.py --target test-long --note "beside two training runs"

The suite's duration is a number the README and docs/implementation-notes.md state, so it comes from a committed
file, as the pages' measured numbers should: the row gives the command, the commit (and whether the tree had
changes), the CPU and its core count, the one-minute load average before and after (about 0 on idle cores; the
suite itself loads them), pytest's counts and its own seconds, and the command's wall seconds (the `make` target's
install check included). The command's output passes through as it comes. A run that fails, is interrupted or
prints no pytest summary writes no row: a timing is only kept for a suite that passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "tests" / "timings.jsonl"
# pytest's last line: `1497 passed, 51 skipped in 507.28s (0:08:27)` (with -q; framed by `=` without it)
SUMMARY = re.compile(r"\b\d+ \w+.* in (\d+(?:\.\d+)?)s\b")
COUNT = re.compile(r"(\d+) (passed|skipped|failed|errors?|deselected|xfailed|xpassed)\b")


def summary(lines: list[str]) -> dict | None:
    """pytest's counts and seconds from its last summary line, None when the output has none."""
    for line in reversed(lines):
        found = SUMMARY.search(line)
        if found:
            counts = {("error" if kind.startswith("error") else kind): int(n) for n, kind in COUNT.findall(line)}
            kinds = ("passed", "skipped", "failed", "error")
            return {k: counts.get(k, 0) for k in kinds} | {"pytest_s": float(found.group(1))}
    return None


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:  # not Linux: the name platform gives
        pass
    return platform.processor() or platform.machine()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def time_command(command: list[str]) -> tuple[int, dict | None]:
    """Run `command` in the repository, its output passing through; (exit code, the row or None)."""
    load_before, start, t0 = os.getloadavg()[0], datetime.datetime.now(datetime.UTC), time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
    wall = time.monotonic() - t0
    counts = summary(lines)
    if proc.returncode != 0 or counts is None:
        return proc.returncode or 1, None
    return 0, {
        "date": start.isoformat(timespec="seconds"),
        "command": " ".join(command),
        "commit": git("rev-parse", "HEAD"),
        "changed": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpu": cpu(),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        **counts,
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="test", help="the make target to time (default: test, the README's)")
    parser.add_argument("--note", default="", help="what else the machine was doing, in words (kept in the row)")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the file a row goes to (default: outputs/tests/timings.jsonl)"
    )
    args = parser.parse_args()
    try:
        code, row = time_command(["make", args.target])
    except KeyboardInterrupt:  # make and pytest stop on the same Ctrl-C; say so in one line, not a traceback
        raise SystemExit(f"error: `make {args.target}` interrupted; no row written") from None
    if row is None:
        raise SystemExit(
            f"error: `make {args.target}` failed (exit {code}) or printed no pytest summary; no row written"
        )
    if args.note:
        row["note"] = args.note
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    minutes, seconds = divmod(round(row["pytest_s"]), 60)
    print(f"[time_tests] {row['passed']} passed, {row['skipped']} skipped in {minutes} min {seconds} s -> {args.out}")


if __name__ == "__main__":
    main()
