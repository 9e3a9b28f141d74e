"""The algorithm-agnostic loop: batches → `algorithm.step` → metrics → evaluation → checkpoints.

It never branches on PPO vs CORY (STYLE.md §3.3). Everything random is either derived from (seed, iteration)
— data order and length draws — or saved in the checkpoint — the global RNGs and each agent's stream — so a
resumed run continues exactly (issue 4). Checkpoints are written to a temporary folder and renamed, so a crash
while writing leaves the previous one intact.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from cory import distributed, runtime
from cory.algorithms.base import Algorithm
from cory.config import ConfigError
from cory.evaluation import eval_lengths, evaluate
from cory.tasks.base import Task

CHECKPOINT_FORMAT = 2  # 2: trainer.json records samples_lines (older checkpoints are refused, not misread)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt or from an incompatible run."""


class NonFiniteError(RuntimeError):
    """Too many consecutive iterations with a non-finite loss, reward or KL."""


@dataclass
class RunSettings:
    """Run-level knobs from `conf/train.yaml` (not learner hyperparameters)."""

    iterations: int
    batch_size: int
    seed: int
    eval_every: int = 0  # 0: evaluate only before training and at the end
    num_eval: int | None = None  # held-out prompts per evaluation (None: all the task provides)
    num_eval_final: int | None = None  # held-out prompts before training and at the end (None: all)
    eval_batch_size: int = 64
    save_every: int = 0  # 0: checkpoint only at the end (and on SIGTERM/SIGINT)
    keep_checkpoints: int = 2
    max_bad_iterations: int = 3
    progress: bool = True


class Trainer:
    def __init__(
        self,
        algorithm: Algorithm,
        task: Task,
        logger,
        run_dir: Path,
        settings: RunSettings,
        run_info: dict,
    ) -> None:
        self.algorithm, self.task, self.logger, self.run_dir = algorithm, task, logger, Path(run_dir)
        self.s, self.run_info = settings, run_info
        self.train_queries = task.train_queries()
        if len(self.train_queries) < settings.batch_size:
            raise ConfigError(
                f"batch_size={settings.batch_size}: the task has only {len(self.train_queries)} training queries"
            )
        # the periodic evaluations use a prefix of the first and final ones' queries, with the same length draws
        self.final_eval_queries = task.eval_queries()[: settings.num_eval_final]
        self.final_eval_lengths = eval_lengths(len(self.final_eval_queries), task.max_new_tokens, settings.seed)
        self.eval_queries = self.final_eval_queries[: settings.num_eval]
        self.eval_lengths = self.final_eval_lengths[: len(self.eval_queries)]
        self.iteration = 0  # number of completed iterations
        self.reseed_at = 0  # iteration of the last RNG reseed (official swap); length draws restart from it
        self.bad_streak = 0
        self.nonfinite_iterations = 0
        self.metrics_lines = 0  # lines written to metrics.jsonl / samples.jsonl: a resume truncates to these
        self.samples_lines = 0
        self.stop_requested = False
        self.wandb_run_id = getattr(logger, "run_id", None)

    # ------------------------------------------------------------------------------------------------ data
    def batch(self, k: int) -> list[str]:
        """Iteration k's queries: epoch-wise reshuffles seeded by (seed, epoch), drop_last (REFERENCE §3.1)."""
        n, B, W = len(self.train_queries), self.s.batch_size, distributed.world_size()
        per_epoch = n // (B * W)  # with W processes each takes its own slice of a global batch of B·W
        epoch, j = divmod(k, per_epoch)
        order = np.random.default_rng([self.s.seed, epoch]).permutation(n)
        start = (j * W + distributed.rank()) * B
        return [self.train_queries[i] for i in order[start : start + B]]

    def max_new_tokens(self, k: int) -> int:
        """One draw from U{lo..hi} per iteration, shared by every generation of the iteration (§3.1)."""
        lo, hi = self.task.max_new_tokens
        return int(np.random.default_rng([self.s.seed, 1, k - self.reseed_at]).integers(lo, hi + 1))

    # ------------------------------------------------------------------------------------------------ loop
    def fit(self) -> dict:
        start_time = time.perf_counter()
        previous = self._install_signal_handlers()
        bar = tqdm(
            range(self.iteration, self.s.iterations),
            initial=self.iteration,
            total=self.s.iterations,
            disable=not self.s.progress,
            dynamic_ncols=True,
            desc=self.run_info.get("algorithm", "train"),
        )
        try:
            if self.iteration == 0:
                self._log(self.evaluate(final=True), step=0)  # before any update
            for k in bar:
                if self.stop_requested:  # the signal came before the first iteration: nothing new to save
                    self._print_stopped(saved=False)
                    break
                t0 = time.perf_counter()
                out = self.algorithm.step(self.batch(k), self.max_new_tokens(k), k)
                if out.reseed:
                    self._reseed(k + 1)
                metrics = out.metrics | {
                    "time/iteration_s": time.perf_counter() - t0,
                    "memory/peak_mb": runtime.peak_memory_mb(self._device()),
                }
                bad = self._count_nonfinite(metrics)
                metrics["train/nonfinite_iterations"] = float(self.nonfinite_iterations)
                self._log(metrics, step=k, samples=out.samples)
                bar.set_postfix(self._postfix(metrics), refresh=False)
                self.iteration = k + 1
                last = self.iteration == self.s.iterations
                if last or (self.s.eval_every and self.iteration % self.s.eval_every == 0):
                    self._log(self.evaluate(final=last), step=self.iteration)
                if bad and self.bad_streak >= self.s.max_bad_iterations:
                    raise NonFiniteError(
                        f"{self.bad_streak} consecutive iterations had a non-finite loss, reward or KL "
                        f"(max_bad_iterations={self.s.max_bad_iterations}, last: iteration {k}); stopping. The last "
                        f"good checkpoint is intact under {self.run_dir / 'checkpoints'}; lower the learning rate "
                        f"or check the reward."
                    )
                # a bad iteration is never checkpointed: resuming restarts from the last good one
                if not bad and (
                    last or self.stop_requested or (self.s.save_every and self.iteration % self.s.save_every == 0)
                ):
                    self.save_checkpoint()
                if self.stop_requested:
                    self._print_stopped(saved=not bad)
                    break
        finally:
            bar.close()
            self._restore_signal_handlers(previous)
        summary = self._summary(self._read_eval_row(0), time.perf_counter() - start_time)
        if distributed.world_size() > 1:  # every process must hold the same weights after data-parallel updates
            in_sync = all(distributed.weights_in_sync(a.policy) for a in self.algorithm.agents.values())
            summary |= {"world_size": distributed.world_size(), "weights_in_sync": in_sync}
        if distributed.is_main():
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _print_stopped(self, saved: bool) -> None:
        what = "checkpoint saved" if saved else "no new checkpoint (the last good one is kept)"
        print(
            f"\n[cory] stopped after iteration {self.iteration} on a signal; {what}. "
            f"Resume with: python -m cory.train resume={self.run_dir}",
            flush=True,
        )

    def evaluate(self, final: bool = False) -> dict[str, float]:
        """Every agent on the held-out queries: the first `num_eval_final` before training and at the end
        (`final`), the first `num_eval` in between."""
        metrics: dict[str, float] = {}
        if not distributed.is_main():  # rank 0 evaluates and logs; the others go on to the next iteration
            return metrics
        queries, lengths = (
            (self.final_eval_queries, self.final_eval_lengths) if final else (self.eval_queries, self.eval_lengths)
        )
        for agent_id, agent in self.algorithm.agents.items():
            m, samples = evaluate(
                agent, self.task, queries, lengths, self.s.eval_batch_size, seed=self.s.seed
            )  # common random numbers: before/after differ by the policy only
            metrics |= {f"eval/{agent_id}/{k}": v for k, v in m.items()}
            self.logger.log_table(f"eval/{agent_id}/samples", samples, self.iteration)
            self.samples_lines += len(samples)
        return metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write `checkpoints/iter_<k>` atomically (temp folder + rename) and keep the last K."""
        root = self.run_dir / "checkpoints"
        final = root / f"iter_{self.iteration:06d}"
        if not distributed.is_main():  # weights are identical on every process: rank 0 writes them
            return final
        tmp = root / f".tmp-iter_{self.iteration:06d}-{os.getpid()}"
        for stale in root.glob(".tmp-*"):  # left by a crash mid-write; one process writes a run's checkpoints
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
        for agent_id, agent in self.algorithm.agents.items():
            agent.save(tmp / "agents" / agent_id)
        save_file(runtime.torch_rng_states(), str(tmp / "torch_rng.safetensors"))
        state = {
            "format": CHECKPOINT_FORMAT,
            "iteration": self.iteration,
            "agents": sorted(self.algorithm.agents),
            "algorithm": self.algorithm.state_dict(),
            "rng": runtime.rng_state(),
            "reseed_at": self.reseed_at,
            "bad_streak": self.bad_streak,
            "nonfinite_iterations": self.nonfinite_iterations,
            "metrics_lines": self.metrics_lines,
            "samples_lines": self.samples_lines,
            "wandb_run_id": self.wandb_run_id,
            "run_info": self.run_info,
        }
        (tmp / "trainer.json").write_text(json.dumps(state))  # written last: its presence marks completeness
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(p for p in root.glob("iter_*") if p.is_dir())[: -self.s.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything `save_checkpoint` wrote; refuse a corrupt or incompatible one in one message."""
        try:
            state = json.loads((path / "trainer.json").read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint {path} is unreadable ({err}); delete it to fall back to an earlier one"
            ) from err
        if state.get("format") != CHECKPOINT_FORMAT or state.get("agents") != sorted(self.algorithm.agents):
            raise CheckpointError(
                f"checkpoint {path} is incompatible with this run: format {state.get('format')} vs "
                f"{CHECKPOINT_FORMAT}, agents {state.get('agents')} vs {sorted(self.algorithm.agents)}"
            )
        try:
            for agent_id, agent in self.algorithm.agents.items():
                agent.load(path / "agents" / agent_id)
            torch_states = load_file(str(path / "torch_rng.safetensors"))
        except Exception as err:  # noqa: BLE001 - any failure here means a damaged checkpoint
            raise CheckpointError(f"checkpoint {path} is corrupt or from another model: {err}") from err
        self.algorithm.load_state_dict(state["algorithm"])
        runtime.set_rng_state(state["rng"])
        runtime.set_torch_rng_states(torch_states)
        self.iteration, self.reseed_at = state["iteration"], state["reseed_at"]
        self.bad_streak, self.nonfinite_iterations = state["bad_streak"], state["nonfinite_iterations"]
        self.metrics_lines, self.samples_lines = state["metrics_lines"], state["samples_lines"]
        self.wandb_run_id = state["wandb_run_id"]
        self.run_info = state["run_info"]  # the run's identity (model choice, git SHA) is that of its first start

    # ------------------------------------------------------------------------------------------------ helpers
    def _log(self, metrics: dict[str, float], step: int, samples: list[dict] | None = None) -> None:
        self.logger.log(metrics, step)
        self.metrics_lines += 1
        if samples:
            self.logger.log_table("train/samples", samples, step)
            self.samples_lines += len(samples)

    def _read_eval_row(self, step: int) -> dict:
        path = self.run_dir / "metrics.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("iteration") == step and any(k.startswith("eval/") for k in row):
                    return row
        return {}

    def _count_nonfinite(self, metrics: dict[str, float]) -> bool:
        keys = [k for k in metrics if k.split("/")[-1] in ("task_reward", "kl", "policy_loss", "value_loss")]
        skipped = any(v > 0 for k, v in metrics.items() if k.endswith("/nonfinite_skipped"))
        bad = skipped or not all(math.isfinite(metrics[k]) for k in keys)
        self.bad_streak = self.bad_streak + 1 if bad else 0
        self.nonfinite_iterations += int(bad)
        return bad

    def _reseed(self, at: int) -> None:
        runtime.seed_everything(self.s.seed)
        for agent in self.algorithm.agents.values():
            agent.rng = np.random.RandomState(agent.seed)
        self.reseed_at = at

    def _device(self) -> torch.device:
        return next(iter(self.algorithm.agents.values())).device

    def _postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        out = {}
        for agent_id in self.algorithm.agents:
            out[f"{agent_id}_r"] = f"{metrics.get(f'train/{agent_id}/task_reward', float('nan')):.3f}"
            out[f"{agent_id}_kl"] = f"{metrics.get(f'train/{agent_id}/kl', float('nan')):.3f}"
        return out

    def _summary(self, initial: dict, wall_s: float) -> dict:
        final = self._read_eval_row(self.iteration) if self.iteration == self.s.iterations else {}
        agents, before = {}, {}
        for agent_id in self.algorithm.agents:
            keys = ("task_reward", "kl", "combined_reward")
            if final:
                agents[agent_id] = {k: final.get(f"eval/{agent_id}/{k}") for k in keys}
            if initial:
                before[agent_id] = {k: initial.get(f"eval/{agent_id}/{k}") for k in keys}
        return self.run_info | {
            "iterations": self.iteration,
            "completed": self.iteration == self.s.iterations,
            "agents": agents,
            "initial": before,
            "wall_time_s": wall_s,
        }

    def _install_signal_handlers(self) -> dict:
        """SIGTERM (SLURM pre-emption) and SIGINT (Ctrl-C): finish the iteration, checkpoint, exit cleanly."""

        def handler(signum: int, _frame) -> None:
            self.stop_requested = True
            print(
                f"\n[cory] {signal.Signals(signum).name} received: finishing this iteration, then saving a "
                f"checkpoint (send it again to abort at once)",
                flush=True,
            )
            signal.signal(signum, previous.get(signum, signal.SIG_DFL))

        previous = {}
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. inside some launchers): leave signals alone
            pass
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for sig, h in previous.items():
            try:
                signal.signal(sig, h)
            except (ValueError, TypeError):
                pass


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (temporary folders of an interrupted write are ignored)."""
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("iter_*") if (p / "trainer.json").exists())
    return done[-1] if done else None


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines of `path`: a resumed run's log then equals an uninterrupted one."""
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)[:keep]
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(lines))
        os.replace(tmp, path)
