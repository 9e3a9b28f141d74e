"""Build classes directly with the values of the composed YAML, the only place their defaults are written.

Constructors carry no defaults for what the configs set (learner hyperparameters, task settings, CORY switches),
so a test that builds one takes every value from `compose_cfg(...)` and overrides only what it is about: a changed
YAML value then reaches the test instead of silently differing from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conftest import compose_cfg
from omegaconf import DictConfig, OmegaConf

from cory.ppo.learner import PPOConfig

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


def algorithm_kwargs(algorithm: str, overrides: Sequence[str] = (), **fields: Any) -> dict[str, Any]:
    """Constructor arguments of `algorithm=<algorithm>` besides task and agents, with `fields` replaced."""
    cfg = compose_cfg([f"algorithm={algorithm}", *overrides])
    kwargs = node_kwargs(cfg.algorithm, drop=("agent",))
    return kwargs | {"generation_batch_size": cfg.hardware.generation_batch_size} | fields
