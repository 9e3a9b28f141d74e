"""Tests for `cory.plotting.plot_curves`, `cory.frontier` with `cory-plot frontier` (collect from folders or
a W&B group, Pareto front, aggregation, CLI) and `cory-plot curves` (seed bands), on fake runs with known
numbers: the plotted data must equal them. CPU only, no network. Run with `pytest tests/test_plotting.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgb

from cory import frontier
from cory.loggers import read_metrics
from cory.plotting import discover_agents, plot_curves, series
from cory.studies import plot_curves as pc
from cory.studies import plot_frontier as pf

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


def _write_metrics(path: Path, n: int = 6) -> None:
    rows = []
    for i in range(n):
        row = {"iteration": i, "cory/llm1_role": i // 2 % 2}
        for j, agent in enumerate(("llm1", "llm2")):
            row[f"train/{agent}/task_reward"] = 0.2 * i + j
            row[f"train/{agent}/kl"] = None if i == 2 else 0.5 * i
            row[f"train/{agent}/kl_coef"] = 0.3 * (1 + 0.01 * i)
            row[f"train/{agent}/combined_reward"] = 0.2 * i - 0.15 * i
        row["train/pioneer/task_reward"] = 0.1 * i
        row["train/observer/kl"] = 0.4 * i
        rows.append(row)
        if i % 3 == 2:
            rows.append({"iteration": i, "eval/llm1/task_reward": 0.3 * i, "eval/llm1/kl": 1.0,
                         "eval/llm2/combined_reward": float(i)})  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")


def test_plot_curves_synthetic(tmp_path):
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    _write_metrics(metrics)
    rows = read_metrics(metrics)
    assert len(rows) == 8  # malformed line skipped
    data = series(rows)
    assert data["train/llm1/kl"][0] == [0, 1, 3, 4, 5]  # null dropped
    assert discover_agents(data) == ["llm1", "llm2"]  # roles excluded
    out = tmp_path / "plots" / "curves.png"
    plot_curves(metrics, out)
    assert _is_png(out)


@pytest.mark.parametrize(
    "content",
    [
        "",
        '{"iteration": 0, "train/agent/task_reward": 1.0}\n',
        '{"iteration": 0, "train/agent/kl": null, "time/iteration_s": 2.0}\n',
        '{"iteration": 0, "eval/agent/task_reward": NaN}\n',
    ],
)
def test_plot_curves_robust(tmp_path, content):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(content)
    out = tmp_path / "curves.png"
    plot_curves(metrics, out)
    assert _is_png(out)


def _summary(root: Path, algorithm: str, kl_coef: float, seed: int, agents: dict) -> None:
    run = root / f"{algorithm}_kl{kl_coef}_s{seed}"
    run.mkdir(parents=True)
    body = {
        "algorithm": algorithm,
        "kl_coef": kl_coef,
        "seed": seed,
        "iterations": 10,
        "agents": {a: {"task_reward": r, "kl": k, "combined_reward": r - 0.3 * k} for a, (r, k) in agents.items()},
    }
    (run / "summary.json").write_text(json.dumps(body))


def test_pareto_front_hand_checked():
    pts = [(1, -5), (2, -3), (2, -4), (3, -3), (0, 0), (3, -6), (0.5, 0), (4, -10)]
    # (2,-3) dominated by (3,-3); (2,-4) by (3,-3); (1,-5) by (2,-3); (3,-6) by (3,-3); (0,0) by (0.5,0).
    assert frontier.pareto_front(pts) == [(0.5, 0), (3, -3), (4, -10)]
    assert frontier.pareto_front([]) == []
    assert frontier.pareto_front([(1, 1), (1, 1)]) == [(1, 1), (1, 1)]
    dicts = [{"x": 1.0, "y": -1.0, "id": "a"}, {"x": 0.0, "y": -2.0, "id": "b"}, {"x": 0.0, "y": 0.0, "id": "c"}]
    assert [p["id"] for p in frontier.pareto_front(dicts)] == ["c", "a"]


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for seed, noise in ((0, 0.0), (1, 0.2)):
        _summary(root / "ppo", "ppo", 0.1, seed, {"llm1": (1.0 + noise, 4.0 + noise)})
        _summary(root / "ppo", "ppo", 0.3, seed, {"llm1": (0.5 + noise, 1.0 + noise)})
        _summary(root / "cory", "cory", 0.1, seed, {"llm1": (1.5 + noise, 3.0), "llm2": (1.2, 5.0 + noise)})
    # A broken summary and an agent with a non-finite value are skipped.
    (root / "broken").mkdir()
    (root / "broken" / "summary.json").write_text("{")
    _summary(root / "other", "cory", 0.3, 0, {"llm1": (float("nan"), 1.0), "llm2": (0.1, 0.2)})
    return root


def test_collect_and_aggregate(sweep):
    points = frontier.collect([sweep / "ppo", sweep / "cory", sweep / "other", sweep / "broken"])
    assert len(points) == 4 + 4 + 1
    p = next(p for p in points if p["algorithm"] == "ppo" and p["kl_coef"] == 0.3 and p["seed"] == 1)
    assert p["agent"] == "llm1" and p["x"] == pytest.approx(0.7) and p["y"] == pytest.approx(-1.2)
    # Passing the parent as well does not duplicate runs.
    assert len(frontier.collect([sweep, sweep / "ppo"])) == len(points)

    agg = frontier.aggregate(points)
    ppo01 = next(r for r in agg if r["algorithm"] == "ppo" and r["kl_coef"] == 0.1)
    assert ppo01["n"] == 2 and ppo01["task_reward"] == pytest.approx(1.1)
    assert ppo01["task_reward_std"] == pytest.approx(0.1) and ppo01["kl"] == pytest.approx(4.1)
    fronts = frontier.fronts(agg)
    # PPO: (1.1, -4.1) and (0.6, -1.1) are both non-dominated. CORY: llm1 (1.6, -3.0), llm2 (1.2, -5.1) dominated,
    # the single-seed (0.1, -0.2) point is non-dominated.
    assert [(round(r["x"], 3), round(r["y"], 3)) for r in fronts["ppo"]] == [(0.6, -1.1), (1.1, -4.1)]
    assert [(r["agent"], r["kl_coef"]) for r in fronts["cory"]] == [("llm2", 0.3), ("llm1", 0.1)]
    table = frontier.format_table(agg, fronts)
    assert "ppo" in table and "cory" in table and "±" in table and "*" in table


def test_frontier_cli(sweep, tmp_path):
    out, js = tmp_path / "out" / "frontier.png", tmp_path / "out" / "frontier.json"
    assert pf.main([str(sweep), "--out", str(out), "--json", str(js)]) == 0
    assert _is_png(out)
    result = json.loads(js.read_text())
    assert set(result) == {"points", "aggregated", "fronts", "joint_front"} and len(result["points"]) == 9
    assert pf.main([str(tmp_path / "empty_dir_that_is_missing"), "--out", str(tmp_path / "x.png")]) == 2


def test_frontier_cli_subprocess(sweep, tmp_path):
    out = tmp_path / "f.png"
    proc = subprocess.run(
        [sys.executable, "-m", "cory.studies.plot", "frontier", str(sweep / "ppo"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert _is_png(out) and "ppo" in proc.stdout


def _errorbar_xy(ax) -> list[tuple[float, float]]:
    """The (x, y) of every errorbar marker drawn on `ax`, in drawing order."""
    return [
        (float(x), float(y)) for c in ax.containers for x, y in zip(c.lines[0].get_xdata(), c.lines[0].get_ydata())
    ]


def test_frontier_draws_the_seed_means_and_fronts_of_the_runs(sweep):
    points = frontier.collect([sweep / "ppo", sweep / "cory"])
    fig, result = frontier.draw_frontier(points)
    ax = fig.axes[0]
    # Seed means by hand: ppo η=0.1 (1.0, 4.0), (1.2, 4.2); η=0.3 (0.5, 1.0), (0.7, 1.2); cory llm1 (1.5, 3.0),
    # (1.7, 3.0); llm2 (1.2, 5.0), (1.2, 5.2). Drawn in the order cory llm1, cory llm2, ppo 0.1, ppo 0.3.
    expected = [(1.6, -3.0), (1.2, -5.1), (1.1, -4.1), (0.6, -1.1)]
    np.testing.assert_allclose(_errorbar_xy(ax), expected)
    # Every single-seed point is drawn behind its mean.
    scattered = sorted(
        tuple(map(float, xy)) for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets()
    )
    np.testing.assert_allclose(scattered, sorted((p["x"], p["y"]) for p in points))
    # The fronts (ringed lines): PPO through both of its means, CORY through LLM1's (LLM2's is dominated).
    fronts = [
        np.column_stack([ln.get_xdata(), ln.get_ydata()])
        for ln in ax.lines
        if ln.get_label().endswith("front (ringed)")
    ]
    assert [f.shape[0] for f in fronts] == [1, 2]  # cory, ppo
    np.testing.assert_allclose(fronts[0], [(1.6, -3.0)])
    np.testing.assert_allclose(fronts[1], [(0.6, -1.1), (1.1, -4.1)])
    assert [r["agent"] for r in result["fronts"]["cory"]] == ["llm1"]
    # The joint front over both methods' means: PPO's η=0.3 point and CORY's LLM1 (PPO's η=0.1 is dominated by it).
    (joint,) = [ln for ln in ax.lines if ln.get_label() == "joint front (all methods)"]
    np.testing.assert_allclose(np.column_stack([joint.get_xdata(), joint.get_ydata()]), [(0.6, -1.1), (1.6, -3.0)])


def test_collect_skips_runs_that_stopped_early(tmp_path):
    _summary(tmp_path, "ppo", 0.1, 0, {"llm1": (1.0, 2.0)})
    _summary(tmp_path, "ppo", 0.1, 1, {"llm1": (9.0, 9.0)})
    stopped = tmp_path / "ppo_kl0.1_s1" / "summary.json"
    stopped.write_text(json.dumps(json.loads(stopped.read_text()) | {"completed": False}))
    assert [p["seed"] for p in frontier.collect([tmp_path])] == [0]


class _FakeRun:
    def __init__(self, run_id, algorithm, kl_coef, seed, evals, state="finished", job_type=None, step=10):
        self.path = ["ent", "proj", run_id]
        self.state, self.job_type = state, job_type
        self.config = {"algorithm": {"_target_": f"cory.algorithms.{algorithm}.{algorithm.upper()}",
                                     "agent": {"init_kl_coef": kl_coef}}, "seed": seed, "iterations": 10}  # fmt: skip
        self.summary = {"_step": step, "train/llm1/kl": 123.0}
        for agent, (reward, kl) in evals.items():
            self.summary |= {f"eval/{agent}/task_reward": reward, f"eval/{agent}/kl": kl,
                             f"eval/{agent}/combined_reward": reward - 0.3 * kl}  # fmt: skip


class _FakeApi:
    def __init__(self, runs):
        self._runs, self.calls = runs, []

    def runs(self, path, filters=None):
        self.calls.append((path, filters))
        return self._runs


def test_frontier_from_a_wandb_group_reads_finished_runs_only(tmp_path):
    api = _FakeApi(
        [
            _FakeRun("a", "ppo", 0.1, 0, {"llm1": (1.0, 4.0)}),
            _FakeRun("b", "cory", 0.1, 0, {"llm1": (1.5, 3.0), "llm2": (1.2, 5.0)}),
            _FakeRun("c", "ppo", 0.1, 1, {"llm1": (9.0, 9.0)}, state="crashed"),
            _FakeRun("d", "ppo", 0.1, 2, {"llm1": (9.0, 9.0)}, step=5),  # stopped before its final evaluation
            _FakeRun("e", "ppo", 0.1, 3, {"llm1": (9.0, 9.0)}, job_type="summary"),  # the sweep's summary run
        ]
    )
    out, js = tmp_path / "f.png", tmp_path / "f.json"
    assert pf.main(["--wandb", "ent/proj/fig3_imdb", "--out", str(out), "--json", str(js)], api=api) == 0
    assert api.calls == [("ent/proj", {"group": "fig3_imdb"})]
    points = json.loads(js.read_text())["points"]
    got = [(p["run"], p["algorithm"], p["kl_coef"], p["seed"], p["agent"], p["x"], p["y"]) for p in points]
    assert got == [
        ("ent/proj/a", "ppo", 0.1, 0, "llm1", 1.0, -4.0),
        ("ent/proj/b", "cory", 0.1, 0, "llm1", 1.5, -3.0),
        ("ent/proj/b", "cory", 0.1, 0, "llm2", 1.2, -5.0),
    ]
    assert [p["combined_reward"] for p in points] == pytest.approx([1.0 - 1.2, 1.5 - 0.9, 1.2 - 1.5])
    assert _is_png(out)
    assert pf.main(["--wandb", "ent/proj", "--out", str(out)], api=api) == 2  # not entity/project/group


# ---------------------------------------------------------------------------------------------- plot_curves.py


def _fake_run(folder: Path, overrides: list[str], agents: dict[str, float], seed: int, iterations: int = 5) -> None:
    """A run folder with Hydra's overrides and metrics whose values are known: train value at iteration i =
    base + 10·seed + i (kl: half of it), evaluations at 0 and `iterations` = base + seed ± 100."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in [*overrides, f"seed={seed}"]))
    rows = [{"iteration": 0} | {f"eval/{a}/task_reward": b + seed - 100 for a, b in agents.items()}]
    for i in range(iterations):
        row = {"iteration": i}
        for a, b in agents.items():
            row |= {f"train/{a}/task_reward": b + 10 * seed + i, f"train/{a}/kl": (b + 10 * seed + i) / 2,
                    f"train/{a}/combined_reward": b - seed}  # fmt: skip
        rows.append(row)
    rows.append({"iteration": iterations} | {f"eval/{a}/task_reward": b + seed + 100 for a, b in agents.items()})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def curve_sweep(tmp_path):
    root = tmp_path / "sweep"
    shared = ["experiment=cpu_imdb", "sweep=cpu_imdb_curves", "progress=false"]
    for seed in (0, 1):
        _fake_run(root / "algorithm=ppo" / f"seed={seed}", [*shared, "algorithm=ppo"], {"llm1": 1.0}, seed)
        _fake_run(
            root / "algorithm=cory" / f"seed={seed}", [*shared, "algorithm=cory"], {"llm1": 2.0, "llm2": 3.0}, seed
        )
    _fake_run(root / "algorithm=ppo" / "seed=2", [*shared, "algorithm=ppo"], {"llm1": 1.0}, 2, iterations=3)
    return root


def test_plot_curves_draws_seed_means_and_min_max_bands(curve_sweep, tmp_path):
    groups, shared = pc.group_runs(pc.discover_runs([curve_sweep]))
    assert sorted(groups) == ["algorithm=cory", "algorithm=ppo"] and len(groups["algorithm=ppo"]) == 3
    assert shared == {"experiment": "cpu_imdb"}  # the seed, the sweep's name and progress are not settings
    curves = pc.curves(groups)
    ppo = next(c for c in curves if (c["label"], c["split"], c["metric"]) == ("algorithm=ppo", "train", "task_reward"))
    # seeds 0, 1, 2 at iterations 0..2 (1 + 10·seed + i), seeds 0 and 1 only at 3..4
    assert ppo["iterations"] == [0, 1, 2, 3, 4] and ppo["seeds"] == [3, 3, 3, 2, 2]
    assert ppo["mean"] == pytest.approx([11, 12, 13, 9, 10]) and ppo["low"] == [1, 2, 3, 4, 5]
    assert ppo["high"] == [21, 22, 23, 14, 15]

    axes = pc.plot(curves, tmp_path / "fig", title="t")["axes"]
    lines = {line.get_label(): line for line in axes["task_reward"].lines}  # groups named in words, not overrides
    assert list(lines["PPO · llm1"].get_ydata()) == pytest.approx(ppo["mean"])
    cory2 = lines["CORY · llm2"]  # (3 + i) and (13 + i): mean 8 + i
    assert list(cory2.get_xdata()) == [0, 1, 2, 3, 4] and list(cory2.get_ydata()) == pytest.approx([8, 9, 10, 11, 12])
    assert list(next(ln for ln in axes["kl"].lines if ln.get_label() == "CORY · llm2").get_ydata()) == (
        pytest.approx([4, 4.5, 5, 5.5, 6])
    )
    ppo_color = to_rgb(lines["PPO · llm1"].get_color())
    (band,) = [
        c.get_paths()[0].vertices
        for c in axes["task_reward"].collections
        if isinstance(c, PolyCollection) and tuple(c.get_facecolor()[0][:3]) == pytest.approx(ppo_color)
    ]
    for x, low, high in zip(ppo["iterations"], ppo["low"], ppo["high"]):
        ys = band[np.isclose(band[:, 0], x), 1]
        assert ys.min() == pytest.approx(low) and ys.max() == pytest.approx(high)
    # held-out evaluations: markers at the seed mean with min–max bars (1 + seed ∓ 100; seed 2 ended at 3)
    ppo_eval = next(c for c in axes["task_reward"].containers if c.get_label() == "PPO · llm1 (held-out)")
    assert list(ppo_eval.lines[0].get_xdata()) == [0, 3, 5]
    assert list(ppo_eval.lines[0].get_ydata()) == pytest.approx([-98, 103, 101.5])
    bars = ppo_eval.lines[2][0].get_segments()  # one vertical segment per marker, from min to max
    np.testing.assert_allclose([(seg[0][1], seg[1][1]) for seg in bars], [(-99, -97), (103, 103), (101, 102)])
    assert all(_is_png(p) or p.suffix == ".pdf" for p in (tmp_path / "fig.png", tmp_path / "fig.pdf"))


def test_plot_curves_cli_writes_png_pdf_and_the_plotted_arrays(curve_sweep, tmp_path):
    prefix = tmp_path / "out" / "fig3"
    assert pc.main([str(curve_sweep), "--out", str(prefix)]) == 0
    assert _is_png(Path(f"{prefix}.png")) and Path(f"{prefix}.pdf").read_bytes()[:5] == b"%PDF-"
    saved = json.loads(Path(f"{prefix}.json").read_text())
    assert saved["shared"] == {"experiment": "cpu_imdb"}
    assert {(c["label"], c["agent"]) for c in saved["curves"]} == {
        ("algorithm=ppo", "llm1"), ("algorithm=cory", "llm1"), ("algorithm=cory", "llm2")
    }  # fmt: skip
    assert pc.main([str(tmp_path / "nothing_here"), "--out", str(prefix)]) == 2


def test_plot_curves_groups_runs_without_hydra_records_by_their_config(tmp_path):
    for algorithm, seed in (("PPO", 0), ("PPO", 1), ("CORY", 0)):
        run = tmp_path / f"{algorithm}{seed}"
        run.mkdir()
        target = f"cory.algorithms.{algorithm.lower()}.{algorithm}"
        extra = "  role_exchange: true\n" if algorithm == "CORY" else ""
        (run / "run_config.yaml").write_text(
            f"seed: {seed}\nalgorithm:\n  _target_: {target}\n{extra}  agent:\n    learning_rate: 1.0e-05\n"
        )
        (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "train/llm1/task_reward": seed}) + "\n")
    groups, shared = pc.group_runs(pc.discover_runs([tmp_path]))
    assert {k: len(v) for k, v in groups.items()} == {"algorithm=ppo": 2, "algorithm=cory": 1}
    assert shared == {"algorithm.agent.learning_rate": "1e-05"}


# ---------------------------------------------------------------------------------------------- one study a figure
def _study_run(folder: Path, task: str, iterations: int, seed: int, reward: float, experiment: str | None = None):
    """A finished run as `cory-train` leaves it: its summary, the task in its config, the experiment override."""
    folder.mkdir(parents=True)
    summary = {"algorithm": "ppo", "kl_coef": 0.1, "seed": seed, "iterations": iterations, "completed": True,
               "agents": {"llm1": {"task_reward": reward, "kl": 1.0, "combined_reward": reward - 0.3}}}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run_config.yaml").write_text(f"seed: {seed}\ntask:\n  name: {task}\n")
    if experiment:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(f"- experiment={experiment}\n")


def test_a_mix_of_tasks_experiments_and_lengths_is_refused_and_split_on_request(tmp_path, capsys):
    """`cory-plot frontier outputs/runs outputs/multiruns` drew one front through IMDB, arithmetic and toy points, and
    counted a 4-iteration run and a 2-iteration sweep job, both seed 0, as two seeds. Now: one study per figure."""
    runs, multiruns = tmp_path / "runs", tmp_path / "multiruns"
    _study_run(runs / "imdb" / "a", "imdb", 12, 0, 0.6, "quickstart")
    _study_run(runs / "toy" / "b", "toy", 4, 0, 0.2, "smoke")
    _study_run(multiruns / "smoke" / "c", "toy", 2, 0, 0.1, "smoke")
    out = tmp_path / "out" / "frontier.png"
    assert pf.main([str(runs), str(multiruns), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the runs are 3 studies")
    for study in ("task imdb · experiment quickstart · 12 it.", "task toy · experiment smoke · 4 it.",
                  "task toy · experiment smoke · 2 it."):  # fmt: skip
        assert study in err
    assert "--task, --experiment and --iterations" in err and "--split" in err and not out.parent.exists()
    # choosing one: the 4-iteration run alone, one seed
    chosen = tmp_path / "chosen.json"
    assert pf.main([str(runs), str(multiruns), "--task", "toy", "--iterations", "4", "--out", str(out),
                    "--json", str(chosen)]) == 0  # fmt: skip
    (row,) = json.loads(chosen.read_text())["aggregated"]
    assert (row["n"], row["runs"], row["task_reward"]) == (1, 1, 0.2)
    assert pf.main([str(runs), "--task", "gsm8k", "--out", str(out)]) == 2
    assert "no run matches --task gsm8k (the runs are: task imdb" in capsys.readouterr().err
    # or each study into its own file
    out = tmp_path / "split" / "frontier.png"
    assert pf.main([str(runs), str(multiruns), "--split", "--out", str(out), "--json", str(tmp_path / "f.json")]) == 0
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == ["frontier-imdb-quickstart-12it.png", "frontier-toy-smoke-2it.png", "frontier-toy-smoke-4it.png"]
    saved = json.loads((tmp_path / "f-toy-smoke-2it.json").read_text())
    assert [p["run"] for p in saved["points"]] == [str((multiruns / "smoke" / "c").resolve())]


def test_seeds_are_counted_once_however_many_runs_share_one(tmp_path):
    """Two runs of seed 0 (a rerun) and one of seed 1 are two seeds: seed 0's value is the mean of its runs."""
    info = frontier.figures.RunInfo(task="toy")
    points = [
        frontier.make_point(run, "ppo", 0.1, seed, "llm1", {"task_reward": r, "kl": 1.0}, info, 4)
        for run, seed, r in (("a", 0, 0.2), ("b", 0, 0.4), ("c", 1, 0.6))
    ]
    (row,) = frontier.aggregate(points)
    assert (row["n"], row["runs"]) == (2, 3)
    assert row["task_reward"] == pytest.approx((0.3 + 0.6) / 2)  # not (0.2 + 0.4 + 0.6) / 3
    assert row["task_reward_std"] == pytest.approx(0.15)  # the spread of the seeds' values 0.3 and 0.6
    assert "2 (3 runs)" in frontier.format_table([row], {"ppo": [row]})
    fig, _ = frontier.draw_frontier(points)
    assert "mean over 2 seeds" in fig.axes[0].get_title()


# ---------------------------------------------------------------------------------------------- W&B, for real
WANDB_RUN = """
import sys
from cory.loggers import WandbLogger

config = {"iterations": 2, "seed": 3, "task": {"name": "toy"},
          "algorithm": {"_target_": "cory.algorithms.cory.CORY", "agent": {"init_kl_coef": 0.1}}}
logger = WandbLogger(sys.argv[1], config, project="p", group="g", mode="offline")
for k, (reward, kl) in enumerate([(0.9, 0.0), (0.5, 2.0), (0.7, 1.5)]):  # the best reward is not the last
    logger.log({"eval/llm1/task_reward": reward, "eval/llm1/kl": kl, "eval/llm1/combined_reward": reward - 0.3 * kl,
                "train/llm1/kl": kl}, step=k)
logger.close()
"""


def _offline_run_read_back(run_dir: Path) -> tuple[dict, dict]:
    """(config, summary) of a real offline W&B run, read back from its run file by W&B's own reader."""
    env = {**__import__("os").environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    made = subprocess.run([sys.executable, "-c", WANDB_RUN, str(run_dir)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=ROOT)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    wandb_cli = Path(sys.executable).parent / "wandb"
    read = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(run_file)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert read.returncode == 0, read.stderr[-2000:]
    records = [json.loads(line) for line in read.stdout.splitlines() if line.startswith("{")]
    summary: dict = {}
    for r in records:
        if r["type"] == "summary":
            summary |= r["summary"].get("update", {})
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    config = {k: json.loads(v["value_json"]) if isinstance(v, dict) and "value_json" in v else v
              for k, v in run["config"]["update"].items()}  # fmt: skip
    return config, summary


class _ReadBackRun:
    def __init__(self, config: dict, summary: dict) -> None:
        self.path, self.state, self.job_type = ["ent", "p", "r1"], "finished", "train"
        self.config, self.summary = config, summary


@pytest.mark.slow
def test_frontier_reads_the_summary_of_a_real_offline_wandb_run(tmp_path):
    """`--wandb` read `summary["eval/<agent>/task_reward"]` as a number, but W&B summarises a declared metric as
    `{last, max}`: every point was dropped. A summary written by our logger and read back from the run file gives
    the final evaluation's values (the last, not the best), as plain numbers or in the old dict form."""
    config, summary = _offline_run_read_back(tmp_path / "run")
    value = summary["eval/llm1/task_reward"]
    assert value == 0.7 or value.get("last") == 0.7  # plain, or the `{last, max}` of W&B's summary declaration
    api = _FakeApi([_ReadBackRun(config, summary)])
    out, js = tmp_path / "f.png", tmp_path / "f.json"
    assert pf.main(["--wandb", "ent/p/g", "--out", str(out), "--json", str(js)], api=api) == 0
    (point,) = json.loads(js.read_text())["points"]
    assert (point["task_reward"], point["kl"], point["seed"], point["kl_coef"]) == (0.7, 1.5, 3, 0.1)
    assert point["combined_reward"] == pytest.approx(0.7 - 0.45) and point["algorithm"] == "cory"
    assert point["iterations"] == 2 and point["task"] == "toy" and _is_png(out)
