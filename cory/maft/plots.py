"""`curves.png` of a Multiagent Finetuning run: accuracy, per-agent accuracy and diversity per fine-tuning round.

Reads the run's `metrics.jsonl` (its `maft/eval/...` rows: one per round, round 0 = the base agents) with
`cory.plotting`'s tolerant reader:
1. held-out accuracy ± s.e. of the final-round vote, the round-1 majority and a single sample;
2. each agent's held-out accuracy (genN: round 1, criticN: last round);
3. diversity: the fraction of problems where the agents disagree, and the embedding dissimilarity, per debate round.

Title (what the run is, from its `run_config.yaml` / `summary.json`), legends beside each panel and plain tick labels
follow `cory.figures`.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cory import figures
from cory.loggers import read_metrics
from cory.plotting import series

_ACCURACIES = {
    "accuracy": "debate (final-round vote)",
    "round1_majority_accuracy": "round-1 majority",
    "single_sample_accuracy": "single sample",
}


def plot_maft_curves(metrics_jsonl: Path, out_png: Path, info: figures.RunInfo | None = None) -> None:
    """Write the three-panel figure of `metrics_jsonl` to `out_png` (`info`: the run; default: read beside it)."""
    metrics_jsonl = Path(metrics_jsonl)
    data = series(read_metrics(metrics_jsonl))
    info = info or figures.read_run_info(metrics_jsonl.parent)
    fig = Figure(figsize=(17, 4.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for key, label in _ACCURACIES.items():
        if f"maft/eval/{key}" in data:
            rounds, values = data[f"maft/eval/{key}"]
            errors = data.get(f"maft/eval/{key}_se", (rounds, [0.0] * len(rounds)))[1]
            axes[0].errorbar(
                rounds, values, yerr=errors if len(errors) == len(values) else None, marker="o", capsize=3, label=label
            )
    agents = sorted(
        k.split("/")[2] for k in data if k.startswith("maft/eval/") and k.count("/") == 3 and k.endswith("/accuracy")
    )
    for agent in agents:
        rounds, values = data[f"maft/eval/{agent}/accuracy"]
        axes[1].plot(rounds, values, marker="o", linestyle="--" if agent.startswith("critic") else "-", label=agent)
    for key in sorted(k for k in data if k.startswith(("maft/eval/disagreement", "maft/eval/embedding"))):
        rounds, values = data[key]
        axes[2].plot(rounds, values, marker="o", label=key.rsplit("/", 1)[-1])
    titles = ("held-out accuracy ± s.e.", "per-agent held-out accuracy", "diversity between agents")
    ylabels = ("accuracy (fraction correct)", "accuracy (fraction correct)", "disagreement (fraction) · 1 − cosine")
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("fine-tuning round (0: base agents)")
        ax.xaxis.get_major_locator().set_params(integer=True)  # rounds are whole numbers
        ax.grid(alpha=0.3)
        if ax.has_data():
            figures.outside_legend(ax, fontsize=7)
        else:
            figures.no_data(ax)
    fig.suptitle(figures.title([info], fallback=metrics_jsonl.parent.name))
    figures.save(fig, out_png, dpi=100)
