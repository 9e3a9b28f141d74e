"""The IMDB claim study's pre-registered statistics and verdicts (docs/results.md, "Pre-registration").

    cory-report claim outputs/claim/results --out outputs/claim

Reads each run's committed `metrics.jsonl` under `RESULTS/experiment=<arm experiment>/seed=<n>/` (what
`cory-sweep --results` copies), pairs CORY's and PPO's runs of the same seed, and writes
`claim.json` (every number), `claim.md` (the tables) and `claim.png` (every seed's held-out curves) into `--out`.

Per arm (A: `imdb_claim_cory` vs `imdb_claim_ppo`; B: `imdb_claim_cory_released` vs `imdb_claim_ppo`;
C: `imdb_claim_cory_released` vs `imdb_claim_ppo_released`), over the seeds that have both runs finished:
1. similar reward: d = final held-out task reward, CORY(llm1) − PPO; holds if the 95 % t interval of the mean d lies
   inside ±0.1, does not hold if it lies outside ±0.1 entirely, else undecided;
2. KL ≤ ½ PPO's: q = final held-out KL, CORY(llm1)/PPO; holds if the interval's upper end ≤ 0.5, does not hold if
   its lower end > 0.5, else undecided (KL at matched held-out reward is reported beside it);
3. frontier: d = final held-out combined reward r − η_eval·KL, CORY(llm1) − PPO; holds if the interval is above 0,
   does not hold if below 0, else undecided.
A run is flat when its last two held-out KLs differ by under 10 %; a seed is flat in an arm when both its runs are;
with fewer than two flat seeds (of three), or fewer than two seeds, every verdict of the arm is "undecided".
Beside the flatness gate each run's KL growth over the last two evaluation intervals is reported (is it slowing?).
The statistics are `cory.studies.stats`'s, the files are read by `cory.studies.results`: a corrupt, partial or
non-numeric result, no arm with a finished pair, or an unwritable `--out` is one line and exit code 2. The same
command: `python -m cory.studies.claim_report`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from cory import figures
from cory.studies import command, results
from cory.studies.command import StudyError
from cory.studies.stats import t_interval

ARMS = {
    "A": ("imdb_claim_cory", "imdb_claim_ppo"),
    "B": ("imdb_claim_cory_released", "imdb_claim_ppo"),
    "C": ("imdb_claim_cory_released", "imdb_claim_ppo_released"),
}
REWARD_MARGIN = 0.1  # claim 1's equivalence margin, TF-IDF logit units
KL_RATIO = 0.5  # claim 2
FLAT = 0.10  # relative change of the held-out KL between the last two evaluations


def held_out(path: Path) -> list[dict]:
    """`(iteration, reward, kl, combined)` of llm1's held-out evaluations, in order (`cory.studies.results`)."""
    return results.held_out(path, "llm1")


def kl_at_reward(curve: list[dict], target: float) -> float:
    """The KL where the held-out reward first reaches `target`, linear between evaluations (NaN if never)."""
    for a, b in zip(curve, curve[1:]):
        if a["reward"] <= target <= b["reward"] and b["reward"] > a["reward"]:
            w = (target - a["reward"]) / (b["reward"] - a["reward"])
            return a["kl"] + w * (b["kl"] - a["kl"])
    if curve and curve[0]["reward"] >= target:
        return curve[0]["kl"]
    return math.nan


def is_flat(curve: list[dict]) -> bool:
    if len(curve) < 2:
        return False
    before, last = curve[-2]["kl"], curve[-1]["kl"]
    return abs(last - before) < FLAT * abs(before) if before else last == before


def kl_growth(curve: list[dict], intervals: int = 2) -> list[float]:
    """The held-out KL's relative change over each of the last `intervals` evaluation intervals, oldest first
    (0.26 = +26 %): whether a run that is not flat is slowing down (shrinking changes) or not."""
    pairs = list(zip(curve, curve[1:]))[-intervals:]
    return [b["kl"] / a["kl"] - 1 if a["kl"] else math.nan for a, b in pairs]


def verdict(low: float, high: float, holds, fails) -> str:
    if math.isnan(low):
        return "undecided"
    return "holds" if holds(low, high) else "does not hold" if fails(low, high) else "undecided"


def arm_report(kept: Path, cory_exp: str, ppo_exp: str) -> dict:
    seeds = []
    for _, _, folder in results.kept_runs(kept, f"experiment={cory_exp}"):
        other = kept / f"experiment={ppo_exp}" / folder.name
        if results.finished(folder) and results.finished(other):
            seeds.append(
                (int(folder.name.split("=")[1]), held_out(folder / "metrics.jsonl"), held_out(other / "metrics.jsonl"))
            )
    per_seed = []
    for seed, cory, ppo in seeds:
        c, p = cory[-1], ppo[-1]
        matched = min(max(x["reward"] for x in cory), max(x["reward"] for x in ppo))
        per_seed.append(
            {
                "seed": seed,
                "iteration": c["iteration"],
                "cory": c,
                "ppo": p,
                "reward_diff": c["reward"] - p["reward"],
                "kl_ratio": _ratio(c["kl"], p["kl"]),
                "combined_diff": c["combined"] - p["combined"],
                "matched_reward": matched,
                "kl_ratio_at_matched_reward": _ratio(kl_at_reward(cory, matched), kl_at_reward(ppo, matched)),
                "flat": is_flat(cory) and is_flat(ppo),
                "kl_growth": {"cory": kl_growth(cory), "ppo": kl_growth(ppo)},
            }
        )
    out = {"cory": cory_exp, "ppo": ppo_exp, "seeds": per_seed, "n": len(per_seed)}
    n_flat = sum(s["flat"] for s in per_seed)
    powered = len(per_seed) >= 2 and n_flat >= 2
    claims = {
        "similar_reward": ("reward_diff", lambda lo, hi: -REWARD_MARGIN <= lo and hi <= REWARD_MARGIN,
                           lambda lo, hi: lo > REWARD_MARGIN or hi < -REWARD_MARGIN),
        "kl_at_most_half": ("kl_ratio", lambda lo, hi: hi <= KL_RATIO, lambda lo, hi: lo > KL_RATIO),
        "frontier_dominates": ("combined_diff", lambda lo, hi: lo > 0, lambda lo, hi: hi < 0),
    }  # fmt: skip
    out["claims"] = {}
    for claim, (key, holds, fails) in claims.items():
        mean, low, high = t_interval([s[key] for s in per_seed])
        decided = verdict(low, high, holds, fails) if powered else "undecided"
        out["claims"][claim] = {"statistic": key, "mean": mean, "ci95": [low, high], "verdict": decided}
    matched = [s["kl_ratio_at_matched_reward"] for s in per_seed if not math.isnan(s["kl_ratio_at_matched_reward"])]
    out["kl_ratio_at_matched_reward"] = dict(zip(("mean", "low", "high"), t_interval(matched)))
    out["flat_seeds"] = n_flat
    out["powered"] = powered
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan  # a PPO run that never left π0 (KL 0) has no ratio


def _growth(changes: list[float]) -> str:
    return ", ".join(f"{100 * c:+.0f} %" for c in changes)


def markdown(report: dict) -> str:
    lines = []
    for arm, r in report["arms"].items():
        lines.append(f"### Arm {arm}: `{r['cory']}` vs `{r['ppo']}` ({r['n']} seeds, {r['flat_seeds']} flat)\n")
        header = (
            "seed | iteration | PPO reward | CORY reward | PPO KL | CORY KL | KL ratio | KL ratio at matched reward"
        )
        lines.append(f"| {header} | combined diff | flat | PPO KL growth | CORY KL growth |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in r["seeds"]:
            lines.append(
                f"| {s['seed']} | {s['iteration']} | {s['ppo']['reward']:.3f} | {s['cory']['reward']:.3f} | "
                f"{s['ppo']['kl']:.2f} | {s['cory']['kl']:.2f} | {s['kl_ratio']:.2f} | "
                f"{s['kl_ratio_at_matched_reward']:.2f} | {s['combined_diff']:+.3f} | "
                f"{'yes' if s['flat'] else 'no'} | {_growth(s['kl_growth']['ppo'])} | "
                f"{_growth(s['kl_growth']['cory'])} |"
            )
        lines.append("")
        lines.append("| claim | statistic | mean | 95 % interval | verdict |")
        lines.append("|---|---|---|---|---|")
        for claim, c in r["claims"].items():
            low, high = c["ci95"]
            lines.append(
                f"| {claim} | {c['statistic']} | {c['mean']:.3f} | [{low:.3f}, {high:.3f}] | {c['verdict']} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(kept: Path, out: Path) -> None:
    """Every seed's held-out reward and KL of llm1 against the iteration, one line per run, coloured by experiment."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = results.kept_runs(kept, "experiment=*")
    experiments = sorted({experiment for experiment, _, _ in runs})
    fig = Figure(figsize=(11, 4), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax_r, ax_kl = fig.subplots(1, 2)
    colors = {exp: f"C{i % 10}" for i, exp in enumerate(experiments)}
    labelled = set()
    for exp, _, folder in runs:
        curve = held_out(folder / "metrics.jsonl")
        its = [c["iteration"] for c in curve]
        label = None if exp in labelled else exp
        labelled.add(exp)
        ax_r.plot(its, [c["reward"] for c in curve], "o-", color=colors[exp], alpha=0.8, label=label)
        ax_kl.plot(its, [c["kl"] for c in curve], "o-", color=colors[exp], alpha=0.8)
    ax_r.set(xlabel="iteration", ylabel="held-out task reward, llm1 (TF-IDF logit)", title="every seed, one line each")
    ax_kl.set(xlabel="iteration", ylabel="held-out KL to π0, llm1 (nats)", title="every seed, one line each")
    for ax in (ax_r, ax_kl):
        figures.iteration_axis(ax)
    figures.figure_legend(fig, [ax_r], fontsize=10, ncols=len(experiments))
    figures.save(fig, out, dpi=100)


def run(argv: Sequence[str] | None = None, prog: str = "cory-report claim") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument("results", type=Path, help="the folder of copied run results (experiment=*/seed=*/)")
    parser.add_argument("--out", type=Path, required=True, help="where claim.{json,md,png} go")
    args = parser.parse_args(argv)
    if not results.kept_runs(args.results, "experiment=*"):
        raise StudyError(f"no run results under {args.results} (expected experiment=<arm>/seed=<n>/metrics.jsonl)")
    report = {"arms": {arm: arm_report(args.results, *pair) for arm, pair in ARMS.items()}}
    report["arms"] = {arm: r for arm, r in report["arms"].items() if r["n"]}
    if not report["arms"]:
        arms = "; ".join(f"{arm}: {cory} and {ppo}" for arm, (cory, ppo) in ARMS.items())
        raise StudyError(
            f"no arm has a seed with both of its runs finished under {args.results} (arms: {arms}); "
            "finish the sweep first (its `cory-sweep` command, run again, continues it)"
        )
    with command.output(args.out):
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "claim.json").write_text(json.dumps(report, indent=2))
        (args.out / "claim.md").write_text(markdown(report))
        plot(args.results, args.out / "claim.png")
    print(markdown(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
