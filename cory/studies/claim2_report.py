"""The second IMDB claim study: its pre-registered statistics, gate and verdicts (docs/results.md, "Pre-registration
2"), and the arithmetic that sized it.

    cory-report claim2 report outputs/claim2/results --out outputs/claim2
    cory-report claim2 plan outputs/claim/results --spread outputs/claim/reward_spread.json \\
        --bounded-spread outputs/claim2/reward_spread_probability.json
    cory-report claim2 unreached outputs/claim2/results       # the runs the rule extends to 200
    cory-report claim2 pilot outputs/claim2/pilot/results     # the learning rate the pilot's rule picks

`report` reads each run's `metrics.jsonl` under `RESULTS/experiment=<arm>/seed=<n>/` (what `cory-sweep
--results` copies), pairs the arms of a seed (`COMPARISONS`) and writes `claim2.json`, `claim2.md` and `claim2.png`
(held-out reward against held-out KL, one line per run and seed, the matched-KL and matched-reward levels
marked). `plan` recomputes, from the first study's committed files, the seed count, the two KL coefficients
and the CPU cost the pre-registration states. `unreached` lists the finished runs that the rule continues; `pilot`
applies the learning-rate rule to the pilot's runs (`sweep=imdb_claim2_pilot`).

Every statistic is a pure function of the held-out curves (`curve`): the rewards are the bounded task reward
(`task.reward.bound=probability`, in [0, 1], ceiling 1) of agent llm1 (CORY's llm2 is reported beside it).
(a) reward at matched KL: each run's held-out reward where its held-out KL first reaches a level, linear between
    evaluations (`reward_at_kl`); per seed the paired difference CORY − PPO at `PRIMARY_KL`.
(b) KL at matched reward: where the held-out reward first reaches a level (`kl_at_reward`); per seed the ratio
    CORY / PPO, averaged on the log scale (a geometric mean with its t interval).
The gate (amendment 1 of the pre-registration, which replaced the saturation gate): statistic (b) of a comparison is
taken at the highest of `REWARD_LEVELS` that at least `MIN_SEEDS` seeds reach in both runs (`matched_level`), and is
undecided when none is; statistic (a) at a KL level decides only when at least `MIN_SEEDS` seeds reach it in both.
The statistics are `cory.studies.stats`'s, the files are read by `cory.studies.results`: a corrupt, partial or
non-numeric result, a folder without runs, an unfinished pilot or an unwritable `--out` is one line and exit code 2.
The same command: `python -m cory.studies.claim2_report`.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from cory import figures
from cory.studies import command, results
from cory.studies.command import StudyError
from cory.studies.stats import ratio_interval, seeds_needed, spread, t_interval, t_quantile

# ------------------------------------------------------------------------------------- pre-registered constants
# amendment 1 (docs/results.md, dated 2026-12-06, before any study run): the saturation gate (the last 3 held-out
# rewards ≥ 0.9 = the ceiling 1 − 0.1) was out of reach — PPO's pilot peaked at 0.57 whatever its rate — so statistic
# (b) is read at the highest of these reward levels that enough seeds reach, highest first
REWARD_LEVELS = (0.60, 0.58, 0.56)
KL_LEVELS = (1.0, 2.0, 4.0)  # nats; statistic (a) is reported at each
PRIMARY_KL = 2.0  # the level statistic (a) decides at
MARGIN = 0.02  # δ of statistic (a), P(positive) units: "CORY is not better" when the interval lies below +δ
KL_RATIO = 0.5  # the paper's "KL ≤ ½ PPO's"
SEEDS = 8
MIN_SEEDS = 6  # of SEEDS: seeds a statistic needs (both runs reaching its level) before it decides
FIRST_LENGTH, EXTENDED_LENGTH = 100, 200  # iterations; a run missing a deciding level at 100 continues to 200
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
AGENTS = ("llm1", "llm2")  # llm1 decides (PPO's only agent); CORY's llm2 is reported beside it


# ------------------------------------------------------------------------------------------------- the curves
def curve(metrics: Path, agent: str = "llm1") -> list[dict]:
    """`{iteration, reward, kl}` of an agent's held-out evaluations, in order (from a run's `metrics.jsonl`)."""
    return results.held_out(metrics, agent, ("reward", "kl"))


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


def kl_at_reward(points: list[dict], level: float) -> float:
    """Statistic (b) of one run: its held-out KL where its held-out reward first reaches `level`."""
    return first_crossing([p["reward"] for p in points], [p["kl"] for p in points], level)


def reaches(points: list[dict], reward: float | None = None, kl: float | None = None) -> bool:
    """Whether a run's held-out reward (or KL) ever reaches the level: the statistic at it is defined for this run."""
    key, level = ("reward", reward) if reward is not None else ("kl", kl)
    return any(p[key] >= level for p in points)


def matched_level(per_seed: list[dict]) -> float | None:
    """The gate of statistic (b): the highest of REWARD_LEVELS whose KL ratio is defined in at least MIN_SEEDS
    seeds (both runs reach it), or None. Chosen by reachability alone, before any ratio is read."""
    for level in REWARD_LEVELS:
        if sum(not math.isnan(s["kl_ratio"][str(level)]) for s in per_seed) >= MIN_SEEDS:
            return level
    return None


# --------------------------------------------------------------------------------------------------- verdicts
def verdict_reward(low: float, high: float) -> str:
    """Statistic (a), CORY − PPO at matched KL: CORY better if the interval is above 0; not better if it lies below
    +MARGIN (equal or worse); else undecided."""
    if math.isnan(low):
        return "undecided"
    return "holds" if low > 0 else "does not hold" if high < MARGIN else "undecided"


def verdict_ratio(low: float, high: float) -> str:
    """Statistic (b), KL ratio CORY / PPO at matched reward: the paper's "at most half" holds if the interval's
    upper end is ≤ 0.5, does not hold if its lower end is > 0.5, else undecided."""
    if math.isnan(low):
        return "undecided"
    return "holds" if high <= KL_RATIO else "does not hold" if low > KL_RATIO else "undecided"


# ------------------------------------------------------------------------------------------------ comparisons
def load_runs(kept: Path) -> dict[tuple[str, int], dict[str, list[dict]]]:
    """(arm, seed) → {agent: held-out curve} of every finished run under `kept` (llm1 always, llm2 where the run
    evaluated one)."""
    runs = {}
    for arm, experiment in ARMS.items():
        for _, seed, folder in results.kept_runs(kept, f"experiment={experiment}"):
            if results.finished(folder):
                path = folder / results.METRICS
                evaluated = results.evaluated_agents(path)
                runs[(arm, seed)] = {a: curve(path, a) for a in AGENTS if a == "llm1" or a in evaluated}
    return runs


def compare(runs: dict, cory_arm: str, ppo_arm: str, agent: str = "llm1") -> dict:
    """Statistics (a) and (b), the gate and their verdicts for one comparison, over the seeds with both runs."""
    seeds = sorted(s for (arm, s) in runs if arm == cory_arm and (ppo_arm, s) in runs and agent in runs[(arm, s)])
    per_seed = []
    for seed in seeds:
        c, p = runs[(cory_arm, seed)][agent], runs[(ppo_arm, seed)]["llm1"]
        row: dict = {"seed": seed}
        row["reward_at_kl"] = {
            str(level): {"cory": reward_at_kl(c, level), "ppo": reward_at_kl(p, level)} for level in KL_LEVELS
        }
        for item in row["reward_at_kl"].values():
            item["diff"] = item["cory"] - item["ppo"]
        row["kl_at_reward"] = {
            str(level): {"cory": kl_at_reward(c, level), "ppo": kl_at_reward(p, level)} for level in REWARD_LEVELS
        }
        # a ratio needs both KLs positive: a run that starts at the level (KL 0) has no ratio
        row["kl_ratio"] = {
            lv: k["cory"] / k["ppo"] if k["ppo"] > 0 and k["cory"] > 0 else math.nan
            for lv, k in row["kl_at_reward"].items()
        }
        per_seed.append(row)
    out = {"cory": cory_arm, "ppo": ppo_arm, "agent": agent, "n": len(per_seed), "seeds": per_seed}
    out["reward_level"] = matched_level(per_seed)
    out["gate"] = out["reward_level"] is not None
    out["reward_at_kl"] = {}
    for level in KL_LEVELS:
        diffs = [s["reward_at_kl"][str(level)]["diff"] for s in per_seed]
        diffs = [d for d in diffs if not math.isnan(d)]
        mean, low, high = t_interval(diffs)
        decided = verdict_reward(low, high) if len(diffs) >= MIN_SEEDS else "undecided"
        out["reward_at_kl"][str(level)] = {"n": len(diffs), "mean": mean, "ci95": [low, high], "verdict": decided}
    level = out["reward_level"] if out["gate"] else REWARD_LEVELS[-1]  # ungated: reported at the lowest, undecided
    ratios = [s["kl_ratio"][str(level)] for s in per_seed if not math.isnan(s["kl_ratio"][str(level)])]
    mean, low, high = ratio_interval(ratios)
    decided = verdict_ratio(low, high) if out["gate"] else "undecided"
    out["kl_ratio"] = {"level": level, "n": len(ratios), "geometric_mean": mean, "ci95": [low, high],
                       "verdict": decided}  # fmt: skip
    return out


def readings(comparisons: dict[str, dict]) -> dict[str, str]:
    """The two answers the pre-registration asks for, from the three comparisons of llm1.

    paper_claim: the main comparison's statistic (b) verdict (CORY's KL at matched reward at most half PPO's).
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


def pilot_curves(kept: Path) -> dict[float, dict[str, list[dict]]]:
    """{learning rate: {experiment: llm1's held-out curve}} of the pilot's finished runs, from their folder names
    (`algorithm.agent.learning_rate=<lr>,experiment=<arm>/seed=<n>`, as `cory-sweep` names them)."""
    pilot: dict[float, dict[str, list[dict]]] = {}
    for _, _, folder in results.kept_runs(kept, "*"):
        keys = dict(part.split("=", 1) for part in folder.parent.name.split(",") if "=" in part)
        if "algorithm.agent.learning_rate" in keys and results.finished(folder):
            try:
                lr = float(keys["algorithm.agent.learning_rate"])
            except ValueError:
                raise StudyError(f"{folder.parent}: the learning rate in its name is not a number") from None
            pilot.setdefault(lr, {})[keys.get("experiment", "run")] = curve(folder / results.METRICS)
    return pilot


def betas(logit: dict, bounded: dict) -> dict[str, float]:
    """The KL coefficients from the initial model's reward spreads (`cory-measure reward-spread`, on the logit and on
    the bounded reward): `main`, the paper's β 0.3 per unit of the logit's σ(r1) carried over to the bounded reward's
    σ(r1); `priced`, what the released CORY's β 0.4 on R̃ = (R − μ)/σ(R) costs per unit of the bounded collective
    reward R, 0.4·σ(R)."""
    return {
        "main": PAPER_BETA * bounded["std_r1"] / logit["std_r1"],
        "priced": RELEASED_BETA * bounded["std_r1_plus_r2"],
        "priced_logit": RELEASED_BETA * logit["std_r1_plus_r2"],
    }


def paired_spread(old_results: Path, levels: tuple[float, ...] = KL_LEVELS) -> dict[str, float]:
    """From the first study's committed runs (arm A: `imdb_claim_cory` vs `imdb_claim_ppo`, llm1): the s.d. over
    seeds of the paired difference of held-out reward (TF-IDF logit) at each matched KL level."""
    pairs = []
    for _, _, folder in results.kept_runs(old_results, "experiment=imdb_claim_cory"):
        ppo = old_results / "experiment=imdb_claim_ppo" / folder.name
        pairs.append((curve(folder / results.METRICS), curve(ppo / results.METRICS)))
    per_level = {}
    for level in levels:
        diffs = [reward_at_kl(cory, level) - reward_at_kl(ppo, level) for cory, ppo in pairs]
        diffs = [d for d in diffs if not math.isnan(d)]
        if len(diffs) < 2:  # an s.d. needs two seeds
            raise StudyError(f"fewer than two seeds of arm A under {old_results} reach {level:g} nats in both runs")
        per_level[str(level)] = spread(diffs)["sd"]
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
    per_experiment: dict[str, list[Path]] = {}
    for experiment, _, folder in results.kept_runs(old_results, "experiment=*"):
        per_experiment.setdefault(experiment, []).append(folder)
    out = {}
    for experiment, folders in per_experiment.items():
        its, evals, walls = [], [], []
        for folder in folders:
            path = folder / results.METRICS
            rows = results.metrics(path)
            times = results.column(rows, "time/iteration_s", path)
            n_eval = len(results.column(rows, "eval/llm1/task_reward", path))
            if not times or not n_eval:
                raise StudyError(f"{path} holds no timed iteration or no held-out evaluation; is it a whole run?")
            where = folder / results.SUMMARY
            wall = results.number(results.field(results.read_json(where), "wall_time_s", str(where)), str(where))
            its += times
            evals.append((wall - sum(times)) / n_eval)
            walls.append(wall)
        out[experiment] = {
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
def report(runs: dict) -> dict:
    """The comparisons of llm1 (and of llm2 beside them) and the readings, from `load_runs`."""
    comparisons = {name: compare(runs, *pair) for name, pair in COMPARISONS.items()}
    secondary = {f"{name}_llm2": compare(runs, *pair, agent="llm2") for name, pair in COMPARISONS.items()}
    return {"comparisons": comparisons, "llm2": secondary, "readings": readings(comparisons)}


def _f(v: float, digits: int = 3) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def markdown(rep: dict) -> str:
    lines = []
    for name, c in rep["comparisons"].items():
        b = c["kl_ratio"]
        gate = f"matched reward {b['level']:g}" if c["gate"] else "no reward level reached by enough seeds"
        lines.append(f"### {name}: `{ARMS[c['cory']]}` (llm1) vs `{ARMS[c['ppo']]}` ({c['n']} seeds; {gate})\n")
        levels = " | ".join(f"Δ reward at KL {lv:g}" for lv in KL_LEVELS)
        lines.append(f"| seed | {levels} | KL at reward {b['level']:g}: CORY | PPO | ratio |")
        lines.append("|---|" + "---|" * len(KL_LEVELS) + "---|---|---|")
        for s in c["seeds"]:
            diffs = " | ".join(_f(s["reward_at_kl"][str(lv)]["diff"]) for lv in KL_LEVELS)
            k = s["kl_at_reward"][str(b["level"])]
            lines.append(
                f"| {s['seed']} | {diffs} | {_f(k['cory'], 2)} | {_f(k['ppo'], 2)} | "
                f"{_f(s['kl_ratio'][str(b['level'])], 2)} |"
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
        lines.append(
            f"| (b) KL ratio at reward {b['level']:g} | {b['n']} | {_f(b['geometric_mean'])} | "
            f"[{_f(b['ci95'][0])}, {_f(b['ci95'][1])}] | {b['verdict']} |"
        )
        lines.append("")
    r = rep["readings"]
    lines.append(f"**Paper's claim, at the matched reward reached (CORY's KL ≤ ½ PPO's):** {r['paper_claim']}.  ")
    lines.append(f"**Does the released code's normalisation explain a KL gap:** {r['normalisation']}.")
    return "\n".join(lines) + "\n"


def plot(runs: dict, out: Path) -> None:
    """Held-out reward against held-out KL of llm1, one line per run and seed, coloured by arm; the matched-KL levels
    dotted, the matched-reward levels dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not runs:
        return
    fig = Figure(figsize=(7, 5), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(ARMS)}
    labelled = set()
    for (arm, _seed), agents in sorted(runs.items()):
        c = agents["llm1"]
        label = None if arm in labelled else f"{ARMS[arm]} (llm1)"
        labelled.add(arm)
        ax.plot([p["kl"] for p in c], [p["reward"] for p in c], "o-", ms=3, color=colors[arm], alpha=0.7, label=label)
    for level in KL_LEVELS:
        ax.axvline(level, color="grey", ls=":", lw=1)
    for i, level in enumerate(REWARD_LEVELS):
        ax.axhline(level, color="black", ls="--", lw=0.8, label="matched-reward levels" if i == 0 else None)
    ax.set(xlabel="held-out KL to π0 (nats)", ylabel="held-out task reward, P(positive)",
           title="every seed, one line each; dotted: matched-KL levels")  # fmt: skip
    ax.legend(fontsize=8)
    figures.save(fig, out, dpi=100)


def _spread_file(path: Path) -> dict[str, float]:
    """σ(r1) and σ(r1 + r2) of a `cory-measure reward-spread` file."""
    found = results.read_json(path)
    return {key: results.number(results.field(found, key, str(path)), f"{path}: {key}")
            for key in ("std_r1", "std_r1_plus_r2")}  # fmt: skip


def plan(old_results: Path, spread_file: Path, bounded_spread: Path | None) -> dict:
    """The pre-registration's arithmetic from the first study's committed files."""
    sd_logit = paired_spread(old_results)
    ppo = [curve(f / results.METRICS) for _, _, f in results.kept_runs(old_results, "experiment=imdb_claim_ppo")]
    # the logit where the comparisons happen: PPO's held-out mean reward at the largest matched KL level
    at = [reward_at_kl(c, max(KL_LEVELS)) for c in ppo]
    spread_logit = _spread_file(spread_file)
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
    where = old_results.parent / "claim.json"  # the first study's report: its per-seed KL ratios at matched reward
    arm_a = results.field(results.field(results.read_json(where), "arms", str(where)), "A", f"{where} arms")
    seeds = results.field(arm_a, "seeds", f"{where} arm A")
    logs = [
        math.log(results.number(results.field(s, "kl_ratio_at_matched_reward", f"{where} arm A seed"), str(where)))
        for s in seeds
    ]
    out["log_kl_ratio_sd"] = spread(logs)["sd"]
    # the interval of a geometric mean over SEEDS seeds spans ×/÷ this factor around it
    out["ratio_factor_8_seeds"] = math.exp(t_quantile(SEEDS - 1) * out["log_kl_ratio_sd"] / math.sqrt(SEEDS))
    if bounded_spread is not None:
        out["betas"] = betas(spread_logit, _spread_file(bounded_spread))
    return out


def unreached(kept: Path) -> list[str]:
    """`experiment=<arm>/seed=<n>` of the finished runs whose llm1 has not reached the lowest matched-reward level
    or the deciding KL level (so would be missing from a deciding statistic) and that have not yet run to
    EXTENDED_LENGTH iterations: the runs the rule continues."""
    todo = []
    for (arm, seed), agents in sorted(load_runs(kept).items()):
        points = agents["llm1"]
        missing = not reaches(points, reward=min(REWARD_LEVELS)) or not reaches(points, kl=PRIMARY_KL)
        if missing and points[-1]["iteration"] < EXTENDED_LENGTH:
            todo.append(f"experiment={ARMS[arm]}/seed={seed}")
    return todo


def _has_runs(kept: Path) -> None:
    """Refuses a folder without any `<what varies>/seed=<n>/metrics.jsonl`: a wrong path, or a sweep not yet run."""
    if not any((folder / results.METRICS).is_file() for _, _, folder in results.kept_runs(kept, "*")):
        raise StudyError(f"no run results under {kept} (expected <what varies>/seed=<n>/metrics.jsonl)")


MODES = {  # mode → what it does (its `--help` line)
    "report": "statistics, verdicts and the figure from the committed runs",
    "plan": "seeds, KL coefficients and cost from the first study's committed files",
    "unreached": "the finished runs the rule continues to 200 iterations",
    "pilot": "the learning rate the pilot's rule picks",
    # the pre-registration's text, which is not edited, prints this name
    "unsaturated": "the same as unreached: its name before amendment 1",
}


def run(argv: Sequence[str] | None = None, prog: str = "cory-report claim2") -> int:
    parser = command.parser(prog, __doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    rep, pl, un, pi, old = (sub.add_parser(name, help=what, description=what) for name, what in MODES.items())
    rep.add_argument("results", type=Path, help="the folder of copied run results (experiment=*/seed=*/)")
    rep.add_argument("--out", type=Path, required=True, help="where claim2.{json,md,png} go")
    pl.add_argument("old_results", type=Path, help="the first study's copied run results (outputs/claim/results)")
    pl.add_argument("--spread", type=Path, required=True, help="the first study's reward_spread.json (logits)")
    pl.add_argument("--bounded-spread", type=Path, help="the same measured with task.reward.bound=probability")
    for listing in (un, old):
        listing.add_argument("results", type=Path, help="the study's copied run results")
    pi.add_argument("results", type=Path, help="the pilot's copied run results (algorithm.agent.learning_rate=...)")
    args = parser.parse_args(argv)

    if args.mode == "plan":
        print(json.dumps(plan(args.old_results, args.spread, args.bounded_spread), indent=2))
        return 0
    _has_runs(args.results)
    if args.mode in ("unreached", "unsaturated"):
        print("\n".join(unreached(args.results)))
        return 0
    if args.mode == "pilot":
        pilot = pilot_curves(args.results)
        tried = {lr: sorted(methods) for lr, methods in sorted(pilot.items())}
        if len(tried) < 3 or any(len(m) < 2 for m in tried.values()):
            raise StudyError(f"the pilot is not finished (finished runs: {tried}); run it to the end first")
        print(f"learning rate by the pilot's rule: {choose_learning_rate(pilot):g}")
        return 0
    runs = load_runs(args.results)
    result = report(runs)
    with command.output(args.out):
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "claim2.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "claim2.md").write_text(markdown(result))
        plot(runs, args.out / "claim2.png")
    print(markdown(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
