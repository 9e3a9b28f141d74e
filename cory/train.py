"""The single entrypoint: `python -m cory.train [hydra overrides]`.

`main` prepares the command line (`cory.cli`) and hands it to Hydra; `_hydra_main` reports user errors as one
`error:` line; `train(cfg, run_dir, overrides)` does the work and is what tests call. A run folder belongs to
one run (`cory.runs`): a new run never starts in a folder that holds one, and `resume=<folder>` continues the
run there with its own config, changed only where the resume command says so and is allowed to. A requeued SLURM
job continues its own run without being told (`cory.runs.requeue_of`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cory import cli
from cory.errors import USER_ERRORS, ConfigError, entry_point, one_line

# Only what `--help` and tab completion need is imported at the top: torch, transformers, peft, Hydra and the run
# layer load inside the functions that use them, so those answer at once and a Ctrl-C during the imports lands
# inside `main`'s error boundary (`scripts/cli_latency.py` measures it; tests/test_console.py checks no torch).
if TYPE_CHECKING:
    from omegaconf import DictConfig

TRAIN_LOG = "train.log"  # Hydra's job log of `cory.train`, in the run folder: what the run said, timestamped


def train(cfg: DictConfig, run_dir: Path, overrides: Sequence[str] = ()) -> dict:
    """Validate, own the run folder, build task/agents/algorithm/logger, train, evaluate; returns the summary.

    Args:
        cfg: the composed config (`resume=<folder>` set: the run's own config is used instead, see `cory.runs`).
        run_dir: the run folder (a resumed run continues in its own folder, so they must be the same).
        overrides: the command-line overrides this config was composed from, recorded in `starts.jsonl`; on
            resume they are compared with the run's config key by key.
    """
    from omegaconf import OmegaConf, read_write

    from cory import runs, runtime
    from cory.config import validate

    run_dir = Path(run_dir)
    primary = int(os.environ.get("RANK", "0")) == 0  # data-parallel: rank 0 owns the folder
    runs.check_resume_value(cfg.get("resume"))
    resuming = bool(cfg.get("resume"))
    if not resuming and runs.requeue_of(run_dir):  # a requeued SLURM sweep job (submitit) in its fixed folder
        runtime.say(f"[cory] SLURM job {runs.slurm_job()} was requeued: resuming its run in {run_dir}")
        cfg = cfg.copy()
        with read_write(cfg):
            cfg.resume, resuming = str(run_dir), True
    changes: dict = {}
    if resuming:
        cfg, changes, overrides = _resume_config(cfg, run_dir, overrides)
    validate(cfg)  # before anything loads: a bad value costs seconds, not a model load
    with runs.own(run_dir, resuming, primary):
        if resuming and _resume_point(cfg, run_dir) == "finished":
            return runs.read_summary(run_dir)
        if primary and not resuming:
            (run_dir / runs.RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))

        def record_start(iteration: int) -> None:  # once the run is built and its checkpoint loaded
            if primary:
                runs.record_start(run_dir, overrides, changes, iteration)
                for key, (old, new) in changes.items():
                    runtime.say(f"[cory] resume changes {key}: {old} → {new} (recorded in {run_dir / runs.STARTS})")

        return _train(cfg, run_dir, resuming, record_start)


def _train(cfg: DictConfig, run_dir: Path, resuming: bool, record_start: Callable[[int], None]) -> dict:
    """Build the run, restore the checkpoint when resuming, record the start (`record_start(iteration)`), train
    and print the summary."""
    from cory import build, distributed, runtime
    from cory.checkpoints import latest_checkpoint, truncate_lines
    from cory.settings import RunSettings
    from cory.trainer import Trainer

    context = build.build_context(cfg, run_dir)
    algorithm = build.build_algorithm(cfg, context)  # checks its own settings, then loads the model it needs
    info = build.run_info(cfg, algorithm, context, _choice("model"))
    settings = RunSettings.from_config(cfg)
    trainer = Trainer(algorithm, None, run_dir, settings, info, context.device)
    if resuming:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:  # checked whole before anything changes: a refusal leaves the folder as it was
            trainer.load_checkpoint(checkpoint)  # restores run_info too: the run keeps its identity
        if distributed.is_main():  # the one writer; another process truncating later would drop its new rows
            # rows logged after the checkpoint are dropped (all of them without one): they are logged again
            truncate_lines(run_dir / "metrics.jsonl", trainer.metrics_lines)
            truncate_lines(run_dir / "samples.jsonl", trainer.samples_lines)
        where = checkpoint.name if checkpoint is not None else "the start (no checkpoint yet)"
    record_start(trainer.iteration)  # only a start that got this far is one
    # from here on, what the run says is also in its train.log (a refused start leaves the folder as it was)
    with runtime.log_to(run_dir / TRAIN_LOG) if distributed.is_main() else contextlib.nullcontext():
        if resuming:
            runtime.say(f"[cory] resumed {run_dir} from {where} (iteration {trainer.iteration})")
        threads = runtime.match_threads(trainer.checkpoint_threads, context.hardware.threads)
        if threads is not None and distributed.is_main():
            runtime.say(f"[cory] {threads}")
        with runtime.rng_untouched():  # wandb.init may draw random numbers; the run's streams must not move
            trainer.logger = (
                build.make_logger(cfg, run_dir, trainer.run_info, trainer.wandb_run_id)
                if distributed.is_main()
                else build.NullLogger()
            )
        trainer.wandb_run_id = getattr(trainer.logger, "run_id", None)
        try:
            summary = trainer.fit()
            for figure in sorted(run_dir.glob("*.png")):  # the report's figures, mirrored (W&B) at the last iteration
                trainer.logger.log_image(figure.stem, figure, trainer.iteration)
        finally:
            trainer.logger.close()
        if distributed.is_main():
            for line in [f"run folder: {run_dir}", *trainer.report_lines, f"wall time {summary['wall_time_s']:.0f} s"]:
                runtime.say(f"[cory] {line}")
    distributed.close()
    trainer.pass_on_stop_signal()  # a scheduler's own handler (submitit: requeue the job, then exit)
    return summary


def _resume_config(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> tuple[DictConfig, dict, list[str]]:
    """The stopped run's own config with the changes the resume command asks for and is allowed to make.

    `overrides` are the run's original ones followed by the resume command's (`cli.resume_overrides`); the
    latter are the new ones, returned with the changes they make.
    """
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from cory import runs

    folder = Path(cfg.resume)
    if folder.resolve() != run_dir.resolve():
        raise ConfigError(f"resume={folder} continues the run in its own folder, not in {run_dir}")
    original = runs.original_overrides(folder)
    new = [o for o in overrides if o not in original and cli.override_key(o) != "resume"]
    # the targets a user named: the resume command's new overrides, and all of them when the command was the run's
    # own again (a sweep or a requeued job continuing its folder: no `resume=` typed, the recorded ones retyped)
    typed = overrides if not any(cli.override_key(o) == "resume" for o in overrides) else new
    trusted = runs.typed([*typed, *cli.typed_overrides()])
    saved = runs.check_resume(folder, trusted)  # builds only what installed configs or this command set
    changes: dict = {}
    if new:
        original = [o for o in original if cli.override_key(o) not in {cli.override_key(n) for n in new}]
        try:
            composed = [cli.compose(o) for o in (original, original + new)]
            base, requested = (OmegaConf.to_container(c, resolve=True) for c in composed)
        except (HydraException, OmegaConfBaseException) as err:  # e.g. a config group renamed since the run began
            raise ConfigError(f"resume={folder}: its overrides no longer compose ({one_line(err)})") from None
        saved_values = OmegaConf.to_container(saved, resolve=True)
        changes = runs.resume_changes(saved_values, base, requested, named=[cli.override_key(o) for o in new])
        saved = runs.apply_resume_changes(saved, requested, changes, folder)
        saved = runs.plain_config(saved, f"resume={folder}: its config with these changes", trusted)
    saved.resume = str(cfg.resume)
    return saved, changes, new


def _resume_point(cfg: DictConfig, run_dir: Path) -> str:
    """Whether the resumed run has work left: "continue", or "finished" (said, and nothing is touched)."""
    from cory import runs
    from cory.checkpoints import latest_checkpoint, read_state

    checkpoint = latest_checkpoint(run_dir)
    state = read_state(checkpoint) if checkpoint is not None else None
    completed = runs.read_summary(run_dir).get("completed") is True
    done = state["iteration"] if state else None
    action = runs.check_extension(run_dir, cfg.iterations, done, bool(state and state.get("pending_eval")), completed)
    if action == "finished":
        print(
            f"[cory] {run_dir} already completed its {done} iterations; nothing to do. To extend it: "
            f"python -m cory.train resume={run_dir} iterations=<more than {done}>",
            flush=True,
        )
    return action


def _choice(group: str) -> str | None:
    from hydra.core.hydra_config import HydraConfig

    try:
        return HydraConfig.get().runtime.choices.get(group)
    except ValueError:  # called outside Hydra (tests use the compose API)
        return None


def run_reporting_errors(cfg: DictConfig, run_dir: Path, overrides: Sequence[str], job_log: str) -> dict | str:
    """`train`, with every failure meant for the user printed as one `error:` line and returned as a string.

    A failed write (disk full, read-only or unwritable folder) names the path; what was written stays. A run
    refused before it started leaves no folder behind (Hydra's own files in it are removed). Ctrl-C before the
    trainer's own handler is set (loading the model, reading the data) is one line and exit code 130, and a new
    run stopped there leaves no folder either.
    """
    from cory import runs

    try:
        return train(cfg, run_dir, overrides)
    except USER_ERRORS as err:
        message = one_line(err)
    except OSError as err:
        if err.errno not in runs.WRITE_ERRNOS:
            raise
        message = runs.write_error_message(err, run_dir)
    except KeyboardInterrupt:
        runs.remove_if_unused(run_dir, [".hydra", job_log])
        kept = (  # a resume's start-up, or a second Ctrl-C that aborted a run (the first one saves)
            f"the run folder {run_dir} keeps what was written (the last complete checkpoint included); continue "
            f"with `python -m cory.train resume={run_dir}`"
            if runs.holds_run(run_dir)
            else "it stopped before its first iteration and nothing was kept; start the run again"
        )
        print(f"error: interrupted (SIGINT); {kept}", file=sys.stderr, flush=True)
        sys.exit(130)
    print(f"error: {message}", file=sys.stderr, flush=True)
    runs.remove_if_unused(run_dir, [".hydra", job_log])
    return message


def _hydra_main(cfg: DictConfig) -> None:
    """The Hydra app (`main` wraps it in `hydra.main`): one run, or one job of a sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    from cory import callbacks, runs

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    sweep = hc.mode == RunMode.MULTIRUN
    if sweep and callbacks.worker_stopped():  # a joblib worker whose sweep was stopped starts no further job
        runs.remove_if_unused(run_dir, [".hydra", f"{hc.job.name}.log"])
        return
    if sweep and not cfg.get("resume") and runs.holds_run(run_dir) and runs.original_overrides(run_dir) == overrides:
        cfg = cfg.copy()  # the sweep's own command again, into its folder (`cory.cli`): this job continues its run
        with read_write(cfg):
            cfg.resume = str(run_dir)
    out = run_reporting_errors(cfg, run_dir, overrides, f"{hc.job.name}.log")
    if isinstance(out, str):
        if sweep:  # the other jobs still run; `main` reports the failure once the sweep is over
            raise cli.SweepJobError(f"{run_dir}: {out}")
        sys.exit(2)
    if sweep and out.get("stopped_by") and hc.launcher._target_.endswith("BasicLauncher"):
        # jobs run one after another in this process: a signal stops the sweep, not just this job
        print("[cory] the sweep stops here; jobs not started yet were not run", flush=True)
        sys.exit(0)


# Ctrl-C while the command line is prepared or Hydra composes the config, before any run folder is used; later the
# run's own handlers answer it (`run_reporting_errors`, the trainer's signal handler)
@entry_point(on_interrupt="interrupted (SIGINT) before the run began; nothing was kept")
def main() -> None:
    """Prepare the command line (resume, run-folder checks, sweep folder names), then run Hydra; `--help` is ours."""
    if cli.wants_help(sys.argv[1:]):
        print(cli.help_text(cli.prog_name("cory-train", "python -m cory.train")))
        return
    sys.argv = [sys.argv[0], *cli.prepare(sys.argv[1:])]
    try:
        import hydra

        # the absolute config path works in-process; the job is named after this module (`train`: its log train.log)
        app = hydra.main(version_base="1.3", config_path=str(cli.CONF_DIR), config_name="train")(_hydra_main)
        cli.run_hydra(app)
    finally:
        cli.forget_typed_overrides()  # a later in-process `train` call was not typed on this command line


if __name__ == "__main__":
    main()
