"""A CORY built on the smoke model that trains every iteration on fixed queries, for the tests of its orchestration
(tests/test_cory.py), of the parts (tests/test_parts.py) and of what the method means (tests/test_meaning.py)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hydra.utils import instantiate

from cory.algorithms.team import Team
from cory.build import build_context
from cory.tasks.toy import ToyTask
from helpers.compose import compose_cfg
from helpers.from_config import task_kwargs

QUERIES = ["bcd", "fgh k", "lm", "npqr"]
MAX_NEW = 3
SMOKE_CORY = ("experiment=smoke", "algorithm=cory")


def make_cory(overrides: tuple[str, ...] = (), reward=None, scored="response", learner=None, **parts) -> Team:
    """A CORY (or any team: `algorithm=<name>` and `algorithm/<part>=<option>` in `overrides`) on the smoke model:
    real agents, unless `learner` builds stubs; the toy task scored by `reward` (texts → scores; default the toy
    config's) on the text `scored` names; `parts` replace built parts (`credit=...`); every iteration trains on
    `QUERIES` with `MAX_NEW` new tokens."""
    given = {o.split("=", 1)[0] for o in overrides}
    defaults = [o for o in (*SMOKE_CORY, "batch_size=8") if o.split("=", 1)[0] not in given]
    cfg = compose_cfg([*defaults, *overrides])
    context = build_context(cfg, Path(tempfile.gettempdir()))
    tokenizer = context.load_model()[1]
    reward = reward or instantiate(cfg.task.reward)
    fields = dict(num_train=8, num_eval=4, scored=scored)
    task = ToyTask(tokenizer, reward=reward, **task_kwargs("toy", SMOKE_CORY, **fields))
    context = dataclasses.replace(context, task=lambda: task)
    built = instantiate(cfg.algorithm, _convert_="all")  # the partial Team with every part built
    kwargs = dict(built.keywords) | {"log_samples": len(QUERIES)} | parts
    if learner is not None:
        kwargs["agent"] = learner
    team = Team(**kwargs, context=context)
    team.team.batch = lambda k: (QUERIES, MAX_NEW)
    return team
