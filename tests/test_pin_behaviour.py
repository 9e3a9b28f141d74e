"""`scripts/pin_behaviour.py`: what a refactoring is checked with must itself catch a moved number."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pin():
    spec = importlib.util.spec_from_file_location("pin_behaviour", REPO / "scripts" / "pin_behaviour.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_differences_names_every_moved_value():
    pin = _pin()
    want = {"metrics": [{"a": 1.0, "b": "x", "c": 2.0}], "samples": []}
    assert pin.differences(want, want, 0.0) == []
    got = {"metrics": [{"a": 1.0 + 1e-9, "b": "y", "d": 0.0}], "samples": [{}]}
    diffs = pin.differences(want, got, 0.0, "case")
    assert "case.metrics[0].a: 1.0 → 1.000000001" in diffs
    assert "case.metrics[0].b: 'x' → 'y'" in diffs
    assert "case.metrics[0].c: missing" in diffs and "case.metrics[0].d: new" in diffs
    assert "case.samples: 0 rows → 1" in diffs
    assert pin.differences({"a": 1.0}, {"a": 1.0 + 1e-9}, 1e-6) == []  # within the stated tolerance
    assert pin.differences({"a": float("nan")}, {"a": float("nan")}, 0.0) == []


def test_a_case_run_twice_is_identical_and_every_case_composes(tmp_path):
    pin = _pin()
    from cory.cli import compose

    for overrides in pin.CASES.values():  # every pinned case is a valid command line
        experiment = [] if any(o.startswith("experiment=") for o in overrides) else ["experiment=smoke"]
        compose([*experiment, *overrides])
    first = pin.run_case(pin.CASES["cory"], tmp_path / "a")
    second = pin.run_case(pin.CASES["cory"], tmp_path / "b")
    assert first["metrics"] and first["samples"]
    assert not any(k.startswith(("time/", "memory/")) for row in first["metrics"] for k in row)
    assert pin.differences(first, second, 0.0) == []


def test_a_pin_file_names_its_machine_and_compare_says_when_it_runs_on_another(tmp_path, capsys):
    pin = _pin()
    out = tmp_path / "pins.json"
    assert pin.main(["record", "--out", str(out), "--case", "ppo"]) == 0
    recorded = json.loads(out.read_text())
    assert recorded["_machine"] == pin.machine() and set(recorded) == {"_machine", "ppo"}
    capsys.readouterr()
    assert pin.main(["compare", str(out)]) == 0  # the same machine: no word about it
    assert "another machine" not in capsys.readouterr().out
    recorded["_machine"] = {"cpu": "elsewhere", "extensions": [], "torch": "0"}
    out.write_text(json.dumps(recorded))
    assert pin.main(["compare", str(out)]) == 0  # the numbers here still match; the line only warns
    printed = capsys.readouterr().out
    assert printed.count("another machine") == 1 and "'cpu': 'elsewhere'" in printed
