"""`Team`: PPO, CORY and their family as one algorithm composed of parts (docs/method.md §1, §12).

One iteration, read against the paper's Algorithm 1 (arXiv 2410.06101) with N roles instead of two:
  1. the schedule says which agent plays each role, and who learns      (Eq. 5: the role map, not the weights, moves)
  2. the roles answer in order, each seeing the one before it           (Alg. 1 l.7-9, knowledge transfer)
  3. every answer is scored on the original query                        (Alg. 1 l.12-13)
  4. the credit rule gives every role its reward                         (Eq. 4: R_k = w_self·r_k + w_other·Σ r_j)
  5. the critic gives every learning role its V_old                      (own value heads, none, or one joint critic)
  6. each learner takes one PPO update on its roles' samples             (Eq. 2 / Eq. 8: KL to π0 on its own prompt)
  7. a joint critic learns the learners' returns
PPO is one role; CORY two roles with role exchange; the variants change one part each:

| part | `algorithm/<group>=` | options |
|---|---|---|
| episode | `episode` | `single` (PPO), `pioneer_observer` (CORY), `chain3`, `team3` |
| schedule | `schedule` | `role_swap`, `simultaneous`, `interleaved`, `sequential` (`cory/algorithms/schedules.py`) |
| credit | `credit` | `collective`, `counterfactual` (`cory/algorithms/credit.py`) |
| critic | `critic` | `per_agent`, `none`, `centralized` (`cory/ppo/critics.py`) |
| layout | `layout` | `separate`, `lora_per_role`, `shared` (`cory/algorithms/layouts.py`) |
| advantage | `advantage` | `gae`, `grpo`, `rloo` (`cory/ppo/estimators.py`) |
| loss | `loss` | `ppo`, `ppo_kl_in_loss` (`cory/ppo/losses.py`) |
The learner (`algorithm.agent`, `cory/ppo/learner.py`) is the same for every one of them, so a difference between two
runs comes from the parts their configs name.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from cory import runtime
from cory.algorithms.agents import AgentSet
from cory.algorithms.base import EvalOutput, Report, RunContext, StepOutput, named_parameters
from cory.algorithms.credit import Credit
from cory.algorithms.episodes import Chain, Played
from cory.algorithms.layouts import Layout
from cory.algorithms.schedules import Schedule
from cory.checkpoints import check_files, damaged, refuse_nonfinite
from cory.errors import CheckpointError, ConfigError
from cory.metrics import AGENT_PLACEHOLDER, role_key
from cory.naming import team_name
from cory.ppo.critics import CRITIC_DIR, Critic, joint_batch
from cory.ppo.estimators import AdvantageEstimator
from cory.ppo.learner import Batch
from cory.ppo.losses import Loss
from cory.ppo.metrics import agent_metrics, headline, nonfinite, sample_rows
from cory.ppo.rollout import Rollout, concat_rollouts
from cory.preemption import abandonable
from cory.tasks.base import SafeScorer

# What a frozen agent's iteration cannot report: statistics of an update it did not take.
_UPDATE_ONLY = ("scaled_collective_reward", "entropy", "sampled_entropy")

# The names a team of two or more roles logs beyond the per-agent catalogue (`cory.ppo.metrics.PPO_METRICS`); the
# by-role views `train/<role>/task_reward` and `train/<role>/kl` are listed in `ROLE_METRICS`.
TEAM_METRICS: dict[str, str] = {
    "cory/llm1_role": "Role held by LLM1 this iteration: 0 = the first role (pioneer), 1 = the second (observer), …",
    "cory/swaps": "Cumulative number of role exchanges so far.",
    f"schedule/{AGENT_PLACEHOLDER}/learned": (
        "1 when the agent took its update this iteration, 0 when the schedule froze it (it still acted and was "
        "scored; no optimiser, KL-controller, score-statistics or RNG change)."
    ),
    f"schedule/{AGENT_PLACEHOLDER}/updates": "Updates the agent has taken so far, this iteration's included.",
    "train/counterfactual_replays": (
        "Extra generations this iteration's credit rule asked for (`algorithm/credit=counterfactual`: one per later "
        "role that saw the removed answer)."
    ),
}


def role_metrics(roles: tuple[str, ...]) -> dict[str, str]:
    """The by-role views of `roles` (whichever agent plays the role this iteration)."""
    out = {}
    for role in roles:
        out[role_key(role, "task_reward")] = f"Task reward of whichever agent is the {role} this iteration."
        out[role_key(role, "kl")] = f"KL_seq of whichever agent is the {role} this iteration."
    return out


@dataclass
class _Record:
    """What one agent did in an iteration: the samples it was scored on (its roles' rollouts), their task and
    collective rewards, and its update's statistics."""

    rollout: Rollout
    task_rewards: list[float]
    collective: list[float]
    stats: dict[str, float]
    learned: bool


class Team:
    """Agents playing `episode.roles`, composed of parts (module docstring). Built by Hydra from
    `cory/conf/algorithm/<name>.yaml`: `agent` is the learner node, shared verbatim by every config; the parts are
    built from their groups; `context` comes from the entry point (`cory.build`)."""

    def __init__(
        self,
        agent,
        episode: Chain,
        schedule: Schedule,
        credit: Credit,
        critic: Critic,
        layout: Layout,
        advantage: AdvantageEstimator,
        loss: Loss,
        log_samples: int,
        *,
        context: RunContext,
    ) -> None:
        check_parts(episode, schedule, critic, layout, advantage)  # before the model loads: seconds, not minutes
        self.learner, self.episode, self.schedule, self.credit = agent, episode, schedule, credit
        self.critic_part, self.layout, self.advantage, self.loss = critic, layout, advantage, loss
        self.log_samples, self.settings = log_samples, context.settings
        ids = layout.agents(episode.roles)
        if layout.needs_lora:
            agent.check_batch(context.settings.batch_size)  # as the agents' set does: a bad value costs seconds
            layout.check_backbone(context.backbone())
        self.team = AgentSet(
            context,
            agent,
            ids,
            {a: layout.handle(a, episode.roles) for a in ids},
            {"advantage": advantage, "loss": loss, "train_value_head": critic.actors_train_values},
            group_size=advantage.group_size,
            longest_prompt=episode.longest_prompt,
        )
        self.task, self.scorer = self.team.task, SafeScorer(self.team.task)
        self.pad_token_id = context.backbone().tokenizer.pad_token_id  # the model is loaded by now
        self.critic = None
        if hasattr(critic, "build"):  # a critic with a model of its own, on the same base as the agents
            s, hw = context.settings, context.hardware
            backbone = context.backbone()
            self.critic = critic.build(
                backbone.policy(CRITIC_DIR, init_seed=s.seed),
                agent,
                seed=s.seed + len(ids),  # its own minibatch stream after the agents' seeds
                pad_token_id=self.pad_token_id,
                device=context.device,
                autocast_dtype=runtime.autocast_dtype(hw.precision),
                forward_batch_size=hw.forward_batch_size,
            )
        self.updates = dict.fromkeys(ids, 0)

    @property
    def agents(self) -> dict:
        """The agents by id (for tests and tools; the trainer never reads them)."""
        return self.team.agents

    def roles(self, iteration: int) -> dict[str, str]:
        """Which agent plays each role in `iteration` (role → agent id)."""
        assigned = self.schedule.players(iteration, list(self.team.agents))
        return dict(zip(self.episode.roles, self.layout.players(assigned, self.episode.roles)))

    def describe(self) -> dict:
        """The run's name (`cory.naming.team_name`: `ppo`, `cory`, `cory_cc`, `cory_interleaved`, …) and what tells
        its runs apart: the initial β, the estimator, and the parts that are not the episode's own."""
        roles, schedule, layout = len(self.episode.roles), self.schedule.name, self.layout.name
        estimator = dict(self.advantage.describe())
        name = team_name(
            self.episode.name,
            roles,
            self.critic_part.name,
            estimator["advantage"],
            schedule,
            layout,
            self.credit.name,
            per_role=bool(estimator.get("per_role", False)),
            sees=self.episode.sees if self.episode.knowledge_transfer else None,
        )
        identity: dict = {}
        if roles > 1 and (schedule != "role_swap" or layout != "separate"):
            identity |= {"schedule": schedule, "policy_sharing": layout}
        if self.credit.name != "collective":
            identity["credit"] = self.credit.name
        if self.critic_part.name == "centralized":
            identity["critic"] = "centralized"
        return {"algorithm": name} | dict(self.learner.describe()) | estimator | identity

    # ---------------------------------------------------------------------------------------------- one iteration
    def step(self, iteration: int) -> StepOutput:
        k, ids = iteration, list(self.team.agents)
        queries, max_new_tokens = self.team.batch(k)
        # 1. who plays each role this iteration (Eq. 5: the role map moves, not the weights)
        players = list(self.roles(k).values())
        actors = [self.team.agents[a].actor for a in players]
        records: dict[str, _Record] = {}
        episodes, seconds = [], {"time/generate_s": 0.0, "time/learn_s": 0.0}
        for phase, learners in enumerate(self.schedule.phases(k, ids)):  # one, unless updates are sequential
            start = time.perf_counter()
            # a stop signal drops the iteration up to step 4: nothing a checkpoint holds has changed yet
            with abandonable() if phase == 0 else contextlib.nullcontext():
                # 2-3. the roles answer in order, each seeing the one before it; each answer scored on the query
                played = self.episode.play(
                    actors,
                    self.task,
                    self.scorer,
                    queries,
                    max_new_tokens,
                    self.team.generation_batch_size,
                    self._whole_batches(players, learners),
                )
                # 4. each role's reward from everyone's (Eq. 4; a counterfactual rule replays later roles)
                rewards = self.credit(played.rewards, played.without)
            middle = time.perf_counter()
            # 5-7. V_old from the critic, one update per learning agent, the joint critic's update
            self._update(players, learners, played, rewards, records)
            seconds["time/generate_s"] += middle - start
            seconds["time/learn_s"] += time.perf_counter() - middle
            episodes.append(played)
        first = episodes[0]
        metrics = self._metrics(k, players, records, first) | seconds
        metrics["train/reward_failures"] = float(sum(e.failures for e in episodes))
        if any(e.replays for e in episodes):
            metrics["train/counterfactual_replays"] = float(sum(e.replays for e in episodes))
        roles = self.episode.roles
        samples = sample_rows(
            queries, dict(zip(roles, first.rollouts)), dict(zip(roles, first.rewards)), self.log_samples
        )
        # the official code's disk swap, after a role exchange (docs/method.md §1.5)
        if self.schedule.resets_after(k):
            self.team.reset(k + 1)
        return StepOutput(metrics, samples, nonfinite(metrics), headline(metrics, ids))

    def _whole_batches(self, players: list[str], learners) -> frozenset[int]:
        """The roles whose rollout an update takes whole and unchanged: its agent learns in this phase from that one
        role (a shared policy's roles are concatenated first), with no joint critic reading the rollouts first."""
        if self.critic is not None:
            return frozenset()
        whole = set()
        for agent_id in learners:
            trainable = self._trainable_roles(players, agent_id)[1]
            if len(trainable) == 1:
                whole.add(trainable[0])
        return frozenset(whole)

    def _trainable_roles(self, players: list[str], agent_id: str) -> tuple[list[int], list[int]]:
        """The roles `agent_id` plays this iteration, and those of them whose samples it learns from."""
        roles = [r for r, a in enumerate(players) if a == agent_id]
        return roles, [r for r in roles if self.episode.trainable(r)]

    def _update(self, players, learners, played: Played, rewards, records: dict[str, _Record]) -> None:
        """Steps 5-7 for one phase: every agent in `learners` takes one update on the samples of its trainable
        roles (one batch per agent: a shared policy learns its roles' samples together); a joint critic then learns
        the returns of every role whose agent learned. Frozen agents are not touched."""
        n = len(self.episode.roles)
        # 5. V_old of every role: from the joint critic, or None (the actors' own value heads, or no critic at all)
        joint = joint_batch(played.rollouts, self.critic.pad_token_id) if self.critic is not None else None
        values = self.critic.values(joint, played.rollouts) if joint is not None else [None] * n
        returns: list[torch.Tensor | None] = [None] * n
        learned_roles = [False] * n
        for agent_id in dict.fromkeys(players):  # role order: the first role's agent updates first
            agent = self.team.agents[agent_id]
            roles, trainable = self._trainable_roles(players, agent_id)
            batch = self._batch(trainable or roles, played, rewards, values)
            learns = agent_id in learners and bool(trainable)
            stats = {"kl_coef": agent.learner.kl_coef}
            if learns:
                # 6. one PPO update on this agent's samples, KL to π0 on its own prompts (Eq. 2 / Eq. 8)
                self.updates[agent_id] += 1
                update = agent.learner.update(batch)
                stats = update.stats
                for r in trainable:
                    learned_roles[r] = True
                    returns[r] = update.returns if len(trainable) == 1 else None
            if agent_id in learners or agent_id not in records:  # the phase in which the agent learned, else the first
                collective = [x for r in (trainable or roles) for x in rewards[r]]
                task_rewards = [x for r in (trainable or roles) for x in played.rewards[r]]
                records[agent_id] = _Record(batch.rollout, task_rewards, collective, stats, learns)
        # 7. the joint critic learns the returns of the roles whose agents learned (none with a non-finite update)
        learned_returns = [returns[r] for r in range(n) if learned_roles[r]]
        if self.critic is not None and learned_returns and all(g is not None for g in learned_returns):
            targets = [returns[r] if learned_roles[r] else torch.zeros_like(values[r]) for r in range(n)]
            masks = [played.rollouts[r].response_mask * learned_roles[r] for r in range(n)]
            for r, critic_stats in enumerate(self.critic.update(joint, values, targets, masks)):
                if learned_roles[r]:
                    records[players[r]].stats = records[players[r]].stats | critic_stats

    def _batch(self, roles: list[int], played: Played, rewards, values) -> Batch:
        """One learner's batch: its roles' samples (concatenated in role order), their collective rewards, V_old
        from the joint critic (or None), the role of every sample, and the schedule's KL budget."""
        rollout = played.rollouts[roles[0]]
        for r in roles[1:]:
            rollout = concat_rollouts(rollout, played.rollouts[r], self.pad_token_id)
        scores = torch.tensor([x for r in roles for x in rewards[r]])
        role_ids = torch.cat([torch.full((len(rewards[r]),), r, dtype=torch.long) for r in roles])
        critic_values = None if values[roles[0]] is None else torch.cat([values[r] for r in roles])
        return Batch(rollout, scores, critic_values, role_ids, self.schedule.kl_budget)

    def _metrics(self, k: int, players: list[str], records: dict[str, _Record], played: Played) -> dict[str, float]:
        """Every agent's `train/`, `ppo/` metrics (`agent_metrics`), and with several roles the by-role views, the
        role map and the schedule's record."""
        eta, metrics = self.task.eval_kl_coef, {}
        for agent_id, rec in records.items():
            metrics |= agent_metrics(agent_id, rec.rollout, rec.task_rewards, rec.collective, rec.stats, eta)
            if not rec.learned:
                for name in _UPDATE_ONLY:
                    metrics.pop(f"train/{agent_id}/{name}", None)
        if len(self.episode.roles) == 1:
            return metrics
        for role, rollout, r in zip(self.episode.roles, played.rollouts, played.rewards):
            metrics[role_key(role, "task_reward")] = float(torch.tensor(r).mean())
            metrics[role_key(role, "kl")] = rollout.kls.sum(-1).mean().item()
        if len(records) > 1:  # agents that move between roles
            metrics["cory/llm1_role"] = float(players.index("llm1"))
            metrics["cory/swaps"] = float(self.schedule.swaps(k))
        for agent_id, rec in records.items():
            metrics[f"schedule/{agent_id}/learned"] = float(rec.learned)
            metrics[f"schedule/{agent_id}/updates"] = float(self.updates[agent_id])
        return metrics

    # ------------------------------------------------------------------------------------ the trainer's protocol
    def evaluate(self, iteration: int, final: bool, should_stop) -> EvalOutput | None:
        return self.team.evaluate(final, should_stop)

    def parameters(self):
        yield from self.team.parameters()
        if self.critic is not None:
            yield from named_parameters({CRITIC_DIR: self.critic.parameters()})

    def report(self, rows: list[dict], run_dir: Path) -> Report:
        return self.team.report(rows, run_dir, self.settings.iterations)

    def save(self, directory: Path) -> None:
        self.team.save(directory, {"updates": dict(self.updates)})
        if self.critic is not None:
            self.critic.save(directory / CRITIC_DIR)

    def load(self, directory: Path) -> None:
        checkpoint, folder = directory.parent, directory / CRITIC_DIR
        if self.critic is not None:  # checked before anything is loaded
            if not folder.is_dir():
                raise CheckpointError(f"checkpoint {checkpoint} has no centralised critic ({CRITIC_DIR}/)")
            check_files(folder, checkpoint)
        state = self.team.load(directory)
        with damaged(directory / "team.json", checkpoint):
            self.updates = {agent_id: int(n) for agent_id, n in state["updates"].items()}
            if set(self.updates) != set(self.team.agents):
                raise ValueError(f"agents {sorted(self.updates)}, expected {sorted(self.team.agents)}")
        if self.critic is not None:
            with damaged(folder, checkpoint):
                self.critic.load(folder)
            refuse_nonfinite(self.critic.state_tensors(), folder, checkpoint)


def check_parts(
    episode: Chain, schedule: Schedule, critic: Critic, layout: Layout, advantage: AdvantageEstimator
) -> None:
    """Combinations of parts that cannot work, one line naming the groups (before any model loads)."""
    if advantage.uses_values and not critic.has_values:
        raise ConfigError(
            f"algorithm/advantage={type(advantage).__name__.lower()} needs values, and algorithm/critic={critic.name} "
            "gives none: use algorithm/critic=per_agent or centralized, or a group estimator (grpo, rloo)"
        )
    if not advantage.uses_values and critic.has_values:
        raise ConfigError(
            f"algorithm/advantage={type(advantage).__name__.lower()} compares the samples of a prompt and ignores "
            f"values: algorithm/critic={critic.name} would be trained for nothing (use algorithm/critic=none)"
        )
    if layout.name == "shared" and schedule.name != "simultaneous":
        raise ConfigError(
            f"algorithm/layout=shared has one policy in every role: algorithm/schedule={schedule.name} has nothing to "
            "freeze, order or exchange (use algorithm/schedule=simultaneous)"
        )
    if layout.name == "shared" and critic.name == "centralized":
        raise ConfigError(
            "algorithm/critic=centralized: one shared policy has one value head for every role "
            "(algorithm/layout=shared takes algorithm/critic=per_agent)"
        )
    if layout.keeps_roles and schedule.exchanges_roles:
        raise ConfigError(
            f"algorithm/layout={layout.name} keeps each role's adapter in its role: algorithm/schedule must not "
            "exchange roles (simultaneous, interleaved or sequential, not role_swap)"
        )
