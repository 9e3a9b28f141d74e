"""A CORY built on the smoke model that trains every iteration on fixed queries, for the tests of its orchestration
(tests/test_cory.py) and of what the method means (tests/test_meaning.py)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hydra.utils import instantiate

from cory.algorithms.cory import CORY
from cory.build import build_context
from cory.tasks.toy import ToyTask
from helpers.compose import compose_cfg
from helpers.from_config import node_kwargs, task_kwargs

QUERIES = ["bcd", "fgh k", "lm", "npqr"]
MAX_NEW = 3
SMOKE_CORY = ("experiment=smoke", "algorithm=cory")


def make_cory(overrides: tuple[str, ...] = (), task_cls: type[ToyTask] = ToyTask, learner=None, **switches) -> CORY:
    """A CORY on the smoke model (real agents, unless `learner` builds stubs): the composed config's switches,
    `switches` replaced; every iteration trains on `QUERIES` with `MAX_NEW` new tokens."""
    cfg = compose_cfg([*SMOKE_CORY, "batch_size=8", *overrides])
    context = build_context(cfg, Path(tempfile.gettempdir()))
    tokenizer = context.load_model()[1]
    task = task_cls(tokenizer, **task_kwargs("toy", SMOKE_CORY, num_train=8, num_eval=4))
    context = dataclasses.replace(context, task=lambda: task)
    kwargs = node_kwargs(cfg.algorithm, drop=("agent",)) | {"log_samples": len(QUERIES)} | switches
    cory = CORY(agent=learner or instantiate(cfg.algorithm.agent), **kwargs, context=context)
    cory.team.batch = lambda k: (QUERIES, MAX_NEW)
    return cory
