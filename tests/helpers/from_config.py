"""Build classes directly with the values of the composed YAML, the only place their defaults are written.

Constructors carry no defaults for what the configs set (learner hyperparameters, task settings, CORY switches),
so a test that builds one takes every value from `compose_cfg(...)` and overrides only what it is about: a changed
YAML value then reaches the test instead of silently differing from it.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cory.ppo.learner import PPOConfig
from helpers.compose import compose_cfg

# The paper's learner block (cory/conf/algorithm/ppo.yaml as the IMDB preset composes it): init β 0.3, 4 epochs, ...
PAPER = ("experiment=imdb_gpt2",)


def node_kwargs(node: DictConfig, drop: Sequence[str] = ()) -> dict[str, Any]:
    """A config node as constructor keyword arguments: resolved, plain Python, without `_target_`-style keys."""
    kwargs = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in kwargs.items() if not k.startswith("_") and k not in drop}


def learner(overrides: Sequence[str] = PAPER, **fields: Any) -> PPOConfig:
    """`PPOConfig` of the config composed with `overrides`, with `fields` replaced."""
    return PPOConfig(**(node_kwargs(compose_cfg(list(overrides)).algorithm.agent) | fields))


def task_kwargs(task: str, overrides: Sequence[str] = ("~experiment",), **fields: Any) -> dict[str, Any]:
    """Constructor arguments of `task=<task>` (its nested `reward` node left out), with `fields` replaced; by
    default the task group's own file, without the default experiment's diff."""
    cfg = compose_cfg([f"task={task}", *overrides])
    return node_kwargs(cfg.task, drop=("reward",)) | fields


def parts(cfg: DictConfig) -> dict[str, Any]:
    """What `learner.build` takes besides the placement, as a run gives it (`cory.algorithms.team.Team`): the
    config's advantage estimator and loss, and whether the agents train their own value heads (its critic)."""
    from hydra.utils import instantiate

    critic = instantiate(cfg.algorithm.critic)
    return {
        "advantage": instantiate(cfg.algorithm.advantage),
        "loss": instantiate(cfg.algorithm.loss),
        "train_value_head": critic.actors_train_values,
    }


def agent_from(cfg: DictConfig, backbone, reference, name: str = "llm1", seed: int = 0):
    """One agent as a run builds it (`cory.algorithms.agents.AgentSet`): the learner node of `cfg` on `backbone`."""
    from hydra.utils import instantiate

    from cory import runtime

    learner = instantiate(cfg.algorithm.agent)
    return learner.build(
        name,
        backbone.policy(name, init_seed=cfg.seed),
        reference,
        backbone.tokenizer,
        seed=seed,
        device=backbone.device,
        autocast_dtype=runtime.autocast_dtype(cfg.hardware.precision),
        forward_batch_size=cfg.hardware.forward_batch_size,
        length_groups=cfg.hardware.get("length_groups", 1),
        add_special_tokens=backbone.add_special_tokens,
        **parts(cfg),
    )


def algorithm_from(
    cfg: DictConfig,
    task: Callable[[Any], Any] | None = None,
    batch: tuple[list[str], int] | None = None,
    run_dir: Path | None = None,
):
    """The algorithm `train` builds from `cfg` (no trainer, no logger), through the same builders.

    Args:
        task: `task(tokenizer) -> Task` replaces the `task` group's object.
        batch: `(queries, max_new_tokens)` every iteration trains on, instead of the run's data schedule.
        run_dir: the run folder the algorithm is given (PPO and CORY write nothing there).
    """
    from cory.build import build_algorithm, build_context

    context = build_context(cfg, run_dir or Path(tempfile.gettempdir()))
    if task is not None:
        built = functools.cache(lambda: task(context.load_model()[1]))
        context = dataclasses.replace(context, task=built)
    algorithm = build_algorithm(cfg, context)
    if batch is not None:
        algorithm.team.batch = lambda k: batch
    return algorithm
