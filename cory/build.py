"""Builders: from a composed, validated config to the objects a run is made of, without Hydra's entry point.

`cory.train`, `cory.evaluate`, scripts and tests build through these functions, so none of them imports the
entry point. Every component is a `_target_`: nothing here names an algorithm, a learner or a task.

- `load_model(cfg.model)` → (model, tokenizer), the `model` group's loader;
- `build_backbone(cfg.model, device)` → `cory.policy.Backbone`, the loaded model with how agents attach to it;
- `build_context(cfg, run_dir)` → `RunContext`: settings plus lazy, cached model / backbone / task;
- `build_algorithm(cfg, context)` → the `algorithm` group's target, completed with the context;
- `run_info(cfg, algorithm, context)` → the run's identity; `make_logger(...)` → the `logger` group's target.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from cory import distributed, runtime
from cory.algorithms.base import Algorithm, RunContext
from cory.config import instantiate_target
from cory.metrics import BEST
from cory.policy import HANDLE_KEYS, Backbone, LoraSettings
from cory.settings import HardwareSettings, RunSettings


def load_model(model_cfg: DictConfig):
    """(model, tokenizer) from the `model` config's loader: its `_target_` with every key but `HANDLE_KEYS`.

    transformers' and the Hub's per-file progress bars are off meanwhile (a first run's conversion and every load
    would print several); one line of ours says what was loaded and how long it took."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    node = OmegaConf.to_container(model_cfg, resolve=True)  # resolved first: `${cache_dir}` lives at the top
    start = time.perf_counter()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        # plain containers for the loader's arguments (`config_overrides` reaches a transformers config as is)
        loaded = instantiate_target({k: v for k, v in node.items() if k not in HANDLE_KEYS}, _convert_="all")
    finally:
        hf_logging.enable_progress_bar()
        enable_progress_bars()
    name = node.get("name_or_path") or node["_target_"].rsplit(".", 1)[-1]
    runtime.say(f"[cory] model {name} loaded in {time.perf_counter() - start:.1f} s")
    return loaded


def backbone_from(model_cfg: DictConfig, model, tokenizer, device) -> Backbone:
    """The loaded model and how agents attach to it (`lora`, `add_special_tokens`; absent keys mean full
    fine-tuning and no special tokens)."""
    block = model_cfg.get("lora")
    lora = LoraSettings.from_block(OmegaConf.to_container(block, resolve=True) if block is not None else {})
    return Backbone(model, tokenizer, lora, bool(model_cfg.get("add_special_tokens", False)), device)


def build_backbone(model_cfg: DictConfig, device) -> Backbone:
    """`load_model`, then `backbone_from`."""
    return backbone_from(model_cfg, *load_model(model_cfg), device)


def build_context(cfg: DictConfig, run_dir: Path) -> RunContext:
    """Seed the run, join a launcher's process group (through accelerate: `cory/distributed.py`), and hand out the
    model and task lazily (loaded once, on the algorithm's first request, after it has checked its own settings)."""
    hardware = HardwareSettings.from_config(cfg.hardware)
    runtime.seed_everything(cfg.seed, hardware.deterministic)
    if hardware.keep_freed_memory:
        runtime.keep_freed_memory()
    if hardware.threads is not None:
        torch.set_num_threads(hardware.threads)
    device = distributed.setup(cfg.hardware, runtime.resolve_device(hardware.device))

    @functools.cache
    def model():
        return load_model(cfg.model)

    @functools.cache
    def backbone() -> Backbone:
        return backbone_from(cfg.model, *model(), device)

    @functools.cache
    def task():
        return instantiate_target(cfg.task, tokenizer=model()[1], _convert_="all")

    return RunContext(RunSettings.from_config(cfg), hardware, device, Path(run_dir), model, backbone, task)


def build_algorithm(cfg: DictConfig, context: RunContext) -> Algorithm:
    """The `algorithm` group's target (a `_partial_` node; its nested learner and settings nodes built by Hydra)
    called with the run's context."""
    return instantiate_target(cfg.algorithm, _convert_="all")(context=context)


def run_info(cfg: DictConfig, algorithm: Algorithm, context: RunContext, model_choice: str | None) -> dict[str, Any]:
    """The run's identity: the algorithm's own description, the seed, the task and model, the code's git SHA."""
    return algorithm.describe() | {
        "seed": cfg.seed,
        "task": context.task().name,
        "model": model_choice,
        "git_sha": runtime.git_sha(),
    }


def make_logger(cfg: DictConfig, run_dir: Path, info: dict, run_id: str | None):
    """The `logger` group's target with the run-time arguments. Called directly, not through `instantiate`:
    its `config` argument would clash with `instantiate(config, ...)` and its nested `_target_`s would be built."""
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items() if not k.startswith("_")}
    kwargs["run_dir"] = str(run_dir)
    if "WandbLogger" in cfg.logger._target_:
        from cory.callbacks import run_identity, wandb_group, wandb_tags

        choices, overrides = run_identity(run_dir)  # as first started: a resumed run keeps its group and tags
        described = [f"{k}={info.get(k)}" for k in ("model", "task", "algorithm")]
        kwargs |= dict(
            # filterable in the W&B UI: the group choices (algorithm=cory, experiment=...) and the overrides
            config=OmegaConf.to_container(cfg, resolve=True)
            | {"git_sha": info.get("git_sha"), "choices": choices, "overrides": overrides, "run": info},
            run_id=run_id,
            name=wandb_run_name(info),
            tags=wandb_tags(choices, overrides, described),
            group=wandb_group(cfg, choices),  # a sweep's runs side by side, else an experiment's
            best=BEST,  # the metrics whose best value W&B keeps beside the last
        )
    return get_object(cfg.logger._target_)(**kwargs)


def wandb_run_name(info: dict) -> str:
    """A training run's W&B name, from its identity (`run_info`): `<algorithm>[-kl<η>]-s<seed>`."""
    name = "-".join(str(info[k]) for k in ("algorithm",) if k in info)
    if "kl_coef" in info:
        name += f"-kl{info['kl_coef']}"
    return f"{name}-s{info['seed']}"


class NullLogger:
    """What processes other than rank 0 log to."""

    run_id = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def log_image(self, name: str, path: Path, step: int) -> None:
        pass

    def log_checkpoint(self, checkpoint: Path, step: int) -> None:
        pass

    def close(self) -> None:
        pass
