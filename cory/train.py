"""The single entrypoint: `python -m cory.train [hydra overrides]` (STYLE.md §3.3 wiring).

`main` is the thin Hydra layer; `train(cfg, run_dir)` does the work and is what tests call.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from cory import distributed, runtime
from cory.config import ConfigError, validate
from cory.hub import AssetUnavailableError
from cory.trainer import CheckpointError, NonFiniteError, RunSettings, Trainer, latest_checkpoint, truncate_lines

RUN_CONFIG = "run_config.yaml"  # the resolved config of the first start; a resumed run reuses it
# Errors whose message is written for the user: `main` prints them as one `error:` line and exits with code 2.
USER_ERRORS = (ConfigError, AssetUnavailableError, CheckpointError, NonFiniteError)

if TYPE_CHECKING:
    from cory.policy import Backbone


def load_model(model_cfg: DictConfig):
    """(model, tokenizer) from the `model` config's loader: its `_target_` with every key but `HANDLE_KEYS`."""
    from cory.policy import HANDLE_KEYS

    node = OmegaConf.to_container(model_cfg, resolve=True)  # resolved first: `${cache_dir}` lives at the top
    return _instantiate({k: v for k, v in node.items() if k not in HANDLE_KEYS})


def build_backbone(model_cfg: DictConfig, device) -> Backbone:
    """The `model` config: the loaded model and how agents attach to it (`lora`, `add_special_tokens`; absent
    keys mean full fine-tuning and no special tokens)."""
    from cory.policy import Backbone, LoraSettings

    model, tokenizer = load_model(model_cfg)
    block = model_cfg.get("lora")
    lora = LoraSettings.from_block(OmegaConf.to_container(block, resolve=True) if block is not None else {})
    return Backbone(model, tokenizer, lora, bool(model_cfg.get("add_special_tokens", False)), device)


def build_agent(name: str, *, backbone: Backbone, reference, cfg: DictConfig, device, seed: int):
    """A fresh agent on `backbone`: its own full copy or LoRA adapter, value head, optimiser and KL controller.
    Initial weights are drawn from `cfg.seed` alone (the same on every rank), so CORY's two agents start
    identical; each agent's minibatch permutations come from its own stream `seed + index`."""
    from cory.agent import Agent, PPOConfig

    index = len(backbone.handles)
    return Agent(
        name,
        backbone.policy(name, init_seed=cfg.seed),
        reference,
        backbone.tokenizer,
        PPOConfig(**OmegaConf.to_container(cfg.algorithm.agent)),
        seed=seed + index,
        device=device,
        autocast_dtype=runtime.autocast_dtype(cfg.hardware.precision),
        forward_batch_size=cfg.hardware.forward_batch_size,
        add_special_tokens=backbone.add_special_tokens,
    )


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Validate, build task/agents/algorithm/logger, train, evaluate; returns the run summary."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resuming = bool(cfg.get("resume"))
    if resuming:
        cfg = _resume_config(cfg, run_dir)
    validate(cfg)  # before anything loads: a bad value costs seconds, not a model load
    if not resuming:
        (run_dir / RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))
    seed = runtime.seed_everything(cfg.seed, cfg.hardware.get("deterministic", False))
    device = distributed.init_from_env(runtime.resolve_device(cfg.hardware.device))  # accelerate/torchrun

    backbone = build_backbone(cfg.model, device)  # the weights are loaded once
    reference = backbone.reference()  # π0: a frozen copy, or the LoRA base with adapters disabled
    task = _instantiate(cfg.task, tokenizer=backbone.tokenizer, _convert_="all")
    make_agent = partial(build_agent, backbone=backbone, reference=reference, cfg=cfg, device=device, seed=seed)
    algo_cfg = OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k != "agent"])
    algorithm = _instantiate(algo_cfg, _convert_="all")(
        task=task, make_agent=make_agent, generation_batch_size=cfg.hardware.generation_batch_size
    )

    run_info = {
        "algorithm": cfg.algorithm._target_.rsplit(".", 1)[-1].lower(),
        "kl_coef": cfg.algorithm.agent.init_kl_coef,
        "seed": cfg.seed,
        "task": task.name,
        "model": _choice("model"),
        "git_sha": runtime.git_sha(),
    }
    settings = RunSettings(
        iterations=cfg.iterations,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        eval_every=cfg.eval_every,
        num_eval=cfg.num_eval,
        num_eval_final=cfg.get("num_eval_final", cfg.num_eval),
        eval_batch_size=cfg.eval_batch_size,
        save_every=cfg.save_every,
        keep_checkpoints=cfg.keep_checkpoints,
        max_bad_iterations=cfg.max_bad_iterations,
        progress=cfg.progress,
    )
    trainer = Trainer(algorithm, task, logger=None, run_dir=run_dir, settings=settings, run_info=run_info)
    if resuming:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            trainer.load_checkpoint(checkpoint)  # restores run_info too: the run keeps its identity
        # rows logged after the checkpoint are dropped (all of them without one): they are logged again
        truncate_lines(run_dir / "metrics.jsonl", trainer.metrics_lines)
        truncate_lines(run_dir / "samples.jsonl", trainer.samples_lines)
        where = checkpoint.name if checkpoint is not None else "the start (no checkpoint yet)"
        print(f"[cory] resumed {run_dir} from {where} (iteration {trainer.iteration})", flush=True)
    with runtime.rng_untouched():  # wandb.init may draw random numbers; the run's streams must not move
        trainer.logger = (
            _make_logger(cfg, run_dir, trainer.run_info, trainer.wandb_run_id)
            if distributed.is_main()
            else NullLogger()
        )
    trainer.wandb_run_id = getattr(trainer.logger, "run_id", None)
    try:
        summary = trainer.fit()
    finally:
        trainer.logger.close()
    if distributed.is_main():
        from cory.plotting import plot_curves

        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
        _print_summary(summary, run_dir)
    distributed.close()
    return summary


class NullLogger:
    """What processes other than rank 0 log to."""

    run_id = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def close(self) -> None:
        pass


def _instantiate(node: DictConfig, **kwargs):
    """`hydra.utils.instantiate`, re-raising our one-line user errors that Hydra wraps in its own exception."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, USER_ERRORS):
            raise err.__cause__ from None
        raise


def _make_logger(cfg: DictConfig, run_dir: Path, run_info: dict, run_id: str | None):
    """The `logger` group's target with the run-time arguments. Called directly, not through `instantiate`:
    its `config` argument would clash with `instantiate(config, ...)` and its nested `_target_`s would be built."""
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items() if not k.startswith("_")}
    kwargs["run_dir"] = str(run_dir)
    if "WandbLogger" in cfg.logger._target_:
        kwargs |= dict(
            config=OmegaConf.to_container(cfg, resolve=True) | {"git_sha": run_info["git_sha"]},
            run_id=run_id,
            name=f"{run_info['algorithm']}-kl{run_info['kl_coef']}-s{run_info['seed']}",
            tags=[f"{k}={run_info.get(k)}" for k in ("model", "task", "algorithm")],
        )
        kwargs["group"] = kwargs.get("group") or _choice("experiment")  # runs of one experiment side by side
    return get_object(cfg.logger._target_)(**kwargs)


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
        lines.append(
            f"[cory] {agent_id}: held-out task reward {before.get('task_reward', float('nan')):.3f} → "
            f"{final['task_reward']:.3f}, KL {before.get('kl', float('nan')):.3f} → {final['kl']:.3f}, "
            f"combined {before.get('combined_reward', float('nan')):.3f} → {final['combined_reward']:.3f}"
        )
    lines.append(f"[cory] wall time {summary['wall_time_s']:.0f} s")
    print("\n".join(lines))


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except USER_ERRORS as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr, flush=True)  # one line, no traceback
        sys.exit(2)


def main() -> None:
    """`resume=<run folder>` makes Hydra reuse that folder as its run dir, so the run continues in place."""
    for arg in sys.argv[1:]:
        folder = arg[len("resume=") :] if arg.startswith("resume=") else ""
        if folder and folder != "null":
            if not os.path.isdir(folder):  # checked before Hydra, which would create the folder
                print(f"error: resume={folder}: no such run folder", file=sys.stderr)
                sys.exit(2)
            if not any(a.startswith("hydra.run.dir=") for a in sys.argv):
                sys.argv.append(f"hydra.run.dir={os.path.abspath(folder)}")
            # Hydra's snapshot of this start (the default config + `resume=`) must not replace the run's own
            sys.argv.append("hydra.output_subdir=.hydra/resumed")
    _check_composes(sys.argv[1:])
    _hydra_main()


def _check_composes(overrides: list[str]) -> None:
    """A wrong option (`task/reward=nope`) or key (`algorithm.agent.lr=1`) as one `error:` line and exit code 2,
    like every other configuration error, instead of Hydra's multi-line report. Single runs only: flags
    (`--cfg`, `-m` sweeps) go straight to Hydra."""
    if any(arg.startswith("-") for arg in overrides):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(Path(__file__).resolve().parents[1] / "conf")):
            compose("train", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        message = " ".join(str(err).split()).split(" Config search path:")[0]  # the search path is noise here
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
