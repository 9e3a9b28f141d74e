"""The algorithm-agnostic loop, read as the `Algorithm` protocol's docstring: step, evaluate, save.

    evaluate (the one before training, or the one a stop deferred)
    for each iteration k:
        step k                → log its metrics and samples, check the weights are finite
        evaluate when due     → log the held-out metrics and tables
        save when due         → checkpoints/iter_<k+1>, written aside and renamed
    report                    → summary.json, the console's last lines

It knows an algorithm only through `cory.algorithms.base.Algorithm`: it never reads agents, learners or their
hyperparameters, and never branches on which algorithm runs. Everything random is either derived from
(seed, iteration) by the algorithm or saved in the checkpoint (the global RNGs here, the algorithm's own streams in
its `save`), so a resumed run continues exactly. Loading a checkpoint checks every file and every weight before the
run trusts it.

How a run stops is `cory.stopping`'s: on a stop signal the run saves the last completed iteration within seconds;
an iteration still generating or scoring is dropped, together with its draws from the global RNGs, and the resumed
run redoes it; one already in its update finishes first, unless `snapshot_updates=true`: then the state after the
completed iterations is written aside before each iteration, the whole iteration may be dropped, and that copy
becomes the checkpoint. An evaluation in progress is dropped too; the checkpoint records it as pending and the
resumed run does it first. Weights that turn non-finite stop the run before they can be saved.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from cory import distributed, engines, preemption, runtime
from cory.algorithms.base import Algorithm
from cory.checkpoints import (
    ALGORITHM_DIR,
    CHECKPOINT_FORMAT,
    install_checkpoint,
    latest_checkpoint,
    load_torch_rng,
    read_state,
    verify_checksums,
    write_checkpoint,
)
from cory.errors import CheckpointError, NonFiniteError
from cory.loggers import JsonlLogger, read_metrics
from cory.metrics import MEMORY_PEAK_MB, NONFINITE_ITERATIONS, TIME_ITERATION
from cory.settings import RunSettings
from cory.stopping import Snapshots, StopSignals, restore_rng_if_abandoned

# torch's message when a sampling distribution or a kernel meets inf/NaN (e.g. weights blown up by a huge step)
_NONFINITE_RUNTIME = re.compile(r"\b(inf|nan)\b", re.IGNORECASE)


class Trainer:
    """Runs `algorithm` for `settings.iterations` iterations in `run_dir`, logging through `logger`.

    Args:
        algorithm: anything with the `Algorithm` protocol.
        logger: the `MetricLogger` (set after a resume has restored the W&B run id; see `cory.train`).
        run_dir: the run folder (checkpoints, summary.json; the logger writes metrics.jsonl there).
        settings: run-level keys.
        run_info: the run's identity (the algorithm's `describe()`, task, model, git SHA): summary and W&B.
        device: where peak memory is measured.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        logger,
        run_dir: Path,
        settings: RunSettings,
        run_info: dict,
        device: torch.device,
    ) -> None:
        self.algorithm, self.logger, self.run_dir = algorithm, logger, Path(run_dir)
        self.s, self.run_info, self.device = settings, run_info, device
        self.iteration = 0  # number of completed iterations
        self.pending_eval = True  # an evaluation owed at `iteration` (a fresh run owes the one before training)
        self.bad_streak = 0
        self.nonfinite_iterations = 0
        self.metrics_lines = 0  # lines written to metrics.jsonl / samples.jsonl: a resume truncates to these
        self.samples_lines = 0
        snapshots = settings.snapshot_updates and distributed.world_size() == 1  # several processes never abandon
        in_progress = (
            "the iteration in progress is dropped and redone on resume"
            if snapshots
            else "one still generating is dropped and redone on resume; one in its update finishes first"
        )
        self.signals = StopSignals(in_progress)
        self.snapshots = Snapshots(settings.snapshot_dir, self.run_dir / "checkpoints") if snapshots else None
        self.wandb_run_id = getattr(logger, "run_id", None)
        self.earlier_wall_s = 0.0  # wall time of the earlier starts, up to the checkpoint this one resumed from
        self.checkpoint_threads: int | None = None  # torch threads of the checkpoint this start resumed from
        self._start_time = time.perf_counter()
        self._eval_headline: dict[str, float] = {}
        self.report_lines: list[str] = []  # the algorithm's report, for the console once the run ends

    def _plan(self) -> str:
        s, info = self.s, self.run_info
        what = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("git_sha", "seed") and v is not None)
        evaluation = f"every {s.eval_every} iterations" if s.eval_every else "before training and at the end"
        saving = "at the end" if s.save_final else "on signals only"
        saving = f"every {s.save_every} iterations" if s.save_every else saving
        return (
            f"{what}; seed {s.seed}; iterations {self.iteration} → {s.iterations}, batch {s.batch_size}; "
            f"evaluation {evaluation}; checkpoints {saving}"
        )

    # ------------------------------------------------------------------------------------------------ loop
    @property
    def stopped_by(self) -> str | None:
        """The signal that stopped the run (SIGTERM, SIGINT, SIGUSR1, ...), or None."""
        return self.signals.stopped_by

    def fit(self) -> dict:
        self._start_time = time.perf_counter()
        with self.signals.installed():
            try:
                self._loop()
            finally:
                if self.snapshots is not None:
                    self.snapshots.clear()
        summary = self._summary(time.perf_counter() - self._start_time)
        if distributed.world_size() > 1:  # every process must hold the same weights after data-parallel updates
            summary["world_size"] = distributed.world_size()
            if not distributed.sharded_weights():  # ZeRO-3: each process holds its own shard, by design
                summary["weights_in_sync"] = distributed.weights_in_sync([t for _, t in self.algorithm.parameters()])
        if distributed.is_main():
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _loop(self) -> None:
        """The iterations from the current one to the last: step, evaluate, save; or stop on a signal."""
        stopping = self.signals.should_stop
        bar = tqdm(
            range(self.iteration, self.s.iterations),
            initial=self.iteration,
            total=self.s.iterations,
            disable=not self.s.progress,
            dynamic_ncols=True,
            desc=self.run_info.get("algorithm", "train"),
        )
        runtime.say(f"[cory] run folder: {self.run_dir}")
        runtime.say(f"[cory] plan: {self._plan()}")
        try:
            self._run_pending_eval()  # before any update, or the one a signal deferred to this resume
            for k in bar:
                if stopping():  # the signal came before this iteration (in an evaluation, or it was
                    self._stop_before(k, dropped=False)  # never abandonable): save what the run has
                    break
                bad = self._iteration(k, bar)
                runtime.release_freed_memory()  # the heap kept for the iteration's reuse goes back (keep_freed_memory)
                if bad is None:  # a stop signal dropped iteration k before it changed anything
                    self._stop_before(k, dropped=True)
                    break
                self.iteration = k + 1
                last = self.iteration == self.s.iterations
                self.pending_eval = last or bool(self.s.eval_every and self.iteration % self.s.eval_every == 0)
                if self.pending_eval and not stopping():  # on a signal the checkpoint comes first; the
                    self._run_pending_eval()  # resume evaluates
                stop = stopping()
                if bad and self.bad_streak >= self.s.max_bad_iterations:
                    raise NonFiniteError(
                        f"{self.bad_streak} consecutive iterations had a non-finite loss, reward or KL "
                        f"(max_bad_iterations={self.s.max_bad_iterations}, last: iteration {k + 1}); stopping. "
                        f"{self._last_good()} Start a new run with a lower learning rate, or check the reward."
                    )
                due = self.s.save_every and self.iteration % self.s.save_every == 0
                final = last and (self.s.save_every or self.s.save_final)
                # a bad iteration is never checkpointed: resuming restarts from the last good one
                if not bad and (due or final or stop):
                    self.save_checkpoint()
                if stop:
                    self._print_stopped(saved=not bad)
                    break
        finally:
            bar.close()

    def _iteration(self, k: int, bar: tqdm) -> bool | None:
        """One training iteration: step, metrics, log, weight check. Returns whether it was non-finite, or None
        when a stop signal dropped it (`cory.preemption`): nothing logged, the global RNGs as they were."""
        t0 = time.perf_counter()
        droppable = self.snapshots is not None  # with a copy of the state before it, the iteration may be dropped
        if droppable:
            self.snapshots.take(lambda path: write_checkpoint(path, self.algorithm.save, self._state(), 1, False))
        with (
            self._nonfinite_guard(f"iteration {k + 1}"),
            restore_rng_if_abandoned() as abandoned,
            preemption.abandonable() if droppable else contextlib.nullcontext(),
        ):
            out = self.algorithm.step(k)
        if abandoned.happened:
            return None
        metrics = out.metrics | {
            TIME_ITERATION: time.perf_counter() - t0,
            MEMORY_PEAK_MB: runtime.peak_memory_mb(self.device),
        }
        # several processes count an iteration bad when any found it so: a bad one is never checkpointed, and the
        # checkpoint is collective
        nonfinite = out.nonfinite if distributed.world_size() == 1 else any(distributed.every(out.nonfinite))
        self.bad_streak = self.bad_streak + 1 if nonfinite else 0
        self.nonfinite_iterations += int(nonfinite)
        metrics[NONFINITE_ITERATIONS] = float(self.nonfinite_iterations)
        metrics = distributed.mean_metrics(metrics)  # data parallel: rank 0 logs the means over processes
        # logged at the number of completed iterations, k + 1: the console's "iteration k+1/N", the checkpoint
        # iter_<k+1> and the evaluation after it share that step (docs/metrics.md, "Steps")
        self._log(metrics, step=k + 1, samples=out.samples)
        self._check_weights(k)
        bar.set_postfix({key: f"{v:.3f}" for key, v in out.headline.items()}, refresh=False)
        numbers = " ".join(f"{key} {v:.3f}" for key, v in out.headline.items())
        flag = " (non-finite: update skipped)" if nonfinite else ""
        line = f"[cory] iteration {k + 1}/{self.s.iterations}: {numbers}{flag} ({metrics[TIME_ITERATION]:.1f} s)"
        runtime.say(line, console=not self.s.progress)  # with a progress bar, the bar shows it; train.log keeps it
        return nonfinite

    def _run_pending_eval(self) -> None:
        if self.pending_eval:  # the first and the last evaluation are the full ones (`num_eval_final`)
            metrics = self.evaluate(final=self.iteration in (0, self.s.iterations))
            runtime.release_freed_memory()
            if metrics is not None:  # None: a signal interrupted it; it stays pending
                self._log(metrics, step=self.iteration)
                self.pending_eval = False
                shown = " ".join(f"{k} {v:.3f}" for k, v in self._eval_headline.items())
                if distributed.is_main():  # the one that evaluated
                    runtime.say(f"[cory] evaluation after {self.iteration} iterations: {shown}")

    def _stop_before(self, k: int, dropped: bool) -> None:
        """Stopped by a signal before iteration k changed anything (`dropped`: it had begun): checkpoint the
        completed iterations, unless the latest checkpoint holds exactly them already, none was done, or the last
        one was non-finite (a bad iteration is never checkpointed)."""
        latest = latest_checkpoint(self.run_dir)
        have = (
            latest is not None
            and latest.name == f"iter_{self.iteration:06d}"
            and read_state(latest)["metrics_lines"] == self.metrics_lines
        )
        saved = not have and self.iteration > 0 and self.bad_streak == 0
        saved = distributed.every(saved)[0]  # rank 0's view of the checkpoints it wrote: saving is collective
        snapshot = self.snapshots.path if self.snapshots is not None else None
        if dropped and snapshot is not None:  # the step may have stopped half-way through its update
            if saved:  # the snapshot is the state after the completed iterations: it becomes their checkpoint
                install_checkpoint(snapshot, self._checkpoint_path(), self.s.keep_checkpoints)
            earlier = self.earlier_wall_s  # this start's time is counted by `fit`, not again from the snapshot
            self.load_checkpoint(snapshot)  # the weights in memory too, for whoever uses them after `fit`
            self.earlier_wall_s = earlier
        elif saved:
            self.save_checkpoint()
        note = f" (iteration {k + 1} was dropped; the resume redoes it)" if dropped else ""
        self._print_stopped(saved=saved, note=note)

    def _print_stopped(self, saved: bool, note: str = "") -> None:
        what = "checkpoint saved." if saved else f"no new checkpoint. {self._last_good()}"
        runtime.say(
            f"[cory] stopped after iteration {self.iteration} on a signal{note}; {what} "
            f"Resume with: python -m cory.train resume={self.run_dir}"
        )

    def _last_good(self) -> str:
        """Where a stopped run can be resumed from, said only when it is true."""
        latest = latest_checkpoint(self.run_dir)
        if latest is None:
            return "No checkpoint was written before this point (a resume starts over)."
        return f"The last good checkpoint, {latest}, is intact."

    def evaluate(self, final: bool = False) -> dict[str, float] | None:
        """The algorithm's held-out evaluation after `iteration` iterations, its tables written once it is
        complete; None when a signal arrived meanwhile (the evaluation stays owed)."""
        # rank 0 evaluates and logs; the others go on to the next iteration, except under ZeRO and FSDP: a sharded
        # forward is collective (ZeRO-3, FSDP), and an engine starts at its first use, which may be this evaluation
        # (ZeRO-2 too: `deepspeed.initialize` is collective)
        if not (distributed.is_main() or distributed.sharded()):
            return {}
        with (
            self._nonfinite_guard(f"the evaluation at iteration {self.iteration}"),
            restore_rng_if_abandoned() as abandoned,
        ):
            # under ZeRO and FSDP every process evaluates, in step: each stops between parts only when all do
            signals = self.signals
            stopped = signals.should_stop if distributed.sharded() else lambda: signals.requested
            out = self.algorithm.evaluate(self.iteration, final, stopped)
            if out is None:  # stopped between its parts: it stays owed, and what it drew is put back
                raise preemption.Abandoned
        if abandoned.happened:
            return None
        if not distributed.is_main():  # it took part; rank 0 logs
            return {}
        self._eval_headline = out.headline
        for name, rows in out.tables:
            self.logger.log_table(name, rows, self.iteration)
            self.samples_lines += len(rows)
        return out.metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write `checkpoints/iter_<k>` atomically and keep the last `keep_checkpoints`."""
        final = self._checkpoint_path()
        # each process's own RNG streams (they differ: seed + rank), so that every process resumes exactly
        streams = distributed.every((runtime.rng_state(), runtime.torch_rng_states()))
        if distributed.is_main():  # weights are identical on every process: rank 0 writes them
            state = self._state() | ({"rng_by_rank": [r for r, _ in streams]} if len(streams) > 1 else {})
            torch_rng = {f"rank{i}/{k}": t for i, (_, ts) in enumerate(streams) for k, t in ts.items()}
            write_checkpoint(
                final,
                self.algorithm.save,
                state,
                self.s.keep_checkpoints,
                torch_rng=torch_rng if len(streams) > 1 else None,
            )
            if not self.signals.requested:  # a stopping run exits at once; its next start's checkpoints go to W&B
                self.logger.log_checkpoint(final, self.iteration)
        elif distributed.sharded():  # ZeRO: the Adam state is in pieces, every process takes part in gathering it
            with tempfile.TemporaryDirectory() as scratch:  # what another process writes is not kept
                self.algorithm.save(Path(scratch))
        return final

    def _checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / f"iter_{self.iteration:06d}"

    def _state(self) -> dict:
        """`trainer.json` of a checkpoint taken now."""
        return {
            "format": CHECKPOINT_FORMAT,
            "iteration": self.iteration,
            "rng": runtime.rng_state(),
            "bad_streak": self.bad_streak,
            "nonfinite_iterations": self.nonfinite_iterations,
            "metrics_lines": self.metrics_lines,
            "samples_lines": self.samples_lines,
            "wandb_run_id": self.wandb_run_id,
            "run_info": self.run_info,
            "pending_eval": self.pending_eval,
            "wall_time_s": self.earlier_wall_s + time.perf_counter() - self._start_time,
            "torch_threads": torch.get_num_threads(),  # the float rounding of a product depends on it
        }

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything `save_checkpoint` wrote; refuse a damaged, incompatible or non-finite one in one
        message naming the file, before anything of the run folder is changed."""
        state = read_state(path)
        if state["format"] != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"checkpoint {path} is incompatible with this run: format {state['format']} vs {CHECKPOINT_FORMAT}"
            )
        self.algorithm.load(path / ALGORITHM_DIR)  # its own one-line refusals name what is wrong
        torch_states = load_torch_rng(path, distributed.rank())
        # what still parsed must also be what was saved; every file of a checkpoint is listed (the snapshot, this
        # process's own copy, was written without checksums)
        verify_checksums(path, state, complete=self.snapshots is None or path != self.snapshots.path)
        by_rank = state.get("rng_by_rank", [])  # several processes: each resumes its own streams
        runtime.set_rng_state(by_rank[distributed.rank()] if distributed.rank() < len(by_rank) else state["rng"])
        runtime.set_torch_rng_states(torch_states)
        self.iteration = state["iteration"]
        self.bad_streak, self.nonfinite_iterations = state["bad_streak"], state["nonfinite_iterations"]
        self.metrics_lines, self.samples_lines = state["metrics_lines"], state["samples_lines"]
        self.wandb_run_id = state["wandb_run_id"]
        self.run_info = state["run_info"]  # the run's identity (model choice, git SHA) is that of its first start
        self.pending_eval = bool(state.get("pending_eval", False))
        self.earlier_wall_s = float(state.get("wall_time_s", 0.0))
        self.checkpoint_threads = state.get("torch_threads")  # None in checkpoints from before it was recorded

    # ------------------------------------------------------------------------------------------------ helpers
    def _log(self, metrics: dict[str, float], step: int, samples: list[dict] | None = None) -> None:
        self.logger.log(metrics, step)
        self.metrics_lines += 1
        if samples:
            self.logger.log_table("train/samples", samples, step)
            self.samples_lines += len(samples)

    def _check_weights(self, k: int) -> None:
        """After a step every trainable tensor must be finite; a NaN weight cannot be undone, so the run stops
        here, before a checkpoint could hold it."""
        named = [(name, engines.local(t)) for name, t in self.algorithm.parameters()]  # ZeRO-3: this process's shard
        finite = runtime.all_finite([t for _, t in named])
        if distributed.sharded_weights():  # every process stops together, whichever shard went bad
            finite = all(distributed.every(finite))
        if not finite:
            bad = next((name for name, t in named if not runtime.all_finite([t])), None)
            if distributed.sharded_weights():  # the name from the first process that holds a bad shard
                bad = next(name for name in distributed.every(bad) if name is not None)
            raise NonFiniteError(
                f"iteration {k + 1} left non-finite weights ({bad}); stopping without saving them. "
                f"{self._last_good()} Start a new run with a lower learning rate."
            )

    @contextlib.contextmanager
    def _nonfinite_guard(self, what: str) -> Iterator[None]:
        """Finite but exploded weights give inf/NaN logits, and sampling then fails inside torch: one line."""
        try:
            yield
        except RuntimeError as err:
            if not _NONFINITE_RUNTIME.search(str(err)):
                raise
            first = str(err).strip().splitlines()[0]
            raise NonFiniteError(
                f"{what} met non-finite numbers ({first}): the weights have diverged. {self._last_good()} "
                f"Start a new run with a lower learning rate."
            ) from err

    def _summary(self, wall_s: float) -> dict:
        summary = self.run_info | {
            "iterations": self.iteration,
            "completed": self.iteration == self.s.iterations and not self.pending_eval,
            "stopped_by": self.stopped_by,
        }
        if distributed.is_main():
            report = self.algorithm.report(read_metrics(self.run_dir / JsonlLogger.METRICS_FILE), self.run_dir)
            summary |= report.summary
            self.report_lines = report.lines
        # the whole run's wall time: this start's, plus the earlier starts' up to the checkpoint it resumed from
        return summary | {"wall_time_s": self.earlier_wall_s + wall_s, "wall_time_this_start_s": wall_s}

    def pass_on_stop_signal(self) -> None:
        """Once the run has stopped on a signal and saved: the handler the run replaced takes it (`cory.stopping`)."""
        self.signals.pass_on()
