"""Tests for `cory.plotting.plot_curves` and `scripts/plot_frontier.py` (collect, Pareto front, aggregation, CLI)
on synthetic files. CPU only, no network. Run with `pytest tests/test_plotting.py`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cory.plotting import discover_agents, plot_curves, read_metrics, series

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load_frontier():
    spec = importlib.util.spec_from_file_location("plot_frontier", ROOT / "scripts" / "plot_frontier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pf = _load_frontier()


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
    assert pf.pareto_front(pts) == [(0.5, 0), (3, -3), (4, -10)]
    assert pf.pareto_front([]) == []
    assert pf.pareto_front([(1, 1), (1, 1)]) == [(1, 1), (1, 1)]
    dicts = [{"x": 1.0, "y": -1.0, "id": "a"}, {"x": 0.0, "y": -2.0, "id": "b"}, {"x": 0.0, "y": 0.0, "id": "c"}]
    assert [p["id"] for p in pf.pareto_front(dicts)] == ["c", "a"]


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
    points = pf.collect([sweep / "ppo", sweep / "cory", sweep / "other", sweep / "broken"])
    assert len(points) == 4 + 4 + 1
    p = next(p for p in points if p["algorithm"] == "ppo" and p["kl_coef"] == 0.3 and p["seed"] == 1)
    assert p["agent"] == "llm1" and p["x"] == pytest.approx(0.7) and p["y"] == pytest.approx(-1.2)
    # Passing the parent as well does not duplicate runs.
    assert len(pf.collect([sweep, sweep / "ppo"])) == len(points)

    agg = pf.aggregate(points)
    ppo01 = next(r for r in agg if r["algorithm"] == "ppo" and r["kl_coef"] == 0.1)
    assert ppo01["n"] == 2 and ppo01["task_reward"] == pytest.approx(1.1)
    assert ppo01["task_reward_std"] == pytest.approx(0.1) and ppo01["kl"] == pytest.approx(4.1)
    fronts = pf.fronts(agg)
    # PPO: (1.1, -4.1) and (0.6, -1.1) are both non-dominated. CORY: llm1 (1.6, -3.0), llm2 (1.2, -5.1) dominated,
    # the single-seed (0.1, -0.2) point is non-dominated.
    assert [(round(r["x"], 3), round(r["y"], 3)) for r in fronts["ppo"]] == [(0.6, -1.1), (1.1, -4.1)]
    assert [(r["agent"], r["kl_coef"]) for r in fronts["cory"]] == [("llm2", 0.3), ("llm1", 0.1)]
    table = pf.format_table(agg, fronts)
    assert "ppo" in table and "cory" in table and "±" in table and "*" in table


def test_frontier_cli(sweep, tmp_path):
    out, js = tmp_path / "out" / "frontier.png", tmp_path / "out" / "frontier.json"
    assert pf.main([str(sweep), "--out", str(out), "--json", str(js)]) == 0
    assert _is_png(out)
    result = json.loads(js.read_text())
    assert set(result) == {"points", "aggregated", "fronts"} and len(result["points"]) == 9
    assert pf.main([str(tmp_path / "empty_dir_that_is_missing"), "--out", str(tmp_path / "x.png")]) == 1


def test_frontier_cli_subprocess(sweep, tmp_path):
    out = tmp_path / "f.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_frontier.py"), str(sweep / "ppo"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert _is_png(out) and "ppo" in proc.stdout
