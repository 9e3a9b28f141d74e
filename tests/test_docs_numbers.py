"""The numbers README.md and docs/*.md state about finished runs are the committed files' numbers.

Each check recomputes a printed number from the small files under `outputs/` (run summaries, metrics, study
tables) and asserts that the page prints it as rounded: the claim study's cost and code commits, the family sweeps'
means, interval counts and wall times, the GSM8K CPU runs, MAFT's wall times and the default experiment's runs
(`outputs/quickstart/`). The study tables themselves are checked in tests/test_family_report.py and
tests/test_claim2_report.py, MAFT's accuracies in tests/test_maft.py.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from pytest import approx

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "outputs"


def page(name: str) -> str:
    return " ".join((REPO / name).read_text().split())  # one line: a number may sit across a line break


def summaries(folder: Path) -> dict[str, dict]:
    """`<experiment or algorithm>/<seed>` → summary.json of every run under a study's results folder."""
    files = folder.glob("*/*/summary.json")
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text()) for p in files}


def last_peak_mb(metrics: Path) -> float:
    """A run's peak RSS: the last `memory/peak_mb` its metrics.jsonl logged."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["memory/peak_mb"] for r in rows if "memory/peak_mb" in r][-1]


def iteration_medians(folder: Path) -> dict[str, float]:
    out = {}
    for metrics in folder.glob("*/*/metrics.jsonl"):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        times = [r["time/iteration_s"] for r in rows if "time/iteration_s" in r]
        out[f"{metrics.parent.parent.name}/{metrics.parent.name}"] = statistics.median(times)
    return out


def span(values, digits: int = 0, unit: str = "") -> str:
    """`low–high` as the pages print a range (an en dash, rounded)."""
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}{unit}"


# ------------------------------------------------------------------------------------------------- claim study
def test_the_claim_studys_cost_and_commits() -> None:
    runs = summaries(OUT / "claim" / "results")
    assert len(runs) == 9
    hours = {exp: sum(r["wall_time_s"] for k, r in runs.items() if k.startswith(f"experiment={exp}/")) / 3600
             for exp in ("imdb_claim_ppo", "imdb_claim_cory", "imdb_claim_cory_released")}  # fmt: skip
    total = sum(hours.values())
    results, readme = page("docs/results.md"), page("README.md")
    assert f"{total:.1f} run-hours" in readme
    assert (
        f"sum to {total:.1f} run-hours (PPO {hours['imdb_claim_ppo']:.1f}, arm A {hours['imdb_claim_cory']:.1f}, "
        f"arm B {hours['imdb_claim_cory_released']:.1f})" in results
    )
    cory = [r["wall_time_s"] / 3600 for k, r in runs.items() if "cory" in k]
    ppo = [r["wall_time_s"] / 3600 for k, r in runs.items() if "ppo" in k]
    assert f"{span(cory, 1)} hours per CORY run and {span(ppo, 1)} per PPO run" in results
    medians = iteration_medians(OUT / "claim" / "results")
    per_arm = {
        exp: statistics.median(
            t
            for metrics in (OUT / "claim" / "results" / f"experiment={exp}").glob("*/metrics.jsonl")
            for t in (json.loads(line).get("time/iteration_s") for line in metrics.read_text().splitlines())
            if t is not None
        )
        for exp in ("imdb_claim_cory", "imdb_claim_cory_released", "imdb_claim_ppo")
    }
    assert medians  # every run logged its iteration times
    a, b, p = (f"{per_arm[e]:.0f} s" for e in ("imdb_claim_cory", "imdb_claim_cory_released", "imdb_claim_ppo"))
    assert f"median of {a[:-2]} s, {b[:-2]} s and {p} per iteration" in results
    # the seven commits the runs record, each named with its runs
    shas = {r["git_sha"][:7] for r in runs.values()}
    assert len(shas) == 7 and all(f"`{sha}`" in results for sha in shas)
    assert "faithful_official_swap=false" in results


# ------------------------------------------------------------------------------------------------ family sweeps
def _intervals(family: Path) -> tuple[int, int]:
    """(intervals, intervals excluding zero) over both difference tables of a family report."""
    total = excluding = 0
    for against in json.loads(family.read_text())["differences"].values():
        for agents in against.values():
            for columns in agents.values():
                for cell in columns.values():
                    if cell is not None:
                        total += 1
                        excluding += cell["ci95"][0] > 0 or cell["ci95"][1] < 0
    return total, excluding


def test_the_family_interval_counts() -> None:
    gpu, cpu = _intervals(OUT / "family" / "family.json"), _intervals(OUT / "family_cpu" / "family.json")
    assert gpu == (26, 2) and cpu == (52, 2)
    readme, results = page("README.md"), page("docs/results.md")
    assert "2 of 26 intervals on the GPU and 2 of 52 on the CPU exclude zero" in readme
    assert "Of the 26 intervals in the two difference tables, two exclude zero" in results
    assert "of the 52 intervals in the two difference tables, two exclude zero" in results


def _mean(family: str, algorithm: str, agent: str, column: str) -> float:
    data = json.loads((OUT / family / "family.json").read_text())
    return data["algorithms"][algorithm]["agents"][agent][column]["mean"]


def test_the_readme_rows_are_the_three_seed_means() -> None:
    readme = page("README.md")
    m = lambda *key: _mean("family_cpu", *key)  # noqa: E731
    assert (
        f"held-out accuracy {m('cory', 'llm1', 'accuracy'):.3f} / {m('cory', 'llm2', 'accuracy'):.3f} against "
        f"{m('ppo', 'llm1', 'accuracy'):.3f}, KL {m('cory', 'llm1', 'kl'):.2f} / {m('cory', 'llm2', 'kl'):.2f} "
        f"against {m('ppo', 'llm1', 'kl'):.2f} nats" in readme
    )
    assert (
        f"CORY below PPO at pass@1 ({m('cory', 'llm1', 'pass@1'):.3f} / {m('cory', 'llm2', 'pass@1'):.3f} against "
        f"{m('ppo', 'llm1', 'pass@1'):.3f}), above it at pass@16 ({m('cory', 'llm1', 'pass@16'):.3f} / "
        f"{m('cory', 'llm2', 'pass@16'):.3f} against {m('ppo', 'llm1', 'pass@16'):.3f})" in readme
    )
    base = {seed["pass@16"] for seed in json.loads((OUT / "family_cpu" / "family.json").read_text())["base"].values()}
    (base16,) = base  # one evaluation of the base model, the same for every seed
    assert f"below the base model's {base16:.3f} there" in readme
    g = lambda *key: _mean("family", *key)  # noqa: E731
    assert (
        f"GPU: GRPO and shared-policy CORY {g('grpo', 'llm1', 'accuracy'):.2f}, "
        f"PPO {g('ppo', 'llm1', 'accuracy'):.2f}, "
        f"CORY {g('cory', 'llm1', 'accuracy'):.2f} / {g('cory', 'llm2', 'accuracy'):.2f}, CORY with a centralised "
        f"critic {g('cory_cc', 'llm1', 'accuracy'):.2f} / {g('cory_cc', 'llm2', 'accuracy'):.2f}" in readme
    )
    assert f"{g('cory_shared', 'llm1', 'accuracy'):.2f}" == f"{g('grpo', 'llm1', 'accuracy'):.2f}"
    assert (
        f"CPU, all 18 runs with pass@k: CORY {m('cory', 'llm1', 'accuracy'):.2f} / "
        f"{m('cory', 'llm2', 'accuracy'):.2f} "
        f"against PPO's {m('ppo', 'llm1', 'accuracy'):.2f}, shared policy {m('cory_shared', 'llm1', 'accuracy'):.2f}"
        in readme
    )


def test_the_family_sweeps_wall_times() -> None:
    runs = summaries(OUT / "family_cpu" / "results")
    medians = iteration_medians(OUT / "family_cpu" / "results")
    results, readme = page("docs/results.md"), page("README.md")
    light = [k for k in runs if k.split("/")[0] in ("algorithm=ppo", "algorithm=grpo")]
    alone = [k for k in light if not k.endswith("seed=0")]  # seed 0 ran beside MAFT
    assert f"a median of {span([medians[k] for k in alone])} s per iteration" in results
    assert f"`wall_time_s` {span([runs[k]['wall_time_s'] for k in alone])} s" in results
    assert f"(seed 0, {span([medians[k] for k in light if k.endswith('seed=0')])} s per iteration)" in results
    for algorithm in ("cory", "cory_cc", "cory_interleaved", "cory_shared"):
        walls = [r["wall_time_s"] for k, r in runs.items() if k.split("/")[0] == f"algorithm={algorithm}"]
        assert f"{span(walls)} s" in results, algorithm
    later = [r["wall_time_s"] for k, r in runs.items() if "cory" in k and not k.endswith("seed=0")]
    assert f"their training wall times sum to {sum(later) / 3600:.1f} run-hours" in results
    ppo = [runs[f"algorithm=ppo/seed={s}"]["wall_time_s"] / 60 for s in range(3)]
    cory = [runs[f"algorithm=cory/seed={s}"]["wall_time_s"] / 60 for s in range(3)]
    assert f"{span(ppo)} min (PPO) and {span(cory)} min (CORY) per run" in readme


# ------------------------------------------------------------------------------------------- GSM8K CPU and MAFT
def test_gsm8k_cpu_pages() -> None:
    gsm8k = page("docs/gsm8k.md")
    cory = json.loads((OUT / "gsm8k_cpu" / "cory_summary.json").read_text())
    ppo = json.loads((OUT / "gsm8k_cpu" / "ppo_summary.json").read_text())
    assert f"PPO took {ppo['wall_time_s']:.0f} s and CORY {cory['wall_time_s']:.0f} s (`wall_time_s`" in gsm8k
    assert f"{cory['agents']['llm1']['kl']:.3f} now" in gsm8k
    for name, summary in (("ppo", ppo), ("cory", cory)):  # the curves' data: every evaluation
        rows = [json.loads(line) for line in (OUT / "gsm8k_cpu" / f"{name}_metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in rows if "eval/llm1/task_reward" in r]
        assert len(evaluated) == 6
        assert evaluated[-1]["eval/llm1/task_reward"] == approx(summary["agents"]["llm1"]["task_reward"])
    for run, agents in (("PPO", ppo["agents"]), ("CORY", cory["agents"])):
        for agent, final in agents.items():
            assert f"**{final['task_reward']:.3f}**" in gsm8k and f"**{final['kl']:.2f}**" in gsm8k, (run, agent)
    m = lambda *key: _mean("family_cpu", *key)  # noqa: E731
    assert (
        f"held-out accuracy {m('cory', 'llm1', 'accuracy'):.3f} and {m('cory', 'llm2', 'accuracy'):.3f} against "
        f"{m('ppo', 'llm1', 'accuracy'):.3f}" in gsm8k
    )
    assert "1,937" not in gsm8k and "6,164" not in gsm8k  # the memory numbers no committed file holds


@pytest.mark.parametrize(
    "summary, printed",
    [
        ("maft_cpu/maft_summary.json", "65 minutes on the 2-core machine"),
        ("maft_cpu/single_ft_summary.json", "33 minutes, mostly alone"),
        ("maft_cpu/results/maft/summary.json", "The re-runs took 44 and"),
        ("maft_cpu/results/single_ft/summary.json", "The re-runs took 44 and 48 minutes"),
    ],
)
def test_maft_wall_times(summary: str, printed: str) -> None:
    minutes = round(json.loads((OUT / summary).read_text())["wall_time_s"] / 60)
    assert printed in page("docs/maft.md") and f"{minutes}" in printed


# ------------------------------------------------------------------------------------------- the default experiment
def recorded_overrides(folder: Path) -> list[str]:
    """The overrides a committed run folder recorded (Hydra's `overrides.yaml`, one `- key=value` a line)."""
    return [o.strip("- ").strip() for o in (folder / "overrides.yaml").read_text().splitlines()]


def settings_row(run: dict, setting: str, seed: str) -> str:
    """A row of docs/results.md's table of the default experiment's settings, from the run's summary."""
    before, after = run["initial"], run["agents"]
    num = lambda x, d=3: f"{x:.{d}f}".replace("-", "−")  # noqa: E731
    agents = list(after)
    return (
        f"| {setting} | {seed} | {num(before[agents[0]]['task_reward'])} → "
        f"{' / '.join(num(after[a]['task_reward']) for a in agents)} | "
        f"{' / '.join(num(after[a]['kl'], 2) for a in agents)} | "
        f"{' / '.join(num(after[a]['combined_reward']) for a in agents)} |"
    )


def test_the_default_experiments_settings_table() -> None:
    """Every run of outputs/quickstart/settings/ is a row of docs/results.md's table, with its overrides."""
    results = page("docs/results.md")
    runs = sorted((OUT / "quickstart" / "settings").glob("*/seed=*/summary.json"))
    assert len(runs) >= 9
    shown = lambda o: o not in ("experiment=quickstart", "progress=false") and not o.startswith("seed=")  # noqa: E731
    for path in runs:
        overrides = recorded_overrides(path.parent)
        setting = " ".join(f"`{o}`" for o in overrides if shown(o)) or "the default"
        seed = path.parent.name.split("=")[1]
        assert settings_row(json.loads(path.read_text()), setting, seed) in results, path


def test_the_null_control_is_its_committed_run() -> None:
    """docs/results.md's fifth round: the printed command is the null run's overrides, and its numbers (held-out KL
    ± s.e., the training KL at the last iteration) are that run's and the real-reward PPO run's."""
    folder = OUT / "quickstart" / "null_reward" / "seed=0"
    overrides = recorded_overrides(folder)
    assert "task/reward=constant" in overrides
    results = page("docs/results.md")
    assert f"python -m cory.train {' '.join(overrides)} " in results + " "
    last_train_kl = []
    for name in (folder / "metrics.jsonl", OUT / "quickstart" / "ppo_metrics.jsonl"):
        rows = [json.loads(line) for line in name.read_text().splitlines()]
        last_train_kl.append(next(r["train/llm1/kl"] for r in reversed(rows) if "train/llm1/kl" in r))
    run = json.loads((folder / "summary.json").read_text())
    null, ppo = (
        run["agents"]["llm1"],
        json.loads((OUT / "quickstart" / "ppo_summary.json").read_text())["agents"]["llm1"],
    )
    assert null["task_reward"] == run["initial"]["llm1"]["task_reward"]  # no signal: the reward could not move
    assert f"**{null['kl']:.2f} ± {null['kl_se']:.2f} nats**, against {ppo['kl']:.2f} ± {ppo['kl_se']:.2f}" in results
    train = f"{last_train_kl[0]:.2f} nats at iteration 12 without the signal and {last_train_kl[1]:.2f} with it"
    assert train in results
    assert f"PPO {null['kl']:.1f}, {ppo['kl']:.1f} with the real one" in page("README.md")
    # the default, CORY: both agents, against the committed default run
    folder = OUT / "quickstart" / "null_reward_cory" / "seed=0"
    overrides = recorded_overrides(folder)
    assert f"python -m cory.train {' '.join(overrides)} " in results + " " and "task/reward=constant" in overrides
    null = json.loads((folder / "summary.json").read_text())["agents"]
    real = json.loads((OUT / "quickstart" / "cory_summary.json").read_text())["agents"]
    both = " / ".join(f"{null[a]['kl']:.2f} ± {null[a]['kl_se']:.2f}" for a in ("llm1", "llm2"))
    assert f"**{both} nats** (llm1 / llm2), against {real['llm1']['kl']:.2f} / {real['llm2']['kl']:.2f}" in results
    kls = lambda run: " / ".join(f"{run[a]['kl']:.1f}" for a in ("llm1", "llm2"))  # noqa: E731
    assert f"{kls(null)} nats ({kls(real)} with the real one" in page("README.md")


def test_the_readme_gives_the_default_experiments_spread_over_seeds() -> None:
    """README's default-run sentence: seed 0 (`outputs/quickstart/cory_summary.json`) and seeds 1-2 of the table."""
    runs = [json.loads((OUT / "quickstart" / "cory_summary.json").read_text())]
    runs += [
        json.loads(p.read_text()) for p in (OUT / "quickstart" / "settings" / "default").glob("seed=*/summary.json")
    ]
    assert sorted(r["seed"] for r in runs) == [0, 1, 2]
    gains = [r["agents"][a]["task_reward"] - r["initial"][a]["task_reward"] for r in runs for a in r["agents"]]
    kls = [r["agents"][a]["kl"] for r in runs for a in r["agents"]]
    falls = [r["initial"][a]["combined_reward"] - r["agents"][a]["combined_reward"] for r in runs for a in r["agents"]]
    readme, results = page("README.md"), page("docs/results.md")
    moved = f"moves by −{-min(gains):.2f} to +{max(gains):.2f} (mean +{statistics.mean(gains):.2f}"
    assert moved in readme and moved.split(" (")[0] in results
    assert f"{min(kls):.1f}–{max(kls):.1f} nats" in readme and f"{min(kls):.1f}–{max(kls):.1f} nats" in results
    assert f"falls by {min(falls):.1f} to {max(falls):.1f}" in results


def test_the_default_runs_wall_times_are_their_summaries() -> None:
    """The default run's and its PPO baseline's wall times in README and docs/results.md are their summaries'."""
    minutes = lambda s: f"{int(s // 60)} min {round(s % 60)} s"  # noqa: E731
    cory = json.loads((OUT / "quickstart" / "cory_summary.json").read_text())["wall_time_s"]
    ppo = json.loads((OUT / "quickstart" / "ppo_summary.json").read_text())["wall_time_s"]
    readme, results = page("README.md"), page("docs/results.md")
    fresh = OUT / "quickstart" / "fresh_clone_070a814"
    quiet = json.loads((fresh / "summary.json").read_text())["wall_time_s"]
    peak_gb = last_peak_mb(fresh / "metrics.jsonl") / 1000
    assert f"sentiment reward: {minutes(quiet)} on a quiet 2-core AMD EPYC, {minutes(cory)} on another" in readme
    assert f"at a peak of about {peak_gb:.0f} GB of memory" in readme
    assert f"(CORY, default) | {minutes(cory)} |" in results
    assert f"`python -m cory.train algorithm=ppo` | {minutes(ppo)} |" in results


def test_the_fresh_clones_default_run_is_the_committed_one() -> None:
    """docs/results.md: the fresh clones' `make run` of 2026-12-07 logged the committed default run's numbers (the
    first one's summary equals `cory_summary.json` but for the commit and the wall time, the second one's metrics
    rows equal `cory_metrics.jsonl` but for time and memory; the page gives their commits, times and peak)."""
    fresh = json.loads((OUT / "quickstart" / "fresh_clone_2026-12-07_summary.json").read_text())
    committed = json.loads((OUT / "quickstart" / "cory_summary.json").read_text())
    assert fresh["agents"] == committed["agents"] and fresh["initial"] == committed["initial"]
    results = page("docs/results.md")
    seconds = fresh["wall_time_s"]
    assert f"(commit `{fresh['git_sha'][:7]}`" in results
    assert f"bit for bit, in {int(seconds // 60)} min {round(seconds % 60)} s" in results
    # the second fresh clone, with kept memory on by default: the same rows, its time and peak as printed
    again = OUT / "quickstart" / "fresh_clone_070a814"

    def rows(path: Path) -> list[dict]:
        lines = path.read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k.split("/")[0] not in ("time", "memory")} for x in lines]

    assert rows(again / "metrics.jsonl") == rows(OUT / "quickstart" / "cory_metrics.jsonl")
    summary = json.loads((again / "summary.json").read_text())
    assert summary["agents"] == committed["agents"] and summary["git_sha"].startswith("070a814")
    seconds = summary["wall_time_s"]
    assert f"logged the same rows bit for bit in {int(seconds // 60)} min {round(seconds % 60)} s" in results
    new, old = last_peak_mb(again / "metrics.jsonl"), last_peak_mb(OUT / "quickstart" / "cory_metrics.jsonl")
    assert (
        f"peak RSS of {new:,.0f} MB against the committed run's {old:,.0f} MB (+{100 * (new / old - 1):.1f} %"
        in results
    )


def test_gsm8k_cpu_passk_table_is_the_committed_evaluations() -> None:
    """docs/gsm8k.md's pass@k table: each row's numbers are its committed `outputs/gsm8k_cpu/*_passk.json`."""
    gsm8k = (REPO / "docs" / "gsm8k.md").read_text()  # line by line: the table's rows
    keys = ("pass@1", "pass@2", "pass@4", "pass@8", "pass@16", "greedy_accuracy", "no_answer_rate")
    ppo = json.loads((OUT / "gsm8k_cpu" / "ppo_passk.json").read_text())
    cory = json.loads((OUT / "gsm8k_cpu" / "cory_passk.json").read_text())
    assert ppo["base"] == cory["base"]  # the same base model, problems and seed
    for label, result in (
        ("base SmolLM2-135M-Instruct", ppo["base"]),
        ("PPO, after 25 iterations", ppo["llm1"]),
        ("CORY LLM1, after 25 iterations", cory["llm1"]),
        ("CORY LLM2, after 25 iterations", cory["llm2"]),
    ):
        cells = [f"{result[k]:.3f}" for k in keys]
        row = next(line for line in gsm8k.splitlines() if line.startswith(f"| {label} |"))
        shown = [c.strip().strip("*") for c in row.strip("|").split("|")[2:]]
        assert shown == cells, label


def test_where_the_combined_reward_falls_in_the_settings_tried_and_the_optimum_is_the_committed_one() -> None:
    """README and results.md: the count of settings runs, in how many agent-runs the combined reward falls, how far it
    rises in the others and what those cost (samples per agent, CORY's wall time), and the KL-regularised optimum's
    numbers from `outputs/quickstart/kl_optimum*.json` (`cory-measure kl-optimum`)."""
    folders = [p.parent for p in (OUT / "quickstart" / "settings").glob("*/seed=*/summary.json")]
    runs = [json.loads((f / "summary.json").read_text()) for f in folders]
    change = lambda r, a: r["agents"][a]["combined_reward"] - r["initial"][a]["combined_reward"]  # noqa: E731
    changes = [change(r, a) for r in runs for a in r["agents"]]
    rises = sorted(c for c in changes if c >= 0)
    falls = len(changes) - len(rises)
    readme, results = page("README.md"), page("docs/results.md")
    assert f"falls in {falls} of the {len(changes)} agent-runs of the {len(runs)} other" in readme
    assert f"Over the table's {len(runs)} runs ({len(changes)} agent-runs" in results
    assert f"falls in {falls}; it rises by {rises[0]:.3f} to {rises[-1]:.3f} in the other" in results
    assert f"(by at most +{rises[-1]:.3f}) take eight times the default's samples per agent" in readme
    for folder, run in zip(folders, runs, strict=True):
        if all(change(run, a) < 0 for a in run["agents"]):
            continue
        overrides = recorded_overrides(folder)  # 24 iterations of 64: 8 × the default's 12 of 16
        assert "iterations=24" in overrides and "batch_size=64" in overrides, folder
        if len(run["agents"]) == 2:
            assert f"That CORY run took 18 min ({run['wall_time_s']:,.0f} s)" in results
    for name in ("kl_optimum.json", "kl_optimum_norepeat.json"):
        o = json.loads((OUT / "quickstart" / name).read_text())
        assert (o["prompts"], o["samples"], o["eta"]) == (64, 16, 0.3)
        printed = (
            f"+{o['reward_gain']:.2f} ± {o['reward_gain_se']:.2f} in task reward at {o['kl']:.2f} ± {o['kl_se']:.2f} "
            f"nats, a combined reward up by +{o['combined_gain']:.2f} ± {o['combined_gain_se']:.2f}"
        )
        assert printed in results, name
    default = json.loads((OUT / "quickstart" / "kl_optimum.json").read_text())
    assert f"Answers to one prompt differ by {default['within_prompt_sd']:.2f} in reward" in results


def test_the_claim2_probe_without_the_repetition_penalty_is_its_committed_summary() -> None:
    """results.md's pre-registration log: the probe's start, end and KL from its summary."""
    run = json.loads((OUT / "claim2" / "probes" / "ppo_lr3e-5_norepeat_seed100" / "summary.json").read_text())
    start, end = run["initial"]["llm1"]["task_reward"], run["agents"]["llm1"]
    assert run["seed"] == 100 and run["iterations"] == 10
    assert f"went {start:.3f} → {end['task_reward']:.3f} (KL {end['kl']:.2f})" in page("docs/results.md")


def test_the_claim2_probe_of_a_response_only_reward_is_its_committed_summary() -> None:
    """results.md's pre-registration log: the second probe's start, its iteration-10 evaluation, end and KL."""
    folder = OUT / "claim2" / "probes" / "ppo_lr3e-5_response_seed100"
    run = json.loads((folder / "summary.json").read_text())
    start, end = run["initial"]["llm1"]["task_reward"], run["agents"]["llm1"]
    assert run["seed"] == 100 and run["iterations"] == 20
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    mid = next(r for r in rows if r.get("iteration") == 10 and "eval/llm1/task_reward" in r)
    text = page("docs/results.md")
    assert f"went {start:.3f} → {end['task_reward']:.3f} (KL {end['kl']:.2f}) in 20 iterations" in text
    assert f"with {mid['eval/llm1/task_reward']:.3f} (KL {mid['eval/llm1/kl']:.2f}) at iteration 10" in text


def test_the_claim2_pilot_numbers_in_the_log_are_the_committed_runs() -> None:
    """results.md's pre-registration log: PPO's pilot runs, start → end with their KL, and each one's peak that
    amendment 1 gives as its reason."""
    text = page("docs/results.md")
    pilot = OUT / "claim2" / "pilot" / "results"
    peaks = {}
    for rate in ("1e-05", "3e-05", "0.0001"):
        run = pilot / f"algorithm.agent.learning_rate={rate},experiment=imdb_claim2_ppo" / "seed=100"
        rows = run / "metrics.jsonl"
        evals = [json.loads(line) for line in rows.read_text().splitlines()]
        evals = [r for r in evals if "eval/llm1/task_reward" in r]
        first, last = evals[0]["eval/llm1/task_reward"], evals[-1]
        label = f"{float(rate):.0e}".replace("e-0", "e-")
        head, kl = f"{label} {first:.3f} → {last['eval/llm1/task_reward']:.3f} (", f"{last['eval/llm1/kl']:.2f}"
        assert f"{head}{kl}" in text or f"{head}KL {kl}" in text, head  # the first one names the unit
        peaks[label] = max(evals, key=lambda r: r["eval/llm1/task_reward"])
    p = {k: f"{r['eval/llm1/task_reward']:.3f}" for k, r in peaks.items()}
    assert f"peaked at {p['1e-5']} (1e-5), {p['3e-5']} (3e-5)" in text
    assert f"and {p['1e-4']} (1e-4, at {peaks['1e-4']['eval/llm1/kl']:.1f} nats" in text


def test_the_claim2_cory_pilot_numbers_in_the_log_are_the_committed_runs() -> None:
    """results.md's pre-registration log: CORY's finished pilot runs, llm1's start → end with its KL and llm2's end."""
    text = page("docs/results.md")
    pilot = OUT / "claim2" / "pilot" / "results"
    ends = []
    for rate, label in (("1e-05", "1e-5"), ("3e-05", "3e-5")):
        rows = (
            pilot / f"algorithm.agent.learning_rate={rate},experiment=imdb_claim2_cory" / "seed=100" / "metrics.jsonl"
        )
        evals = [r for r in map(json.loads, rows.read_text().splitlines()) if "eval/llm1/task_reward" in r]
        first, last = evals[0]["eval/llm1/task_reward"], evals[-1]
        assert last["iteration"] == 40
        printed = f"CORY {label} {first:.3f} → {last['eval/llm1/task_reward']:.3f} (KL {last['eval/llm1/kl']:.2f})"
        assert printed in text, printed
        ends.append(f"{last['eval/llm2/task_reward']:.3f}")
    assert f"llm2 ended at {ends[0]} and {ends[1]}" in text


def test_the_claim2_pilots_last_run_in_the_log_is_its_committed_summary() -> None:
    """results.md's pre-registration log: CORY at 1e-4, llm1's start → end with its KL and llm2's end."""
    run = OUT / "claim2" / "pilot" / "results" / "algorithm.agent.learning_rate=0.0001,experiment=imdb_claim2_cory"
    summary = json.loads((run / "seed=100" / "summary.json").read_text())
    start, llm1, llm2 = summary["initial"]["llm1"]["task_reward"], summary["agents"]["llm1"], summary["agents"]["llm2"]
    assert summary["iterations"] == 40 and summary["completed"]
    printed = f"CORY at 1e-4 went {start:.3f} → {llm1['task_reward']:.3f} (KL {llm1['kl']:.2f}), with llm2 at"
    assert f"{printed} {llm2['task_reward']:.3f}" in page("docs/results.md").replace("\n  ", " ")


def test_the_claim2_studys_progress_is_its_committed_runs() -> None:
    """README's "N of 32 runs finished" counts the committed result folders, its per-seed cost is seed 0's committed
    wall times, and the log's wall time of each run it names is that run's summary."""
    runs = summaries(OUT / "claim2" / "results")
    assert runs and all(r["completed"] and r["iterations"] == 100 for r in runs.values())
    readme, results = page("README.md"), page("docs/results.md")
    assert f"{len(runs)} of 32 runs finished" in readme
    arms = ("imdb_claim2_ppo", "imdb_claim2_ppo_priced", "imdb_claim2_cory", "imdb_claim2_cory_released")
    hours = sum(runs[f"experiment={arm}/seed=0"]["wall_time_s"] for arm in arms) / 3600
    assert f"seed 0's four runs took {hours:.1f} run-hours of wall time (about {8 * hours:.0f} for 8 seeds)" in readme
    for arm, label in (("cory_released", "the released CORY's seed 0"), ("cory", "CORY's seed 0")):
        wall = runs[f"experiment=imdb_claim2_{arm}/seed=0"]["wall_time_s"]
        assert f"{label}, 100 iterations ({wall:,.0f} s of wall time" in results, label


# ------------------------------------------------------------------------------------------------ a cost option
def test_the_fused_gelu_table_is_its_committed_measurement() -> None:
    """docs/cost.md's table for `gelu_pytorch_tanh`: each pair's forward, backward and s/iter, the medians and the
    two ratios, as outputs/cost/fused_gelu_ab.json rounds them."""
    runs = json.loads((OUT / "cost" / "fused_gelu_ab.json").read_text())["runs"]
    cost = page("docs/cost.md")
    medians, forwards = {}, {}
    for fused, label in ((False, "`gelu_new` (default)"), (True, "fused")):
        pairs = sorted((r for r in runs if r["fused_gelu"] is fused), key=lambda r: r["round"])
        assert [r["round"] for r in pairs] == [1, 2, 3] and all(r["algorithm"] == "ppo" for r in pairs)
        forward = [r["phases_s"]["learner_forward"] for r in pairs]
        backward = [r["phases_s"]["learner_backward"] for r in pairs]
        seconds = [r["s_per_iter"] for r in pairs]
        medians[fused], forwards[fused] = (statistics.median(forward), statistics.median(seconds)), forward
        listed = ", ".join
        row = (f"| {label} | {listed(f'{x:.2f}' for x in forward)} | {listed(f'{x:.2f}' for x in backward)} | "
               f"{medians[fused][1]:.2f} ({listed(f'{x:.2f}' for x in seconds)}) |")  # fmt: skip
        assert row in cost, row
    assert f"({medians[True][0] / medians[False][0]:.2f}× the default's median)" in cost
    assert f"**{medians[True][1] / medians[False][1]:.2f}×**" in cost
    assert "The forward is faster in every pair" in cost and all(map(float.__lt__, forwards[True], forwards[False]))


# ------------------------------------------------------------------------------------------------- cost on AMX
def test_the_amx_cost_tables_are_the_committed_measurements() -> None:
    """docs/cost.md's tables for the CPU with AMX: the side-by-side medians against the official code, the phases of
    fp32 and bf16 runs and the bf16 − fp32 gaps, each as its committed JSON rounds."""
    cost = page("docs/cost.md")
    bench = json.loads((OUT / "official" / "benchmark_vs_official_amx.json").read_text())
    for algorithm in ("ppo", "cory"):
        ours, official = bench[algorithm], bench["official"][algorithm]
        ratio = ours["s_per_iter"] / official["s_per_iter"]
        row = f"**{ours['s_per_iter']:.2f}** ({', '.join(f'{v:.2f}' for v in ours['s_per_iter_per_repeat'])})"
        assert row in cost and f"{official['s_per_iter']:.2f} (" in cost
        assert f"{ours['generate_s']:.2f} + {ours['learn_s']:.2f}" in cost
        assert f"{official['generate_s']:.2f} + {official['learn_s']:.2f}" in cost
        assert f"**{ratio:.2f}**" in cost and ratio > 0.5  # the page says the fp32 target is not met
    phases = {
        (a, p): json.loads((OUT / "cost" / f"phases_amx_{a}_{p}.json").read_text())
        for a in ("ppo", "cory")
        for p in ("fp32", "bf16")
    }
    for (algorithm, precision), d in phases.items():
        assert d["algorithm"] == algorithm and d["precision"] == precision and d["threads"] == 1
        assert f"**{d['s_per_iter']:.2f} s**" in cost
        learner = d["phases_s"]["learner_forward"] + d["phases_s"]["learner_backward"]
        assert f"{learner:.2f} s" in cost
        if precision == "fp32":
            assert f"**{d['learner_vs_floor']:.2f}×**" in cost and f"{d['decode_vs_floor']:.2f}×" in cost
    for algorithm in ("ppo", "cory"):
        speedup = phases[(algorithm, "fp32")]["s_per_iter"] / phases[(algorithm, "bf16")]["s_per_iter"]
        assert f"({speedup:.2f}× faster)" in cost
    for name in ("gpt2_small", "smollm2"):
        gap = json.loads((OUT / "cost" / f"precision_gap_amx_{name}.json").read_text())
        assert gap["cpu_bf16"][0] == "amx_bf16" and gap["threads"] == 1
        cells = (
            f"{gap['max_abs_logp']:.3f} ({gap['mean_abs_logp']:.{2 if gap['mean_abs_logp'] < 0.01 else 3}g})",
            f"{100 * gap['max_rel_kl_seq']:.1f} % ({100 * gap['mean_rel_kl_seq']:.1f} %)",
            f"{gap['fp32_s']:.2f} → {gap['bf16_s']:.2f} s",
        )
        for cell in cells:
            assert cell in cost, cell


def test_the_kept_memory_table_is_the_committed_benchmark() -> None:
    """docs/cost.md's before/after table for `hardware.keep_freed_memory`: medians, each repeat's, peak RSS and the
    ratios, from the committed benchmark JSON."""
    cost = page("docs/cost.md")
    bench = json.loads((OUT / "cost" / "keep_freed_memory_ab.json").read_text())
    for algorithm in ("ppo", "cory"):
        here, ref = bench[algorithm], bench["ref"][algorithm]
        for d in (here, ref):
            repeats = ", ".join(f"{v:.2f}" for v in d["s_per_iter_per_repeat"])
            assert f"{d['s_per_iter']:.2f}** ({repeats})" in cost or f"{d['s_per_iter']:.2f} ({repeats})" in cost
            assert f"{d['peak_mb']:,.0f} MB" in cost
        assert f"**{bench['vs_ref'][algorithm]:.2f}**" in cost
        assert f"+{100 * (here['peak_mb'] / ref['peak_mb'] - 1):.{0 if algorithm == 'ppo' else 1}f} %" in cost


def test_the_kept_memory_growth_is_the_committed_runs() -> None:
    """docs/cost.md's 12-iteration memory growth and medians with and without `hardware.keep_freed_memory`."""
    cost = page("docs/cost.md")
    runs = json.loads((OUT / "cost" / "keep_freed_memory_growth.json").read_text())["runs"]
    for algorithm in ("ppo", "cory"):
        kept, default = runs[f"{algorithm}/keep_freed_memory=true"], runs[f"{algorithm}/keep_freed_memory=false"]
        assert kept["iteration"] == default["iteration"] == list(range(1, 13))
        peak = max(kept["peak_mb"])
        assert f"{peak:,.0f} MB by iteration {kept['iteration'][kept['peak_mb'].index(peak)]}" in cost
        assert kept["peak_mb"][-1] == peak  # it stayed there to the end
        assert f"**+{100 * (peak / max(default['peak_mb']) - 1):.0f} %**" in cost
        medians = [statistics.median(r["iteration_s"][4:]) for r in (kept, default)]
        assert f"{medians[0]:.2f} against {medians[1]:.2f} s" in cost


def test_the_released_memory_table_is_the_committed_runs() -> None:
    """docs/cost.md's table for `hardware.keep_freed_memory` with the heap given back after each iteration (the
    default): medians, their ratios, peak RSS and its change, and where PPO's peak was reached, from the committed
    runs."""
    cost = page("docs/cost.md")
    runs = json.loads((OUT / "cost" / "keep_freed_memory_release.json").read_text())["runs"]
    for algorithm, first in (("ppo", 4), ("cory", 1)):  # PPO: iterations 5-12; CORY: 2-6
        on, off = runs[f"{algorithm}/keep_freed_memory=true"], runs[f"{algorithm}/keep_freed_memory=false"]
        m_on, m_off = (statistics.median(r["iteration_s"][first:]) for r in (on, off))
        p_on, p_off = max(on["peak_mb"]), max(off["peak_mb"])
        change = 100 * (p_on / p_off - 1)
        sign = "+" if change >= 0 else "−"
        assert f"| {m_off:.2f} | {p_off:,.0f} MB |" in cost
        assert f"**{m_on:.2f}** ({m_on / m_off:.2f}×) | {p_on:,.0f} MB ({sign}{abs(change):.1f} %)" in cost
    ppo = runs["ppo/keep_freed_memory=true"]
    top = max(ppo["peak_mb"])
    assert f"{ppo['peak_mb'][0]:,.0f} MB after the first iteration, {top:,.0f} from the eleventh" in cost
    assert ppo["iteration"][ppo["peak_mb"].index(top)] == 11


def test_the_epyc_phases_table_is_the_committed_runs() -> None:
    """docs/cost.md's learner-against-floor table on the AMD EPYC, with and without `keep_freed_memory`: every cell
    from the committed phases runs."""
    cost = page("docs/cost.md")
    runs = json.loads((OUT / "cost" / "phases_epyc_keep_freed_memory.json").read_text())["runs"]
    order = [runs[k] for k in ("ppo_off", "ppo_on", "cory_off", "cory_on")]
    learner = [r["phases_s"]["learner_forward"] + r["phases_s"]["learner_backward"] for r in order]
    assert "| s/iter | " + " | ".join(f"{r['s_per_iter']:.2f}" for r in order) + " |" in cost
    assert "| learner forward + backward | " + " | ".join(f"{s:.2f} s" for s in learner) + " |" in cost
    ratios = [f"{r['learner_vs_floor']:.2f}×" for r in order]
    assert f"| {ratios[0]} | **{ratios[1]}** | {ratios[2]} | **{ratios[3]}** |" in cost
    sampling = [r["sample_vs_floor"] for r in order]
    assert "(prompt forward + decode steps) | " + " | ".join(f"{x:.2f}×" for x in sampling) + " |" in cost
    assert f"is {min(sampling):.2f}–{max(sampling):.2f}× its matrix products" in cost
    steps = [r["s_per_decode_step"] / r["decode_floor_s"] for r in order]
    assert "| a decode step ÷ its matrix products | " + " | ".join(f"{x:.2f}×" for x in steps) + " |" in cost
    assert f"is {min(steps):.2f}–{max(steps):.2f}× here" in cost
    assert f"({order[1]['learner_vs_floor']:.3f} and {order[3]['learner_vs_floor']:.3f})" in cost


def test_the_padding_tables_are_the_committed_measurements() -> None:
    """docs/cost.md's "Padding": the learner's padding and padded FLOPs under `hardware.length_groups` from the
    committed phases runs, the GEMM-rate spread they showed, and every cell of the paired timing table (padding,
    the one rectangle's median seconds, each setting's ratio) from `scripts/length_groups.py`'s committed JSON."""
    cost = page("docs/cost.md")
    section = cost[cost.index("### Padding") : cost.index("### Memory the kernel maps again")]
    runs = json.loads((OUT / "cost" / "phases_length_groups.json").read_text())["runs"]
    ppo = [runs[f"ppo/length_groups={k}"] for k in (1, 2, 4)]
    cory = [runs[f"cory/length_groups={k}"] for k in (1, 2)]
    assert "from 11.7 % to 4.0 % (k = 2) and 1.2 % (k = 4) for PPO" in section
    assert [round(100 * r["padding"], 1) for r in ppo] == [11.7, 4.0, 1.2]
    assert [round(r["learner_padded_gflop"]) for r in ppo] == [1039, 975, 954]
    assert [round(100 * r["padding"], 1) for r in cory] == [12.5, 4.5]
    assert [round(r["learner_padded_gflop"]) for r in cory] == [3307, 3067]
    assert "1,039 to 975 and 954 GFLOP" in section and "3,307 to 3,067 GFLOP" in section
    rates = [r["gemm_gflops"]["learner"] for r in runs.values()]
    assert f"{min(rates):.0f}–{max(rates):.0f} GFLOP/s" in section
    for shape in ("imdb", "observer", "ragged"):
        report = json.loads((OUT / "cost" / f"length_groups_{shape}.json").read_text())
        one, two, four = (report["settings"][k] for k in ("1", "2", "4"))
        lines = (REPO / "docs" / "cost.md").read_text().splitlines()  # the table's rows, one per line
        row = next(line for line in lines if line.startswith(f"| `{shape}`"))
        assert f"| {report['rows']} rows" in row.replace(f"`{shape}`: ", "")
        assert f"{100 * one['padding']:.1f} % ({one['s_median']:.2f} s)" in row
        for got in (two, four):
            assert f"{100 * got['padding']:.1f} %, **{got['vs_first']:.2f}×**" in row


def test_the_fsdp_thread_count_trials_are_the_committed_ones() -> None:
    """docs/guarantees.md's account of resuming the FSDP probe's code at another thread count: the six resume points
    (identical at one thread, differing at two, no answer's length changed) and the 48 repeated resumes (each
    differing from its first resumed update, none changing a task reward or an answer's length)."""
    text = page("docs/guarantees.md")
    six = json.loads((OUT / "preemption" / "fsdp_resume_threads_3009fbc.json").read_text())["trials"]
    assert sum(t["resume_threads"] == 1 for t in six.values()) == 6  # "six resume points"
    assert all(t["identical"] == (t["resume_threads"] == 1) for t in six.values())
    assert not any(t["answer_lengths_differ"] for t in six.values())
    loop = json.loads((OUT / "preemption" / "fsdp_resume_threads_loop_3009fbc.json").read_text())
    trials = loop["trials"].values()
    assert len(trials) == 48 and "all 48 resumes differed" in text
    assert {t["seed"] for t in trials} == set(range(1, 25)) and "24 seeds" in text
    assert all(t["first_difference"][0] == t["resumed_after"] for t in trials)
    assert not any(t["answer_lengths_differ"] or t["task_rewards_differ"] for t in trials)
    low, high = min(t["max_relative_difference"] for t in trials), max(t["max_relative_difference"] for t in trials)
    printed = "({} to {} relative at most)".format(*(f"{x:.1e}".replace("e-0", "e-") for x in (low, high)))
    assert printed in text


def test_the_quiet_epyc_phases_table_is_the_committed_runs() -> None:
    """docs/cost.md's quiet table at the defaults on the AMD EPYC (two runs per algorithm, the decode step proper):
    every cell and the ranges the text gives, from the committed phases runs."""
    cost = page("docs/cost.md")
    runs = json.loads((OUT / "cost" / "phases_epyc_release_quiet.json").read_text())["runs"]
    order = [runs[k] for k in ("ppo_1", "ppo_2", "cory_1", "cory_2")]

    def row(label: str, cells: list[str]) -> None:
        assert f"| {label} | " + " | ".join(cells) + " |" in cost, label

    row("s/iter", [f"{r['s_per_iter']:.2f}" for r in order])
    rates = [r["gemm_gflops"] for r in order]
    row(
        "GEMM rate at the learner's rows / at the decode step's 16 rows",
        [f"{g['learner']:.1f} / {g['decode']:.1f}" for g in rates],
    )
    learner = [r["learner_vs_floor"] for r in order]
    row("learner forward + backward ÷ its matrix-product floor", [f"{x:.2f}×" for x in learner])
    row("sampling ÷ its matrix products", [f"{r['sample_vs_floor']:.2f}×" for r in order])
    row("prompt forwards, s per iteration", [f"{r['prefill_s']:.2f}" for r in order])
    steps = [r["decode_step_vs_floor"] for r in order]
    cells = [f"{r['decode_step_s']:.3f} ÷ {r['decode_step_floor_s']:.3f} s = {x:.2f}×" for r, x in zip(order, steps)]
    row("a decode step proper ÷ its matrix products", cells)
    row(
        "the decode-step measure of the table above (prompt forward in the step)",
        [f"{r['decode_vs_floor']:.2f}×" for r in order],
    )
    for r, x in zip(order, steps):  # the ratio is the table's two times, and they are the run's own
        assert x == approx(r["decode_step_s"] / r["decode_step_floor_s"])
        assert r["decode_step_s"] * r["decode_forwards_per_iter"] + r["prefill_s"] == approx(r["phases_s"]["sample"])
    assert f"the learner is at {min(learner):.2f}–{max(learner):.2f}× its floor" in cost
    assert f"a decode step at {min(steps):.2f}–{max(steps):.2f}× its products" in cost
    times = [r["s_per_iter"] for r in order]
    slow = [times[1] / times[0] - 1, times[3] / times[2] - 1]  # run 2 against run 1 of the same command
    assert f"moved by {100 * min(slow):.0f}–{100 * max(slow):.0f} % between the two runs" in cost
    ppo_rates, cory_rates = [g["decode"] for g in rates[:2]], [g["decode"] for g in rates[2:]]
    assert (
        f"({min(ppo_rates):.1f}–{max(ppo_rates):.1f} against {min(cory_rates):.1f}–{max(cory_rates):.1f} GFLOP/s"
        in cost
    )


def test_the_suites_timing_is_the_last_row_its_script_wrote() -> None:
    """README's and the implementation notes' `make test` count and time are the last row of
    `outputs/tests/timings.jsonl` (`scripts/time_tests.py`) timed on idle cores (a one-minute load average under 1
    before it) and a committed tree; rows taken beside other work stay in the file, noted as such."""
    rows = [json.loads(line) for line in (OUT / "tests" / "timings.jsonl").read_text().splitlines() if line.strip()]
    idle = [r for r in rows if r["command"] == "make test" and r["load_before"] < 1 and not r["changed"]]
    last = idle[-1]
    minutes, seconds = divmod(round(last["pytest_s"]), 60)
    took = f"{minutes} min {seconds} s"
    machine = f"idle cores of a {last['cores']}-core {last['cpu']}"
    assert f"({last['passed'] + last['skipped']} tests; {took} at its last timing on {machine}" in page("README.md")
    notes = page("docs/implementation-notes.md")
    assert f"{last['passed']} passed, {last['skipped']} skipped in {took} on {machine} ({last['date'][:10]}" in notes
