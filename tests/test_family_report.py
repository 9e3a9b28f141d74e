"""The family sweep's table (`cory-report family`, `cory/studies/family_report.py`) on hand-made run results with
hand-computed spreads: the per-agent mean ± s.d. [min–max] over seeds, pass@k from the runs that have it, the base
model per seed, the median seconds per iteration, unfinished runs left out and named; the Welch intervals of each
agent against PPO and of each CORY variant against CORY."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cory.studies import family_report
from cory.studies.stats import welch

REPO = Path(__file__).resolve().parents[1]


def _passk(p1: float) -> dict:
    return {"pass@1": p1, "pass@4": p1 + 0.1, "pass@16": p1 + 0.2, "greedy_accuracy": p1 + 0.05}


def _run(results: Path, algorithm: str, seed: int, agents: dict, times: list[float], passk=None, done=True) -> None:
    """A run folder as `run_sweep --results` copies it: `agents` maps an id to its final (accuracy, KL)."""
    folder = results / f"algorithm={algorithm}" / f"seed={seed}"
    folder.mkdir(parents=True)
    summary = {
        "algorithm": algorithm,
        "completed": done,
        "agents": {a: {"task_reward": acc, "kl": kl} for a, (acc, kl) in agents.items()},
        "initial": {a: {"task_reward": 0.25 + 0.01 * seed, "kl": 0.0} for a in agents},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    rows = [{"iteration": i, "time/iteration_s": t} for i, t in enumerate(times)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if passk is not None:
        (folder / "passk.json").write_text(json.dumps(passk))


def test_spreads_pass_at_k_base_and_timing_are_the_hand_computed_ones(tmp_path):
    for seed, acc in enumerate([0.5, 0.6, 0.7]):  # PPO: three seeds, pass@k on all
        passk = {"base": _passk(0.3 + 0.01 * seed), "llm1": _passk(acc - 0.1)}
        _run(tmp_path, "ppo", seed, {"llm1": (acc, 1.0 + seed)}, [4.0, 5.0, 9.0], passk)
    # CORY: two finished seeds, one without pass@k; a third still running
    _run(tmp_path, "cory", 0, {"llm1": (0.4, 2.0), "llm2": (0.2, 1.0)}, [6.0, 6.0], {"llm1": _passk(0.3)})
    _run(tmp_path, "cory", 1, {"llm1": (0.6, 4.0), "llm2": (0.4, 3.0)}, [8.0])
    _run(tmp_path, "cory", 2, {"llm1": (0.9, 9.0), "llm2": (0.9, 9.0)}, [1.0], done=False)
    report = family_report.family(tmp_path)
    assert list(report["algorithms"]) == ["ppo", "cory"]  # the sweep's order, not the alphabet
    ppo = report["algorithms"]["ppo"]
    assert ppo["seeds"] == [0, 1, 2]
    acc = ppo["agents"]["llm1"]["accuracy"]
    assert acc["mean"] == pytest.approx(0.6) and acc["sd"] == pytest.approx(0.1)  # sd of (.5, .6, .7), n − 1
    assert (acc["min"], acc["max"], acc["n"]) == (0.5, 0.7, 3)
    assert ppo["agents"]["llm1"]["kl"]["sd"] == pytest.approx(1.0)  # KL 1, 2, 3
    assert ppo["agents"]["llm1"]["pass@16"]["mean"] == pytest.approx(0.7)  # (0.4, 0.5, 0.6) + 0.2
    assert ppo["seconds_per_iteration"] == 5.0  # every run's median of (4, 5, 9)
    cory = report["algorithms"]["cory"]
    assert cory["seeds"] == [0, 1] and report["unfinished"] == ["algorithm=cory/seed=2"]
    llm2 = cory["agents"]["llm2"]["accuracy"]
    assert llm2["mean"] == pytest.approx(0.3) and llm2["sd"] == pytest.approx(0.1 * math.sqrt(2))
    assert cory["agents"]["llm1"]["pass@1"]["n"] == 1  # only seed 0 was scored
    assert cory["agents"]["llm2"]["pass@1"] is None
    assert cory["seconds_per_iteration"] == 7.0  # median over seeds of (6, 8)
    assert report["base"][1] == {"accuracy": pytest.approx(0.26)} | {
        k: pytest.approx(v) for k, v in _passk(0.31).items()
    }
    table = family_report.markdown(report)
    assert "| PPO | llm1 | 3 | 0.600 ± 0.100 [0.500–0.700] |" in table
    assert "0.300 (1 seed)" in table and "Not finished (left out): algorithm=cory/seed=2." in table


def test_agents_are_compared_with_ppo_and_variants_with_cory_by_welch_intervals_over_seeds(tmp_path):
    for seed, acc in enumerate([0.5, 0.6, 0.7]):
        _run(tmp_path, "ppo", seed, {"llm1": (acc, 1.0 + seed)}, [1.0], {"llm1": _passk(acc)})
    _run(tmp_path, "cory", 0, {"llm1": (0.4, 2.0), "llm2": (0.2, 1.0)}, [1.0], {"llm1": _passk(0.3)})
    _run(tmp_path, "cory", 1, {"llm1": (0.6, 4.0), "llm2": (0.4, 3.0)}, [1.0])
    _run(tmp_path, "cory_cc", 0, {"llm1": (0.5, 1.0), "llm2": (0.5, 1.0)}, [1.0])
    _run(tmp_path, "cory_cc", 1, {"llm1": (0.7, 1.0), "llm2": (0.5, 1.0)}, [1.0])
    report = family_report.family(tmp_path)
    assert list(report["differences"]) == ["ppo/llm1", "cory/same agent"]
    against_ppo, against_cory = report["differences"]["ppo/llm1"], report["differences"]["cory/same agent"]
    assert list(against_ppo) == ["cory", "cory_cc"] and list(against_cory) == ["cory_cc"]
    acc = against_ppo["cory"]["llm1"]["accuracy"]
    # by hand: 0.5 − 0.6; s.e.² = 0.02/2 + 0.01/3; Welch–Satterthwaite df = (1/75)² / (0.01²/1 + (1/300)²/2)
    assert acc["diff"] == pytest.approx(-0.1)
    assert acc["se"] == pytest.approx(math.sqrt(0.01 + 0.01 / 3))
    assert acc["df"] == pytest.approx(32 / 19)
    from scipy import stats

    half = stats.t.ppf(0.975, 32 / 19) * math.sqrt(0.01 + 0.01 / 3)
    assert acc["ci95"] == pytest.approx([-0.1 - half, -0.1 + half])
    assert against_ppo["cory"]["llm2"]["accuracy"]["diff"] == pytest.approx(-0.3)  # against PPO's llm1
    assert against_ppo["cory"]["llm1"]["kl"]["diff"] == pytest.approx(1.0)  # mean(2, 4) − mean(1, 2, 3)
    assert against_ppo["cory"]["llm1"]["pass@1"] is None  # one scored seed: no interval
    # each variant's agent against CORY's same agent: llm2 0.5 − mean(0.2, 0.4); s.e.² = 0 + 0.02/2, df = 1
    llm2 = against_cory["cory_cc"]["llm2"]["accuracy"]
    assert llm2["diff"] == pytest.approx(0.2) and llm2["se"] == pytest.approx(0.1) and llm2["df"] == pytest.approx(1)
    assert against_cory["cory_cc"]["llm1"]["accuracy"]["diff"] == pytest.approx(0.1)  # 0.6 − 0.5
    assert welch([1.0, 1.0], [0.0, 0.0])["ci95"] == [1.0, 1.0]  # no spread on either side
    assert welch([1.0], [0.0, 1.0]) is None
    table = family_report.markdown(report)
    ci = acc["ci95"]
    assert f"| CORY | llm1 | -0.100 [{ci[0]:+.3f}, {ci[1]:+.3f}] | — |" in table
    assert "Difference to PPO, llm1" in table and "Difference to CORY, same agent" in table


def test_the_report_writes_its_files_and_refuses_an_empty_folder(tmp_path, capsys):
    (tmp_path / "none").mkdir()
    assert family_report.main([str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert "error: no finished run results" in capsys.readouterr().err and not (tmp_path / "out").exists()
    _run(tmp_path / "r", "grpo", 0, {"llm1": (0.5, 1.0)}, [3.0])
    assert family_report.main([str(tmp_path / "r"), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "family.json").read_text())
    assert list(report["algorithms"]) == ["grpo"]
    assert "| GRPO | llm1 | 1 | 0.500 (1 seed) |" in (tmp_path / "out" / "family.md").read_text()


@pytest.mark.parametrize("study", ["family", "family_cpu"])
def test_the_committed_tables_are_what_the_committed_runs_give(study, tmp_path):
    """`outputs/<study>/family.md` is the report of the committed results, and every algorithm's accuracy, KL and
    pass@k cells in it, and every difference (to PPO, to CORY) that has an interval, are the ones docs/results.md
    prints."""
    assert family_report.main([str(REPO / "outputs" / study / "results"), "--out", str(tmp_path)]) == 0
    table = (tmp_path / "family.md").read_text()
    assert table == (REPO / "outputs" / study / "family.md").read_text()
    results = (REPO / "docs" / "results.md").read_text().replace("**", "")  # bold marks the best cells
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and " | llm" in line]
    assert rows
    for cells in rows:
        cells = [c.strip(" |") for c in cells]
        numbers = [c for c in cells[2:] if "[" in c or "seed" in c]  # accuracy, KL, pass@k, greedy; differences
        assert numbers or len(cells) == 6, cells  # a difference row may be all "—" (a side with one seed)
        assert all(c in results for c in numbers), cells
