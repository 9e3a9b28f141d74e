"""Test doubles for the Multiagent Finetuning tests: an arithmetic task, a chat template, a composed config, a
scripted agent pool that answers without a model, a run context without a model, and `python -m cory.train` that
pauses at one stage of a MAFT round (so that a test can signal or kill it exactly there)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import save_file

from cory.algorithms.base import RunContext
from cory.maft.debate import Chat
from cory.models import build_tiny_gpt2
from cory.settings import HardwareSettings, RunSettings
from cory.tasks.problems import Problem, arithmetic_problems, split_disjoint
from helpers.compose import compose_cfg

# A minimal chat template for the in-memory byte tokenizer (which has none): role tags, EOS closes every turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def tiny_gpt2_that_writes_digits(n_positions: int = 1024, boost: float = 3.0):
    """The tiny random GPT-2 with the logits of "1" and "2" raised by boost² (a bias on one hidden unit): its answers
    are numbers made of 1s and 2s, so with two new tokens agents often agree, votes exist and every agent gets data."""
    model, tokenizer = build_tiny_gpt2(n_positions=n_positions)
    digits = tokenizer.convert_tokens_to_ids(["1", "2"])
    with torch.no_grad():
        model.transformer.ln_f.bias[0] += boost
        model.lm_head.weight[digits, 0] += boost  # tied with the input embedding; harmless here
    return model, tokenizer


class ArithmeticProblems:
    """A task that only provides problems, as the reasoning tasks do (`train_problems` / `eval_problems`)."""

    def __init__(self, tokenizer=None, num_train: int = 6, num_eval: int = 4, seed: int = 0, name: str = "arith"):
        problems = arithmetic_problems(num_train + num_eval, seed, terms=(2, 2), digits=(1, 1), operators="+")
        self.name = name
        self._train, self._eval = split_disjoint(problems[:num_train], problems[num_train:])

    def train_problems(self) -> list[Problem]:
        return list(self._train)

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)


def maft_cfg(tmp_path: Path, overrides: list[str] | None = None, **task) -> DictConfig:
    """`algorithm=maft` on the tiny GPT-2 with the byte tokenizer's chat template and `ArithmeticProblems`."""
    cfg = compose_cfg(
        [
            "~experiment",
            "algorithm=maft",
            "hardware=cpu",
            "progress=false",
            f"cache_dir={tmp_path / 'cache'}",
            "num_eval=null",
            "iterations=1",  # one fine-tuning round, evaluated and checkpointed
            "eval_every=1",
            "save_every=1",
            "algorithm.num_agents=2",
            "algorithm.embedding_diversity=false",
            "algorithm.generation.max_new_tokens=2",
            "algorithm.generation.summary_max_new_tokens=12",
            "algorithm.sft.learning_rate=1e-2",
            "algorithm.sft.batch_size=4",
            "algorithm.sft.max_length=1024",
            *(overrides or []),
        ]
    )
    OmegaConf.update(cfg, "algorithm.agent_models.chat_template", CHAT_TEMPLATE)
    cfg.task = OmegaConf.create({"_target_": "helpers.maft_fakes.ArithmeticProblems", **task})
    cfg.model = OmegaConf.create({"_target_": "helpers.maft_fakes.tiny_gpt2_that_writes_digits"})
    return cfg


class Problems:
    """A task holding given problems (the same list for training and held-out unless told otherwise)."""

    name = "problems"

    def __init__(self, train: list[Problem], eval: list[Problem] | None = None) -> None:
        self._train, self._eval = list(train), list(train if eval is None else eval)

    def train_problems(self) -> list[Problem]:
        return list(self._train)

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)


def no_model():
    raise AssertionError("the model was loaded")


def fake_context(run_dir: Path, task, load_model: Callable = lambda: (None, None), num_eval=None) -> RunContext:
    """What the entry point hands an algorithm, with `load_model` and `task` given (no model by default)."""
    return RunContext(
        settings=RunSettings(iterations=1, batch_size=2, seed=0, eval_every=1, num_eval=num_eval, save_every=1),
        hardware=HardwareSettings(device="cpu", precision="fp32", forward_batch_size=8, generation_batch_size=8),
        device=torch.device("cpu"),
        run_dir=Path(run_dir),
        load_model=load_model,
        backbone=no_model,
        task=lambda: task,
    )


def scripted_agent_models(answer):
    """An `agent_models` partial's stand-in: called as MAFT calls it, it returns a `ScriptedPool`."""

    def make(model, tokenizer, names, **hardware) -> ScriptedPool:
        return ScriptedPool(names, answer)

    return make


class ScriptedPool:
    """An agent pool without a model: `answer(name, chat)` writes each response; every call is recorded."""

    def __init__(self, names: list[str], answer) -> None:
        self.names, self.answer = names, answer
        self.calls: list[tuple[str | None, list[Chat]]] = []
        self.finetuned: dict[str, list[Chat]] = {}
        self.resets: list[str] = []

    def generate(self, name, chats, max_new_tokens, settings) -> list[str]:
        self.calls.append((name, chats))
        return [self.answer(name, chat) for chat in chats]

    def finetune(self, name, chats, settings, seed) -> dict[str, float]:
        self.finetuned[name] = chats
        return {"loss": 1.0, "examples": float(len(chats))}

    def reset(self, name) -> None:
        self.resets.append(name)

    def save(self, name, path) -> None:  # a real safetensors file, as the pools write (stage files are checked)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"weight": torch.zeros(1)}, str(path))

    def load(self, name, path) -> None:
        pass

    def state_dict(self, name) -> dict[str, torch.Tensor]:
        return {}

    def parameters(self, name) -> list[torch.Tensor]:
        return []


# --------------------------------------------------------------------------------------------- a paused real run
PAUSE_ARGS = {"finetune_agent": 0, "debate_round": 1}  # where the stage's key starts in the method's arguments


def main_with_a_pause() -> None:
    """`python -m cory.train` (the real entry point, `cory.train.main`) that stops once at one MAFT stage.

    `MAFT_PAUSE` names it: `finetune_agent:<round>:<agent index>` (before that agent's SFT) or
    `debate_round:<split>:<round>:<debate round, 0-based>` (before that debate round). There the process writes the
    file `MAFT_PAUSE_MARKER` and waits until `<marker>.go` exists (or it is killed), then carries on. Run as
    `python -c "from helpers.maft_fakes import main_with_a_pause; main_with_a_pause()" <overrides>` with tests/ on
    PYTHONPATH.
    """
    import cory.train
    from cory.algorithms.maft import MAFT

    method, *key = os.environ["MAFT_PAUSE"].split(":")
    marker = Path(os.environ["MAFT_PAUSE_MARKER"])
    original, start = getattr(MAFT, method), PAUSE_ARGS[method]

    def paused(self, *args, **kwargs):
        if [str(a) for a in args[start : start + len(key)]] == key and not marker.exists():
            marker.write_text(str(os.getpid()))
            while not marker.with_suffix(".go").exists():
                time.sleep(0.02)
        return original(self, *args, **kwargs)

    setattr(MAFT, method, paused)
    cory.train.main()
