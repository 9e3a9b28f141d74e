"""The command line around Hydra: checks that must happen before Hydra writes anything, and one-line errors.

`prepare(argv)` runs before Hydra starts:
- `resume=<folder>` becomes `hydra.run.dir=<folder>` (the run continues in place); it is refused with `-m` or
  with an explicit `hydra.run.dir` (a resumed run never moves), and when the folder is not a run folder;
- a new run's folder (`hydra.run.dir`, or the default under `outputs/`) must be creatable and writable, and an
  explicit one must not hold a run already (Hydra would overwrite its `.hydra/` before the run could refuse);
- a sweep that sweeps a key the folder names leave out (`cory/conf/train.yaml`'s `exclude_keys`) gets that key back
  in its job folder names, so two jobs never share a folder;
- a single run's overrides are composed once, so a wrong option or key is one `error:` line;
- a SLURM job that was requeued and runs its command again resumes its own run (`runs.requeue_of`): the folder
  its command names, or its run among the default folders, as if `resume=<folder>` had been typed.

`run_hydra` then runs the app with Hydra's own error reports off, so that a composition error or a failed
sweep job reaches us and is printed as one line (exit code 2) instead of a traceback.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cory import runs
from cory.errors import ConfigError, one_line

CONF_DIR = Path(__file__).resolve().parent / "conf"
DEFAULT_RUNS = Path("outputs/runs")  # where `cory/conf/train.yaml` puts a run's folder when none is given
_typed: list[str] = []  # the overrides this process's command line typed (`prepare`), before any resume is added
_HELP = {"-h", "--help", "--hydra-help", "--version", "--shell-completion", "-sc", "--info", "-i"}


class SweepJobError(Exception):
    """A sweep job failed with a user error (already printed by the job); raised so Hydra marks it failed."""


_PLAIN_PATH = re.compile(r"[\w./~:+-]*", re.ASCII)


def quote_path_override(override: str) -> str:
    """`key=<path>` with the path quoted for Hydra's override grammar when it needs it: any folder a shell can
    pass (a sweep job's `…/iterations=2/seed=0`, spaces, non-ASCII) is one value, not an error."""
    key, value = override.split("=", 1)
    if _PLAIN_PATH.fullmatch(value) or value[:1] in "'\"":
        return override
    quote = "'" if "'" not in value else '"'
    if quote in value:
        raise ConfigError(f"{key}={value}: a path holding both kinds of quotes cannot be passed to Hydra")
    return f"{key}={quote}{value}{quote}"


def unquote(value: str) -> str:
    """A value as Hydra will see it: without the quotes `quote_path_override` (or the user) put around it."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def override_key(override: str) -> str:
    """The dotted key an override sets: `+a.b=1` → `a.b`, `task/reward=x` → `task.reward`, `~a` → `a`."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key.replace("/", ".")


def _parse(args: Sequence[str]):
    """Hydra's own reading of the command line (flags and overrides), or None for help-like commands."""
    if _HELP & set(args):
        return None
    from hydra._internal.utils import get_args_parser  # the parser @hydra.main itself uses

    try:
        return get_args_parser().parse_args(list(args))
    except SystemExit:  # malformed flags: Hydra reports them itself
        return None


def prepare(args: list[str]) -> list[str]:
    """The argv Hydra should see; exits with one `error:` line (code 2) when the command cannot run."""
    args = [quote_path_override(a) if a.startswith(("resume=", "hydra.run.dir=")) else a for a in args]
    parsed = _parse(args)
    if parsed is None:
        return args
    _typed[:] = list(parsed.overrides)
    requeued = _requeued_run(parsed)
    if requeued is not None:  # the same command again, after SLURM requeued the job: continue its run
        print(
            f"[cory] SLURM job {runs.slurm_job()} was requeued (restart {runs.slurm_restart()}): resuming its run "
            f"in {requeued}",
            flush=True,
        )
        args = [a for a in args if not a.startswith("hydra.run.dir=")] + [quote_path_override(f"resume={requeued}")]
        parsed = _parse(args)
    try:
        overrides = list(parsed.overrides)
        values = {override_key(o): unquote(o.split("=", 1)[1]) for o in overrides if "=" in o}
        primary = int(os.environ.get("RANK", "0")) == 0  # data-parallel: rank 0 checks, all ranks follow
        extra = []
        runs.check_resume_value(values.get("resume"))
        if values.get("resume", "null") not in ("null", ""):
            extra = _resume_args(values, parsed.multirun, overrides)
            # Hydra composes the run's own command (so its keys exist) with this one's overrides on top
            flags = [a for a in args if a not in overrides]
            overrides = resume_overrides(Path(values["resume"]), overrides)
            args = flags + overrides
        elif parsed.multirun or _sweep_file(values):
            sweep_dir = Path(values.get("hydra.sweep.dir", "outputs/multiruns"))
            runs.check_writable(sweep_dir, "hydra.sweep.dir")
            if "hydra.sweep.dir" in values and (sweep_dir / "multirun.yaml").exists():
                extra = _continue_sweep(sweep_dir, [o for o in overrides if not _is_hydra_override(o)], primary)
            extra += _exclude_keys_args(overrides)
        elif primary:
            run_dir = Path(values.get("hydra.run.dir", "outputs/runs"))
            runs.check_writable(run_dir, "hydra.run.dir")
            if "hydra.run.dir" in values:
                runs.refuse_if_taken(run_dir, "hydra.run.dir")
        if not parsed.multirun and parsed.cfg is None and not _sweep_file(values) and not _sweeps(overrides):
            check_composes(overrides + extra)
    except ConfigError as err:
        print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)
    return args + extra


def _is_hydra_override(override: str) -> bool:
    return override_key(override).split(".")[0] == "hydra"


def _continue_sweep(sweep_dir: Path, task_overrides: list[str], primary: bool) -> list[str]:
    """A sweep folder given again (`hydra.sweep.dir=`) with the sweep's own overrides continues that sweep: each job
    resumes its run (`cory.train`; a finished one does nothing), a job never started starts. Hydra's record of this
    start goes to `.hydra/resumed/`, leaving each job's first one. Any other sweep there is refused."""
    try:
        recorded = OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task
        recorded = [str(o) for o in recorded]
    except Exception:  # noqa: BLE001 - unreadable, or not Hydra's: not a sweep this command can continue
        recorded = None
    if recorded != task_overrides:
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep"
            + (f" of other overrides ({' '.join(recorded)})" if recorded else "")
            + "; rerun that sweep's own command to continue it, or choose a new folder"
        )
    if primary:
        print(f"[cory] continuing the sweep in {sweep_dir}: finished jobs are kept, stopped ones resume", flush=True)
    return ["hydra.output_subdir=.hydra/resumed"]


def _requeued_run(parsed) -> Path | None:
    """The run folder a restarted SLURM job resumes without being told (`runs.requeue_of`): the folder its command
    names (`hydra.run.dir=`), or its run among the default folders; None for any other command."""
    if parsed.multirun or parsed.cfg is not None or not runs.slurm_job() or runs.slurm_restart() < 1:
        return None
    values = {override_key(o): unquote(o.split("=", 1)[1]) for o in parsed.overrides if "=" in o}
    if values.get("resume", "null") not in ("null", "") or _sweep_file(values):
        return None
    if "hydra.run.dir" in values:
        folder = Path(values["hydra.run.dir"])
        return folder if runs.requeue_of(folder) else None
    return runs.requeued_run_under(DEFAULT_RUNS)


def _sweep_file(values: dict[str, str]) -> bool:
    return values.get("sweep", "null") != "null"


def _sweeps(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []  # reported by the composition check (single run) or by Hydra (sweep)
    return [o for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]


def _resume_args(values: dict[str, str], multirun: bool, overrides: list[str]) -> list[str]:
    folder = values["resume"]
    if multirun:
        raise ConfigError(f"resume={folder}: a resume continues one run; it cannot be part of a -m sweep")
    if "hydra.run.dir" in values:
        raise ConfigError(
            f"resume={folder} continues the run in its own folder; drop hydra.run.dir={values['hydra.run.dir']} "
            f"(to run the experiment elsewhere, start a new run there)"
        )
    if not os.path.isdir(folder):  # checked before Hydra, which would create the folder
        raise ConfigError(f"resume={folder}: no such run folder")
    # checked whole before Hydra writes there or builds its callbacks: what the folder may set, its layout, records
    runs.check_resume(Path(folder), runs.typed(overrides))
    # Hydra's snapshot of this start (the default config + the resume command) must not replace the run's own;
    # `hydra.mode=RUN`: one run, even when its first start named a sweep file (which sets MULTIRUN) in run mode,
    # as `scripts/run_sweep.py` starts each job
    run_dir = quote_path_override(f"hydra.run.dir={os.path.abspath(folder)}")
    return [run_dir, "hydra.output_subdir=.hydra/resumed", "hydra.mode=RUN"]


def typed_overrides() -> list[str]:
    """What this process's command line typed (empty when `cory.train` was not started from one): a `_target_`
    named there is the user's choice, also when a resume or a requeue repeats the run's own recorded overrides."""
    return list(_typed)


def forget_typed_overrides() -> None:
    _typed.clear()


def resume_overrides(folder: Path, overrides: list[str]) -> list[str]:
    """The overrides a resume command composes: the run's first start's, minus the keys given again, then these."""
    given = {override_key(o) for o in overrides}
    return [o for o in runs.original_overrides(folder) if override_key(o) not in given] + overrides


def _exclude_keys_args(overrides: list[str]) -> list[str]:
    """Keys that folder names leave out (seed aside, always in them) but that this sweep varies go back in."""
    excluded = list(OmegaConf.load(CONF_DIR / "train.yaml").hydra.job.config.override_dirname.exclude_keys)
    swept = {o.key_or_group for o in _sweeps(overrides)}
    keep = [k for k in excluded if k == "seed" or k not in swept]
    if keep == excluded:
        return []
    return [f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keep)}]"]


def check_composes(overrides: list[str]) -> None:
    """A wrong option (`task/reward=nope`) or key (`algorithm.agent.lr=1`) as one `error:` line and exit code 2,
    like every other configuration error, instead of Hydra's multi-line report."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        compose([o for o in overrides if not o.startswith("hydra.")])
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err).split(" Config search path:")[0]) from None  # the search path is noise


def compose(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    """The job config `python -m cory.train <overrides>` composes, inside a running Hydra app or outside one;
    `hydra_config`: with Hydra's own node (`hydra.*`: sweeper parameters, folder names)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra_config)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra_config)


def run_hydra(app: Callable[[], None]) -> None:
    """Run the `@hydra.main` app; a composition error or a failed sweep job becomes one `error:` line.

    With `HYDRA_FULL_ERROR=1` Hydra re-raises instead of printing its own report, so the failure reaches here.
    A failed sweep job has printed its own `error:` line already; the sweep's other jobs have run.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except SweepJobError as err:
        print(f"error: a sweep job failed ({one_line(err)}); the other jobs ran", file=sys.stderr, flush=True)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:
        message = one_line(err).split(" Config search path:")[0]
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)
