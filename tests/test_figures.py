"""Tests for what every figure shares (`cory.figures`) as the figures use it: titles from the runs, units from the
task, legends that list what is drawn and cover no data, no offset tick labels, CORY's role-swap marks, seed notes,
smoothing, and the plot scripts' one-line errors. Fake run folders with known numbers; CPU only, no network.
Run with `pytest tests/test_figures.py`.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from cory import figures, frontier
from cory.evaluate import passk_title, plot_passk
from cory.plotting import draw_curves, plot_curves
from cory.studies import plot_curves as pc
from cory.studies import plot_frontier as pf

ROOT = Path(__file__).resolve().parents[1]

TFIDF_IMDB = {"_target_": "cory.tasks.imdb.IMDBTask", "name": "imdb", "eval_kl_coef": 0.3,
              "reward": {"_target_": "cory.tasks.rewards.TfidfSentimentReward"}}  # fmt: skip


def _config(algorithm: str = "cory", kl_coef: float = 0.05, seed: int = 3, task: dict = TFIDF_IMDB) -> dict:
    target = {"cory": "cory.algorithms.cory.CORY", "ppo": "cory.algorithms.ppo.PPO"}[algorithm]
    return {"seed": seed, "task": task, "algorithm": {"_target_": target, "agent": {"init_kl_coef": kl_coef}}}


def _run(folder: Path, config: dict, rows: list[dict], overrides: list[str] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "run_config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if overrides is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return folder


def _cory_rows(n: int = 6, swaps: tuple = (0, 0, 1, 1, 1, 2), beta0: float = 0.3, seed: int = 0) -> list[dict]:
    """CORY-like metrics: β moves by 1e-5 per iteration (an offset formatter's favourite), swaps as given."""
    rows = []
    for i in range(n):
        row = {"iteration": i, "cory/swaps": float(swaps[i])}
        for j, agent in enumerate(("llm1", "llm2")):
            row |= {f"train/{agent}/task_reward": 0.1 * i + j + seed, f"train/{agent}/kl": 0.5 * i + seed,
                    f"train/{agent}/combined_reward": -0.05 * i,
                    f"train/{agent}/kl_coef": beta0 + 1e-5 * i}  # fmt: skip
        row |= {"train/pioneer/task_reward": 0.1 * i, "train/observer/task_reward": 0.1 * i + 1}
        rows.append(row)
    rows.append({"iteration": n, "eval/llm1/task_reward": 0.9, "eval/llm2/task_reward": 1.1, "eval/llm1/kl": 2.0})
    return rows


def _drawn(fig: Figure) -> None:
    fig.canvas.draw()


def _labelled_artists(axes) -> dict[str, list]:
    out: dict[str, list] = {}
    for ax in axes:
        for artist in [*ax.lines, *ax.collections, *ax.containers]:
            label = artist.get_label()
            if label and not label.startswith("_"):
                out.setdefault(label, []).append(artist)
    return out


def _data_points_px(ax) -> np.ndarray:
    """Display coordinates of every data vertex on `ax` (lines, markers, scatter offsets)."""
    xy = [np.column_stack([ln.get_xdata(), ln.get_ydata()]) for ln in ax.lines if len(ln.get_xdata())]
    xy += [c.get_offsets() for c in ax.collections if len(c.get_offsets()) and not isinstance(c, PolyCollection)]
    xy = [a for a in xy if np.isfinite(np.asarray(a, dtype=float)).all()]
    if not xy:
        return np.empty((0, 2))
    points = np.concatenate([np.asarray(a, dtype=float) for a in xy])
    return ax.transData.transform(points)


def _assert_legend_covers_no_data(fig: Figure, legend) -> None:
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        px = _data_points_px(ax)
        inside = (px[:, 0] >= box.x0) & (px[:, 0] <= box.x1) & (px[:, 1] >= box.y0) & (px[:, 1] <= box.y1)
        assert not inside.any(), f"legend covers data points {px[inside]}"
        assert not box.overlaps(ax.get_window_extent(renderer)), "legend overlaps the plotting area"


# ------------------------------------------------------------------------------------------- run identity
def test_run_info_reads_what_the_run_is_from_its_config_summary_and_overrides(tmp_path):
    run = _run(tmp_path / "final_cory", _config(kl_coef=0.05, seed=3), [], overrides=["experiment=quickstart"])
    info = figures.read_run_info(run)
    assert info == figures.RunInfo("CORY", "imdb", "quickstart", 0.05, 3, 0.3, "TF-IDF logit")
    # Units follow the reward's class, the ablations the switches; a summary alone still names algorithm and seed.
    paper_reward = {**TFIDF_IMDB, "reward": {"_target_": "cory.tasks.rewards.ClassifierReward"}}
    assert figures.reward_unit({"task": paper_reward}) == "classifier logit"
    assert figures.reward_unit({"task": {"_target_": "cory.tasks.gsm8k.GSM8KTask"}}) == "fraction correct"
    assert figures.reward_unit({"task": {"_target_": "my.Unknown"}}) is None
    share = {"_target_": "cory.tasks.toy.CharacterShare"}
    toy = {"_target_": "cory.tasks.toy.ToyTask", "reward": share}
    assert figures.reward_unit({"task": toy | {"reward": share | {"characters": "aeiou"}}}) == "fraction of vowels"
    assert figures.reward_unit({"task": toy | {"reward": share | {"characters": "xy"}}}) == "fraction of 'xy'"
    assert figures.reward_unit({"task": toy | {"reward": {"_target_": "my.LetterReward"}}}) is None  # not the toy's
    assert figures.reward_unit({"task": {"_target_": "cory.tasks.toy.ToyTask"}}) == "fraction of vowels"  # older runs
    bounded = {**paper_reward, "reward": {**paper_reward["reward"], "bound": "probability"}}
    assert figures.reward_unit({"task": bounded}) == "P(positive)"  # a bounded reward is a probability
    clipped = {**paper_reward, "reward": {**paper_reward["reward"], "bound": "clip", "ceiling": 3.0}}
    assert figures.reward_unit({"task": clipped}) == "classifier logit"
    ablation = _config() | {"algorithm": {"_target_": "cory.algorithms.cory.CORY", "role_exchange": False}}
    assert figures.run_info(ablation).algorithm == "CORY w/o REx"
    assert figures.run_info(None, {"algorithm": "maft", "seed": 0, "single_agent_ft": True}) == figures.RunInfo(
        algorithm="MAFT single-agent FT", seed=0
    )
    infos = [figures.RunInfo("PPO", "imdb", None, 0.1, 1), figures.RunInfo("CORY", "imdb", None, 0.1, 0)]
    assert figures.describe(infos) == "PPO vs CORY · task imdb · η=0.1 · seeds 0, 1"


def test_single_run_curves_are_titled_by_algorithm_eta_task_and_seed_with_units(tmp_path):
    run = _run(tmp_path / "final_cory", _config(kl_coef=0.05, seed=3), _cory_rows())
    fig = draw_curves(run / "metrics.jsonl")
    title = fig._suptitle.get_text()
    assert title == "CORY · task imdb · η=0.05 · seed 3" and "final_cory" not in title
    by_title = {ax.get_title(): ax for ax in fig.axes}
    assert by_title["task reward"].get_ylabel() == "task reward (TF-IDF logit)"
    assert by_title["KL_seq to π0"].get_ylabel() == "KL_seq (nats)"
    assert "combined reward r − η_eval·KL_seq, η_eval = 0.3" in by_title  # the run's task.eval_kl_coef
    assert by_title["KL coefficient β"].get_ylabel() == "β (TF-IDF logit per nat)"


def _saved_figure(monkeypatch, draw, *args) -> Figure:
    """The Figure that `draw(*args)` writes, as written (after whatever it does before saving)."""
    saved = []
    original = Figure.savefig

    def keep(fig, *a, **k):
        saved.append(fig)
        return original(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    draw(*args)
    monkeypatch.setattr(Figure, "savefig", original)
    return saved[-1]


def test_no_axis_carries_an_offset(tmp_path, monkeypatch):
    run = _run(tmp_path / "r", _config(), _cory_rows(beta0=0.3))
    # β runs 0.30000 … 0.30005: matplotlib's default labels the ticks 0.00001… with "+3e-1" in a corner
    fig = _saved_figure(monkeypatch, plot_curves, run / "metrics.jsonl", tmp_path / "c.png")
    for ax in fig.axes:
        assert ax.yaxis.get_offset_text().get_text() == "" and ax.xaxis.get_offset_text().get_text() == ""
    beta = next(ax for ax in fig.axes if ax.get_title() == "KL coefficient β")
    assert "0.30" in [t.get_text() for t in beta.get_yticklabels()]  # the value itself, not an offset from it
    points = [frontier.make_point("r", "ppo", 0.1, 0, "llm1", {"task_reward": 0.3 + 1e-5 * i, "kl": 1 + i})
              for i in range(3)]  # fmt: skip
    fig = _saved_figure(monkeypatch, frontier.plot_frontier, points, tmp_path / "f.png")
    assert fig.axes[0].xaxis.get_offset_text().get_text() == ""


def test_a_beta_that_barely_moves_is_drawn_flat_and_one_that_moves_fills_its_panel(tmp_path):
    """β drifting by 0.01 % (an adaptive controller in a short run) was stretched to the panel's full height, a
    zigzag out of nothing: its axis now spans at least ±10 % of β. A β that really moves keeps its own range."""
    run = _run(tmp_path / "r", _config(), _cory_rows(beta0=0.3))  # β: 0.30000 … 0.30005
    fig = draw_curves(run / "metrics.jsonl")
    beta = next(ax for ax in fig.axes if ax.get_title() == "KL coefficient β")
    low, high = beta.get_ylim()
    assert high - low == pytest.approx(0.2 * 0.30005) and low < 0.3 and high > 0.30005
    rows = _cory_rows()
    for i, row in enumerate(rows[:-1]):  # β doubling over the run, 0.3 → 0.6
        row |= {"train/llm1/kl_coef": 0.3 + 0.06 * i, "train/llm2/kl_coef": 0.3 + 0.06 * i}
    moving = _run(tmp_path / "m", _config(), rows)
    beta = next(ax for ax in draw_curves(moving / "metrics.jsonl").axes if ax.get_title() == "KL coefficient β")
    low, high = beta.get_ylim()
    assert 0.28 < low < 0.3 and 0.6 < high < 0.62  # matplotlib's own margins around 0.3 … 0.6


def test_an_agents_line_that_repeats_another_is_dashed_and_says_so(tmp_path):
    """β fixed alike for both agents drew llm2's line exactly over llm1's, hiding it: a repeated series is dashed and
    its label names the agent it repeats; series that differ keep solid lines and plain labels."""
    rows = _cory_rows()
    for row in rows[:-1]:
        row |= {"train/llm1/kl_coef": 0.3, "train/llm2/kl_coef": 0.3}
    fig = draw_curves(_run(tmp_path / "r", _config(), rows) / "metrics.jsonl")
    beta = next(ax for ax in fig.axes if ax.get_title() == "KL coefficient β")
    lines = {ln.get_label(): ln for ln in beta.lines}
    assert lines["llm1 train"].get_linestyle() == "-" and lines["llm2 train (= llm1)"].get_linestyle() == "--"
    reward = next(ax for ax in fig.axes if ax.get_title() == "task reward")
    assert {"llm1 train", "llm2 train"} <= {ln.get_label() for ln in reward.lines}


def test_iteration_ticks_are_whole_numbers(tmp_path):
    """Two iterations gave ticks at 0.25, 0.5, …: an iteration axis has integer ticks only."""
    run = _run(tmp_path / "r", _config(), _cory_rows(n=2, swaps=(0, 0)))
    fig = draw_curves(run / "metrics.jsonl")
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    groups, _ = pc.group_runs(pc.discover_runs([_sweep(tmp_path / "s")]))
    sweep_fig = pc.plot(pc.curves(groups), tmp_path / "fig", groups=pc.describe_groups(groups))["figure"]
    for ax in sweep_fig.axes:
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_title()


def test_the_pioneer_line_does_not_hide_the_agent_that_holds_the_role(tmp_path):
    """In CORY the pioneer's curve is, iteration by iteration, one agent's own: a by-role line drawn on top hid llm1.
    The by-role curves are wide faint strokes beneath the agents' lines."""
    run = _run(tmp_path / "r", _config(), _cory_rows())  # the pioneer's task reward is llm1's until the swap
    fig = draw_curves(run / "metrics.jsonl")
    ax = next(ax for ax in fig.axes if ax.get_title() == "task reward")
    lines = {ln.get_label(): ln for ln in ax.lines}
    agent, role = lines["llm1 train"], lines["pioneer (by role)"]
    np.testing.assert_allclose(agent.get_ydata()[:2], role.get_ydata()[:2])  # the same values where llm1 leads
    assert role.get_zorder() < agent.get_zorder()  # drawn beneath it
    assert role.get_linewidth() > 2 * agent.get_linewidth() and role.get_alpha() < 0.5  # wide and see-through


def test_cory_curves_mark_the_logged_role_swaps(tmp_path):
    # `cory/swaps` grows at iterations 2 and 5: the roles changed after iterations 1 and 4.
    run = _run(tmp_path / "r", _config(), _cory_rows(swaps=(0, 0, 1, 1, 1, 2)))
    assert figures.swap_iterations([0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 1, 2]) == [2, 5]
    fig = draw_curves(run / "metrics.jsonl")
    for ax in fig.axes:
        marks = [ln for ln in ax.lines if ln.get_color() == figures.SWAP_STYLE["color"]]
        assert sorted(float(ln.get_xdata()[0]) for ln in marks) == [1.5, 4.5]
    ppo = _run(tmp_path / "p", _config("ppo"), [r for r in _cory_rows() if r.pop("cory/swaps", 0) is not None])
    assert not any(ln.get_color() == figures.SWAP_STYLE["color"] for ax in draw_curves(ppo / "metrics.jsonl").axes
                   for ln in ax.lines)  # fmt: skip


def test_curve_legend_lists_what_is_drawn_and_covers_no_data(tmp_path):
    run = _run(tmp_path / "r", _config(), _cory_rows())
    fig = draw_curves(run / "metrics.jsonl")
    _drawn(fig)
    (legend,) = fig.legends
    entries = [t.get_text() for t in legend.get_texts()]
    assert entries == list(dict.fromkeys(_labelled_artists(fig.axes)))
    assert "role swap" in entries and entries.count("role swap") == 1
    _assert_legend_covers_no_data(fig, legend)


def test_smoothing_draws_the_moving_mean_over_a_faint_raw_curve(tmp_path):
    assert figures.moving_mean([1, 2, 3, 4, 5], 2) == [1, 1.5, 2.5, 3.5, 4.5]
    assert figures.moving_mean([1, 5], 1) == [1, 5]
    run = _run(tmp_path / "r", _config(), _cory_rows())
    fig = draw_curves(run / "metrics.jsonl", smooth=3)
    ax = next(ax for ax in fig.axes if ax.get_title() == "task reward")
    (line,) = [ln for ln in ax.lines if ln.get_label() == "llm1 train"]
    raw = [0.1 * i for i in range(6)]
    np.testing.assert_allclose(line.get_ydata(), [0, 0.05, 0.1, 0.2, 0.3, 0.4])
    assert any(np.allclose(ln.get_ydata(), raw) and ln.get_alpha() < 0.5 for ln in ax.lines)
    assert "moving mean over 3 iterations" in fig._suptitle.get_text()


# ------------------------------------------------------------------------------------------- frontier
def _frontier_points(seeds=(0,)) -> list[dict]:
    info = figures.RunInfo(task="imdb", experiment="cpu_imdb", reward_unit="TF-IDF logit")
    points = []
    # PPO's front is one point (η=0.1 dominates the others): it must still be drawn (a ring), not a legend ghost.
    for seed in seeds:
        for algorithm, agent, eta, reward, kl in (
            ("ppo", "llm1", 0.03, 0.77, 3.75), ("ppo", "llm1", 0.1, 0.78, 3.18), ("ppo", "llm1", 0.3, 0.62, 3.28),
            ("cory", "llm1", 0.1, 0.60, 2.92), ("cory", "llm2", 0.1, 0.92, 4.11), ("cory", "llm2", 0.3, 0.61, 2.70),
        ):  # fmt: skip
            metrics = {"task_reward": reward + 0.01 * seed, "kl": kl}
            points.append(frontier.make_point(f"{algorithm}{eta}s{seed}", algorithm, eta, seed, agent, metrics, info))
    return points


def test_frontier_legend_lists_exactly_what_is_drawn_outside_the_axes():
    fig, result = frontier.draw_frontier(_frontier_points())
    _drawn(fig)
    ax = fig.axes[0]
    legend = ax.get_legend()
    entries = [t.get_text() for t in legend.get_texts()]
    artists = _labelled_artists([ax])
    assert entries == list(artists)  # no proxy entry: each one is an artist on the axes
    for label, drawn in artists.items():  # ... and each of them shows data
        assert all(len(getattr(a, "get_xdata", lambda a=a: a.lines[0].get_xdata())()) for a in drawn), label
    assert {"PPO front (ringed)", "CORY front (ringed)", "joint front (all methods)"} <= set(entries)
    (ppo_front,) = artists["PPO front (ringed)"]
    assert list(zip(ppo_front.get_xdata(), ppo_front.get_ydata())) == [(0.78, -3.18)]
    assert ppo_front.get_markerfacecolor() == "none" and ppo_front.get_markersize() > 10  # a visible ring
    assert [(r["algorithm"], r["kl_coef"]) for r in result["joint_front"]] == [
        ("cory", 0.3),
        ("ppo", 0.1),
        ("cory", 0.1),
    ]
    _assert_legend_covers_no_data(fig, legend)


def test_frontier_title_units_and_seed_note():
    fig, _ = frontier.draw_frontier(_frontier_points())
    ax = fig.axes[0]
    assert ax.get_title() == "KL–reward frontier\nPPO vs CORY · task imdb · experiment cpu_imdb · seed 0 · one seed"
    assert ax.get_xlabel() == "held-out task reward (TF-IDF logit)" and ax.get_ylabel() == "− held-out KL_seq (nats)"
    fig2, _ = frontier.draw_frontier(_frontier_points(seeds=(0, 1)))
    assert fig2.axes[0].get_title().endswith("seeds 0, 1\nmean over 2 seeds ± std")  # lines of at most 80 characters


# ------------------------------------------------------------------------------------------- sweep curves
def _sweep(root: Path, seeds=(0,)) -> Path:
    for algorithm in ("ppo", "cory"):
        for seed in seeds:
            rows = _cory_rows(seed=seed)
            if algorithm == "ppo":
                rows = [{k: v for k, v in r.items() if "llm2" not in k and "cory/" not in k and "/pioneer/" not in k
                         and "/observer/" not in k} for r in rows]  # fmt: skip
            overrides = ["experiment=cpu_imdb", f"algorithm={algorithm}", f"seed={seed}"]
            _run(root / algorithm / f"seed={seed}", _config(algorithm, 0.1, seed), rows, overrides)
    return root


def test_sweep_curves_with_one_seed_claim_no_band(tmp_path):
    groups, _ = pc.group_runs(pc.discover_runs([_sweep(tmp_path / "s")]))
    fig = pc.plot(pc.curves(groups), tmp_path / "fig", groups=pc.describe_groups(groups))["figure"]
    title = fig._suptitle.get_text()
    assert title == "CORY vs PPO · task imdb · experiment cpu_imdb · η=0.1 · seed 0 · one seed"
    assert not any(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "task reward (TF-IDF logit)" and "η_eval = 0.3" in fig.axes[2].get_title()
    swaps = sorted(float(ln.get_xdata()[0]) for ln in ax.lines if ln.get_color() == figures.SWAP_STYLE["color"])
    assert swaps == [1.5, 4.5]  # CORY's logged swaps; PPO has none
    _drawn(fig)
    _assert_legend_covers_no_data(fig, fig.legends[0])


def test_sweep_curves_with_two_seeds_draw_a_min_max_band(tmp_path):
    groups, _ = pc.group_runs(pc.discover_runs([_sweep(tmp_path / "s", seeds=(0, 1))]))
    fig = pc.plot(pc.curves(groups), tmp_path / "fig", groups=pc.describe_groups(groups))["figure"]
    assert (
        fig._suptitle.get_text()
        .replace("\n", " · ")
        .endswith("seeds 0, 1 · mean over 2 seeds; band and bars: min–max over seeds")
    )  # wrapped between facts (`figures.TITLE_WIDTH`)
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bands) == 3  # ppo llm1, cory llm1, cory llm2
    ys = bands[0].get_paths()[0].vertices[:, 1]  # seed 0 and 1 differ by 1 in task reward
    assert ys.min() == pytest.approx(0.0) and ys.max() == pytest.approx(1.5)


def test_sweep_curves_redraw_from_their_json(tmp_path):
    sweep = _sweep(tmp_path / "s")
    assert pc.main([str(sweep), "--out", str(tmp_path / "a" / "curves")]) == 0
    assert pc.main(["--from-json", str(tmp_path / "a" / "curves.json"), "--out", str(tmp_path / "b" / "curves")]) == 0
    a, b = (json.loads((tmp_path / d / "curves.json").read_text()) for d in ("a", "b"))
    assert a == b and a["groups"]["algorithm=cory"]["swaps"] == [2, 5]  # the JSON keeps the settings themselves


# ------------------------------------------------------------------------------------------- script errors
def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_plot_scripts_report_an_unwritable_out_in_one_line(tmp_path, capsys, monkeypatch):
    sweep = _sweep(tmp_path / "s")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert pc.main([str(sweep), "--out", str(blocker / "curves")]) == 2  # a file where a folder should be
    assert _one_line_error(capsys).startswith(f"error: cannot write {blocker}")
    assert pf.main(["--from-json", str(_frontier_json(tmp_path)), "--out", str(blocker / "f.png")]) == 2
    assert "error: cannot write" in _one_line_error(capsys)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ro" / "f.png"))

    monkeypatch.setattr(Figure, "savefig", read_only)
    assert pf.main(["--from-json", str(_frontier_json(tmp_path)), "--out", str(tmp_path / "ro" / "f.png")]) == 2
    assert _one_line_error(capsys) == (
        f"error: cannot write {tmp_path / 'ro' / 'f.png'} (Read-only file system); choose a writable --out"
    )


def _frontier_json(tmp_path: Path) -> Path:
    path = tmp_path / "points.json"
    if not path.exists():
        path.write_text(json.dumps({"points": _frontier_points()}))
    return path


def test_plot_scripts_report_empty_inputs_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out" / "f"
    assert pc.main([str(empty), "--out", str(out)]) == 2
    assert _one_line_error(capsys).startswith(f"error: no run (a folder holding metrics.jsonl) under {empty}")
    assert pf.main([str(empty), "--out", f"{out}.png"]) == 2
    assert "no summary.json found" in _one_line_error(capsys)
    assert pc.main([str(tmp_path / "missing")]) == 2
    assert _one_line_error(capsys) == f"error: no such folder: {tmp_path / 'missing'}"
    sweep = _sweep(tmp_path / "s")
    assert pc.main([str(sweep), "--where", "algorithm=maft", "--out", str(out)]) == 2
    assert _one_line_error(capsys) == (
        f"error: 2 runs under {sweep}, none with algorithm=maft (algorithm is cory, ppo); "
        "change --where to one of these values"
    )
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True  # no empty figure


def test_plot_frontier_wandb_without_access_is_one_line(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "f.png")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert pf.main(["--wandb", "ent/proj/group", "--out", out]) == 2
    assert "WANDB_MODE=disabled" in _one_line_error(capsys)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    assert pf.main(["--wandb", "ent/proj/group", "--out", out]) == 2
    assert "needs a W&B API key" in _one_line_error(capsys)
    assert not Path(out).exists()


def test_plot_frontier_subprocess_error_is_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "WANDB_MODE": "offline", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "cory.studies.plot_frontier", "--wandb", "e/p/g", "--out", str(tmp_path / "f")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "WANDB_MODE=offline" in proc.stderr


# ------------------------------------------------------------------------------------------- pass@k
def test_passk_figure_titles_the_run_and_keeps_its_legend_off_the_data(tmp_path, monkeypatch):
    summary = {m: {"pass@1": a, "pass@2": a + 0.1, "pass@4": a + 0.2} for m, a in (("base", 0.3), ("llm1", 0.5))}
    info = figures.run_info(_config("cory", 0.01, 0, {"_target_": "cory.tasks.arithmetic.ArithmeticTask",
                                                        "name": "arithmetic"}))  # fmt: skip
    title = passk_title(info, 4, 64, Path("checkpoints/iter_000025"))
    assert title == "pass@k\nCORY · task arithmetic · η=0.01 · seed 0 · checkpoint iter_000025 · n=4, 64 problems"
    fig = _saved_figure(monkeypatch, plot_passk, summary, tmp_path / "passk.png", title)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "pass@k (fraction of problems)" and ax.get_title() == title
    _assert_legend_covers_no_data(fig, ax.get_legend())


def test_a_long_title_is_wrapped_between_facts_and_loses_none():
    """Six algorithms and the run facts (the family sweep's frontier) ran past both edges of the figure on one line."""
    names = ("ppo", "grpo", "cory", "cory_cc", "cory_interleaved", "cory_shared")
    infos = [
        figures.RunInfo(algorithm=a, task="arithmetic", experiment="gsm8k_cpu", seed=s) for a in names for s in (0, 1)
    ]
    text = figures.title(infos, heading="KL–reward frontier: family_arithmetic", note="mean over 3 seeds ± std")
    lines = text.splitlines()
    assert lines[0] == "KL–reward frontier: family_arithmetic" and len(lines) >= 3
    assert all(len(line) <= figures.TITLE_WIDTH for line in lines)
    assert " · ".join(lines[1:]) == " · ".join([figures.describe(infos), "mean over 3 seeds ± std"])


def test_methods_with_the_same_means_stay_visible_as_nested_markers():
    """GRPO and shared-policy CORY ended at the same mean on the family sweep: one marker must not hide the other."""
    info = figures.RunInfo(task="arithmetic")
    points = [
        frontier.make_point(f"{a}{s}", a, None, s, "llm1", {"task_reward": 0.661, "kl": 3.07}, info)
        for a in ("grpo", "cory_shared")
        for s in (0, 1)
    ]
    fig, _ = frontier.draw_frontier(points)
    ax = fig.axes[0]
    means = {c.get_label(): c.lines[0] for c in ax.containers}  # the error-bar markers, one per method · agent
    assert len(means) == 2
    a, b = means.values()
    assert list(a.get_xydata()[0]) == list(b.get_xydata()[0])  # the same place ...
    assert a.get_markersize() != b.get_markersize()  # ... drawn in two sizes, the smaller on top
    rings = [ln for ln in ax.lines if ln.get_label().endswith("front (ringed)")]
    assert len({ln.get_markersize() for ln in rings}) == 2


def test_eta_labels_at_one_place_are_stacked_not_written_over_each_other():
    """Two methods whose means coincide, at different η: their η labels were written at the same offset, one over the
    other. Each label now clears the others; the same η in the same colour at one place is written once."""
    info = figures.RunInfo(task="imdb")
    points = [
        frontier.make_point("a", "ppo", 0.1, 0, "llm1", {"task_reward": 0.60, "kl": 3.0}, info),
        frontier.make_point("b", "cory", 0.3, 0, "llm1", {"task_reward": 0.60, "kl": 3.0}, info),
        frontier.make_point("c", "cory", 0.03, 0, "llm2", {"task_reward": 0.601, "kl": 3.01}, info),
        frontier.make_point("d", "ppo", 0.3, 0, "llm1", {"task_reward": 0.90, "kl": 5.0}, info),
    ]
    fig, _ = frontier.draw_frontier(points)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text() in ("0.1", "0.3", "0.03")]
    assert sorted(t.get_text() for t in labels) == ["0.03", "0.1", "0.3", "0.3"]
    boxes = [t.get_window_extent(fig.canvas.get_renderer()) for t in labels]
    overlapping = [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes))
                   for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]  # fmt: skip
    assert not overlapping
    assert ax.get_legend().get_title().get_text() == "η next to each point"


def test_one_eta_for_every_point_is_said_once_not_written_at_each():
    """The family sweep: every point at η = 0.01, nine identical labels on top of the markers. Said in the legend."""
    points = [
        frontier.make_point(a, a, 0.01, 0, "llm1", {"task_reward": r, "kl": k}, figures.RunInfo(task="arithmetic"))
        for a, r, k in (("ppo", 0.53, 2.2), ("cory", 0.51, 2.3), ("grpo", 0.55, 4.0))
    ]
    fig, _ = frontier.draw_frontier(points)
    ax = fig.axes[0]
    assert not [t for t in ax.texts if t.get_text() == "0.01"]
    assert ax.get_legend().get_title().get_text() == "η = 0.01 at every point"


def test_group_settings_read_as_words_in_the_legend(tmp_path):
    """Legends of `cory-plot curves` were raw overrides (`algorithm=cory,seed=1`)."""
    assert figures.setting_label("algorithm=cory,seed=1") == "CORY, seed 1"
    assert figures.setting_label("algorithm=ppo algorithm.agent.init_kl_coef=0.1") == "PPO, η=0.1"
    assert figures.setting_label("algorithm=cory_cc task.eval_kl_coef=0.3") == "CORY + centralised critic, η_eval=0.3"
    assert figures.setting_label("algorithm.agent.learning_rate=1e-05") == "learning rate 1e-05"
    assert figures.setting_label("all runs") == "all runs"
    groups, _ = pc.group_runs(pc.discover_runs([_sweep(tmp_path / "s")]))
    fig = pc.plot(pc.curves(groups), tmp_path / "fig", groups=pc.describe_groups(groups))["figure"]
    entries = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "CORY · llm1" in entries and "PPO · llm1 (held-out)" in entries and "role swap (CORY)" in entries
    assert not [e for e in entries if "=" in e]


def test_every_algorithm_option_has_a_figure_name():
    options = {p.stem for p in (Path(figures.__file__).parent / "conf" / "algorithm").glob("*.yaml")}
    assert options <= set(figures.ALGORITHM_NAMES), options - set(figures.ALGORITHM_NAMES)
