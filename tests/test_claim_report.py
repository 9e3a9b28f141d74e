"""The IMDB claim study's statistics (`cory-report claim`, `cory/studies/claim_report.py`), on hand-made run results
with hand-computed intervals: the paired per-seed differences, the t interval, the verdict rules and the flatness
gate; the committed report is what the committed runs give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cory.studies import claim_report, reward_spread

REPO = Path(__file__).resolve().parents[1]

T_975_2 = 4.302652729911275  # Student t, 97.5 % quantile, 2 degrees of freedom


def _run(results: Path, experiment: str, seed: int, curve: list[tuple[float, float]], completed: bool = True) -> None:
    """A run folder as `run_sweep --results` copies it: held-out (reward, KL) at iterations 0, 20, 40, …"""
    folder = results / f"experiment={experiment}" / f"seed={seed}"
    folder.mkdir(parents=True)
    rows = []
    for i, (reward, kl) in enumerate(curve):
        rows.append({"iteration": 20 * i, "train/llm1/kl": 0.0})  # a training row between evaluations
        rows.append(
            {
                "iteration": 20 * i,
                "eval/llm1/task_reward": reward,
                "eval/llm1/kl": kl,
                "eval/llm1/combined_reward": reward - 0.3 * kl,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"completed": completed}))


def test_paired_differences_intervals_and_verdicts_are_the_preregistered_ones(tmp_path):
    for seed, (d, cory_kl) in enumerate([(0.00, 2.0), (0.02, 2.2), (0.04, 2.4)]):
        _run(tmp_path, "imdb_claim_ppo", seed, [(0.0, 0.0), (0.5, 7.6), (1.0, 8.0)])
        _run(tmp_path, "imdb_claim_cory", seed, [(0.0, 0.0), (0.5, cory_kl * 0.95), (1.0 + d, cory_kl)])
    arm = claim_report.arm_report(tmp_path, "imdb_claim_cory", "imdb_claim_ppo")
    assert arm["n"] == 3 and arm["flat_seeds"] == 3 and arm["powered"]
    reward = arm["claims"]["similar_reward"]
    half = T_975_2 * 0.02 / math.sqrt(3)  # sd of (0, 0.02, 0.04) is 0.02
    assert reward["mean"] == pytest.approx(0.02) and reward["ci95"] == pytest.approx([0.02 - half, 0.02 + half])
    assert reward["verdict"] == "holds"  # [-0.030, 0.070] lies inside ±0.1
    kl = arm["claims"]["kl_at_most_half"]
    assert kl["mean"] == pytest.approx(2.2 / 8.0) and kl["verdict"] == "holds"  # ratios 0.25, 0.275, 0.3
    combined = arm["claims"]["frontier_dominates"]  # d + 0.3·(8 − KL_cory) > 0 for every seed, tight spread
    assert combined["ci95"][0] > 0 and combined["verdict"] == "holds"
    # KL at matched reward: both reach 1.0 (PPO's best); CORY reaches it between iterations 20 and 40
    seed0 = arm["seeds"][0]
    assert seed0["matched_reward"] == pytest.approx(1.0)
    assert seed0["kl_ratio_at_matched_reward"] == pytest.approx(2.0 / 8.0)


def test_a_wide_interval_is_undecided_and_an_excluded_margin_does_not_hold(tmp_path):
    for seed, d in enumerate([0.3, 0.35, 0.4]):  # CORY's reward clearly higher: outside ±0.1 entirely
        _run(tmp_path, "imdb_claim_ppo", seed, [(0.0, 0.0), (1.0, 8.0), (1.0, 8.1)])
        _run(tmp_path, "imdb_claim_cory", seed, [(0.0, 0.0), (1.0, 5.0), (1.0 + d, 5.1)])
    arm = claim_report.arm_report(tmp_path, "imdb_claim_cory", "imdb_claim_ppo")
    assert arm["claims"]["similar_reward"]["verdict"] == "does not hold"
    # KL ratios 5.1/8.1 ≈ 0.63 for every seed: the interval is above 0.5
    assert arm["claims"]["kl_at_most_half"]["verdict"] == "does not hold"


def test_too_few_flat_or_finished_seeds_make_every_verdict_undecided(tmp_path):
    for seed in range(3):
        _run(tmp_path, "imdb_claim_ppo", seed, [(0.0, 0.0), (0.5, 4.0), (1.0, 8.0)])  # KL still doubling
        _run(tmp_path, "imdb_claim_cory", seed, [(0.0, 0.0), (0.5, 1.0), (1.0, 2.0)])
    arm = claim_report.arm_report(tmp_path, "imdb_claim_cory", "imdb_claim_ppo")
    assert arm["flat_seeds"] == 0 and not arm["powered"]
    # the KL's growth over the last two intervals: PPO 0 → 4 → 8 (first interval undefined), CORY 1 → 2
    growth = arm["seeds"][0]["kl_growth"]
    assert math.isnan(growth["ppo"][0]) and growth["ppo"][1] == pytest.approx(1.0)
    assert growth["cory"][1] == pytest.approx(1.0)
    assert {c["verdict"] for c in arm["claims"].values()} == {"undecided"}
    # an unfinished CORY run drops its seed from the pairs
    other = tmp_path / "second"
    _run(other, "imdb_claim_ppo", 0, [(0.0, 0.0), (1.0, 8.0), (1.0, 8.0)])
    _run(other, "imdb_claim_cory", 0, [(0.0, 0.0), (1.0, 2.0), (1.0, 2.0)], completed=False)
    assert claim_report.arm_report(other, "imdb_claim_cory", "imdb_claim_ppo")["n"] == 0


def test_the_report_writes_its_files_and_refuses_an_empty_folder(tmp_path, capsys):
    assert claim_report.main([str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err
        == f"error: no such folder: {tmp_path / 'none'}; pass the --results folder of the sweep\n"
    )
    (tmp_path / "empty").mkdir()
    assert claim_report.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no run results under" in capsys.readouterr().err and not (tmp_path / "out").exists()
    for seed in range(2):
        _run(tmp_path / "r", "imdb_claim_ppo", seed, [(0.0, 0.0), (1.0, 8.0)])
        _run(tmp_path / "r", "imdb_claim_cory_released", seed, [(0.0, 0.0), (1.0, 3.0)])
    assert claim_report.main([str(tmp_path / "r"), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "claim.json").read_text())
    assert set(report["arms"]) == {"B"}  # only arm B has both of its experiments
    assert (tmp_path / "out" / "claim.png").stat().st_size > 0 and "Arm B" in (
        tmp_path / "out" / "claim.md"
    ).read_text()


def test_the_committed_report_is_what_the_committed_runs_give(tmp_path, capsys):
    """`outputs/claim/claim.{md,json}` are `cory-report claim outputs/claim/results --out outputs/claim`, byte for
    byte (the verdicts docs/results.md states come from them)."""
    assert claim_report.main([str(REPO / "outputs" / "claim" / "results"), "--out", str(tmp_path)]) == 0
    for name in ("claim.md", "claim.json"):
        assert (tmp_path / name).read_text() == (REPO / "outputs" / "claim" / name).read_text(), name


def test_reward_spread_plays_the_runs_first_batches_without_learning(tmp_path):
    """`cory-measure reward-spread` on the tiny model: one batch of the run's schedule, both roles scored, no
    update."""
    out = tmp_path / "spread.json"
    assert reward_spread.main(["--batches", "2", "--out", str(out), "experiment=smoke", "algorithm=cory"]) == 0
    result = json.loads(out.read_text())
    assert result["episodes"] == 2 * 16  # experiment=smoke's batch, two iterations
    assert result["ratio"] == pytest.approx(result["std_r1_plus_r2"] / result["std_r1"])
