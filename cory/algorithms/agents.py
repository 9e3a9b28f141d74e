"""`AgentSet`: the agents of a policy-gradient team and everything every team does identically around them.

A team (`cory/algorithms/team.py`) holds one `AgentSet`:
- the agents, built from the learner node (`algorithm.agent`, a `_target_`) on the run's model, each on the handle
  its layout names (its own full copy or LoRA adapter, value head, optimiser and KL controller), all sharing one frozen
  reference π0;
- the data schedule: iteration k's queries (epoch-wise reshuffles seeded by (seed, epoch), drop_last; each repeated
  `group_size` times for an estimator that compares samples of one prompt) and its response-length draw (seeded by
  (seed, k)), docs/method.md §3.1;
- the held-out set and its fixed per-prompt length draws, and the evaluation of each agent alone (§1.6);
- what a checkpoint holds for them, the finite-weight check's tensors, and the run's summary and curves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from cory import distributed, runtime
from cory.algorithms.base import EvalOutput, Report, RunContext, named_parameters
from cory.checkpoints import check_files, damaged, refuse_nonfinite, write_policies
from cory.errors import CheckpointError, ConfigError
from cory.ppo.backends import HFBackend, make_backends
from cory.ppo.evaluation import eval_lengths, evaluate
from cory.preemption import abandonable
from cory.tasks.base import Task

TEAM_STATE = "team.json"


class QuerySchedule:
    """Iteration k's training queries and `max_new_tokens`, from (seed, k) alone: a resumed run draws the same.

    With `group_size` G > 1 (a critic-free learner's G samples per prompt, docs/method.md §9) a batch holds
    `batch_size / G` distinct queries, each repeated G times contiguously: `batch_size` stays the number of samples.
    """

    def __init__(
        self, queries: list[str], batch_size: int, seed: int, max_new_tokens: tuple[int, int], group_size: int = 1
    ) -> None:
        distinct = batch_size // group_size
        if len(queries) < distinct * distributed.world_size():
            raise ConfigError(f"batch_size={batch_size}: the task has only {len(queries)} training queries")
        self.queries, self.batch_size, self.seed, self.span = queries, distinct, seed, max_new_tokens
        self.group_size = group_size
        self.reseed_at = 0  # iteration of the last RNG reseed (the official swap); length draws restart from it

    def batch(self, k: int) -> list[str]:
        """Iteration k's queries: epoch-wise reshuffles seeded by (seed, epoch), drop_last (docs/method.md §3.1)."""
        n, B, W = len(self.queries), self.batch_size, distributed.world_size()
        per_epoch = n // (B * W)  # with W processes each takes its own slice of a global batch of B·W
        epoch, j = divmod(k, per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(n)
        start = (j * W + distributed.rank()) * B
        return [self.queries[i] for i in order[start : start + B] for _ in range(self.group_size)]

    def max_new_tokens(self, k: int) -> int:
        """One draw from U{lo..hi} per iteration, shared by every generation of the iteration (§3.1)."""
        lo, hi = self.span
        return int(np.random.default_rng([self.seed, 1, k - self.reseed_at]).integers(lo, hi + 1))


class AgentSet:
    """The agents `names` of one run, with their data schedule, held-out set, checkpoints and report.

    Args:
        context: the run (settings, hardware, lazy model and task).
        learner: the learner node as built by Hydra (`algorithm.agent`): it validates its own values and builds
            one agent per name with `learner.build(...)`.
        names: agent ids, `llm1` first (CORY's initial pioneer).
        handles: the model handle each agent is built on (its own name, or its role's with one adapter per role).
        parts: what `learner.build` takes besides the placement (the advantage estimator, the loss, whether the
            agents train their own value heads).
        group_size: samples per prompt (an estimator that compares the samples of one prompt; 1 otherwise).
        longest_prompt: the longest prompt the algorithm will show an agent for a query, as a function of the query
            and the response length cap (None: the query-only prompt is the longest).
    """

    def __init__(
        self,
        context: RunContext,
        learner,
        names: list[str],
        handles: dict[str, str],
        parts: dict,
        group_size: int = 1,
        longest_prompt: Callable[[Task, str, int], tuple[str, int] | None] | None = None,
    ) -> None:
        s, hw = context.settings, context.hardware
        learner.check_batch(s.batch_size)  # before the model loads: a bad value costs seconds
        if s.batch_size % group_size:
            raise ConfigError(
                f"algorithm.advantage.group_size={group_size} must divide batch_size={s.batch_size} "
                "(batch_size counts samples: batch_size / group_size prompts per iteration)"
            )
        self.context, self.learner, self.seed = context, learner, s.seed
        backbone = context.backbone()  # the weights are loaded once
        reference = backbone.reference()  # π0: a frozen copy, or the LoRA base with adapters disabled
        self.task: Task = context.task()
        self.agents = {}
        # what samples each agent's responses (`rollout` group; None: the agent's own policy, `HFBackend`)
        backends = make_backends(s.rollout, names, learner, backbone, context.device, s.seed)
        for index, name in enumerate(names):
            # initial weights from the run seed alone (every agent starts identical); each agent draws its minibatch
            # permutations from its own stream `seed + index` (docs/method.md §1.5)
            policy = backbone.policy(handles[name], init_seed=s.seed)
            backend = backends[name] or HFBackend(policy, backbone.tokenizer, context.device, s.rollout.decode)
            self.agents[name] = learner.build(
                name,
                policy,
                reference,
                backbone.tokenizer,
                seed=s.seed + index,
                device=context.device,
                autocast_dtype=runtime.autocast_dtype(hw.precision),
                forward_batch_size=hw.forward_batch_size,
                length_groups=hw.length_groups,
                add_special_tokens=backbone.add_special_tokens,
                **parts,
                backend=backend,
            )
        self.schedule = QuerySchedule(
            self.task.train_queries(), s.batch_size, s.seed, self.task.max_new_tokens, group_size
        )
        # the periodic evaluations use a prefix of the first and final ones' queries, with the same length draws
        self.final_queries = self.task.eval_queries()[: s.num_eval_final]
        if not self.final_queries:
            raise ConfigError("task: no held-out queries to evaluate on")
        self.final_lengths = eval_lengths(len(self.final_queries), self.task.max_new_tokens, s.seed)
        self.eval_queries = self.final_queries[: s.num_eval]
        self.eval_lengths = self.final_lengths[: len(self.eval_queries)]
        self.eval_batch_size = s.eval_batch_size
        self.generation_batch_size = hw.generation_batch_size
        self._check_context(longest_prompt)

    # ------------------------------------------------------------------------------------------------ data
    def batch(self, k: int) -> tuple[list[str], int]:
        """Iteration k's queries and its `max_new_tokens`."""
        return self.schedule.batch(k), self.schedule.max_new_tokens(k)

    def reset(self, at: int) -> None:
        """The official swap's side effects (docs/method.md §1.5): every agent's optimiser, KL controller and score
        moments fresh, the global RNGs, each agent's stream and the length draws reseeded."""
        for agent in self.agents.values():
            agent.reset(reseed=True)
        runtime.seed_everything(self.seed)
        self.schedule.reseed_at = at

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, final: bool, should_stop: Callable[[], bool]) -> EvalOutput | None:
        """Every agent alone on the held-out queries (the first `num_eval_final` before training and at the end,
        the first `num_eval` in between), with common random numbers: before/after differ by the policy only."""
        queries, lengths = (
            (self.final_queries, self.final_lengths) if final else (self.eval_queries, self.eval_lengths)
        )
        metrics: dict[str, float] = {}
        tables = []
        for agent_id, agent in self.agents.items():
            if should_stop():
                return None
            with abandonable():  # evaluation changes no training state: a stop signal drops it at once
                m, samples = evaluate(agent.actor, self.task, queries, lengths, self.eval_batch_size, seed=self.seed)
            metrics |= {f"eval/{agent_id}/{k}": v for k, v in m.items()}
            tables.append((f"eval/{agent_id}/samples", samples))
        headline = {
            f"{agent_id}_{short}": metrics[f"eval/{agent_id}/{name}"]
            for agent_id in self.agents
            for name, short in (("task_reward", "r"), ("kl", "kl"), ("combined_reward", "combined"))
        }
        return EvalOutput(metrics, tables, headline)

    # ------------------------------------------------------------------------------------------ checkpoints
    def parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return named_parameters(
            {agent_id: agent.trainee.trainable_parameters() for agent_id, agent in self.agents.items()}
        )

    def save(self, directory: Path, state: dict) -> None:
        """Each agent's folder, and `team.json`: the schedule's reseed point, the algorithm's own `state` and the
        folders that hold policies (what `cory.evaluate` and an export read)."""
        for agent_id, agent in self.agents.items():
            agent.save(directory / agent_id)
        (directory / TEAM_STATE).write_text(json.dumps({"reseed_at": self.schedule.reseed_at, "algorithm": state}))
        write_policies(directory, list(self.agents))

    def load(self, directory: Path) -> dict:
        """Every agent's files, checked before any is loaded, then every loaded tensor must be finite; returns the
        algorithm's own state as `save` got it."""
        missing = [a for a in self.agents if not (directory / a).is_dir()]
        if missing:
            raise CheckpointError(
                f"checkpoint {directory.parent} is incompatible with this run: it has no agent {', '.join(missing)}"
            )
        checkpoint = directory.parent
        with damaged(directory / TEAM_STATE, checkpoint):
            state = json.loads((directory / TEAM_STATE).read_text())
            reseed_at, algorithm_state = int(state["reseed_at"]), dict(state["algorithm"])
        for agent_id in self.agents:
            check_files(directory / agent_id, checkpoint)
        for agent_id, agent in self.agents.items():
            with damaged(directory / agent_id, checkpoint):
                agent.load(directory / agent_id)
            refuse_nonfinite(agent.trainee.state_tensors(), directory / agent_id, checkpoint)
        self.schedule.reseed_at = reseed_at
        return algorithm_state

    # ------------------------------------------------------------------------------------------------ report
    def report(self, rows: list[dict], run_dir: Path, iterations: int) -> Report:
        """Held-out task reward, KL and combined reward of every agent before training and at the end."""
        first = _eval_row(rows, 0)
        last = _eval_row(rows, iterations)
        agents, initial = {}, {}
        keys = ("task_reward", "kl", "combined_reward", "task_reward_se", "kl_se", "combined_reward_se")
        for agent_id in self.agents:
            if last:
                agents[agent_id] = {k: last.get(f"eval/{agent_id}/{k}") for k in keys}
            if first:
                initial[agent_id] = {k: first.get(f"eval/{agent_id}/{k}") for k in keys}
        lines = []
        for agent_id, after in agents.items():
            before = initial.get(agent_id, {})

            def pair(key: str, before=before, after=after) -> str:
                se = f" ± {_num(after.get(f'{key}_se')):.3f}" if after.get(f"{key}_se") is not None else ""
                return f"{_num(before.get(key)):.3f} → {_num(after.get(key)):.3f}{se}"

            lines.append(
                f"{agent_id}: held-out task reward {pair('task_reward')}, KL {pair('kl')}, "
                f"combined {pair('combined_reward')}"
            )
        from cory.plotting import plot_curves

        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
        return Report({"agents": agents, "initial": initial}, lines)

    # ------------------------------------------------------------------------------------------------ checks
    def _check_context(self, longest_prompt: Callable[[Task, str, int], tuple[str, int] | None] | None) -> None:
        """Refuse prompts that cannot fit the model's context with their longest response (before any step).

        The longest prompt is the query-only one, or what `longest_prompt` says for the longest query (CORY: the
        observer prompt with a pioneer response of the maximum length; a chain that shows every earlier answer: the
        last role's prompt with each of them of the maximum length; an estimate to within a token or two of
        tokenisation at the joins).
        """
        actor = next(iter(self.agents.values())).actor
        limit = actor.context_length()
        queries = self.schedule.queries + self.final_queries
        if not limit or not queries:
            return
        hi = self.task.max_new_tokens[1]
        lengths = actor.token_counts([self.task.pioneer_prompt(q) for q in queries])
        longest, what = max(lengths) + hi, "the longest prompt"
        found = longest_prompt(self.task, queries[int(np.argmax(lengths))], hi) if longest_prompt else None
        if found is not None:
            prompt, extra = found
            observer = actor.token_counts([prompt])[0] + extra + hi
            longest, what = max(longest, observer), "the longest observer prompt (with the earlier responses)"
        if longest > limit:
            raise ConfigError(
                f"{what} plus a response of task.max_new_tokens={hi} is {longest} tokens, more than the model's "
                f"context of {limit} positions; lower task.max_new_tokens or use shorter prompts"
            )


def _eval_row(rows: list[dict], iteration: int) -> dict:
    for row in rows:
        if row.get("iteration") == iteration and any(k.startswith("eval/") for k in row):
            return row
    return {}


def _num(value) -> float:
    return float("nan") if value is None else float(value)
