"""Debate prompts, the majority vote and the per-agent data selection of Multiagent Finetuning (docs/method.md §7).

Everything here is pure: text in, text or choices out, and randomness only through a `numpy.random.Generator` that
the caller seeds. The prompts are this project's wording of the paper's instructions (§7 "Debate"):

- round 1: solve the problem, explain briefly, give the final answer in `\\boxed{}`;
- rounds ≥ 2: the other agents' previous-round answers (pasted raw, at most `max_others`, shuffled) or a summary of
  them written by the base model, then a request for an updated answer in `\\boxed{}`.

A debate is kept per problem as a `DebateRecord`: the user message each agent saw and the response it gave in every
round. Agent n's conversation, which is what it is fine-tuned on, is rebuilt from the record exactly as it was
generated: its own round-1 answer once, as its own assistant turn, and the others' answers only in the user turns.

Data selection (§7 "Per-agent data selection"), with ŷ the label of a problem (the vote, or the ground truth):
- generation agent n: D^G_n = its own round-1 conversations whose answer equals ŷ;
- critic agent n: its own whole conversations whose final answer equals ŷ, split into C− (round-1 answer ≠ ŷ: it
  corrected itself) and C+ (round-1 answer = ŷ: it kept a right answer), mixed as w·C− + (1−w)·C+. Every C− is
  kept, as in the official code (each correction is used), and C+ is subsampled (seeded, problem order kept) to at
  most (1−w)/w·|C−|: the mix is exactly w : 1−w whenever C+ has enough examples, and richer in C− otherwise. With no
  C− the critic gets no data that round (the official code too). The sizes of both pools are logged: with weak
  models C− is often small (§7).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal

import numpy as np

from cory.tasks.answers import answers_equal, extract_answer

Chat = list[dict[str, str]]  # [{"role": "user" | "assistant", "content": ...}, ...]

ROUND1_PROMPT = (
    "Solve the following math problem. Explain your reasoning briefly, then give the final answer as a single "
    "number in \\boxed{{}}.\n\nProblem: {question}"
)
UPDATE_REQUEST = (  # the templates below are `str.format` strings: `{{}}` renders as `{}`
    "Use this as additional information and check your previous answer. Give an updated solution, explained "
    "briefly, with the final answer as a single number in \\boxed{{}}."
)
OTHERS_PROMPT = "These are the solutions of other agents to the same problem:\n\n{answers}\n\n" + UPDATE_REQUEST
SUMMARY_PROMPT = (
    "This is a summary of the solutions of other agents to the same problem:\n\n{summary}\n\n" + UPDATE_REQUEST
)
SUMMARY_REQUEST = (
    "Here are several solutions to the problem: {question}\n\n{answers}\n\nSummarise these solutions in a few "
    "sentences. Keep the final answer of each solution and the main steps that lead to it."
)


def round1_message(question: str) -> str:
    """The user message of round 1, the same for every generation agent."""
    return ROUND1_PROMPT.format(question=question)


def _numbered(responses: Sequence[str]) -> str:
    return "\n\n".join(f"Solution {i + 1}: {text.strip()}" for i, text in enumerate(responses))


def others_message(other_responses: Sequence[str]) -> str:
    """The user message of a round ≥ 2 without summarisation: the other agents' answers pasted in."""
    return OTHERS_PROMPT.format(answers=_numbered(other_responses))


def summary_message(summary: str) -> str:
    """The user message of a round ≥ 2 with summarisation: the base model's summary of the other agents' answers."""
    return SUMMARY_PROMPT.format(summary=summary.strip())


def summary_request(question: str, other_responses: Sequence[str]) -> Chat:
    """The chat the base model answers to summarise the other agents' answers for one critic."""
    return [{"role": "user", "content": SUMMARY_REQUEST.format(question=question, answers=_numbered(other_responses))}]


def pick_others(responses: Sequence[str], agent: int, rng: np.random.Generator, max_others: int | None) -> list[str]:
    """The previous-round responses of every agent but `agent`, shuffled, at most `max_others` of them."""
    others = [text for i, text in enumerate(responses) if i != agent]
    order = rng.permutation(len(others))
    return [others[i] for i in order][:max_others]


@dataclass
class DebateRecord:
    """One problem's debate. Lists are indexed [round][agent]; round 0 is the generation agents' round."""

    question: str
    truth: str  # ground-truth answer; read only by metrics and by `filter=ground_truth`
    prompts: list[list[str]] = field(default_factory=list)  # the user message agent n saw in each round
    responses: list[list[str]] = field(default_factory=list)
    answers: list[list[str | None]] = field(default_factory=list)  # `extract_answer(response, boxed=True)`
    summaries: list[list[str | None]] = field(default_factory=list)  # the summary a critic saw (None: raw answers)

    def add_round(self, prompts: list[str], responses: list[str], summaries: list[str | None] | None = None) -> None:
        self.prompts.append(list(prompts))
        self.responses.append(list(responses))
        self.answers.append([extract_answer(text, boxed=True) for text in responses])
        self.summaries.append(list(summaries) if summaries is not None else [None] * len(responses))

    def chat(self, agent: int, rounds: int) -> Chat:
        """Agent `agent`'s conversation through `rounds` completed rounds (user and assistant turns alternate)."""
        messages: Chat = []
        for r in range(rounds):
            messages.append({"role": "user", "content": self.prompts[r][agent]})
            messages.append({"role": "assistant", "content": self.responses[r][agent]})
        return messages

    def next_chat(self, agent: int, user_message: str) -> Chat:
        """The conversation agent `agent` answers in the next round: its history plus the new user message."""
        return self.chat(agent, len(self.responses)) + [{"role": "user", "content": user_message}]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DebateRecord:
        return cls(**data)


def majority_vote(answers: Sequence[str | None], rng: np.random.Generator) -> str | None:
    """The most frequent parsed answer; None when no agent produced a number.

    Args:
        answers: normalised number strings as `extract_answer` returns them (None: no number), one per agent.
        rng: breaks a tie uniformly among the tied answers, listed in numeric order first, so the result depends on
            the seed and the set of tied answers only: not on agent order, and never on string order (§7).
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    tied = sorted((a for a, c in counts.items() if c == top), key=Decimal)
    return tied[0] if len(tied) == 1 else tied[int(rng.integers(len(tied)))]


def generation_data(records: Sequence[DebateRecord], labels: Sequence[str | None], agent: int) -> list[Chat]:
    """D^G_n: agent n's own round-1 conversations whose answer equals the label (problems without one are skipped)."""
    return [
        record.chat(agent, rounds=1)
        for record, label in zip(records, labels)
        if label is not None and answers_equal(record.answers[0][agent], label)
    ]


@dataclass
class CriticData:
    chats: list[Chat]  # the mixed dataset
    corrected: int  # |C−| before mixing
    kept: int  # |C+| before mixing


def critic_data(
    records: Sequence[DebateRecord], labels: Sequence[str | None], agent: int, w: float, rng: np.random.Generator
) -> CriticData:
    """Critic agent n's whole conversations whose final answer equals the label, mixed as w·C− + (1−w)·C+."""
    corrected: list[Chat] = []
    kept: list[Chat] = []
    for record, label in zip(records, labels):
        if label is None or not answers_equal(record.answers[-1][agent], label):
            continue
        pool = kept if answers_equal(record.answers[0][agent], label) else corrected
        pool.append(record.chat(agent, rounds=len(record.responses)))
    return CriticData(mix(corrected, kept, w, rng), len(corrected), len(kept))


def mix(corrected: list[Chat], kept: list[Chat], w: float, rng: np.random.Generator) -> list[Chat]:
    """w·C− + (1−w)·C+: every C−, and C+ subsampled to at most (1 − w)/w · |C−|.

    E.g. w = 2/3 with |C−| = 2, |C+| = 10 gives both C− and one C+; with |C−| = 10, |C+| = 2 all twelve.
    """
    if not 0.0 < w <= 1.0:
        raise ValueError(f"critic_mix_w={w}: must lie in (0, 1]")
    eps = 1e-9  # 2 · (1/3) / (2/3) must floor to 1, not 0
    return list(corrected) + _subsample(kept, math.floor(len(corrected) * (1.0 - w) / w + eps), rng)


def _subsample(items: list[Chat], n: int, rng: np.random.Generator) -> list[Chat]:
    if n >= len(items):
        return list(items)
    chosen = np.sort(rng.choice(len(items), size=n, replace=False))
    return [items[i] for i in chosen]
