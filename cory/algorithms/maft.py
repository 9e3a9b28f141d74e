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
agents' data together, plays every role. Every evaluation also appends each problem's 0/1 outcomes to the run
folder's `eval_outcomes.jsonl` (`cory.maft.outcomes`): two evaluations score the same problems, so their difference
is judged by a paired test (`cory-report paired`).

Through the trainer (`cory.algorithms.base.Algorithm`), one iteration is one fine-tuning round and the run-level
`iterations` is the number of rounds L:
- `evaluate(k)` is the held-out debate after k rounds (k = 0: the base agents, the free baselines);
- `step(k)` is fine-tuning round k + 1 (0-based iterations, 1-based rounds). In metrics.jsonl, whose `iteration`
  counts completed iterations, the row of iteration k with `maft/eval/...` holds the evaluation after round k, and
  the row of iteration k with `maft/train/...`, `maft/data/...` and `maft/sft/...` holds round k's fine-tuning.
Every stage (each debate round, each agent's SFT) is saved in the run folder as it finishes (`cory.maft.store`) and
seeded by (seed, stage); a checkpoint holds every trained agent's weights. A run killed mid-round and resumed from its
last checkpoint reads back the stages it had finished since and continues exactly as an uninterrupted run.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from cory import distributed, runtime
from cory.algorithms.base import EvalOutput, Report, RunContext, StepOutput, named_parameters
from cory.checkpoints import check_files, damaged, refuse_nonfinite
from cory.errors import CheckpointError, ConfigError, writing
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
from cory.maft.outcomes import OUTCOMES_FILE, append_outcomes, outcome_rows
from cory.maft.sft import SFTSettings
from cory.maft.store import RunStore
from cory.preemption import abandonable
from cory.tasks.problems import Problem

TRAIN, EVAL = "train", "eval"
_STAGE = {TRAIN: 0, EVAL: 1, "sft": 2, "mix": 3, "vote": 4}
SHARED = "shared"  # the one model of the single-agent FT baseline
STATE = "maft.json"  # in a checkpoint's algorithm folder, beside each trained agent's `<agent>.safetensors`


class AgentPool(Protocol):
    """The agents' weights (`cory.maft.agents.LoraAgents` or `FullCopies`); name None is the base model."""

    def generate(
        self, name: str | None, chats: list[Chat], max_new_tokens: int, settings: GenerationSettings
    ) -> list[str]: ...

    def finetune(self, name: str, chats: list[Chat], settings: SFTSettings, seed: int) -> dict[str, float]: ...

    def reset(self, name: str) -> None: ...

    def save(self, name: str, path: Path) -> None: ...

    def load(self, name: str, path: Path) -> None: ...

    def state_dict(self, name: str) -> dict[str, torch.Tensor]: ...

    def parameters(self, name: str) -> list[torch.Tensor]: ...


def stage_seed(seed: int, stage: str, *parts: int) -> int:
    """A seed for one stage of the run, independent of everything that ran before it."""
    return int(np.random.SeedSequence([seed, _STAGE[stage], *parts]).generate_state(1)[0])


class MAFT:
    """N generation + N critic agents, `debate_rounds` rounds of debate, one round of SFT per iteration (§7).

    Built by Hydra from `cory/conf/algorithm/maft.yaml`; `agent_models` is the `algorithm/agent_models` group's
    partial (LoRA adapters over one base, or full copies), called with the run's model; `context` comes from the
    entry point (`cory.build`). The task must provide problems (`train_problems()`, `eval_problems()`); the
    held-out set is the first `num_eval` of them, the same set after every round (`num_eval_final` is not used, so
    that every round, round 0's baselines included, is measured on one set).
    """

    def __init__(
        self,
        num_agents: int,
        debate_rounds: int,
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
        agent_models: Callable[..., AgentPool],
        agent: dict | None = None,
        *,
        context: RunContext,
    ) -> None:
        # `agent` is the PPO/CORY learner block that the default experiment sets (`algorithm.agent`); MAFT has no
        # such learner, so `algorithm=maft` with that experiment accepts the block and ignores it.
        del agent
        _check(num_agents >= 1, f"algorithm.num_agents={num_agents}: must be >= 1")
        _check(debate_rounds >= 1, f"algorithm.debate_rounds={debate_rounds}: must be >= 1")
        _check(debate_rounds == 1 or num_agents >= 2, "algorithm.debate_rounds > 1 needs num_agents >= 2 (critics)")
        _check(max_others >= 1, f"algorithm.max_others={max_others}: must be >= 1")
        _check(filter in ("vote", "ground_truth"), f"algorithm.filter={filter!r}: allowed vote, ground_truth")
        _check(0.0 < critic_mix_w <= 1.0, f"algorithm.critic_mix_w={critic_mix_w}: must lie in (0, 1]")
        _check(finetune_from in ("previous", "base"), f"algorithm.finetune_from={finetune_from!r}: previous, base")
        _check(log_samples >= 0, f"algorithm.log_samples={log_samples}: must be >= 0")
        _check(
            not distributed.sharded(),
            "algorithm=maft fine-tunes with TRL's SFTTrainer, which DeepSpeed and FSDP do not shard here: "
            "hardware=deepspeed_zero2|deepspeed_zero3|fsdp applies to the PPO-family learners; "
            "use hardware=cpu or gpu",
        )
        self.seed, self.store = context.settings.seed, RunStore(context.run_dir)
        self.num_agents, self.debate_rounds = num_agents, debate_rounds
        self.summarize, self.max_others, self.filter = summarize, max_others, filter
        self.critic_mix_w, self.finetune_from, self.single_agent_ft = critic_mix_w, finetune_from, single_agent_ft
        self.log_samples, self.generation, self.sft = log_samples, generation, sft
        self.roles = [gen_name(n) for n in range(num_agents)]
        self.roles += [critic_name(n) for n in range(num_agents)] if debate_rounds > 1 else []
        self.rounds_done = 0  # fine-tuning rounds finished (saved in checkpoints)
        # the settings are checked: now the model, the agents' weights on it, and the task's problems
        model, tokenizer = context.load_model()
        hardware = context.hardware
        self.pool: AgentPool = agent_models(
            model,
            tokenizer,
            self.trained_agents,
            seed=self.seed,
            device=context.device,
            precision=hardware.precision,
            generation_batch_size=hardware.generation_batch_size,
        )
        task = context.task()
        _check(
            callable(getattr(task, "train_problems", None)) and callable(getattr(task, "eval_problems", None)),
            f"task {getattr(task, 'name', type(task).__name__)} provides no problems (train_problems / eval_problems);"
            f" algorithm=maft needs a reasoning task, e.g. task=arithmetic or task=gsm8k",
        )
        self.train_problems: list[Problem] = task.train_problems()
        self.eval_problems: list[Problem] = task.eval_problems()[: context.settings.num_eval]
        _check(len(self.train_problems) > 0, "task: no training problems to fine-tune on")
        _check(len(self.eval_problems) > 0, "task: no held-out problems to evaluate on")
        self.encoder = load_encoder() if embedding_diversity and num_agents > 1 else None

    @property
    def trained_agents(self) -> list[str]:
        """The names of the weights that are fine-tuned: one per role, or the single shared model."""
        return [SHARED] if self.single_agent_ft else list(self.roles)

    def weights_of(self, role: str) -> str:
        return SHARED if self.single_agent_ft else role

    # ----------------------------------------------------------------------------------------------------------------
    # The Algorithm protocol
    # ----------------------------------------------------------------------------------------------------------------

    def describe(self) -> dict:
        return {"algorithm": "maft", "num_agents": self.num_agents, "single_agent_ft": self.single_agent_ft}

    def step(self, iteration: int) -> StepOutput:
        """Fine-tuning round `iteration + 1`: debate on the training problems, vote, per-agent data, SFT."""
        metrics = self.finetune_round(iteration + 1, self.train_problems)
        self.rounds_done = iteration + 1
        losses = [v for k, v in metrics.items() if k.startswith("maft/sft/")]
        examples = sum(v for k, v in metrics.items() if k.startswith("maft/data/") and k.endswith("/examples"))
        headline = {"train_accuracy": metrics["maft/train/accuracy"], "sft_examples": examples}
        return StepOutput(metrics, nonfinite=not all(math.isfinite(v) for v in losses), headline=headline)

    def evaluate(self, iteration: int, final: bool, should_stop: Callable[[], bool]) -> EvalOutput | None:
        """The held-out debate after `iteration` rounds (0: the base agents); None if `should_stop()` became true
        between its debate rounds (the finished ones are saved: the resumed run reads them back)."""
        out = self.evaluate_round(iteration, self.eval_problems, should_stop)
        if out is None:
            return None
        metrics, samples = out
        runtime.say(f"[maft] {round_line(iteration, metrics)}")
        headline = {k: metrics[f"maft/eval/{k}"] for k in ("accuracy", "accuracy_se") if f"maft/eval/{k}" in metrics}
        return EvalOutput(metrics, [("maft/debates", samples)], headline)

    def parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return named_parameters({agent: self.pool.parameters(agent) for agent in self.trained_agents})

    def save(self, directory: Path) -> None:
        """Each trained agent's own weights (`<agent>.safetensors`) and `maft.json` (the agents, the rounds done).
        The stages of a round in progress are not in the checkpoint: they are in the run folder (`rounds/`)."""
        for agent in self.trained_agents:
            self.pool.save(agent, directory / f"{agent}.safetensors")
        (directory / STATE).write_text(json.dumps({"agents": self.trained_agents, "rounds": self.rounds_done}))

    def load(self, directory: Path) -> None:
        checkpoint = directory.parent
        with damaged(directory / STATE, checkpoint):
            state = json.loads((directory / STATE).read_text())
            agents, rounds = [str(a) for a in state["agents"]], int(state["rounds"])
        missing = [a for a in self.trained_agents if not (directory / f"{a}.safetensors").is_file()]
        if agents != self.trained_agents or missing:
            raise CheckpointError(
                f"checkpoint {checkpoint} is incompatible with this run: it holds the agents {', '.join(agents)}, "
                f"this run trains {', '.join(self.trained_agents)}"
            )
        check_files(directory, checkpoint)
        for agent in agents:
            path = directory / f"{agent}.safetensors"
            with damaged(path, checkpoint):
                self.pool.load(agent, path)
            refuse_nonfinite(self.pool.state_dict(agent), path, checkpoint)
        self.rounds_done = rounds

    def report(self, rows: list[dict], run_dir: Path) -> Report:
        """Baselines from round 0 and every round's held-out accuracies ± s.e., from the logged rows; curves.png."""
        evals = {int(row["iteration"]): row for row in rows if "maft/eval/accuracy" in row}
        base = evals.get(0, {})
        last_round = f"round{self.debate_rounds}_accuracy"
        summary = {
            "num_agents": self.num_agents,
            "debate_rounds": self.debate_rounds,
            "finetune_rounds": self.rounds_done,
            "single_agent_ft": self.single_agent_ft,
            "filter": self.filter,
            "train_problems": len(self.train_problems),
            "eval_problems": len(self.eval_problems),
            "baselines": {  # round 0: the base agents
                "single_sample": _accuracy(base, "single_sample_accuracy"),
                "majority": _accuracy(base, "round1_majority_accuracy"),
                "debate": _accuracy(base, "accuracy"),
            },
            "rounds": [
                {"round": k}
                | _accuracy(row, "accuracy")
                | {
                    "round1_accuracy": row.get("maft/eval/round1_accuracy"),
                    "final_round_accuracy": row.get(f"maft/eval/{last_round}"),
                    "single_sample_accuracy": row.get("maft/eval/single_sample_accuracy"),
                    "disagreement_round1": row.get("maft/eval/disagreement_round1"),
                    "embedding_dissimilarity_round1": row.get("maft/eval/embedding_dissimilarity_round1"),
                }
                for k, row in sorted(evals.items())
            ],
        }
        from cory.maft.plots import plot_maft_curves  # matplotlib: only when a run reports

        plot_maft_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
        return Report(summary, [round_line(k, row) for k, row in sorted(evals.items())])

    # ----------------------------------------------------------------------------------------------------------------
    # One fine-tuning round, top to bottom
    # ----------------------------------------------------------------------------------------------------------------

    def finetune_round(self, k: int, problems: list[Problem]) -> dict[str, float]:
        """Round k ≥ 1: debate on the training problems, vote, select each agent's data, fine-tune each agent."""
        t0 = time.perf_counter()
        # steps 1-3 change no weights, and the stage files they write are those a resumed run would write (seeded
        # by stage): a stop signal drops the round here at once; the resumed run reads the finished stages back
        with abandonable():
            # 1. debate with the agents as round k − 1 left them
            records = self.debate(problems, TRAIN, k)
            assert records is not None  # a training debate is not asked to stop between its rounds
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

    def debate(
        self, problems: list[Problem], split: str, k: int, should_stop: Callable[[], bool] | None = None
    ) -> list[DebateRecord] | None:
        """Every debate round on `problems` with the current agents; each round is saved as it finishes. None when
        `should_stop()` turns true before a round that is not saved yet."""
        records = [DebateRecord(p.question, p.answer) for p in problems]
        for r in range(self.debate_rounds):
            if should_stop is not None and should_stop():
                return None
            compute = partial(self.debate_round, records, split, k, r)
            records = self.store.debate(k, split, r + 1, len(problems), compute)
        return records

    def debate_round(self, records: list[DebateRecord], split: str, k: int, r: int) -> list[DebateRecord]:
        """Debate round r (0-based): the prompts every agent sees, then every agent's answer."""
        runtime.say(f"[maft] round {k}: {split} debate, round {r + 1}/{self.debate_rounds}, {len(records)} problems")
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
        """SFT of one agent on its own data; a resumed run that finds this round's weights saved loads them."""
        path = self.store.weights(k, agent)
        if self.store.saved_weights(k, agent) is not None:  # fine-tuned by a start that was killed later in the round
            try:
                self.pool.load(agent, path)
            except Exception as err:  # noqa: BLE001 - whole, but not this agent's (another model's weights)
                first = (str(err).strip().splitlines() or [""])[0]
                raise CheckpointError(
                    f"{path} does not fit agent {agent} ({type(err).__name__}: {first}); delete it and resume, and "
                    f"its stage is computed again"
                ) from None
        else:
            if self.finetune_from == "base":
                self.pool.reset(agent)
            stats: dict[str, float] = {"examples": 0.0}
            if chats:  # no data: the agent keeps its weights this round
                runtime.say(f"[maft] round {k}: fine-tuning {agent} on {len(chats)} conversations")
                seed = stage_seed(self.seed, "sft", k, index)
                stats = self.pool.finetune(agent, chats, self.sft, seed)
            self.store.save_weights_stats(k, agent, stats)
            with writing(path):  # a full disk: one line naming the stage file (safetensors raises no OSError)
                self.pool.save(agent, path)
        stats = self.store.weights_stats(k, agent)
        return {f"maft/sft/{agent}/loss": stats["loss"]} if "loss" in stats else {}

    # ----------------------------------------------------------------------------------------------------------------
    # Held-out evaluation
    # ----------------------------------------------------------------------------------------------------------------

    def evaluate_round(
        self, k: int, problems: list[Problem], should_stop: Callable[[], bool] | None = None
    ) -> tuple[dict[str, float], list[dict]] | None:
        """The held-out debate after round k: its metrics and a few transcripts for the samples table (None: a
        stop was requested between its debate rounds)."""
        t0 = time.perf_counter()
        records = self.debate(problems, EVAL, k, should_stop)
        if records is None:
            return None
        votes, round1_votes = self.votes(records, EVAL, k, self.debate_rounds - 1), self.votes(records, EVAL, k, 0)
        metrics = debate_metrics(records, votes, round1_votes, EVAL)
        # every problem's outcomes, for paired tests between rounds and runs (they score the same problems)
        outcomes = self.store.run_dir / OUTCOMES_FILE
        replaced = append_outcomes(outcomes, outcome_rows(k, records, votes, round1_votes))
        if replaced:
            runtime.say(f"[maft] {outcomes}: {replaced} rows of round {k} were of other problems; replaced")
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


def round_line(k: int, row: dict) -> str:
    """One round's held-out accuracies for the console: `round k: held-out accuracy 0.250 ± 0.217 (n=4); ...`."""

    def pm(key: str) -> str:
        return f"{_num(row.get(f'maft/eval/{key}')):.3f} ± {_num(row.get(f'maft/eval/{key}_se')):.3f}"

    return (
        f"round {k}: held-out accuracy {pm('accuracy')} (n={int(row.get('maft/eval/problems', 0))}); "
        f"round-1 majority {pm('round1_majority_accuracy')}; single sample {pm('single_sample_accuracy')}; "
        f"round-1 disagreement {_num(row.get('maft/eval/disagreement_round1')):.2f}"
    )


def _accuracy(row: dict, key: str) -> dict[str, float | None]:
    return {"accuracy": row.get(f"maft/eval/{key}"), "se": row.get(f"maft/eval/{key}_se")}


def _num(value) -> float:
    return math.nan if value is None else float(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
