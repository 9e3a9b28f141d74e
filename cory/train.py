"""The single entrypoint: `python -m cory.train [hydra overrides]` (STYLE.md §3.3 wiring).

`main` is the thin Hydra layer; `train(cfg, run_dir)` does the work and is what tests call.
"""

from __future__ import annotations

import copy
import os
import sys
from functools import partial
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cory import runtime
from cory.config import ConfigError, validate
from cory.hub import AssetUnavailableError
from cory.trainer import CheckpointError, NonFiniteError, RunSettings, Trainer, latest_checkpoint, truncate_lines

RUN_CONFIG = "run_config.yaml"  # the resolved config of the first start; a resumed run reuses it


def build_agent(name: str, *, model, ref_model, tokenizer, cfg: DictConfig, device, seed: int, first: list):
    """A fresh agent: the initial model itself for the first one, a deep copy for the others, so CORY's two
    agents start from identical weights (value heads included: same `value_head_seed`)."""
    from cory.agent import Agent, PPOConfig

    weights = model if not first else copy.deepcopy(model)
    first.append(name)
    return Agent(
        name, weights, ref_model, tokenizer, PPOConfig(**OmegaConf.to_container(cfg.algorithm.agent)),
        seed=seed + len(first) - 1, value_head_seed=seed, device=device,
        autocast_dtype=runtime.autocast_dtype(cfg.hardware.precision),
        forward_batch_size=cfg.hardware.forward_batch_size,
    )


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Validate, build task/agents/algorithm/logger, train, evaluate; returns the run summary."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.get("resume"):
        cfg = _resume_config(cfg, run_dir)
    validate(cfg)
    (run_dir / RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))
    seed = runtime.seed_everything(cfg.seed, cfg.hardware.get("deterministic", False))
    device = runtime.resolve_device(cfg.hardware.device)

    from cory.models import make_reference

    model, tokenizer = instantiate(cfg.model)
    model.to(device)
    ref_model = make_reference(model)
    task = instantiate(cfg.task, tokenizer=tokenizer, _convert_="all")
    make_agent = partial(build_agent, model=model, ref_model=ref_model, tokenizer=tokenizer, cfg=cfg,
                         device=device, seed=seed, first=[])
    algo_cfg = OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k != "agent"])
    algorithm = instantiate(algo_cfg, _convert_="all")(
        task=task, make_agent=make_agent, generation_batch_size=cfg.hardware.generation_batch_size)

    run_info = {"algorithm": cfg.algorithm._target_.rsplit(".", 1)[-1].lower(),
                "kl_coef": cfg.algorithm.agent.init_kl_coef, "seed": cfg.seed, "task": task.name,
                "model": _choice("model"), "git_sha": runtime.git_sha()}
    settings = RunSettings(
        iterations=cfg.iterations, batch_size=cfg.batch_size, seed=cfg.seed, eval_every=cfg.eval_every,
        num_eval=cfg.num_eval, eval_batch_size=cfg.eval_batch_size, save_every=cfg.save_every,
        keep_checkpoints=cfg.keep_checkpoints, max_bad_iterations=cfg.max_bad_iterations, progress=cfg.progress)
    checkpoint = latest_checkpoint(run_dir) if cfg.get("resume") else None
    trainer = Trainer(algorithm, task, logger=None, run_dir=run_dir, settings=settings, run_info=run_info)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
        truncate_lines(run_dir / "metrics.jsonl", trainer.metrics_lines)
        print(f"[cory] resumed {run_dir} from {checkpoint.name} (iteration {trainer.iteration})")
    logger_cfg = dict(run_dir=str(run_dir))
    if "WandbLogger" in cfg.logger._target_:
        logger_cfg |= dict(config=OmegaConf.to_container(cfg, resolve=True) | {"git_sha": run_info["git_sha"]},
                           run_id=trainer.wandb_run_id, name=f"{run_info['algorithm']}-kl{run_info['kl_coef']}"
                           f"-s{cfg.seed}", tags=[f"{g}={_choice(g)}" for g in ("model", "task", "algorithm")])
    trainer.logger = instantiate(cfg.logger, **logger_cfg)
    trainer.wandb_run_id = getattr(trainer.logger, "run_id", None)
    try:
        summary = trainer.fit()
    finally:
        trainer.logger.close()
    from cory.plotting import plot_curves

    plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    _print_summary(summary, run_dir)
    return summary


def _resume_config(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """The stopped run's own config; command-line overrides other than `resume`/`progress` are ignored."""
    saved = Path(cfg.resume) / RUN_CONFIG
    if not saved.exists():
        raise ConfigError(f"resume={cfg.resume}: no {RUN_CONFIG} there; is it a cory run folder?")
    old = OmegaConf.load(saved)
    old.resume, old.progress = cfg.resume, cfg.progress
    return old


def _choice(group: str) -> str | None:
    try:
        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:  # called outside Hydra (tests use the compose API)
        return None


def _print_summary(summary: dict, run_dir: Path) -> None:
    lines = [f"[cory] run folder: {run_dir}"]
    for agent_id, final in summary.get("agents", {}).items():
        before = summary.get("initial", {}).get(agent_id, {})
        lines.append(f"[cory] {agent_id}: held-out task reward {before.get('task_reward', float('nan')):.3f} → "
                     f"{final['task_reward']:.3f}, KL {before.get('kl', float('nan')):.3f} → {final['kl']:.3f}, "
                     f"combined {before.get('combined_reward', float('nan')):.3f} → {final['combined_reward']:.3f}")
    lines.append(f"[cory] wall time {summary['wall_time_s']:.0f} s")
    print("\n".join(lines))


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except (ConfigError, AssetUnavailableError, CheckpointError, NonFiniteError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """`resume=<run folder>` makes Hydra reuse that folder as its run dir, so the run continues in place."""
    for arg in sys.argv[1:]:
        if arg.startswith("resume=") and len(arg) > len("resume=") and arg[len("resume=") :] != "null":
            if not any(a.startswith("hydra.run.dir=") for a in sys.argv):
                sys.argv.append(f"hydra.run.dir={os.path.abspath(arg[len('resume='):])}")
    _hydra_main()


if __name__ == "__main__":
    main()
