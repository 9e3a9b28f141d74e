"""Multiagent Finetuning (MAFT): agents debate, a majority vote labels the data, each agent learns its own share.

Read against docs/method.md §7 (Subramaniam et al., "Multiagent Finetuning: Self Improvement with Diverse Reasoning
Chains", ICLR 2025, arXiv 2501.05707). It is supervised fine-tuning, not RL: no reward model, and the ground truth is
used only to score (or, with `filter=ground_truth`, to select the data, as in STaR). One fine-tuning round k:
  1. debate on the training problems with the agents of round k − 1:
     round 1: N generation agents answer independently;
     rounds ≥ 2: N critic agents each see the other agents' previous answers (summarised by the base model, or
     pasted raw, at most `max_others`, shuffled) after their own previous answer, and answer again;
  2. majority vote over the final-round answers (ties: a seeded random choice, never string order);
  3. per-agent data: generation agent n keeps its own round-1 answers that agree with the vote (D^G_n); critic agent
     n keeps its own conversations whose final answer agrees, mixed as w·C− + (1−w)·C+ (D^C_n);
  4. supervised fine-tuning of each agent on its own data only, from its previous weights (or from the base).
Before any fine-tuning (round 0) and after every round the agents debate the held-out problems: the final vote's
accuracy ± s.e. is the paper's metric, and round 0 holds the free baselines (one sample, round-1 majority, debate
without fine-tuning). `single_agent_ft=true` is the single-agent FT baseline: one shared model, trained on all the
agents' data together, plays every role.

Every stage is saved as it finishes (`cory.maft.store`) and seeded by (seed, stage), so a killed run restarted on the
same folder skips what is done and continues exactly.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from cory.errors import ConfigError
from cory.maft.agents import GenerationSettings
from cory.maft.debate import (
    Chat,
    DebateRecord,
    critic_data,
    generation_data,
    majority_vote,
    others_message,
    pick_others,
    round1_message,
    summary_message,
    summary_request,
)
from cory.maft.metrics import critic_name, debate_metrics, embedding_metrics, gen_name, load_encoder
from cory.maft.sft import SFTSettings
from cory.maft.store import RunStore
from cory.tasks.problems import Problem

TRAIN, EVAL = "train", "eval"
_STAGE = {TRAIN: 0, EVAL: 1, "sft": 2, "mix": 3, "vote": 4}
SHARED = "shared"  # the one model of the single-agent FT baseline


class AgentPool(Protocol):
    """The agents' weights (`cory.maft.agents.LoraAgents` or `FullCopies`); name None is the base model."""

    def generate(
        self, name: str | None, chats: list[Chat], max_new_tokens: int, settings: GenerationSettings
    ) -> list[str]: ...

    def finetune(self, name: str, chats: list[Chat], settings: SFTSettings, seed: int) -> dict[str, float]: ...

    def reset(self, name: str) -> None: ...

    def save(self, name: str, path: Path) -> None: ...

    def load(self, name: str, path: Path) -> None: ...


def stage_seed(seed: int, stage: str, *parts: int) -> int:
    """A seed for one stage of the run, independent of everything that ran before it."""
    return int(np.random.SeedSequence([seed, _STAGE[stage], *parts]).generate_state(1)[0])


class MAFT:
    """N generation + N critic agents, `debate_rounds` rounds of debate, `finetune_rounds` rounds of SFT (§7)."""

    def __init__(
        self,
        *,
        make_agents: Callable[[list[str]], AgentPool],
        store: RunStore,
        seed: int,
        num_agents: int,
        debate_rounds: int,
        finetune_rounds: int,
        summarize: bool,
        max_others: int,
        filter: str,
        critic_mix_w: float,
        finetune_from: str,
        single_agent_ft: bool,
        embedding_diversity: bool,
        log_samples: int,
        generation: GenerationSettings,
        sft: SFTSettings,
    ) -> None:
        _check(num_agents >= 1, f"algorithm.num_agents={num_agents}: must be >= 1")
        _check(debate_rounds >= 1, f"algorithm.debate_rounds={debate_rounds}: must be >= 1")
        _check(debate_rounds == 1 or num_agents >= 2, "algorithm.debate_rounds > 1 needs num_agents >= 2 (critics)")
        _check(finetune_rounds >= 0, f"algorithm.finetune_rounds={finetune_rounds}: must be >= 0")
        _check(max_others >= 1, f"algorithm.max_others={max_others}: must be >= 1")
        _check(filter in ("vote", "ground_truth"), f"algorithm.filter={filter!r}: allowed vote, ground_truth")
        _check(0.0 < critic_mix_w <= 1.0, f"algorithm.critic_mix_w={critic_mix_w}: must lie in (0, 1]")
        _check(finetune_from in ("previous", "base"), f"algorithm.finetune_from={finetune_from!r}: previous, base")
        self.store, self.seed = store, seed
        self.num_agents, self.debate_rounds, self.finetune_rounds = num_agents, debate_rounds, finetune_rounds
        self.summarize, self.max_others, self.filter = summarize, max_others, filter
        self.critic_mix_w, self.finetune_from, self.single_agent_ft = critic_mix_w, finetune_from, single_agent_ft
        self.log_samples, self.generation, self.sft = log_samples, generation, sft
        self.roles = [gen_name(n) for n in range(num_agents)]
        self.roles += [critic_name(n) for n in range(num_agents)] if debate_rounds > 1 else []
        self.pool = make_agents(self.trained_agents)
        self.encoder = load_encoder() if embedding_diversity and num_agents > 1 else None

    @property
    def trained_agents(self) -> list[str]:
        """The names of the weights that are fine-tuned: one per role, or the single shared model."""
        return [SHARED] if self.single_agent_ft else list(self.roles)

    def weights_of(self, role: str) -> str:
        return SHARED if self.single_agent_ft else role

    def restore(self) -> None:
        """Load every agent's latest saved weights (a restarted run)."""
        for agent, path in self.store.latest_weights(self.trained_agents).items():
            self.pool.load(agent, path)

    # ----------------------------------------------------------------------------------------------------------------
    # One fine-tuning round, top to bottom
    # ----------------------------------------------------------------------------------------------------------------

    def finetune_round(self, k: int, problems: list[Problem]) -> dict[str, float]:
        """Round k ≥ 1: debate on the training problems, vote, select each agent's data, fine-tune each agent."""
        t0 = time.perf_counter()
        # 1. debate with the agents as round k − 1 left them
        records = self.debate(problems, TRAIN, k)
        # 2. majority vote over the final-round answers; the label is the vote (or, as in STaR, the ground truth)
        votes = self.votes(records, TRAIN, k, self.debate_rounds - 1)
        labels = votes if self.filter == "vote" else [record.truth for record in records]
        metrics = debate_metrics(records, votes, self.votes(records, TRAIN, k, 0), TRAIN)
        t1 = time.perf_counter()
        # 3. each agent's own data: D^G_n for generation agent n, w·C− + (1−w)·C+ for critic agent n
        datasets, sizes = self.select_data(records, labels, k)
        # 4. supervised fine-tuning of each agent on its own data only
        for index, (agent, chats) in enumerate(datasets.items()):
            metrics |= self.finetune_agent(k, index, agent, chats)
        return metrics | sizes | {"time/debate_s": t1 - t0, "time/sft_s": time.perf_counter() - t1}

    def debate(self, problems: list[Problem], split: str, k: int) -> list[DebateRecord]:
        """Every debate round on `problems` with the current agents; each round is saved as it finishes."""
        records = [DebateRecord(p.question, p.answer) for p in problems]
        for r in range(self.debate_rounds):
            compute = partial(self.debate_round, records, split, k, r)
            records = self.store.debate(k, split, r + 1, compute)
        return records

    def debate_round(self, records: list[DebateRecord], split: str, k: int, r: int) -> list[DebateRecord]:
        """Debate round r (0-based): the prompts every agent sees, then every agent's answer."""
        print(
            f"[maft] round {k}: {split} debate, round {r + 1}/{self.debate_rounds}, {len(records)} problems",
            flush=True,
        )
        torch.manual_seed(stage_seed(self.seed, split, k, r))
        rng = np.random.default_rng(stage_seed(self.seed, split, k, r))
        records, n = copy.deepcopy(records), self.num_agents
        summaries: list[list[str | None]] = [[None] * n for _ in records]
        if r == 0:  # generation agents: the problem alone
            prompts = [[round1_message(record.question)] * n for record in records]
        else:  # critics: the other agents' previous answers (never their own), summarised or raw
            cap = None if self.summarize else self.max_others
            others = [[pick_others(rec.responses[-1], a, rng, cap) for a in range(n)] for rec in records]
            if self.summarize:  # by the base model, adapters off (§7)
                requests = [summary_request(rec.question, o) for rec, row in zip(records, others) for o in row]
                flat = self.pool.generate(None, requests, self.generation.summary_max_new_tokens, self.generation)
                summaries = [flat[i * n : (i + 1) * n] for i in range(len(records))]
                prompts = [[summary_message(s) for s in row] for row in summaries]
            else:
                prompts = [[others_message(o) for o in row] for row in others]
        role = gen_name if r == 0 else critic_name
        responses = [[""] * n for _ in records]
        for a in range(n):  # each agent answers its own conversation: its history plus this round's prompt
            chats = [record.next_chat(a, prompts[i][a]) for i, record in enumerate(records)]
            agent = self.weights_of(role(a))
            answers = self.pool.generate(agent, chats, self.generation.max_new_tokens, self.generation)
            for i, text in enumerate(answers):
                responses[i][a] = text
        for record, p, y, s in zip(records, prompts, responses, summaries):
            record.add_round(p, y, s)
        return records

    def votes(self, records: list[DebateRecord], split: str, k: int, debate_round: int) -> list[str | None]:
        """The majority answer of each problem in one debate round, ties broken by a per-problem seeded RNG."""
        seeds = [stage_seed(self.seed, "vote", _STAGE[split], k, debate_round, i) for i in range(len(records))]
        return [majority_vote(rec.answers[debate_round], np.random.default_rng(s)) for rec, s in zip(records, seeds)]

    def select_data(
        self, records: list[DebateRecord], labels: list[str | None], k: int
    ) -> tuple[dict[str, list[Chat]], dict[str, float]]:
        """Each trained agent's fine-tuning conversations (saved to the run folder) and the datasets' sizes."""
        data = {gen_name(a): generation_data(records, labels, a) for a in range(self.num_agents)}
        sizes: dict[str, float] = {}
        for a in range(self.num_agents if self.debate_rounds > 1 else 0):
            rng = np.random.default_rng(stage_seed(self.seed, "mix", k, a))
            critic = critic_data(records, labels, a, self.critic_mix_w, rng)
            data[critic_name(a)] = critic.chats
            sizes[f"maft/data/{critic_name(a)}/corrected"] = float(critic.corrected)
            sizes[f"maft/data/{critic_name(a)}/kept"] = float(critic.kept)
        if self.single_agent_ft:  # one model learns from every agent's data
            data = {SHARED: [chat for chats in data.values() for chat in chats]}
        for agent, chats in data.items():
            sizes[f"maft/data/{agent}/examples"] = float(len(chats))
            self.store.save_data(k, agent, chats)
        return data, sizes

    def finetune_agent(self, k: int, index: int, agent: str, chats: list[Chat]) -> dict[str, float]:
        """SFT of one agent on its own data (skipped when a restarted run finds its weights saved)."""
        path = self.store.weights(k, agent)
        if not path.exists():
            if self.finetune_from == "base":
                self.pool.reset(agent)
            stats: dict[str, float] = {"examples": 0.0}
            if chats:  # no data: the agent keeps its weights this round
                print(f"[maft] round {k}: fine-tuning {agent} on {len(chats)} conversations", flush=True)
                seed = stage_seed(self.seed, "sft", k, index)
                stats = self.pool.finetune(agent, chats, self.sft, seed)
            self.store.save_weights_stats(k, agent, stats)
            self.pool.save(agent, path)
        stats = self.store.weights_stats(k, agent)
        return {f"maft/sft/{agent}/loss": stats["loss"]} if "loss" in stats else {}

    # ----------------------------------------------------------------------------------------------------------------
    # Held-out evaluation
    # ----------------------------------------------------------------------------------------------------------------

    def evaluate(self, k: int, problems: list[Problem]) -> tuple[dict[str, float], list[dict]]:
        """The held-out debate after round k: its metrics and a few transcripts for the samples table."""
        t0 = time.perf_counter()
        records = self.debate(problems, EVAL, k)
        votes = self.votes(records, EVAL, k, self.debate_rounds - 1)
        metrics = debate_metrics(records, votes, self.votes(records, EVAL, k, 0), EVAL)
        if self.encoder is not None:
            metrics |= embedding_metrics(records, self.encoder, EVAL)
        samples = []
        for record, vote in list(zip(records, votes))[: self.log_samples]:
            row = {"question": record.question, "truth": record.truth, "vote": vote}
            row |= {gen_name(a): record.responses[0][a] for a in range(self.num_agents)}
            if self.debate_rounds > 1:
                row |= {critic_name(a): record.responses[-1][a] for a in range(self.num_agents)}
            samples.append(row)
        return metrics | {"time/eval_s": time.perf_counter() - t0}, samples


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
