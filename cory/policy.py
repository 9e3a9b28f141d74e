"""The model handle each agent learns through, the frozen reference π0, and the `Backbone` that builds both.

Two ways to give CORY's agents (and PPO's one) their weights (docs/method.md §1.1, §3.3):

- **Full fine-tuning** (`model.lora.enabled=false`): each agent owns a full copy of the model and π0 is one more
  frozen copy (`cory.models.make_reference`), shared by the agents.
- **LoRA** (PEFT): each agent owns one named adapter (its id, `llm1`/`llm2`) and its value head. With
  `model.lora.share_base=true` (required with 4-bit) every adapter sits on one frozen base, and π0 is that base with
  the adapters disabled (PEFT's `disable_adapter()`), as TRL builds the reference of a PEFT model: the base
  weights exist once in memory.

`PolicyWithValueHead` is what a `cory.ppo.trainee.Trainee` holds in both cases. It activates its own adapter before
every forward and generate, lists the parameters it owns *by name* (PEFT's `set_adapter` flips `requires_grad` with the
active adapter, so a `requires_grad` filter would hand one agent's optimiser the other agent's adapter), and saves
and loads only what it owns: the adapter (PEFT's `adapter_model.safetensors` + `adapter_config.json`) and the value
head with LoRA, the whole policy otherwise. Nothing is pickled.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cory.engines import frozen
from cory.models import make_reference

# Keys of `cory/conf/model/*.yaml` that describe how agents attach to the loaded model; every other key goes to the
# loader (`_target_`), like `algorithm.agent` beside the algorithm's own keys.
HANDLE_KEYS = ("lora", "add_special_tokens")
FULL_WEIGHTS = "policy.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
VALUE_HEAD_WEIGHTS = "value_head.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """`model.lora`: train LoRA adapters instead of all weights (docs/method.md §3.3 for the GSM8K values).

    Attributes:
        enabled: false = full fine-tuning (the other fields are then unused).
        r: adapter rank; alpha: scaling numerator (scale = alpha / r); dropout: LoRA dropout.
        target_modules: module names to adapt; None = PEFT's default for the architecture (Llama: q_proj, v_proj).
        share_base: all agents' adapters on one base model (π0 = that base with adapters disabled); false gives
            each agent its own copy of the base (same numbers, more memory; not possible with 4-bit).
    """

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "r": "[1, inf)",
        "alpha": "(0, inf)",
        "dropout": "[0, 1)",
    }

    enabled: bool
    r: int
    alpha: int
    dropout: float
    target_modules: tuple[str, ...] | None
    share_base: bool

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> LoraSettings | None:
        """The `model.lora` block as settings; None (full fine-tuning) when it is empty or `enabled` is false."""
        if not block.get("enabled", False):
            return None
        modules = block["target_modules"]
        return cls(**{**block, "target_modules": None if modules is None else tuple(modules)})

    def peft_config(self, model: nn.Module):
        """The PEFT `LoraConfig` for `model` (no bias, causal LM).

        `fan_in_fan_out` is set from the model: GPT-2's projections are transformers' `Conv1D`, which stores its
        weight as [in, out]. PEFT would set it itself, with a warning per adapted layer; the adapters are the same.
        """
        from peft import LoraConfig
        from transformers.pytorch_utils import Conv1D

        modules = list(self.target_modules) if self.target_modules is not None else None
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=modules,
            fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
            bias="none",
            task_type="CAUSAL_LM",
        )


class ValueHead(nn.Module):
    """Dropout(p) → Linear(hidden → 1) on the last hidden state, output in float32 (TRL 0.11.4 `ValueHead`)."""

    def __init__(self, hidden_size: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.summary = nn.Linear(hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[B, L, H] → [B, L] float32."""
        out = self.dropout(hidden_states).to(self.summary.weight.dtype)
        return self.summary(out).squeeze(-1).float()


class PolicyWithValueHead(nn.Module):
    """One agent's policy: a causal LM (or one named adapter of a PEFT model) and its own value head.

    Args:
        pretrained_model: the agent's whole model (full fine-tuning) or the PEFT model holding `adapter`.
        value_head_dropout: dropout of the value head (TRL: 0.1).
        adapter: the adapter this handle trains; None for full fine-tuning.
    """

    def __init__(
        self, pretrained_model: nn.Module, value_head_dropout: float = 0.1, adapter: str | None = None
    ) -> None:
        super().__init__()
        self.pretrained_model = pretrained_model
        self.adapter = adapter
        self.v_head = ValueHead(pretrained_model.config.get_text_config().hidden_size, value_head_dropout)
        # PEFT names adapter weights `...lora_A.<adapter>.weight`, `...lora_B.<adapter>.weight`
        self._own_adapter = re.compile(rf"\.lora_\w+\.{re.escape(adapter)}(\.|$)") if adapter else None

    def activate(self) -> None:
        """Make this handle's adapter the active one (and trainable; the others are frozen by PEFT)."""
        if self.adapter is not None:
            self.pretrained_model.set_adapter(self.adapter)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L] ids, mask and positions → (logits [B, K, V] float32, values [B, K] float32) at K positions:
        the last K = `logits_to_keep` (all L when 0), or the positions a 1-D tensor `logits_to_keep` lists.
        Skipping the LM head on prompt positions is pure speed: CORY's observer prompt is three times the
        pioneer's."""
        self.activate()
        out = self.pretrained_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=logits_to_keep,
        )
        hidden = out.hidden_states[-1]
        if isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return out.logits.float(), self.v_head(hidden)

    def generate(self, **kwargs) -> torch.Tensor:
        """`generate` of the underlying model with this handle's adapter active."""
        return self.sampler().generate(**kwargs)

    def sampler(self) -> nn.Module:
        """The causal LM that samples this handle's responses: the underlying model, this handle's adapter active."""
        self.activate()
        return self.pretrained_model

    def owns(self, name: str) -> bool:
        """Whether parameter `name` (as in `named_parameters()`) belongs to this agent alone."""
        if self._own_adapter is None:
            return True
        return name.startswith("v_head.") or self._own_adapter.search(name) is not None

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What this agent's optimiser steps: its adapter and value head (LoRA), or every weight (full)."""
        return [p for name, p in self.named_parameters() if self.owns(name)]

    def save_weights(self, directory: Path) -> None:
        """Safetensors of what this handle owns: the adapter + value head (LoRA) or the whole policy (full)."""
        directory = Path(directory)
        if self.adapter is None:  # each tensor once under its first name (tied embeddings are one tensor)
            state = self.state_dict()
            tensors = {group[0]: state[group[0]].detach().contiguous().clone() for group in _tied_names(self)}
            save_file(tensors, str(directory / FULL_WEIGHTS), metadata={"format": "pt"})
            return
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.pretrained_model, adapter_name=self.adapter)
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(directory / ADAPTER_WEIGHTS))
        config = self.pretrained_model.peft_config[self.adapter].to_dict()
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, default=list, indent=1))
        value_head = {k: v.contiguous() for k, v in self.v_head.state_dict().items()}
        save_file(value_head, str(directory / VALUE_HEAD_WEIGHTS))

    def load_weights(self, directory: Path) -> None:
        """Inverse of `save_weights`.

        Raises:
            ValueError: the files do not fit this model (another architecture, rank or target modules).
        """
        directory = Path(directory)
        device = str(self.v_head.summary.weight.device)
        if self.adapter is None:
            _load_tied(self, load_file(str(directory / FULL_WEIGHTS), device=device), directory / FULL_WEIGHTS)
            return
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        state = load_file(str(directory / ADAPTER_WEIGHTS), device=device)
        expected = get_peft_model_state_dict(self.pretrained_model, adapter_name=self.adapter)
        if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
            raise ValueError(f"{directory / ADAPTER_WEIGHTS} does not fit this model's `{self.adapter}` adapter")
        set_peft_model_state_dict(self.pretrained_model, state, adapter_name=self.adapter)
        self.v_head.load_state_dict(load_file(str(directory / VALUE_HEAD_WEIGHTS), device=device))


def _tied_names(module: nn.Module) -> list[list[str]]:
    """The state dict's names grouped by the tensor they name: tied weights (GPT-2's embedding and LM head) are one
    group. Found by storage address and shape, not by storage, because DeepSpeed ZeRO makes every parameter a
    view of one flat buffer (which is also why safetensors' `save_model` cannot be used: it refuses that)."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        groups.setdefault((tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())), []).append(name)
    return list(groups.values())


def _load_tied(module: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy `tensors` into `module` in place (a tied group from any one of its names).

    Raises:
        ValueError: a tensor is missing, extra or of another shape (another architecture or size)."""
    targets = module.state_dict(keep_vars=True)
    groups = _tied_names(module)
    extra = set(tensors) - set(targets)
    for group in groups:
        name = next((n for n in group if n in tensors), None)
        if name is None or extra or tensors[name].shape != targets[name].shape:
            raise ValueError(f"{path} does not fit this model ({(sorted(extra) or [group[0]])[0]})")
    with torch.no_grad():
        for group in groups:
            targets[group[0]].copy_(tensors[next(n for n in group if n in tensors)])


class AdapterFreeReference(nn.Module):
    """π0 as the LoRA agents' base model with every adapter disabled: no copy of the weights (docs/method.md §3.3).

    Called like a Hugging Face causal LM (`cory.ppo.rollout.forward_logits`). It holds the `Backbone`, not the PEFT
    model, so it registers no parameters of its own: they belong to the agents' shared model.
    """

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self._backbone = backbone

    def forward(self, **kwargs):
        model = self._backbone.peft_model
        if model is None:
            raise RuntimeError("the LoRA reference needs the base model wrapped by a first agent (Backbone.policy)")
        with model.disable_adapter():
            return model(**kwargs)


class Backbone:
    """The loaded model and tokenizer, and the agents' handles and π0 built from them.

    Args:
        model: the model as loaded (float weights, or 4-bit on its CUDA device).
        tokenizer: its tokenizer, with a pad token.
        lora: the agents' adapters (`model.lora`); None = full fine-tuning.
        add_special_tokens: tokenise prompts with the tokenizer's special tokens (Llama's BOS); false keeps GPT-2's
            and SmolLM2's prompts exactly as written.
        device: where the weights and value heads live.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        lora: LoraSettings | None,
        add_special_tokens: bool,
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = torch.device(device)
        if getattr(model, "hf_quantizer", None) is None:  # a 4-bit model is placed by its loader and cannot move
            model.to(self.device)
        self.base, self.tokenizer, self.lora, self.add_special_tokens = model, tokenizer, lora, add_special_tokens
        self.peft_model = None  # the PEFT model of the first LoRA agent (every agent's, with share_base)
        self.handles: dict[str, PolicyWithValueHead] = {}
        self._reference: nn.Module | None = None

    def policy(self, name: str, init_seed: int) -> PolicyWithValueHead:
        """A new agent's handle named `name`. Its random parts (value head; LoRA A matrices) are drawn from
        `init_seed` alone, so agents built with the same seed start identical (docs/method.md §1.1)."""
        if name in self.handles:
            raise ValueError(f"an agent named {name!r} already exists")
        with (
            torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", FutureWarning)  # PEFT calls a renamed transformers method
            torch.manual_seed(init_seed)
            weights = self._weights_for(name)
            handle = PolicyWithValueHead(weights, adapter=None if self.lora is None else name)
        handle.v_head.to(self.device)
        handle.eval()
        self.handles[name] = handle
        return handle

    def reference(self) -> nn.Module:
        """π0, shared by every agent: a frozen copy of the initial weights (full fine-tuning; build it before any
        training; collective under ZeRO-3) or the adapter-free base (LoRA)."""
        if self._reference is None:  # ZeRO-3 shards the frozen copy as it shards the agents (`engines.frozen`)
            self._reference = frozen(make_reference(self.base)) if self.lora is None else AdapterFreeReference(self)
        return self._reference

    def _weights_for(self, name: str) -> nn.Module:
        first = not self.handles
        if self.lora is None:  # full fine-tuning: the first agent takes the loaded model, later ones a copy
            return self.base if first else copy.deepcopy(self.base)
        config = self.lora.peft_config(self.base)
        if first:
            from peft import get_peft_model

            self.peft_model = get_peft_model(self.base, config, adapter_name=name)
            return self.peft_model
        if self.lora.share_base:
            self.peft_model.add_adapter(name, config)
            return self.peft_model
        model = copy.deepcopy(self.peft_model)  # its own base copy: drop the first agent's adapter from it
        model.add_adapter(name, config)
        model.set_adapter(name)
        model.delete_adapter(next(iter(self.handles)))
        return model
