"""`scripts/time_tests.py`: the suite's timing that README and the implementation notes state is a row it wrote."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("time_tests", REPO / "scripts" / "time_tests.py")
time_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(time_tests)


@pytest.mark.parametrize(
    "lines, want",
    [
        (["....", "1497 passed, 51 skipped in 507.28s (0:08:27)"], (1497, 51, 0, 0, 507.28)),
        (["= 2 failed, 3 passed, 1 error, 4 deselected in 4.50s ="], (3, 0, 2, 1, 4.5)),
        (["12 passed in 3s", "tests/test_a.py::test_b took 2.00s"], (12, 0, 0, 0, 3.0)),  # the last summary line
    ],
)
def test_the_summary_is_pytests_last_counts_and_seconds(lines, want):
    got = time_tests.summary(lines)
    assert (got["passed"], got["skipped"], got["failed"], got["error"], got["pytest_s"]) == want


def test_output_without_a_pytest_summary_gives_none():
    assert time_tests.summary(["make: *** [Makefile:31: test] Error 2", "57.65s call tests/test_x.py::test_y"]) is None


def _printing(line: str, code: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import sys; print('collecting ...'); print({line!r}); sys.exit({code})"]


def test_a_passing_command_gives_a_row_with_its_counts_commit_and_machine(capsys):
    code, row = time_tests.time_command(_printing("7 passed, 2 skipped in 1.25s"))
    assert code == 0
    assert (row["passed"], row["skipped"], row["failed"], row["pytest_s"]) == (7, 2, 0, 1.25)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert row["commit"] == head and isinstance(row["changed"], bool)
    assert row["cores"] >= 1 and row["cpu"] and row["load_before"] >= 0 and 0 <= row["wall_s"] < 60
    assert "7 passed, 2 skipped in 1.25s" in capsys.readouterr().out  # the output passes through


@pytest.mark.parametrize("line, code", [("1 failed, 6 passed in 1.00s", 1), ("no summary here", 0)])
def test_a_failed_suite_or_one_without_a_summary_gives_no_row(line, code):
    got, row = time_tests.time_command(_printing(line, code))
    assert row is None and got == (code or 1)


def test_main_appends_one_row_with_the_note_and_refuses_a_failed_run_in_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "timings.jsonl"
    out.parent.mkdir(exist_ok=True)
    out.write_text('{"earlier": true}\n')
    ran = []

    def fake(command):
        ran.append(command)
        return 0, {"passed": 3, "skipped": 1, "pytest_s": 125.4}

    monkeypatch.setattr(time_tests, "time_command", fake)
    monkeypatch.setattr(sys, "argv", ["time_tests.py", "--target", "test-long", "--note", "idle", "--out", str(out)])
    time_tests.main()
    assert ran == [["make", "test-long"]]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [{"earlier": True}, {"passed": 3, "skipped": 1, "pytest_s": 125.4, "note": "idle"}]
    assert "3 passed, 1 skipped in 2 min 5 s" in capsys.readouterr().out

    monkeypatch.setattr(time_tests, "time_command", lambda command: (2, None))
    with pytest.raises(SystemExit, match=r"^error: `make test-long` failed \(exit 2\)") as err:
        time_tests.main()
    assert "\n" not in str(err.value) and len(out.read_text().splitlines()) == 2


def test_ctrl_c_during_the_suite_is_one_line_and_writes_no_row(tmp_path, monkeypatch):
    def interrupted(command):
        raise KeyboardInterrupt

    monkeypatch.setattr(time_tests, "time_command", interrupted)
    monkeypatch.setattr(sys, "argv", ["time_tests.py", "--out", str(tmp_path / "timings.jsonl")])
    with pytest.raises(SystemExit, match=r"^error: `make test` interrupted; no row written$"):
        time_tests.main()
    assert not (tmp_path / "timings.jsonl").exists()
