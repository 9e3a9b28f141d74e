"""The IMDB claim study's pre-registered statistics and verdicts (docs/results.md, "Pre-registration").

    python scripts/claim_report.py outputs/claim/results --out outputs/claim

Reads each run's committed `metrics.jsonl` under `RESULTS/experiment=<arm experiment>/seed=<n>/` (what
`scripts/run_sweep.py --results` copies), pairs CORY's and PPO's runs of the same seed, and writes
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
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {
    "A": ("imdb_claim_cory", "imdb_claim_ppo"),
    "B": ("imdb_claim_cory_released", "imdb_claim_ppo"),
    "C": ("imdb_claim_cory_released", "imdb_claim_ppo_released"),
}
REWARD_MARGIN = 0.1  # claim 1's equivalence margin, TF-IDF logit units
KL_RATIO = 0.5  # claim 2
FLAT = 0.10  # relative change of the held-out KL between the last two evaluations


def held_out(path: Path) -> list[dict]:
    """`(iteration, reward, kl, combined)` of llm1's held-out evaluations, in order."""
    from cory.loggers import read_metrics

    rows = [r for r in read_metrics(path) if "eval/llm1/task_reward" in r]
    return [
        {
            "iteration": r["iteration"],
            "reward": r["eval/llm1/task_reward"],
            "kl": r["eval/llm1/kl"],
            "combined": r["eval/llm1/combined_reward"],
        }
        for r in rows
    ]


def finished(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / "summary.json").read_text()).get("completed"))
    except (OSError, ValueError):
        return False


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean over `values` (n − 1 degrees of freedom); n < 2 gives NaNs."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return mean, math.nan, math.nan
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


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


def arm_report(results: Path, cory_exp: str, ppo_exp: str) -> dict:
    seeds = []
    for folder in sorted((results / f"experiment={cory_exp}").glob("seed=*")):
        other = results / f"experiment={ppo_exp}" / folder.name
        if finished(folder) and finished(other):
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
                "kl_ratio": c["kl"] / p["kl"] if p["kl"] else math.nan,
                "combined_diff": c["combined"] - p["combined"],
                "matched_reward": matched,
                "kl_ratio_at_matched_reward": kl_at_reward(cory, matched) / kl_at_reward(ppo, matched),
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


def plot(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = sorted(p.name.split("=", 1)[1] for p in results.glob("experiment=*"))
    if not experiments:
        return
    fig, (ax_r, ax_kl) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    colors = dict(zip(experiments, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for exp in experiments:
        for i, folder in enumerate(sorted((results / f"experiment={exp}").glob("seed=*"))):
            curve = held_out(folder / "metrics.jsonl")
            its = [c["iteration"] for c in curve]
            label = exp if i == 0 else None
            ax_r.plot(its, [c["reward"] for c in curve], "o-", color=colors[exp], alpha=0.8, label=label)
            ax_kl.plot(its, [c["kl"] for c in curve], "o-", color=colors[exp], alpha=0.8)
    ax_r.set(xlabel="iteration", ylabel="held-out task reward, llm1 (TF-IDF logit)", title="every seed, one line each")
    ax_kl.set(xlabel="iteration", ylabel="held-out KL to π0, llm1 (nats)", title="every seed, one line each")
    fig.legend(loc="outside lower center", ncols=len(experiments))
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the folder of copied run results (experiment=*/seed=*/)")
    parser.add_argument("--out", type=Path, required=True, help="where claim.{json,md,png} go")
    args = parser.parse_args(argv)
    if not any(args.results.glob("experiment=*/seed=*/metrics.jsonl")):
        print(f"error: no run results under {args.results} (expected experiment=<arm>/seed=<n>/metrics.jsonl)")
        return 2
    report = {"arms": {arm: arm_report(args.results, *pair) for arm, pair in ARMS.items()}}
    report["arms"] = {arm: r for arm, r in report["arms"].items() if r["n"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "claim.json").write_text(json.dumps(report, indent=2))
    (args.out / "claim.md").write_text(markdown(report))
    plot(args.results, args.out / "claim.png")
    print(markdown(report) or "no arm has a seed with both runs finished yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
