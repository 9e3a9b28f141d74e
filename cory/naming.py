"""Run folder names: the OmegaConf resolvers `cory/conf/train.yaml` uses, registered when `cory` is imported.

- `cory.uniq`: a short suffix that makes each start's folder unique (cached, so every job of one sweep and
  every process of one data-parallel launch gets the same one);
- `cory.sweep_name`: the folder a sweep's jobs share, named after the `sweep=` choice, else the experiment
  (Hydra cannot resolve `${hydra:...}` where it builds the sweep folder, but a plain interpolation works);
- `cory.job_subdir`: a sweep job's folder, its semantic overrides then `seed=<n>`, so it reads like a table row.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from omegaconf import OmegaConf

_MAX_DIRNAME = 160  # a sweep job's folder name longer than this is shortened with a hash (filesystems cap at 255)


def uniq() -> str:
    """A short suffix that makes a start's folder unique. Processes of one data-parallel launch (torchrun,
    accelerate) share it: it is derived from the rendezvous they share; otherwise it is random."""
    shared = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    if os.environ.get("LOCAL_RANK") is not None and any(shared):
        return hashlib.sha256("|".join(shared).encode()).hexdigest()[:6]
    return os.urandom(3).hex()


def sweep_name(sweep: str | None, experiment: str | None) -> str:
    """The folder a sweep's jobs share under `outputs/multiruns`: the `sweep=` choice, else the experiment."""
    return str(sweep or experiment or "sweep")


def job_subdir(override_dirname: str, seed: Any) -> str:
    """`<semantic overrides>/seed=<n>` (just `seed=<n>` without any), so a sweep folder reads like its table.

    A `/` inside an override (`task/reward=tfidf`, a path value) would nest folders, so it becomes `_`.
    """
    name = str(override_dirname or "").replace("/", "_")
    if len(name) > _MAX_DIRNAME:
        name = f"{name[: _MAX_DIRNAME - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return f"{name}/seed={seed}" if name else f"seed={seed}"


def register_resolvers() -> None:
    """Register the resolvers (idempotent). `cory.uniq` is cached: Hydra copies a sweep's resolver cache into
    every job's config, pickled or not, so the master process and its jobs agree on the suffix."""
    if not OmegaConf.has_resolver("cory.uniq"):
        OmegaConf.register_new_resolver("cory.uniq", uniq, use_cache=True)
        OmegaConf.register_new_resolver("cory.sweep_name", sweep_name)
        OmegaConf.register_new_resolver("cory.job_subdir", job_subdir)


# Episodes whose agents exchange roles by default (CORY's pioneer and observer, a chain): a run of theirs is named
# after its schedule only when it is another one. Every other episode's natural schedule is fixed roles.
ROLE_SWAPPING_EPISODES = ("cory", "cory_chain3")


def team_name(
    episode: str,
    roles: int,
    critic: str,
    advantage: str,
    schedule: str,
    layout: str,
    credit: str,
    per_role: bool = False,
    sees: str | None = None,
) -> str:
    """The name of a policy-gradient team in summaries, W&B and figures, from its parts' option names
    (`cory/algorithms/team.py`): the episode's own name (`ppo`, `cory`, `team3`, …), `_cc` with a centralised critic,
    the advantage estimator when it is not GAE (with one role it replaces `ppo`: `grpo`, `rloo`), with several roles
    the layout and the schedule when they are not the episode's own (`cory_interleaved`, `cory_shared`,
    `cory_lora_per_role`), `_per_role` when the estimator normalises each role apart (`cory_shared_per_role`), the
    credit rule when it is not the collective reward (`cory_counterfactual`), and which earlier answers a chain's
    later roles see when it is not all of them (`sees`: given for three or more roles with knowledge transfer, where
    `latest` and `all` differ; `cory_chain3_sees_latest`)."""
    name = episode + ("_cc" if critic == "centralized" else "")
    if advantage != "gae":
        name = advantage if roles == 1 else f"{name}_{advantage}"
    if roles > 1:
        home = "role_swap" if episode in ROLE_SWAPPING_EPISODES else "simultaneous"
        if layout != "separate":
            name += f"_{layout}" + ("" if schedule == "simultaneous" else f"_{schedule}")
        elif schedule != home:
            name += f"_{schedule}"
    if per_role and roles > 1:
        name += "_per_role"
    if credit != "collective":
        name += f"_{credit}"
    if sees is not None and roles > 2 and sees != "all":
        name += f"_sees_{sees}"
    return name
