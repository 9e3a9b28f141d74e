"""The second IMDB claim study's pre-registered analysis (`cory-report claim2`, `cory/studies/claim2_report.py`) on
hand-made curves with hand-computed values: the first-crossing interpolation behind reward at matched KL and KL at
matched reward, the gate (the matched-reward level enough seeds reach, amendment 1), the t intervals (a geometric one
for KL ratios, `cory.studies.stats`), the seed count, the verdict rules and the reading across comparisons, the
learning-rate pilot's rule, the KL coefficients and the cost; the command on hand-made run folders, a missing input
one `error:` line; that the numbers docs/results.md states for the sizing are what `plan` computes from the committed
files of the first study; and the study's driver."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from cory.studies import claim2_report as claim2
from cory.studies import report
from cory.studies.stats import ratio_interval, seeds_needed, t_interval, t_quantile

REPO = Path(__file__).resolve().parents[1]

T_975 = {1: 12.706204736174703, 2: 4.302652729911275, 7: 2.3646242510102993}  # Student t 97.5 % quantiles


def pts(*pairs: tuple[float, float]) -> list[dict]:
    """A held-out curve from (reward, kl) pairs, evaluations every 10 iterations."""
    return [{"iteration": 10 * i, "reward": r, "kl": k} for i, (r, k) in enumerate(pairs)]


def test_first_crossing_interpolates_at_the_first_pass_only() -> None:
    xs, ys = [0.0, 1.0, 3.0], [0.5, 0.6, 0.9]
    assert claim2.first_crossing(xs, ys, 2.0) == pytest.approx(0.75)  # halfway from (1, 0.6) to (3, 0.9)
    assert claim2.first_crossing(xs, ys, 3.0) == pytest.approx(0.9)
    assert claim2.first_crossing(xs, ys, 0.0) == 0.5  # reached at the start
    assert math.isnan(claim2.first_crossing(xs, ys, 3.5))  # never reached
    # x goes up past the level, back down, and up again: only the first pass counts
    assert claim2.first_crossing([0.0, 2.5, 1.5, 3.0], [0.0, 1.0, 0.2, 0.4], 2.0) == pytest.approx(0.8)


def test_reward_at_kl_kl_at_reward_and_reaching_a_level() -> None:
    c = pts((0.55, 0.0), (0.70, 1.0), (0.85, 3.0), (0.92, 4.0), (0.95, 5.0), (0.91, 6.0))
    assert claim2.reward_at_kl(c, 2.0) == pytest.approx(0.775)  # 0.70 + ½·0.15
    assert claim2.reward_at_kl(c, 4.0) == pytest.approx(0.92)
    assert claim2.kl_at_reward(c, 0.9) == pytest.approx(3.0 + 5 / 7)  # 0.85 → 0.92 over 3 → 4 nats
    assert claim2.REWARD_LEVELS == (0.60, 0.58, 0.56)  # amendment 1, highest first
    assert claim2.reaches(c, reward=0.95) and not claim2.reaches(c, reward=0.96)
    assert claim2.reaches(c, kl=6.0) and not claim2.reaches(c[:3], kl=4.0)


def test_t_intervals_and_the_geometric_one() -> None:
    mean, low, high = t_interval([1.0, 2.0, 3.0])  # sd 1
    half = T_975[2] / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert all(math.isnan(v) for v in t_interval([1.0])[1:])
    # logs −ln 4, −ln 2, 0: mean −ln 2 (geometric mean ½), sd ln 2
    gm, low, high = ratio_interval([0.25, 0.5, 1.0])
    half = T_975[2] * math.log(2) / math.sqrt(3)
    assert (gm, low, high) == pytest.approx((0.5, math.exp(-math.log(2) - half), math.exp(-math.log(2) + half)))
    with pytest.raises(ValueError, match="positive ratios"):  # a KL of 0 has no logarithm: the caller leaves it out
        ratio_interval([0.5, 0.0])
    assert all(t_quantile(dof) == pytest.approx(q) for dof, q in T_975.items())


def test_seeds_needed() -> None:
    # sd 1, half-width 1: t(n−1)/√n is 1.049 at n = 6 and 0.925 at n = 7
    assert seeds_needed(1.0, 1.0) == 7
    # the first study's paired s.d. 0.12 (logits) for ±0.1: 2.365·0.12/√8 = 0.1003 misses, 2.306·0.12/3 = 0.092
    assert seeds_needed(0.12, 0.1) == 9
    assert T_975[7] * 0.1116 / math.sqrt(8) < 0.1 and seeds_needed(0.1116, 0.1) == 8


@pytest.mark.parametrize(
    "low, high, reward, ratio",
    [
        (0.01, 0.05, "holds", "holds"),  # above 0 / below ½
        (-0.05, 0.015, "does not hold", "holds"),  # below +δ = 0.02
        (-0.01, 0.03, "undecided", "holds"),
        (0.51, 0.9, "holds", "does not hold"),
        (0.3, 0.7, "holds", "undecided"),
        (math.nan, math.nan, "undecided", "undecided"),
    ],
)
def test_verdict_rules(low: float, high: float, reward: str, ratio: str) -> None:
    assert claim2.MARGIN == 0.02 and claim2.KL_RATIO == 0.5
    assert claim2.verdict_reward(low, high) == reward
    assert claim2.verdict_ratio(low, high) == ratio


def _write(results: Path, arm: str, seed: int, curve: list[dict], llm2: list[dict] | None = None) -> None:
    folder = results / f"experiment={claim2.ARMS[arm]}" / f"seed={seed}"
    folder.mkdir(parents=True)
    rows = []
    for i, p in enumerate(curve):
        row = {"iteration": p["iteration"], "eval/llm1/task_reward": p["reward"], "eval/llm1/kl": p["kl"]}
        if llm2 is not None:
            row |= {"eval/llm2/task_reward": llm2[i]["reward"], "eval/llm2/kl": llm2[i]["kl"]}
        rows += [row, {"iteration": p["iteration"], "train/llm1/kl": 0.0, "time/iteration_s": 2.0}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"completed": True, "wall_time_s": 100.0}))


def test_a_comparison_on_hand_made_seeds(tmp_path: Path) -> None:
    """8 seeds; PPO reaches 0.60 at 4 nats, CORY at 2 + 0.1·s nats (ratios 0.5 … 0.675); at KL 2 PPO's reward is
    0.56 and CORY's 0.52 + 0.08·2/(2 + 0.1·s); seed 7's PPO run falls back before 0.60, so that level has 7 seeds
    (≥ 6: it is the matched level); CORY's KL reaches 4 nats only in seeds 5–7."""
    ppo = pts((0.52, 0.0), (0.56, 2.0), (0.60, 4.0), (0.61, 5.0), (0.62, 6.0))
    for seed in range(8):
        k = 2.0 + 0.1 * seed
        _write(tmp_path, "cory", seed, pts((0.52, 0.0), (0.60, k), (0.62, k + 0.5), (0.62, k + 1), (0.63, k + 1.5)))
        _write(tmp_path, "ppo", seed, ppo if seed < 7 else ppo[:2] + pts((0.59, 4.0), (0.58, 5.0), (0.57, 6.0))[:3])
    runs = claim2.load_runs(tmp_path)
    c = claim2.compare(runs, "cory", "ppo")
    assert c["n"] == 8 and c["reward_level"] == 0.60 and c["gate"]
    seed0 = c["seeds"][0]
    assert seed0["kl_at_reward"]["0.6"] == pytest.approx({"cory": 2.0, "ppo": 4.0}) and seed0["kl_ratio"]["0.6"] == 0.5
    assert math.isnan(c["seeds"][7]["kl_ratio"]["0.6"]) and c["seeds"][7]["kl_ratio"]["0.58"] > 0  # PPO: 0.56 → 0.59
    # CORY at KL 2 for seed s: on the leg (0, 0.52) → (2 + 0.1 s, 0.60)
    for s in c["seeds"]:
        expected = 0.52 + 2.0 / (2.0 + 0.1 * s["seed"]) * 0.08
        assert s["reward_at_kl"]["2.0"]["diff"] == pytest.approx(expected - 0.56)
    ratios = [(2.0 + 0.1 * s) / 4.0 for s in range(7)]  # the seeds whose runs both reach 0.60
    gm, low, high = ratio_interval(ratios)
    assert c["kl_ratio"]["level"] == 0.60
    assert c["kl_ratio"]["n"] == 7 and c["kl_ratio"]["geometric_mean"] == pytest.approx(gm)
    assert c["kl_ratio"]["ci95"] == pytest.approx([low, high])
    assert low > 0.5 and c["kl_ratio"]["verdict"] == "does not hold"
    assert c["reward_at_kl"]["2.0"]["verdict"] == "holds"  # CORY higher at matched KL in every seed
    assert c["reward_at_kl"]["4.0"]["n"] == 3 and c["reward_at_kl"]["4.0"]["verdict"] == "undecided"  # < 6 seeds


def test_the_matched_level_steps_down_to_what_enough_seeds_reach(tmp_path: Path) -> None:
    """Five seeds reach 0.60 (too few), seven 0.58: the ratio is read at 0.58 over those seven seeds only."""
    for seed in range(8):
        top = 0.61 if seed < 5 else 0.585 if seed < 7 else 0.57
        _write(tmp_path, "cory", seed, pts((0.52, 0.0), (0.56, 0.5), (top, 1.0)))
        _write(tmp_path, "ppo", seed, pts((0.52, 0.0), (0.56, 1.0), (0.62, 4.0)))
    c = claim2.compare(claim2.load_runs(tmp_path), "cory", "ppo")
    assert c["reward_level"] == 0.58 and c["kl_ratio"]["level"] == 0.58 and c["kl_ratio"]["n"] == 7
    # at 0.58: CORY 0.5 + (0.02/0.05)·0.5 = 0.7 nats in seeds 0–4, 0.5 + (0.02/0.025)·0.5 = 0.9 in seeds 5–6; PPO
    # 1 + (0.02/0.06)·3 = 2.0: ratios 0.35 and 0.45, geometric mean exp((5 ln 0.35 + 2 ln 0.45)/7) = 0.3761
    gm, low, high = ratio_interval([0.35] * 5 + [0.45] * 2)
    assert c["kl_ratio"]["geometric_mean"] == pytest.approx(gm) and gm == pytest.approx(0.3761, abs=1e-4)
    assert c["kl_ratio"]["ci95"] == pytest.approx([low, high]) and high < claim2.KL_RATIO
    assert c["kl_ratio"]["verdict"] == "holds"


def test_an_ungated_comparison_is_undecided_whatever_its_numbers(tmp_path: Path) -> None:
    ppo = pts((0.52, 0.0), (0.55, 4.0), (0.54, 5.0), (0.53, 6.0), (0.53, 7.0))  # never reaches the lowest level
    cory = pts((0.52, 0.0), (0.65, 1.0), (0.66, 1.2), (0.67, 1.3), (0.67, 1.4))
    for seed in range(8):
        _write(tmp_path, "cory", seed, cory)
        _write(tmp_path, "ppo", seed, ppo)
    c = claim2.compare(claim2.load_runs(tmp_path), "cory", "ppo")
    assert c["reward_level"] is None and not c["gate"]
    assert c["kl_ratio"]["level"] == 0.56 and c["kl_ratio"]["n"] == 0 and c["kl_ratio"]["verdict"] == "undecided"


def _comparison(ratio_ci: tuple[float, float], ratio_verdict: str, reward_verdict: str, gate: bool = True) -> dict:
    return {
        "gate": gate,
        "kl_ratio": {"ci95": list(ratio_ci), "verdict": ratio_verdict},
        "reward_at_kl": {str(claim2.PRIMARY_KL): {"verdict": reward_verdict}},
    }


@pytest.mark.parametrize(
    "main, released, priced, normalisation",
    [
        # a gap with normalisation, none without, and a PPO at the same KL price does as well
        (("does not hold",), ((0.3, 0.6), "undecided"), "does not hold", "the normalisation explains it"),
        # released CORY beats the priced PPO at matched KL: more than the price
        (("does not hold",), ((0.3, 0.6), "undecided"), "holds", "cooperation adds to it"),
        # no gap in the released setting
        (("does not hold",), ((0.7, 1.2), "does not hold"), "does not hold", "no gap to explain"),
        # the paper's claim holds without normalisation: not the normalisation's doing alone
        (("holds",), ((0.3, 0.45), "holds"), "does not hold", "undecided"),
        (("does not hold",), ((0.3, 0.6), "undecided"), "undecided", "undecided"),
    ],
)
def test_readings_across_comparisons(main, released, priced, normalisation) -> None:
    comparisons = {
        "main": _comparison((0.0, 0.0), main[0], "undecided"),
        "released": _comparison(*released, "undecided"),
        "priced": _comparison((0.9, 1.1), "undecided", priced),
    }
    r = claim2.readings(comparisons)
    assert r == {"paper_claim": main[0], "normalisation": normalisation}
    comparisons["released"]["gate"] = False
    assert claim2.readings(comparisons)["normalisation"] == "undecided"


def test_the_learning_rate_rule() -> None:
    rises = pts((0.55, 0), (0.6, 1), (0.66, 2))  # +0.11, steady
    flat = pts((0.55, 0), (0.57, 1), (0.58, 2))  # +0.03 only
    collapses = pts((0.55, 0), (0.8, 3), (0.6, 9))  # +0.05 overall, but a fall of 0.2
    pilot = {
        1e-5: {"ppo": flat, "cory": rises},
        3e-5: {"ppo": rises, "cory": rises},
        1e-4: {"ppo": rises, "cory": collapses},
    }
    assert claim2.choose_learning_rate(pilot) == 3e-5
    assert claim2.choose_learning_rate({1e-5: {"ppo": flat}, 3e-5: {"ppo": collapses}}) == 1e-5  # none: smallest


def test_the_pilot_command_reads_the_sweep_folders_and_applies_the_rule(tmp_path: Path, capsys) -> None:
    rises, collapses = pts((0.55, 0), (0.6, 1), (0.66, 2)), pts((0.55, 0), (0.8, 3), (0.6, 9))
    for lr, cory in (("1e-5", rises), ("3e-5", rises), ("1e-4", collapses)):
        for experiment, c in (("imdb_claim2_ppo", rises), ("imdb_claim2_cory", cory)):
            folder = tmp_path / f"algorithm.agent.learning_rate={lr},experiment={experiment}" / "seed=100"
            folder.mkdir(parents=True)
            rows = [
                {"iteration": p["iteration"], "eval/llm1/task_reward": p["reward"], "eval/llm1/kl": p["kl"]} for p in c
            ]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (folder / "summary.json").write_text(json.dumps({"completed": True}))
    assert claim2.pilot_curves(tmp_path)[3e-5] == {"imdb_claim2_ppo": rises, "imdb_claim2_cory": rises}
    assert claim2.main(["pilot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "learning rate by the pilot's rule: 3e-05"
    (
        tmp_path / "algorithm.agent.learning_rate=1e-4,experiment=imdb_claim2_cory" / "seed=100" / "summary.json"
    ).write_text(json.dumps({"completed": False}))
    assert claim2.main(["pilot", str(tmp_path)]) == 2  # a stopped run: the rule waits for the whole pilot
    assert capsys.readouterr().err.startswith("error: the pilot is not finished")


def test_betas_by_hand() -> None:
    b = claim2.betas({"std_r1": 1.14, "std_r1_plus_r2": 2.05}, {"std_r1": 0.25, "std_r1_plus_r2": 0.45})
    assert b["main"] == pytest.approx(0.3 * 0.25 / 1.14)  # 0.0658
    assert b["priced"] == pytest.approx(0.18) and b["priced_logit"] == pytest.approx(0.82)


def test_sigmoid_slope_against_quadrature() -> None:
    from scipy import integrate, stats

    def exact(mean: float, sd: float) -> float:
        f = lambda r: stats.norm.pdf(r, mean, sd) * math.exp(-r) / (1 + math.exp(-r)) ** 2  # noqa: E731
        return integrate.quad(f, mean - 12 * sd, mean + 12 * sd)[0]

    assert claim2.sigmoid_slope(0.0, 1e-6) == pytest.approx(0.25)  # σ'(0) = ¼
    for mean, sd in ((0.0, 1.0), (0.8, 1.14), (-1.0, 2.0)):
        assert claim2.sigmoid_slope(mean, sd) == pytest.approx(exact(mean, sd), abs=1e-6)


def test_run_cost_and_projection_by_hand(tmp_path: Path) -> None:
    """Two PPO runs of 3 iterations (2 s each) and 3 evaluations in 100 s of wall time: (100 − 6)/3 s per
    evaluation."""
    for seed in (0, 1):
        folder = tmp_path / "experiment=imdb_claim_ppo" / f"seed={seed}"
        folder.mkdir(parents=True)
        rows = []
        for i in range(3):
            rows += [{"iteration": i, "eval/llm1/task_reward": 0.5}, {"iteration": i, "time/iteration_s": 2.0}]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps({"completed": True, "wall_time_s": 100.0}))
    cost = claim2.run_cost(tmp_path)["imdb_claim_ppo"]
    assert cost == pytest.approx({"iteration_s": 2.0, "evaluation_s": 94 / 3, "runs": 2, "wall_h": 200 / 3600})
    fake = {k: {"iteration_s": 36.0, "evaluation_s": 360.0} for k in ("imdb_claim_ppo", "imdb_claim_cory")}
    fake["imdb_claim_cory_released"] = {"iteration_s": 72.0, "evaluation_s": 720.0}
    p = claim2.projected_hours(fake, seeds=2, iterations=100, every=10)  # 100 iterations, 11 evaluations
    assert p["per_run_h"]["ppo"] == pytest.approx((3600 + 3960) / 3600)
    assert p["per_run_h"]["released"] == pytest.approx((7200 + 7920) / 3600)
    assert p["total_h"] == pytest.approx(2 * (3 * 2.1 + 4.2))


def test_unreached_lists_the_runs_the_rule_continues(tmp_path: Path) -> None:
    _write(tmp_path, "ppo", 0, pts((0.52, 0), (0.55, 1), (0.57, 2), (0.56, 3)))  # reaches 0.56 and 2 nats
    _write(tmp_path, "cory", 0, pts((0.52, 0), (0.54, 1), (0.55, 2), (0.55, 3)))  # not 0.56
    _write(tmp_path, "cory", 1, pts((0.52, 0), (0.58, 0.5), (0.60, 1.0), (0.61, 1.9)))  # not 2 nats
    long = [{"iteration": 200, "reward": 0.55, "kl": 9.0}]
    _write(tmp_path, "released", 0, pts((0.52, 0), (0.53, 1), (0.54, 2)) + long)  # not 0.56, but already at 200
    assert claim2.unreached(tmp_path) == ["experiment=imdb_claim2_cory/seed=0", "experiment=imdb_claim2_cory/seed=1"]


def test_report_command_writes_its_files_and_refuses_an_empty_folder(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert claim2.main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: no run results under")
    c = pts((0.5, 0), (0.61, 1), (0.62, 2), (0.63, 3))
    for arm in claim2.ARMS:
        _write(tmp_path / "results", arm, 0, c, llm2=c)
    assert claim2.main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "claim2.json").read_text())
    assert written["comparisons"]["main"]["n"] == 1 and written["readings"]["paper_claim"] == "undecided"
    assert (tmp_path / "out" / "claim2.png").stat().st_size > 0
    md = (tmp_path / "out" / "claim2.md").read_text()
    assert "(b) KL ratio at reward 0.56" in md and "no reward level reached by enough seeds" in md  # one seed < 6


def test_cory_report_claim2_runs_each_mode_and_a_missing_input_is_one_line(tmp_path: Path, capsys) -> None:
    """`cory-report claim2` as the installed command dispatches it: `report` and `unreached` on hand-made runs;
    a missing results folder, a mistyped mode and a run without held-out evaluations are one `error:` line, exit 2,
    nothing written."""
    results, out = tmp_path / "results", tmp_path / "out"
    reached = pts((0.5, 0), (0.61, 1), (0.62, 2), (0.63, 3))
    for arm in claim2.ARMS:
        _write(results, arm, 0, reached, llm2=reached if arm in ("cory", "released") else None)
    assert report.main(["claim2", "report", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads((out / "claim2.json").read_text())
    assert (out / "claim2.md").read_text() in printed and written["llm2"]["main_llm2"]["n"] == 1
    assert written["llm2"]["priced_llm2"]["n"] == 1  # released CORY's llm2 against the priced PPO's llm1
    assert report.main(["claim2", "unreached", str(results)]) == 0
    assert capsys.readouterr().out.strip() == ""  # every run reached 0.56 and 2 nats: the rule continues none
    _write(results, "cory", 1, pts((0.5, 0), (0.52, 1), (0.55, 2)))
    for mode in ("unreached", "unsaturated"):  # the second: the name the pre-registration's text prints
        assert report.main(["claim2", mode, str(results)]) == 0
        assert capsys.readouterr().out.split() == ["experiment=imdb_claim2_cory/seed=1"]
    shutil.rmtree(results / "experiment=imdb_claim2_cory" / "seed=1")

    for argv, expect in (
        (["claim2", "report", str(tmp_path / "none"), "--out", str(tmp_path / "out2")], "no such folder"),
        (["claim2", "pilot", str(tmp_path / "none")], "no such folder"),
        (["claim2", "reprot", str(results)], "cory-report claim2: argument mode: invalid choice: 'reprot'"),
    ):
        assert report.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and expect in err, err
    ppo = results / "experiment=imdb_claim2_ppo" / "seed=0" / "metrics.jsonl"
    ppo.write_text(json.dumps({"iteration": 0, "train/llm1/kl": 0.0}) + "\n")  # no held-out evaluation
    assert report.main(["claim2", "report", str(results), "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no held-out evaluation of llm1" in err, err
    assert not (tmp_path / "out2").exists()


def test_the_preregistered_sizing_is_what_plan_computes_from_the_committed_files() -> None:
    """docs/results.md's numbers for the second study, recomputed from outputs/claim/ and outputs/claim2/."""
    plan = claim2.plan(
        REPO / "outputs/claim/results",
        REPO / "outputs/claim/reward_spread.json",
        REPO / "outputs/claim2/reward_spread_probability.json",
    )
    text = (REPO / "docs/results.md").read_text()
    section = text[text.index("## Pre-registration 2") :]
    sd = plan["paired_sd_logit"]
    for value in (f"{sd['1.0']:.3f}", f"{sd['2.0']:.3f}", f"{sd['4.0']:.3f}", f"{plan['sigmoid_slope']:.3f}"):
        assert value in section
    assert f"{plan['paired_sd_probability']:.4f}" in section
    assert f"{plan['seeds_for_margin']} seeds" in section and f"{plan['seeds_for_0.1_logit']} seeds" in section
    b = plan["betas"]
    assert f"{b['main']:.3f}" in section and f"{b['priced']:.3f}" in section and f"{b['priced_logit']:.2f}" in section
    cost = plan["cost"]
    for exp in ("imdb_claim_ppo", "imdb_claim_cory", "imdb_claim_cory_released"):
        assert f"{cost[exp]['iteration_s']:.0f} s" in section and f"{cost[exp]['evaluation_s']:.0f} s" in section
    assert f"{plan['projected']['total_h']:.0f} CPU-hours" in section
    total = sum(c["wall_h"] for c in cost.values())
    assert f"{total:.1f} run-hours" in text


# ------------------------------------------------------------------------------------------------- the driver
def _repo_with_the_driver(tmp_path: Path) -> Path:
    """A git repository holding the study's driver, as the real one does (`scripts/`); the report it runs is this
    checkout's `cory.studies.claim2_report` (`_driver` puts it first on the path)."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "reproduce_claim2.sh", repo / "scripts" / "reproduce_claim2.sh")
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def _driver(repo: Path, *args: str, **env: str):
    import os
    import subprocess
    import sys

    # the driver runs `$PY -m cory.studies...` from the copy: this checkout's package, not another installed one
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = os.environ | {"PY": sys.executable, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"} | env
    env["PYTHONPATH"] = path
    return subprocess.run(["bash", "scripts/reproduce_claim2.sh", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip


def test_the_driver_reports_refuses_unknown_steps_and_will_not_extend_a_lost_run(tmp_path: Path) -> None:
    repo = _repo_with_the_driver(tmp_path)
    out = _driver(repo, "bogus")
    assert (
        out.returncode == 2
        and out.stdout.strip() == "error: unknown step 'bogus'; expected pilot, study, extend or report"
    )
    results = repo / "outputs" / "claim2" / "results"
    for arm in claim2.ARMS:
        _write(results, arm, 0, pts((0.5, 0), (0.91, 1), (0.92, 2), (0.93, 3)))
    out = _driver(repo, "report")
    assert out.returncode == 0, out.stderr
    assert (repo / "outputs" / "claim2" / "claim2.md").is_file() and "### main" in out.stdout
    _write(results, "cory", 1, pts((0.5, 0), (0.52, 1), (0.55, 2)))  # not at 0.56 by 100: the rule extends it …
    out = _driver(repo, "extend")  # … but its run folder (with the checkpoint) is not on this machine
    assert out.returncode == 2
    assert (
        out.stdout.strip()
        == "error: outputs/claim2/runs/experiment=imdb_claim2_cory/seed=1 is gone; run the study on this machine first"
    )
    (results / "experiment=imdb_claim2_cory" / "seed=1" / "summary.json").write_text("{")  # the listing fails …
    out = _driver(repo, "extend")  # … and stops the driver with its own error, instead of extending nothing
    assert out.returncode == 2 and "is not valid JSON" in out.stderr, (out.stdout, out.stderr)


@pytest.mark.long
@pytest.mark.slow
def test_the_driver_runs_the_study_resumably_and_commits_each_finished_run(tmp_path: Path) -> None:
    """`study` on the tiny model, one seed, 2 iterations: four runs, their small files committed, nothing else."""
    import subprocess

    repo = _repo_with_the_driver(tmp_path)
    tiny = ["seed=0", "iterations=2", "model=tiny_gpt2", "batch_size=4", "algorithm.agent.mini_batch_size=4",
            "num_eval=4", "task.num_eval=8", "eval_every=1", "save_every=1"]  # fmt: skip
    out = _driver(repo, "study", *tiny, CORY_CACHE=str(tmp_path / "cache"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = subprocess.run(["git", "log", "--format=%s", "--name-only"], cwd=repo, capture_output=True, text=True).stdout
    committed = {line for line in log.splitlines() if line.startswith("outputs/")}
    for experiment in claim2.ARMS.values():
        for name in ("metrics.jsonl", "summary.json", "run_config.yaml", "overrides.yaml"):
            assert f"outputs/claim2/results/experiment={experiment}/seed=0/{name}" in committed
    assert all(line.startswith("outputs/claim2/results/") for line in committed)  # no run folder, no checkpoint
    assert "Second IMDB claim study: finished" in log
    again = _driver(repo, "study", *tiny, CORY_CACHE=str(tmp_path / "cache"))  # everything finished: nothing to do
    assert again.returncode == 0 and "4 jobs, 0 to run" in again.stdout


def test_the_arms_configs_hold_the_coefficients_the_committed_spreads_give() -> None:
    from helpers.compose import compose_cfg

    b = claim2.betas(
        json.loads((REPO / "outputs/claim/reward_spread.json").read_text()),
        json.loads((REPO / "outputs/claim2/reward_spread_probability.json").read_text()),
    )
    beta = {arm: compose_cfg([f"experiment={exp}"]).algorithm.agent.init_kl_coef for arm, exp in claim2.ARMS.items()}
    assert beta == {"ppo": round(b["main"], 3), "cory": round(b["main"], 3), "released": 0.4,
                    "priced": round(b["priced"], 3)}  # fmt: skip
    for exp in claim2.ARMS.values():
        cfg = compose_cfg([f"experiment={exp}"])
        assert cfg.task.reward.bound == "probability" and not cfg.algorithm.agent.adaptive_kl
        assert (cfg.eval_every, cfg.iterations, cfg.batch_size, cfg.num_eval) == (10, 100, 32, 512)
        released = exp == "imdb_claim2_cory_released"
        assert cfg.algorithm.agent.use_score_norm == released == cfg.algorithm.agent.use_score_scaling
        assert cfg.algorithm.schedule.get("faithful_official_swap", False) == released
    rates = {compose_cfg([f"experiment={exp}"]).algorithm.agent.learning_rate for exp in claim2.ARMS.values()}
    assert len(rates) == 1  # one learning rate for every arm
    # the one the pilot's rule gives on its committed runs
    assert rates == {
        claim2.choose_learning_rate(claim2.pilot_curves(REPO / "outputs" / "claim2" / "pilot" / "results"))
    }
