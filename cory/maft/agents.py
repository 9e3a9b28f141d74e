"""The 2N agents' weights and how they generate and train (docs/method.md §7 "Training").

Two interchangeable pools, chosen by `algorithm/agent_models=lora|full`:
- `LoraAgents` (default): one frozen base model with one LoRA adapter per agent, all initialised identically
  (seeded); the base itself, with adapters disabled, writes the debate summaries.
- `FullCopies`: a full copy of the model per agent (fine-tuned in full, lr ≈ 1e-5 in the paper); the untouched
  original writes the summaries.

Both offer the same methods (identical code where it must be repeated): `generate(name, chats, max_new_tokens,
settings)` (name None: the base model), `finetune(name, chats, settings, seed)`, `reset(name)` to the initial
weights, `save`/`load` of one agent's own weights (safetensors), `state_dict(name)` (a copy) and `parameters(name)`
(the agent's trainable tensors themselves, for the trainer's finite-weight check). The agents differ
only by their fine-tuning data, which is the method's point: each is trained on its own answers (§7).

Prompts are rendered with the tokenizer's chat template (`cory.maft.sft.render`), the same one SFT tokenises with.
A tokenizer without a template needs `chat_template` (e.g. the tiny test models).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cory import runtime
from cory.errors import ConfigError
from cory.maft.debate import Chat
from cory.maft.sft import SFTSettings, chat_tokens, encode, render, train_sft


@dataclass(frozen=True)
class GenerationSettings:
    """The `algorithm.generation` block: how every agent samples (the agents must sample: they start identical)."""

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "max_new_tokens": "[1, inf)",
        "summary_max_new_tokens": "[1, inf)",
        "temperature": "(0, inf)",
        "top_p": "(0, 1]",
        "top_k": "[0, inf); 0: no top-k filter",
    }

    max_new_tokens: int  # an answer
    summary_max_new_tokens: int  # a base-model summary of the other agents' answers
    temperature: float
    top_p: float
    top_k: int

    def __post_init__(self) -> None:
        for key in ("max_new_tokens", "summary_max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"algorithm.generation.{key}={getattr(self, key)}: must be >= 1")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError(
                f"algorithm.generation: temperature={self.temperature} must be > 0, top_p={self.top_p} in (0, 1], "
                f"top_k={self.top_k} >= 0"
            )


def set_chat_template(tokenizer: PreTrainedTokenizerBase, chat_template: str | None) -> None:
    """Install `chat_template` when given; a tokenizer must end up with one (generation and SFT both render it)."""
    if chat_template:
        tokenizer.chat_template = chat_template
    if not tokenizer.chat_template:
        raise ConfigError(
            "algorithm.agent_models.chat_template: the model's tokenizer has no chat template; set one (a Jinja "
            "string, used for generation and fine-tuning alike)"
        )
    # Rendered once now, on a conversation shaped like a critic's (user, assistant, user, assistant): a template
    # that does not render, or whose prefixes are not token prefixes (SFT could not find the answers), is refused
    # in one line before any debate, not as a Jinja traceback in the middle of a round.
    probe = [{"role": role, "content": f"{role} {i}"} for i, role in enumerate(["user", "assistant"] * 2)]
    try:
        chat_tokens(tokenizer, probe)
    except Exception as err:  # noqa: BLE001 - Jinja's errors (syntax, undefined names) and the prefix check
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"algorithm.agent_models.chat_template: the chat template fails on a user/assistant conversation "
            f"({type(err).__name__}: {first})"
        ) from None


@torch.no_grad()
def generate_chats(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    chats: list[Chat],
    max_new_tokens: int,
    settings: GenerationSettings,
    *,
    batch_size: int,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> list[str]:
    """One sampled answer per chat (decoded, special tokens dropped, stripped), in the order of `chats`.

    Prompts are sorted by length and generated in left-padded batches, so little compute goes to padding.
    """
    model.eval()
    prompts = [encode(tokenizer, render(tokenizer, chat, add_generation_prompt=True)) for chat in chats]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(prompts[i]) for i in batch)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in batch], device=device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch], device=device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id,
            )
        for i, text in zip(batch, tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)):
            texts[i] = text.strip()
    return [texts[i] for i in range(len(chats))]


def add_lora_adapters(
    model: PreTrainedModel,
    names: list[str],
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | None,
    seed: int,
):
    """The base model wrapped as a `PeftModel` with one LoRA adapter per name, all initialised identically.

    The one place where PEFT wrapping happens. The base weights are frozen by PEFT; `set_adapter(name)` makes that
    adapter the active and only trainable one; `disable_adapter()` gives the base model back. `target_modules` None
    takes PEFT's default for the architecture (q_proj, v_proj for Llama; c_attn for GPT-2).
    """
    from peft import get_peft_model

    from cory.policy import LoraSettings  # one PEFT config for every algorithm's adapters (no bias, causal LM)

    modules = None if target_modules is None else tuple(target_modules)
    settings = LoraSettings(enabled=True, r=r, alpha=alpha, dropout=dropout, target_modules=modules, share_base=True)
    peft_model = None
    for name in names:
        config = settings.peft_config(model)
        with torch.random.fork_rng():
            torch.manual_seed(seed)  # same initial A matrices for every agent (B starts at zero)
            if peft_model is None:
                peft_model = get_peft_model(model, config, adapter_name=name)
            else:
                peft_model.add_adapter(name, config)
    return peft_model


def _adapter_of(parameter_name: str) -> str | None:
    """The adapter a PEFT parameter belongs to (the name after its `lora_*` module), None for a base weight."""
    parts = parameter_name.split(".")
    return next((parts[i + 1] for i in range(len(parts) - 1) if parts[i].startswith("lora_")), None)


def _generate(
    pool, name: str | None, chats: list[Chat], max_new_tokens: int, settings: GenerationSettings
) -> list[str]:
    """What both ways of holding the agents share: generation through `pool.use(name)` (an adapter switch, or a
    copy lookup) with the pool's tokenizer, device, precision and batch size."""
    with pool.use(name) as model:
        hardware = {"device": pool.device, "autocast_dtype": runtime.autocast_dtype(pool.precision)}
        batch = pool.generation_batch_size
        return generate_chats(model, pool.tokenizer, chats, max_new_tokens, settings, batch_size=batch, **hardware)


def _finetune(pool, name: str, chats: list[Chat], settings: SFTSettings, seed: int) -> dict[str, float]:
    """Supervised fine-tuning of agent `name` through `pool.use(name)` (both ways of holding the agents)."""
    with pool.use(name) as model:
        hardware = {"use_cpu": pool.device.type == "cpu", "bf16": pool.precision == "bf16"}
        return train_sft(model, pool.tokenizer, chats, settings, seed=seed, **hardware)


class LoraAgents:
    """Every agent a LoRA adapter of one shared frozen base model (`algorithm/agent_models=lora`)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        names: list[str],
        *,
        r: int,
        alpha: float,
        dropout: float,
        target_modules: list[str] | None,
        chat_template: str | None,
        seed: int,
        device: torch.device,
        precision: str,
        generation_batch_size: int,
    ) -> None:
        set_chat_template(tokenizer, chat_template)
        self.tokenizer, self.names, self.device, self.precision = tokenizer, list(names), device, precision
        self.generation_batch_size = generation_batch_size
        self.model = add_lora_adapters(
            model.to(device), self.names, r=r, alpha=alpha, dropout=dropout, target_modules=target_modules, seed=seed
        )
        self._initial = self.state_dict(self.names[0])  # every adapter starts from these weights

    def generate(
        self, name: str | None, chats: list[Chat], max_new_tokens: int, settings: GenerationSettings
    ) -> list[str]:
        return _generate(self, name, chats, max_new_tokens, settings)

    def finetune(self, name: str, chats: list[Chat], settings: SFTSettings, seed: int) -> dict[str, float]:
        return _finetune(self, name, chats, settings, seed)

    @contextmanager
    def use(self, name: str | None) -> Iterator[nn.Module]:
        """The model as agent `name` (its adapter active and the only trainable one), or the base (None)."""
        if name is None:
            with self.model.disable_adapter():
                yield self.model
        else:
            self.model.set_adapter(name)
            yield self.model

    def parameters(self, name: str) -> list[torch.Tensor]:
        """The agent's own trainable tensors: the LoRA matrices of its adapter (`...lora_A.<name>.weight`)."""
        return [p for n, p in self.model.named_parameters() if _adapter_of(n) == name]

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """A copy of the agent's own weights (its adapter's tensors, keys without the adapter name)."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name).items()}

    def reset(self, name: str) -> None:
        """Back to the initial adapter (fine-tuning "from base", §7)."""
        self._load_state(name, self._initial)

    def save(self, name: str, path: Path) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(path.name + ".tmp")
        save_file(self.state_dict(name), str(tmp))
        os.replace(tmp, path)  # atomic: a file that exists is complete

    def load(self, name: str, path: Path) -> None:
        from safetensors.torch import load_file

        self._load_state(name, load_file(str(path), device=str(self.device)))

    def _load_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        missing = [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]
        if result.unexpected_keys or missing:
            raise ValueError(f"adapter {name}: saved weights do not fit ({result.unexpected_keys[:2]}, {missing[:2]})")


class FullCopies:
    """Every agent a full copy of the model, fine-tuned in full (`algorithm/agent_models=full`)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        names: list[str],
        *,
        chat_template: str | None,
        seed: int,
        device: torch.device,
        precision: str,
        generation_batch_size: int,
    ) -> None:
        set_chat_template(tokenizer, chat_template)
        self.tokenizer, self.names, self.device, self.precision = tokenizer, list(names), device, precision
        self.generation_batch_size = generation_batch_size
        self.base = model.to(device).eval().requires_grad_(False)
        self.copies = {name: copy.deepcopy(self.base).requires_grad_(True) for name in self.names}

    def generate(
        self, name: str | None, chats: list[Chat], max_new_tokens: int, settings: GenerationSettings
    ) -> list[str]:
        return _generate(self, name, chats, max_new_tokens, settings)

    def finetune(self, name: str, chats: list[Chat], settings: SFTSettings, seed: int) -> dict[str, float]:
        return _finetune(self, name, chats, settings, seed)

    @contextmanager
    def use(self, name: str | None) -> Iterator[nn.Module]:
        """The agent's copy, or the untouched base (None)."""
        yield self.base if name is None else self.copies[name]

    def parameters(self, name: str) -> list[torch.Tensor]:
        """The agent's trainable tensors: every weight of its copy (tied ones once)."""
        return list(self.copies[name].parameters())

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """A copy of the agent's weights."""
        return {k: v.detach().clone() for k, v in self.copies[name].state_dict().items()}

    def reset(self, name: str) -> None:
        self.copies[name].load_state_dict(self.base.state_dict())

    def save(self, name: str, path: Path) -> None:
        from safetensors.torch import save_model

        tmp = path.with_name(path.name + ".tmp")
        save_model(self.copies[name], str(tmp))  # handles tied embeddings
        os.replace(tmp, path)

    def load(self, name: str, path: Path) -> None:
        from safetensors.torch import load_model

        load_model(self.copies[name], str(path), device=str(self.device))
