"""Sweep identity in W&B and the end-of-sweep frontier (registered in `cory/conf/train.yaml` under `hydra.callbacks`).

- `run_identity`, `wandb_group`, `wandb_tags`: every run of a sweep lands in one W&B group named after the sweep
  (`sweep.name`, set by each `cory/conf/sweep/*.yaml`; else the experiment), tagged with its config-group choices and
  its overrides. The identity is read from the run's own `.hydra/hydra.yaml` (written at its first start), so a
  resumed run keeps its group and tags.
- `FrontierCallback.on_multirun_end`: after the last job of any `-m` sweep, collect the runs' `summary.json`,
  write `frontier.{png,csv,json}` into the sweep folder and, with `logger=wandb` (any mode but disabled), log
  them to a summary run in the sweep's group (`job_type="summary"`): the per-point table, a scatter chart of
  −KL against task reward and the PNG. Offline, the summary run sits in `<sweep dir>/wandb/` beside the
  sweep's other runs and `wandb sync` uploads it later. A failure here never fails the sweep: one warning line.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cory import frontier
from cory.loggers import resolve_wandb_mode

TAG_MAX_CHARS = 64  # W&B rejects longer tags
# Overrides that say where or how a run ran, not what it is: left out of the tags.
UNTAGGED = ("hydra", "progress", "cache_dir", "resume")


def run_identity(run_dir: str | Path) -> tuple[dict[str, str], list[str]]:
    """The run's config-group choices and command-line overrides, as Hydra recorded them at its first start.

    Read from `run_dir/.hydra/hydra.yaml` (a resumed start writes its own under `.hydra/resumed/`); without that
    file, from the live Hydra config; outside Hydra (the compose API in tests), nothing.
    """
    saved = Path(run_dir) / ".hydra" / "hydra.yaml"
    if saved.is_file():
        hydra_cfg = OmegaConf.load(saved).hydra
    else:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return {}, []
        hydra_cfg = HydraConfig.get()
    choices = {str(k): str(v) for k, v in hydra_cfg.runtime.choices.items() if v is not None}
    return choices, [str(o) for o in hydra_cfg.overrides.task]


def wandb_group(cfg: DictConfig, choices: Mapping[str, str]) -> str | None:
    """The W&B group: `logger.group` when set, else the sweep's name (`sweep.name`), else the experiment."""
    return cfg.logger.get("group") or OmegaConf.select(cfg, "sweep.name") or choices.get("experiment")


def wandb_tags(choices: Mapping[str, str], overrides: list[str], extra: list[str] = ()) -> list[str]:
    """`group=choice` for every config group (Hydra's own `hydra/*` left out), then the overrides that define the
    run (`seed=1`, `algorithm.agent.init_kl_coef=0.01`), then `extra`; unique, each cut to W&B's 64 characters."""
    tags = [f"{group}={choice}" for group, choice in sorted(choices.items()) if not group.startswith("hydra")]
    tags += [o.lstrip("+~") for o in overrides if not o.lstrip("+~").startswith(UNTAGGED)]
    return list(dict.fromkeys(tag[:TAG_MAX_CHARS] for tag in [*tags, *extra]))


def _warn(message: str) -> None:
    print(f"[cory] WARNING: {message}", file=sys.stderr, flush=True)


class FrontierCallback(Callback):
    """Hydra callback: the frontier of a finished multirun, on disk and in W&B (see the module docstring)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            summarise_sweep(Path(str(config.hydra.sweep.dir)), config)
        except Exception as exc:  # noqa: BLE001 - the runs are done and intact; the summary is a convenience
            first = (str(exc).strip().splitlines() or [""])[0]
            _warn(f"sweep summary failed ({type(exc).__name__}: {first}); draw it with scripts/plot_frontier.py")


def summarise_sweep(sweep_dir: Path, cfg: DictConfig) -> dict | None:
    """Write `frontier.{png,csv,json}` into `sweep_dir` and, with `logger=wandb`, log them to a W&B summary run.

    Returns the `cory.frontier.write_frontier` result, or None when no run finished with a final evaluation.
    """
    points = frontier.collect([sweep_dir])
    if not points:
        _warn(f"no finished run with a summary.json under {sweep_dir}; no frontier written")
        return None
    group = wandb_group(cfg, cfg.hydra.runtime.choices)
    result = frontier.write_frontier(points, sweep_dir, title=f"KL-reward frontier: {group or sweep_dir.name}")
    print(frontier.format_table(result["aggregated"], result["fronts"]))
    print(f"[cory] sweep frontier: {', '.join(str(p) for p in result['files'].values())}", flush=True)
    if str(cfg.logger.get("_target_", "")).endswith("WandbLogger"):
        log_frontier_to_wandb(points, result, sweep_dir, cfg.logger, group)
    return result


def log_frontier_to_wandb(
    points: list[dict], result: dict, sweep_dir: Path, logger_cfg: DictConfig, group: str | None
) -> None:
    """A `job_type="summary"` run in the sweep's group holding the per-point table, the scatter chart of
    (task reward, −KL) over it, the seed-mean table and the frontier PNG. Skipped when W&B is disabled."""
    mode = resolve_wandb_mode(logger_cfg.get("mode"))
    if mode == "disabled":
        return
    import wandb

    run = wandb.init(
        dir=str(sweep_dir),
        project=logger_cfg.get("project"),
        entity=logger_cfg.get("entity"),
        group=group,
        job_type="summary",
        name=f"{group}-frontier" if group else "frontier",
        tags=["summary"],
        config={"sweep_dir": str(sweep_dir.resolve()), "runs": len({p["run"] for p in points})},
        mode=mode,
        reinit="finish_previous",
        settings=wandb.Settings(init_timeout=20.0),
    )
    try:
        table = wandb.Table(columns=list(frontier.COLUMNS), data=frontier.table_rows(points))
        columns = ["algorithm", "kl_coef", "agent", "n", *frontier.METRICS, *(f"{m}_std" for m in frontier.METRICS)]
        means = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in result["aggregated"]])
        run.log(
            {
                "frontier/points": table,
                "frontier/scatter": wandb.plot.scatter(table, "task_reward", "neg_kl", title="−KL vs task reward"),
                "frontier/seed_means": means,
                "frontier/png": wandb.Image(str(result["files"]["png"])),
            }
        )
    finally:
        run.finish()
