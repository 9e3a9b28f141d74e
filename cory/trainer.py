"""The algorithm-agnostic loop: batches → `algorithm.step` → metrics → evaluation → checkpoints.

It never branches on PPO vs CORY. Everything random is either derived from (seed, iteration) — data order and
length draws — or saved in the checkpoint — the global RNGs and each agent's stream — so a resumed run
continues exactly. Checkpoints are written to a temporary folder and renamed, so a crash while writing leaves
the previous one intact; loading one checks every file and every weight before the run trusts it.

On SIGTERM/SIGINT the current iteration finishes and is checkpointed at once, before any evaluation it was
due (the checkpoint records that evaluation as pending; the resumed run does it first), so the exit fits a
cluster's grace period. Weights that turn non-finite stop the run before they can be saved.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from cory import distributed, runtime
from cory.algorithms.base import Algorithm
from cory.checkpoints import (
    CHECKPOINT_FORMAT,
    latest_checkpoint,
    load_agent,
    load_torch_rng,
    read_state,
    write_checkpoint,
)
from cory.errors import CheckpointError, ConfigError, NonFiniteError
from cory.ppo import core as ppo_core
from cory.ppo.evaluation import eval_lengths, evaluate
from cory.tasks.base import Task

# torch's message when a sampling distribution or a kernel meets inf/NaN (e.g. weights blown up by a huge step)
_NONFINITE_RUNTIME = re.compile(r"\b(inf|nan)\b", re.IGNORECASE)


@dataclass
class RunSettings:
    """Run-level knobs from `cory/conf/train.yaml` (not learner hyperparameters)."""

    iterations: int
    batch_size: int
    seed: int
    eval_every: int = 0  # 0: evaluate only before training and at the end
    num_eval: int | None = None  # held-out prompts per evaluation (None: all the task provides)
    num_eval_final: int | None = None  # held-out prompts before training and at the end (None: all)
    eval_batch_size: int = 64
    save_every: int = 0  # checkpoint cadence, plus the last iteration; 0: none (SIGTERM/SIGINT always save)
    save_final: bool = False  # with save_every=0: still checkpoint the last iteration (so it can be extended)
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
        self._check_context()
        self.iteration = 0  # number of completed iterations
        self.pending_eval = True  # an evaluation owed at `iteration` (a fresh run owes the one before training)
        self.reseed_at = 0  # iteration of the last RNG reseed (official swap); length draws restart from it
        self.bad_streak = 0
        self.nonfinite_iterations = 0
        self.metrics_lines = 0  # lines written to metrics.jsonl / samples.jsonl: a resume truncates to these
        self.samples_lines = 0
        self.stop_requested = False
        self.stopped_by: str | None = None  # the signal that stopped the run (SIGTERM, SIGINT)
        self.wandb_run_id = getattr(logger, "run_id", None)

    # ------------------------------------------------------------------------------------------------ data
    def batch(self, k: int) -> list[str]:
        """Iteration k's queries: epoch-wise reshuffles seeded by (seed, epoch), drop_last (docs/method.md §3.1)."""
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
            self._run_pending_eval()  # before any update, or the one a signal deferred to this resume
            for k in bar:
                if self.stop_requested:  # the signal came before this iteration: nothing new to save
                    self._print_stopped(saved=False)
                    break
                bad = self._iteration(k, bar)
                self.iteration = k + 1
                last = self.iteration == self.s.iterations
                self.pending_eval = last or bool(self.s.eval_every and self.iteration % self.s.eval_every == 0)
                if not self.stop_requested:  # on a signal the checkpoint comes first; the resume evaluates
                    self._run_pending_eval()
                if bad and self.bad_streak >= self.s.max_bad_iterations:
                    raise NonFiniteError(
                        f"{self.bad_streak} consecutive iterations had a non-finite loss, reward or KL "
                        f"(max_bad_iterations={self.s.max_bad_iterations}, last: iteration {k}); stopping. "
                        f"{self._last_good()} Start a new run with a lower algorithm.agent.learning_rate, or "
                        f"check the reward."
                    )
                due = self.s.save_every and self.iteration % self.s.save_every == 0
                final = last and (self.s.save_every or self.s.save_final)
                # a bad iteration is never checkpointed: resuming restarts from the last good one
                if not bad and (due or final or self.stop_requested):
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

    def _iteration(self, k: int, bar: tqdm) -> bool:
        """One training iteration: step, metrics, log, weight check. Returns whether it was non-finite."""
        t0 = time.perf_counter()
        with self._nonfinite_guard(f"iteration {k}"):
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
        self._check_weights(k)
        bar.set_postfix(self._postfix(metrics), refresh=False)
        return bad

    def _run_pending_eval(self) -> None:
        if self.pending_eval:  # the first and the last evaluation are the full ones (`num_eval_final`)
            metrics = self.evaluate(final=self.iteration in (0, self.s.iterations))
            if metrics is not None:  # None: a signal interrupted it; it stays pending
                self._log(metrics, step=self.iteration)
                self.pending_eval = False

    def _print_stopped(self, saved: bool) -> None:
        what = "checkpoint saved." if saved else f"no new checkpoint. {self._last_good()}"
        print(
            f"\n[cory] stopped after iteration {self.iteration} on a signal; {what} "
            f"Resume with: python -m cory.train resume={self.run_dir}",
            flush=True,
        )

    def _last_good(self) -> str:
        """Where a stopped run can be resumed from, said only when it is true."""
        latest = latest_checkpoint(self.run_dir)
        if latest is None:
            return "No checkpoint was written before this point (a resume starts over)."
        return f"The last good checkpoint, {latest}, is intact."

    def evaluate(self, final: bool = False) -> dict[str, float] | None:
        """Held-out metrics of every agent: the first `num_eval_final` queries before training and at the end
        (`final`), the first `num_eval` in between; None when a signal arrived meanwhile (the rest is skipped)."""
        metrics: dict[str, float] = {}
        if not distributed.is_main():  # rank 0 evaluates and logs; the others go on to the next iteration
            return metrics
        queries, lengths = (
            (self.final_eval_queries, self.final_eval_lengths) if final else (self.eval_queries, self.eval_lengths)
        )
        tables = []
        for agent_id, agent in self.algorithm.agents.items():
            if self.stop_requested:
                return None
            with self._nonfinite_guard(f"the evaluation at iteration {self.iteration}"):
                m, samples = evaluate(
                    agent, self.task, queries, lengths, self.s.eval_batch_size, seed=self.s.seed
                )  # common random numbers: before/after differ by the policy only
            metrics |= {f"eval/{agent_id}/{k}": v for k, v in m.items()}
            tables.append((f"eval/{agent_id}/samples", samples))
        for name, samples in tables:  # written once the evaluation is complete, with its metrics
            self.logger.log_table(name, samples, self.iteration)
            self.samples_lines += len(samples)
        return metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write `checkpoints/iter_<k>` atomically and keep the last `keep_checkpoints`."""
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
            "pending_eval": self.pending_eval,
        }
        final = self.run_dir / "checkpoints" / f"iter_{self.iteration:06d}"
        if distributed.is_main():  # weights are identical on every process: rank 0 writes them
            write_checkpoint(final, self.algorithm.agents, state, self.s.keep_checkpoints)
        return final

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything `save_checkpoint` wrote; refuse a damaged, incompatible or non-finite one in one
        message naming the file, before anything of the run folder is changed."""
        state = read_state(path)
        if state["format"] != CHECKPOINT_FORMAT or state["agents"] != sorted(self.algorithm.agents):
            raise CheckpointError(
                f"checkpoint {path} is incompatible with this run: format {state['format']} vs "
                f"{CHECKPOINT_FORMAT}, agents {state['agents']} vs {sorted(self.algorithm.agents)}"
            )
        for agent_id, agent in self.algorithm.agents.items():
            load_agent(agent, path / "agents" / agent_id, path)
        torch_states = load_torch_rng(path)
        self.algorithm.load_state_dict(state["algorithm"])
        runtime.set_rng_state(state["rng"])
        runtime.set_torch_rng_states(torch_states)
        self.iteration, self.reseed_at = state["iteration"], state["reseed_at"]
        self.bad_streak, self.nonfinite_iterations = state["bad_streak"], state["nonfinite_iterations"]
        self.metrics_lines, self.samples_lines = state["metrics_lines"], state["samples_lines"]
        self.wandb_run_id = state["wandb_run_id"]
        self.run_info = state["run_info"]  # the run's identity (model choice, git SHA) is that of its first start
        self.pending_eval = bool(state.get("pending_eval", False))

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

    def _check_weights(self, k: int) -> None:
        """After a step every trainable tensor must be finite; a NaN weight cannot be undone, so the run stops
        here, before a checkpoint could hold it."""
        for agent_id, agent in self.algorithm.agents.items():
            if not ppo_core.all_finite(agent.trainable_parameters()):
                raise NonFiniteError(
                    f"iteration {k} left non-finite weights in {agent_id}; stopping without saving them. "
                    f"{self._last_good()} Start a new run with a lower algorithm.agent.learning_rate "
                    f"(this one: {agent.config.learning_rate})."
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
                f"Start a new run with a lower algorithm.agent.learning_rate."
            ) from err

    def _check_context(self) -> None:
        """Refuse prompts that cannot fit the model's context with their longest response (before any step).

        The longest prompt is the query-only one, or, for an algorithm that shows one agent's response to the
        other (`knowledge_transfer`), the observer prompt with a response of the maximum length (an estimate
        to within a token or two of tokenisation at the joins).
        """
        agent = next(iter(self.algorithm.agents.values()))
        config = agent.policy.pretrained_model.config.get_text_config()
        limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        queries = self.train_queries + self.final_eval_queries
        if not limit or not queries:
            return
        hi = self.task.max_new_tokens[1]
        special = getattr(agent, "add_special_tokens", False)  # Llama's BOS counts too
        ids = agent.tokenizer([self.task.pioneer_prompt(q) for q in queries], add_special_tokens=special)["input_ids"]
        lengths = [len(x) for x in ids]
        longest, what = max(lengths) + hi, "the longest prompt"
        if getattr(self.algorithm, "knowledge_transfer", False):
            query = queries[int(np.argmax(lengths))]
            template = self.task.observer_prompt(query, "")
            observer = len(agent.tokenizer(template, add_special_tokens=special)["input_ids"]) + 2 * hi
            longest, what = max(longest, observer), "the longest observer prompt (with the pioneer's response)"
        if longest > limit:
            raise ConfigError(
                f"{what} plus a response of task.max_new_tokens={hi} is {longest} tokens, more than the model's "
                f"context of {limit} positions; lower task.max_new_tokens or use shorter prompts"
            )

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
            "completed": self.iteration == self.s.iterations and not self.pending_eval,
            "stopped_by": self.stopped_by,
            "agents": agents,
            "initial": before,
            "wall_time_s": wall_s,
        }

    def _install_signal_handlers(self) -> dict:
        """SIGTERM (SLURM pre-emption) and SIGINT (Ctrl-C): finish the iteration, checkpoint, exit cleanly.
        Outside the main thread (a launcher's worker thread) handlers cannot be set; signals are left alone."""

        def handler(signum: int, _frame) -> None:
            self.stop_requested, self.stopped_by = True, signal.Signals(signum).name
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
