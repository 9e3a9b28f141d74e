"""The second IMDB claim study: its pre-registered statistics, gate and verdicts (docs/results.md, "Pre-registration
2"), and the arithmetic that sized it.

    python scripts/claim2_report.py report outputs/claim2/results --out outputs/claim2
    python scripts/claim2_report.py plan outputs/claim/results --spread outputs/claim/reward_spread.json \\
        --bounded-spread outputs/claim2/reward_spread_probability.json
    python scripts/claim2_report.py unsaturated outputs/claim2/results     # the runs the rule extends to 200
    python scripts/claim2_report.py pilot outputs/claim2/pilot/results     # the learning rate the pilot's rule picks

`report` reads each run's `metrics.jsonl` under `RESULTS/experiment=<arm>/seed=<n>/` (what `cory-sweep
--results` copies), pairs the arms of a seed (`COMPARISONS`) and writes `claim2.json`, `claim2.md` and `claim2.png`
(held-out reward against held-out KL, one line per run and seed, the matched-KL levels and the saturated reward
level marked). `plan` recomputes, from the first study's committed files, the seed count, the two KL coefficients
and the CPU cost the pre-registration states. `unsaturated` lists the finished runs that the rule continues; `pilot`
applies the learning-rate rule to the pilot's runs (`sweep=imdb_claim2_pilot`).

Every statistic is a pure function of the held-out curves (`curve`): the rewards are the bounded task reward
(`task.reward.bound=probability`, in [0, 1], ceiling 1) of agent llm1 (CORY's llm2 is reported beside it).
(a) reward at matched KL: each run's held-out reward where its held-out KL first reaches a level, linear between
    evaluations (`reward_at_kl`); per seed the paired difference CORY − PPO at `PRIMARY_KL`.
(b) KL at saturated reward: where the held-out reward first reaches `SATURATED` (`kl_at_reward`); per seed the ratio
    CORY / PPO, averaged on the log scale (a geometric mean with its t interval).
The gate: a run is saturated when its last `LAST` held-out rewards are all ≥ `SATURATED` (`saturated`); statistic
(b) of a comparison is decided only when at least `MIN_SEEDS` seeds have both runs saturated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cory.studies.stats import t_interval  # noqa: E402  (mean, low, high): the family and claim reports' own

# ------------------------------------------------------------------------------------- pre-registered constants
CEILING = 1.0  # the bounded reward's ceiling: P(positive) ≤ 1
GAP = 0.1  # x: saturated means within GAP of the ceiling
SATURATED = CEILING - GAP  # s*: the saturated reward level of statistic (b) and of the gate
LAST = 3  # k: the gate looks at the last LAST held-out evaluations (every 10 iterations)
KL_LEVELS = (1.0, 2.0, 4.0)  # nats; statistic (a) is reported at each
PRIMARY_KL = 2.0  # the level statistic (a) decides at
MARGIN = 0.02  # δ of statistic (a), P(positive) units: "CORY is not better" when the interval lies below +δ
KL_RATIO = 0.5  # the paper's "KL ≤ ½ PPO's"
SEEDS = 8
MIN_SEEDS = 6  # of SEEDS: seeds a statistic needs (defined, and for (b) saturated) before it decides
FIRST_LENGTH, EXTENDED_LENGTH = 100, 200  # iterations; a run unsaturated at 100 continues to 200
RELEASED_BETA = 0.4  # the released CORY script's β, on its normalised reward
PAPER_BETA = 0.3  # the paper's β on the raw logit

ARMS = {
    "ppo": "imdb_claim2_ppo",
    "cory": "imdb_claim2_cory",
    "released": "imdb_claim2_cory_released",
    "priced": "imdb_claim2_ppo_priced",
}
# comparison → (CORY arm, PPO arm)
COMPARISONS = {"main": ("cory", "ppo"), "released": ("released", "ppo"), "priced": ("released", "priced")}


# ------------------------------------------------------------------------------------------------- the curves
def curve(metrics: Path, agent: str = "llm1") -> list[dict]:
    """`{iteration, reward, kl}` of an agent's held-out evaluations, in order (from a run's `metrics.jsonl`)."""
    from cory.loggers import read_metrics

    return [
        {"iteration": r["iteration"], "reward": r[f"eval/{agent}/task_reward"], "kl": r[f"eval/{agent}/kl"]}
        for r in read_metrics(metrics)
        if f"eval/{agent}/task_reward" in r
    ]


def first_crossing(xs: list[float], ys: list[float], level: float) -> float:
    """y where x first reaches `level` along the points in order, linear between the two points around it; y[0] if
    x starts at or above it; NaN if x never reaches it. Later dips and re-crossings do not count."""
    if not xs:
        return math.nan
    if xs[0] >= level:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 < level <= x1:
            return y0 + (level - x0) / (x1 - x0) * (y1 - y0)
    return math.nan


def reward_at_kl(points: list[dict], level: float) -> float:
    """Statistic (a) of one run: its held-out reward where its held-out KL first reaches `level` nats."""
    return first_crossing([p["kl"] for p in points], [p["reward"] for p in points], level)


def kl_at_reward(points: list[dict], level: float = SATURATED) -> float:
    """Statistic (b) of one run: its held-out KL where its held-out reward first reaches `level`."""
    return first_crossing([p["reward"] for p in points], [p["kl"] for p in points], level)


def saturated(points: list[dict], level: float = SATURATED, last: int = LAST) -> bool:
    """The gate for one run: each of its last `last` held-out rewards is at least `level`."""
    return len(points) >= last and all(p["reward"] >= level for p in points[-last:])


# ------------------------------------------------------------------------------------------------- statistics
def t_quantile(dof: int, level: float = 0.95) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, dof))


def ratio_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, low, high) of positive ratios: the t interval of their logs, exponentiated."""
    mean, low, high = t_interval([math.log(r) for r in ratios], level)
    return tuple(math.exp(v) if not math.isnan(v) else math.nan for v in (mean, low, high))


def seeds_needed(sd: float, half_width: float, level: float = 0.95, most: int = 1000) -> int:
    """The fewest seeds n ≥ 2 whose t interval of a mean, t(n − 1)·sd/√n, is at most `half_width`."""
    for n in range(2, most + 1):
        if t_quantile(n - 1, level) * sd / math.sqrt(n) <= half_width:
            return n
    return most


def verdict_reward(low: float, high: float) -> str:
    """Statistic (a), CORY − PPO at matched KL: CORY better if the interval is above 0; not better if it lies below
    +MARGIN (equal or worse); else undecided."""
    if math.isnan(low):
        return "undecided"
    return "holds" if low > 0 else "does not hold" if high < MARGIN else "undecided"


def verdict_ratio(low: float, high: float) -> str:
    """Statistic (b), KL ratio CORY / PPO at saturated reward: the paper's "at most half" holds if the interval's
    upper end is ≤ 0.5, does not hold if its lower end is > 0.5, else undecided."""
    if math.isnan(low):
        return "undecided"
    return "holds" if high <= KL_RATIO else "does not hold" if low > KL_RATIO else "undecided"


# ------------------------------------------------------------------------------------------------ comparisons
def finished(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / "summary.json").read_text()).get("completed"))
    except (OSError, ValueError):
        return False


def load_runs(results: Path) -> dict[tuple[str, int], dict[str, list[dict]]]:
    """(arm, seed) → {agent: held-out curve} of every finished run under `results`."""
    runs = {}
    for arm, experiment in ARMS.items():
        for folder in sorted((results / f"experiment={experiment}").glob("seed=*")):
            if finished(folder):
                agents = {a: curve(folder / "metrics.jsonl", a) for a in ("llm1", "llm2")}
                runs[(arm, int(folder.name.split("=", 1)[1]))] = {a: c for a, c in agents.items() if c}
    return runs


def compare(runs: dict, cory_arm: str, ppo_arm: str, agent: str = "llm1") -> dict:
    """Statistics (a) and (b), the gate and their verdicts for one comparison, over the seeds with both runs."""
    seeds = sorted(s for (arm, s) in runs if arm == cory_arm and (ppo_arm, s) in runs and agent in runs[(arm, s)])
    per_seed = []
    for seed in seeds:
        c, p = runs[(cory_arm, seed)][agent], runs[(ppo_arm, seed)]["llm1"]
        row = {"seed": seed, "saturated": saturated(c) and saturated(p)}
        row["reward_at_kl"] = {
            str(level): {"cory": reward_at_kl(c, level), "ppo": reward_at_kl(p, level)} for level in KL_LEVELS
        }
        for item in row["reward_at_kl"].values():
            item["diff"] = item["cory"] - item["ppo"]
        row["kl_at_saturated"] = {"cory": kl_at_reward(c), "ppo": kl_at_reward(p)}
        kc, kp = row["kl_at_saturated"]["cory"], row["kl_at_saturated"]["ppo"]
        row["kl_ratio"] = kc / kp if kp > 0 and kc > 0 else math.nan
        per_seed.append(row)
    out = {"cory": cory_arm, "ppo": ppo_arm, "agent": agent, "n": len(per_seed), "seeds": per_seed}
    out["saturated_seeds"] = sum(s["saturated"] for s in per_seed)
    out["gate"] = out["saturated_seeds"] >= MIN_SEEDS
    out["reward_at_kl"] = {}
    for level in KL_LEVELS:
        diffs = [s["reward_at_kl"][str(level)]["diff"] for s in per_seed]
        diffs = [d for d in diffs if not math.isnan(d)]
        mean, low, high = t_interval(diffs)
        decided = verdict_reward(low, high) if len(diffs) >= MIN_SEEDS else "undecided"
        out["reward_at_kl"][str(level)] = {"n": len(diffs), "mean": mean, "ci95": [low, high], "verdict": decided}
    ratios = [s["kl_ratio"] for s in per_seed if s["saturated"] and not math.isnan(s["kl_ratio"])]
    mean, low, high = ratio_interval(ratios) if ratios else (math.nan,) * 3
    decided = verdict_ratio(low, high) if out["gate"] and len(ratios) >= MIN_SEEDS else "undecided"
    out["kl_ratio"] = {"n": len(ratios), "geometric_mean": mean, "ci95": [low, high], "verdict": decided}
    return out


def readings(comparisons: dict[str, dict]) -> dict[str, str]:
    """The two answers the pre-registration asks for, from the three comparisons of llm1.

    paper_claim: the main comparison's statistic (b) verdict (CORY's KL at saturated reward at most half PPO's).
    normalisation: whether the released code's normalisation explains a KL gap of released CORY against PPO:
      "no gap to explain" if the released comparison's KL ratio interval reaches 1 or above;
      "the normalisation explains it" if there is a gap (upper end < 1), the paper's claim does not hold without
        normalisation (main), and a PPO paying released CORY's KL price is not beaten at matched KL (priced (a)
        does not hold);
      "cooperation adds to it" if there is a gap and released CORY beats that PPO at matched KL (priced (a) holds);
      "undecided" otherwise (an ungated or wide comparison included).
    """
    main, released, priced = (comparisons[k] for k in ("main", "released", "priced"))
    out = {"paper_claim": main["kl_ratio"]["verdict"]}
    low, high = released["kl_ratio"]["ci95"]
    priced_a = priced["reward_at_kl"][str(PRIMARY_KL)]["verdict"]
    if not released["gate"] or math.isnan(high):
        out["normalisation"] = "undecided"
    elif high >= 1:
        out["normalisation"] = "no gap to explain"
    elif priced_a == "holds":
        out["normalisation"] = "cooperation adds to it"
    elif priced_a == "does not hold" and main["kl_ratio"]["verdict"] == "does not hold":
        out["normalisation"] = "the normalisation explains it"
    else:
        out["normalisation"] = "undecided"
    return out


# ------------------------------------------------------------------------------------------------ the choices
def choose_learning_rate(pilot: dict[float, dict[str, list[dict]]], rise: float = 0.05, drop: float = 0.05) -> float:
    """The pilot's rule: the largest learning rate at which every method's held-out reward ends at least `rise`
    above its start and never falls by more than `drop` from one evaluation to the next; the smallest tried if
    none qualifies. `pilot` maps a learning rate to {method: held-out curve}."""

    def healthy(points: list[dict]) -> bool:
        rewards = [p["reward"] for p in points]
        steady = all(b - a >= -drop for a, b in zip(rewards, rewards[1:]))
        return len(rewards) >= 2 and rewards[-1] - rewards[0] >= rise and steady

    good = [lr for lr, methods in pilot.items() if methods and all(healthy(c) for c in methods.values())]
    return max(good) if good else min(pilot)


def pilot_curves(results: Path) -> dict[float, dict[str, list[dict]]]:
    """{learning rate: {experiment: llm1's held-out curve}} of the pilot's finished runs, from their folder names
    (`algorithm.agent.learning_rate=<lr>,experiment=<arm>/seed=<n>`, as `cory-sweep` names them)."""
    pilot: dict[float, dict[str, list[dict]]] = {}
    for folder in sorted(results.glob("*/seed=*")):
        keys = dict(part.split("=", 1) for part in folder.parent.name.split(","))
        if finished(folder) and "algorithm.agent.learning_rate" in keys:
            lr = float(keys["algorithm.agent.learning_rate"])
            pilot.setdefault(lr, {})[keys.get("experiment", "run")] = curve(folder / "metrics.jsonl")
    return pilot


def betas(spread: dict, bounded: dict) -> dict[str, float]:
    """The KL coefficients from the initial model's reward spreads (`scripts/reward_spread.py`): `main`, the paper's
    β 0.3 per unit of the logit's σ(r1) carried over to the bounded reward's σ(r1); `priced`, what the released
    CORY's β 0.4 on R̃ = (R − μ)/σ(R) costs per unit of the bounded collective reward R, 0.4·σ(R)."""
    return {
        "main": PAPER_BETA * bounded["std_r1"] / spread["std_r1"],
        "priced": RELEASED_BETA * bounded["std_r1_plus_r2"],
        "priced_logit": RELEASED_BETA * spread["std_r1_plus_r2"],
    }


def paired_spread(old_results: Path, levels: tuple[float, ...] = KL_LEVELS) -> dict[str, float]:
    """From the first study's committed runs (arm A: `imdb_claim_cory` vs `imdb_claim_ppo`, llm1): the s.d. over
    seeds of the paired difference of held-out reward (TF-IDF logit) at each matched KL level."""
    per_level = {}
    for level in levels:
        diffs = []
        for folder in sorted((old_results / "experiment=imdb_claim_cory").glob("seed=*")):
            ppo = old_results / "experiment=imdb_claim_ppo" / folder.name
            d = reward_at_kl(curve(folder / "metrics.jsonl"), level) - reward_at_kl(
                curve(ppo / "metrics.jsonl"), level
            )
            if not math.isnan(d):
                diffs.append(d)
        mean = sum(diffs) / len(diffs)
        per_level[str(level)] = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    return per_level


def sigmoid_slope(mean: float, sd: float, points: int = 2001) -> float:
    """E[σ'(r)] for r ~ Normal(mean, sd²) (trapezoid over ±6 sd): how much a logit difference shrinks, on average,
    when each response's logit r becomes its probability σ(r)."""
    total, weight = 0.0, 0.0
    for i in range(points):
        z = -6 + 12 * i / (points - 1)
        r = mean + sd * z
        w = math.exp(-z * z / 2) * (0.5 if i in (0, points - 1) else 1.0)
        s = 1 / (1 + math.exp(-r))
        total, weight = total + w * s * (1 - s), weight + w
    return total / weight


def run_cost(old_results: Path) -> dict[str, dict[str, float]]:
    """Per experiment of the first study: seconds per training iteration (median of `time/iteration_s` over its
    runs' iterations) and per held-out evaluation of 512 prompts ((wall time − Σ iteration times) / evaluations,
    mean over runs: what is not an iteration is an evaluation, a checkpoint or the start)."""
    import statistics

    from cory.loggers import read_metrics

    out = {}
    for exp_folder in sorted(old_results.glob("experiment=*")):
        its, evals, walls = [], [], []
        for folder in sorted(exp_folder.glob("seed=*")):
            rows = read_metrics(folder / "metrics.jsonl")
            times = [r["time/iteration_s"] for r in rows if "time/iteration_s" in r]
            n_eval = sum(1 for r in rows if "eval/llm1/task_reward" in r)
            wall = json.loads((folder / "summary.json").read_text())["wall_time_s"]
            its += times
            evals.append((wall - sum(times)) / n_eval)
            walls.append(wall)
        out[exp_folder.name.split("=", 1)[1]] = {
            "iteration_s": statistics.median(its),
            "evaluation_s": statistics.fmean(evals),
            "runs": len(walls),
            "wall_h": sum(walls) / 3600,
        }
    return out


def projected_hours(
    cost: dict, seeds: int = SEEDS, iterations: int = FIRST_LENGTH, every: int = 10, arms: tuple = tuple(ARMS)
) -> dict:
    """CPU-hours (one core per run, as the first study ran) of `arms` over `seeds`, from `run_cost`: the arms without
    normalisation cost what the first study's PPO and CORY arm A cost per iteration and evaluation, the released arm
    what its arm B cost. The pilot is `seeds=3` (its three learning rates), `iterations=40`, arms PPO and CORY."""
    like = {"ppo": "imdb_claim_ppo", "cory": "imdb_claim_cory", "released": "imdb_claim_cory_released"}
    like["priced"] = "imdb_claim_ppo"
    evaluations = iterations // every + 1
    per_run = {
        arm: (iterations * cost[like[arm]]["iteration_s"] + evaluations * cost[like[arm]]["evaluation_s"]) / 3600
        for arm in arms
    }
    return {"per_run_h": per_run, "total_h": seeds * sum(per_run.values())}


# ------------------------------------------------------------------------------------------------------ output
def report(results: Path) -> dict:
    runs = load_runs(results)
    comparisons = {name: compare(runs, *pair) for name, pair in COMPARISONS.items()}
    secondary = {f"{name}_llm2": compare(runs, *pair, agent="llm2") for name, pair in COMPARISONS.items()}
    return {"comparisons": comparisons, "llm2": secondary, "readings": readings(comparisons)}


def _f(v: float, digits: int = 3) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def markdown(rep: dict) -> str:
    lines = []
    for name, c in rep["comparisons"].items():
        lines.append(
            f"### {name}: `{ARMS[c['cory']]}` (llm1) vs `{ARMS[c['ppo']]}` "
            f"({c['n']} seeds, {c['saturated_seeds']} saturated; gate {'met' if c['gate'] else 'not met'})\n"
        )
        levels = " | ".join(f"Δ reward at KL {lv:g}" for lv in KL_LEVELS)
        lines.append(f"| seed | saturated | {levels} | KL at {SATURATED:g}: CORY | PPO | ratio |")
        lines.append("|---|---|" + "---|" * len(KL_LEVELS) + "---|---|---|")
        for s in c["seeds"]:
            diffs = " | ".join(_f(s["reward_at_kl"][str(lv)]["diff"]) for lv in KL_LEVELS)
            k = s["kl_at_saturated"]
            lines.append(
                f"| {s['seed']} | {'yes' if s['saturated'] else 'no'} | {diffs} | {_f(k['cory'], 2)} | "
                f"{_f(k['ppo'], 2)} | {_f(s['kl_ratio'], 2)} |"
            )
        lines.append("")
        lines.append("| statistic | seeds | mean | 95 % interval | verdict |")
        lines.append("|---|---|---|---|---|")
        for lv, a in c["reward_at_kl"].items():
            primary = " (decides)" if float(lv) == PRIMARY_KL else ""
            lines.append(
                f"| (a) Δ reward at KL {float(lv):g}{primary} | {a['n']} | {_f(a['mean'])} | "
                f"[{_f(a['ci95'][0])}, {_f(a['ci95'][1])}] | {a['verdict']} |"
            )
        b = c["kl_ratio"]
        lines.append(
            f"| (b) KL ratio at reward {SATURATED:g} | {b['n']} | {_f(b['geometric_mean'])} | "
            f"[{_f(b['ci95'][0])}, {_f(b['ci95'][1])}] | {b['verdict']} |"
        )
        lines.append("")
    r = rep["readings"]
    lines.append(f"**Paper's claim (CORY's KL ≤ ½ PPO's at saturated reward):** {r['paper_claim']}.  ")
    lines.append(f"**Does the released code's normalisation explain a KL gap:** {r['normalisation']}.")
    return "\n".join(lines) + "\n"


def plot(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(results)
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    colors = dict(zip(ARMS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    labelled = set()
    for (arm, _seed), agents in sorted(runs.items()):
        c = agents["llm1"]
        label = None if arm in labelled else f"{ARMS[arm]} (llm1)"
        labelled.add(arm)
        ax.plot([p["kl"] for p in c], [p["reward"] for p in c], "o-", ms=3, color=colors[arm], alpha=0.7, label=label)
    for level in KL_LEVELS:
        ax.axvline(level, color="grey", ls=":", lw=1)
    ax.axhline(SATURATED, color="black", ls="--", lw=1, label=f"saturated reward {SATURATED:g}")
    ax.set(xlabel="held-out KL to π0 (nats)", ylabel="held-out task reward, P(positive)",
           title="every seed, one line each; dotted: matched-KL levels")  # fmt: skip
    ax.legend(fontsize=8)
    fig.savefig(out)
    plt.close(fig)


def plan(old_results: Path, spread: Path, bounded_spread: Path | None) -> dict:
    """The pre-registration's arithmetic from the first study's committed files."""
    sd_logit = paired_spread(old_results)
    ppo = [curve(f / "metrics.jsonl") for f in sorted((old_results / "experiment=imdb_claim_ppo").glob("seed=*"))]
    # the logit where the comparisons happen: PPO's held-out mean reward at the largest matched KL level
    at = [reward_at_kl(c, max(KL_LEVELS)) for c in ppo]
    spread_logit = json.loads(spread.read_text())
    slope = sigmoid_slope(sum(at) / len(at), spread_logit["std_r1"])
    worst = max(sd_logit.values())
    out = {
        "paired_sd_logit": sd_logit,
        "sigmoid_slope": slope,
        "paired_sd_probability": worst * slope,
        "seeds_for_margin": seeds_needed(worst * slope, MARGIN),
        "seeds_for_0.1_logit": seeds_needed(worst, 0.1),
        "cost": run_cost(old_results),
    }
    out["projected"] = projected_hours(out["cost"])
    out["pilot"] = projected_hours(out["cost"], seeds=3, iterations=40, arms=("ppo", "cory"))
    matched = json.loads((old_results.parent / "claim.json").read_text())["arms"]["A"]["seeds"]
    logs = [math.log(s["kl_ratio_at_matched_reward"]) for s in matched]
    mean = sum(logs) / len(logs)
    out["log_kl_ratio_sd"] = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    out["ratio_factor_8_seeds"] = math.exp(t_quantile(SEEDS - 1) * out["log_kl_ratio_sd"] / math.sqrt(SEEDS))
    if bounded_spread is not None:
        out["betas"] = betas(spread_logit, json.loads(bounded_spread.read_text()))
    return out


def unsaturated(results: Path) -> list[str]:
    """`experiment=<arm>/seed=<n>` of the finished runs whose llm1 fails the gate and that have not yet run to
    EXTENDED_LENGTH iterations: the runs the rule continues."""
    todo = []
    for (arm, seed), agents in sorted(load_runs(results).items()):
        points = agents["llm1"]
        if not saturated(points) and points[-1]["iteration"] < EXTENDED_LENGTH:
            todo.append(f"experiment={ARMS[arm]}/seed={seed}")
    return todo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="statistics, verdicts and the figure from the committed runs")
    rep.add_argument("results", type=Path)
    rep.add_argument("--out", type=Path, required=True)
    pl = sub.add_parser("plan", help="seeds, KL coefficients and cost from the first study's committed files")
    pl.add_argument("old_results", type=Path)
    pl.add_argument("--spread", type=Path, required=True, help="the first study's reward_spread.json (logits)")
    pl.add_argument("--bounded-spread", type=Path, help="the same measured with task.reward.bound=probability")
    un = sub.add_parser("unsaturated", help="the finished runs the rule continues to 200 iterations")
    un.add_argument("results", type=Path)
    pi = sub.add_parser("pilot", help="the learning rate the pilot's rule picks")
    pi.add_argument("results", type=Path)
    args = parser.parse_args(argv)

    if args.command == "plan":
        print(json.dumps(plan(args.old_results, args.spread, args.bounded_spread), indent=2))
        return 0
    if not any(args.results.glob("*/seed=*/metrics.jsonl")):
        print(f"error: no run results under {args.results} (expected <what varies>/seed=<n>/metrics.jsonl)")
        return 2
    if args.command == "unsaturated":
        print("\n".join(unsaturated(args.results)))
        return 0
    if args.command == "pilot":
        pilot = pilot_curves(args.results)
        tried = {lr: sorted(methods) for lr, methods in sorted(pilot.items())}
        if len(tried) < 3 or any(len(m) < 2 for m in tried.values()):
            print(f"error: the pilot is not finished (finished runs: {tried}); run it to the end first")
            return 2
        print(f"learning rate by the pilot's rule: {choose_learning_rate(pilot):g}")
        return 0
    result = report(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "claim2.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "claim2.md").write_text(markdown(result))
    plot(args.results, args.out / "claim2.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
