"""Episodes: N roles answer one batch of queries in order, each answer scored on the original query.

`Chain` is the episode of every policy-gradient algorithm here (docs/method.md §1.2, §12.3):
- one role is PPO: the agent answers the query-only prompt x = T_pio(q);
- two roles are CORY's pioneer and observer (Alg. 1 l.7-9): the observer's prompt is built from the decoded text of
  the pioneer's answer, x_O = T_obs(q, a_1) (knowledge transfer), then re-tokenised;
- more roles continue the chain: with `sees="all"` role k answers T_obs(q, a_1 ⊕ … ⊕ a_{k−1}), every earlier
  answer in role order joined by `joiner` in the template's one answer slot; with `sees="latest"` it answers
  T_obs(q, a_{k−1}), the answer of the role just before it (for two roles the two are the same prompt).
With `knowledge_transfer=false` every role answers the query alone ("CORY w/o KT", or a team of parallel actors).
Every answer is scored on the original query alone, r_k = r(q, a_k): a later role is never scored on its long prompt
(Alg. 1 l.12-13; l.13's r(s0, a1) is a typo for r(s0, a2)).

A role listed in `frozen_roles` acts and is scored, but whoever plays it takes no update from that role's samples.
`without(k)` replays the episode with role k's message removed (the roles after k answer again from the earlier
answers still there, or from the query alone when none is): what a counterfactual credit rule compares against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cory.errors import ConfigError
from cory.metrics import ROLES
from cory.ppo.actor import Actor
from cory.ppo.rollout import Rollout
from cory.tasks.base import SafeScorer, Task

# which earlier answers a role sees with knowledge transfer (`Chain.sees`)
SEES = ("latest", "all")


@dataclass
class Played:
    """One episode: each role's rollout (B samples) and task rewards r_k = r(q, a_k), the failed scorings, and
    `without(k)`: every role's task rewards had role k said nothing (`Chain.without`, replayed on demand)."""

    rollouts: list[Rollout]
    rewards: list[list[float]]
    failures: int = 0
    replays: int = 0  # extra generations `without` made (a counterfactual credit rule asked for them)
    without: Callable[[int], list[list[float] | None]] = field(default=lambda k: [], repr=False)


@dataclass(frozen=True)
class Chain:
    """`roles` in order (names from `cory.metrics.ROLES`: the first is the query-only role every agent is evaluated
    in), `knowledge_transfer` (role k sees earlier answers through the task's observer template), `frozen_roles`
    (acted, scored, never learned from), and `name`: the algorithm's name in summaries and W&B (`ppo`, `cory`, ...),
    suffixed by the other parts.

    With knowledge transfer, `sees` says which earlier answers role k sees: `"latest"` the latest one still present
    (role k−1's), `"all"` every one still present, in role order, joined by `joiner` into the template's one answer
    slot: x_k = T_obs(q, a_1 ⊕ … ⊕ a_{k−1}). With two roles the two are the same prompt."""

    roles: tuple[str, ...]
    knowledge_transfer: bool
    frozen_roles: tuple[str, ...]
    name: str
    sees: str = "latest"
    joiner: str = "\n\n"

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "frozen_roles", tuple(self.frozen_roles))
        if not self.roles:
            raise ConfigError("algorithm.episode.roles: at least one role")
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"algorithm.episode.roles={list(self.roles)}: distinct names from {ROLES}")
        stray = [r for r in self.frozen_roles if r not in self.roles]
        if stray:
            raise ConfigError(f"algorithm.episode.frozen_roles={list(self.frozen_roles)}: {stray} is not a role")
        if len(self.frozen_roles) == len(self.roles):
            raise ConfigError("algorithm.episode.frozen_roles: every role is frozen, nothing would learn")
        if self.sees not in SEES:
            raise ConfigError(f"algorithm.episode.sees={self.sees!r}: one of {list(SEES)}")

    def trainable(self, role: int) -> bool:
        return self.roles[role] not in self.frozen_roles

    def prompt(self, task: Task, query: str, before: list[str | None]) -> str:
        """Role len(before)'s prompt: the query-only prompt, or with knowledge transfer the observer prompt around
        the earlier answers still present (`before[j]` None: role j's message removed): the latest of them, or all of
        them in role order joined by `joiner` (`sees`); the query-only prompt when none is present."""
        shown = [a for a in before if a is not None] if self.knowledge_transfer else []
        if not shown:
            return task.pioneer_prompt(query)
        return task.observer_prompt(query, self.joiner.join(shown) if self.sees == "all" else shown[-1])

    def play(
        self,
        actors: list[Actor],
        task: Task,
        scorer: SafeScorer,
        queries: list[str],
        max_new_tokens: int,
        batch_size: int,
        for_update: frozenset[int] = frozenset(),
    ) -> Played:
        """Every role answers in order (`actors[k]` plays role k), then every answer is scored on the query. The roles
        in `for_update` answer a batch that their agent's update takes whole (`Actor.act(for_update=True)`)."""
        rollouts = self._answer(actors, task, queries, max_new_tokens, batch_size, for_update)
        rewards, failures = [], 0
        for rollout in rollouts:  # r_k = r(q, a_k) on the original query
            r, failed = scorer(queries, rollout.responses)
            rewards.append(r)
            failures += failed
        played = Played(rollouts, rewards, failures)
        played.without = lambda k: self.without(k, played, actors, task, scorer, queries, max_new_tokens, batch_size)
        return played

    def without(
        self,
        removed: int,
        played: Played,
        actors: list[Actor],
        task: Task,
        scorer: SafeScorer,
        queries: list[str],
        max_new_tokens: int,
        batch_size: int,
    ) -> list[list[float] | None]:
        """Every role's task rewards had role `removed` said nothing: None for that role, the same rewards for the
        roles before it and for roles whose prompt does not change, new answers (generated and scored) for the roles
        after it that saw it."""
        out: list[list[float] | None] = [list(r) for r in played.rewards]
        out[removed] = None
        if not self.knowledge_transfer or removed == len(self.roles) - 1:
            return out  # no later prompt showed its answer
        answers: list[list[str | None]] = [list(r.responses) for r in played.rollouts]
        answers[removed] = [None] * len(queries)
        for k in range(removed + 1, len(self.roles)):
            prompts = [self.prompt(task, q, [a[i] for a in answers[:k]]) for i, q in enumerate(queries)]
            rollout = actors[k].act(prompts, max_new_tokens, task.generation_kwargs, batch_size)
            answers[k] = rollout.responses
            out[k], failed = scorer(queries, rollout.responses)
            played.failures += failed
            played.replays += 1
        return out

    def _answer(self, actors, task, queries, max_new_tokens, batch_size, for_update=frozenset()) -> list[Rollout]:
        rollouts: list[Rollout] = []
        for k, actor in enumerate(actors):
            before = [r.responses for r in rollouts]
            prompts = [self.prompt(task, q, [a[i] for a in before]) for i, q in enumerate(queries)]
            rollouts.append(
                actor.act(prompts, max_new_tokens, task.generation_kwargs, batch_size, for_update=k in for_update)
            )
        return rollouts

    def longest_prompt(self, task: Task, query: str, max_new_tokens: int) -> tuple[str, int] | None:
        """The longest prompt a role sees for `query`, around empty earlier answers, and the answers' length to add
        (the context check before any step); None when every role sees the query alone. With `sees="all"` the last
        of R roles sees R−1 answers: the template around R−1 empty answers joined, plus (R−1)·`max_new_tokens`."""
        if len(self.roles) == 1 or not self.knowledge_transfer:
            return None
        shown = len(self.roles) - 1 if self.sees == "all" else 1
        return task.observer_prompt(query, self.joiner.join([""] * shown)), shown * max_new_tokens
