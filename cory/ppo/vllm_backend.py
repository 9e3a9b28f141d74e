"""The vLLM rollout backend: one vLLM engine colocated on the learner's GPU samples every agent's responses.

vLLM is imported only when the engine starts (it is a CUDA-only extra: `requirements-gpu.txt`), so this module and
its pure helpers import on any machine. How the engine follows the learner:

- it starts from the model's `config.json` alone with dummy weights (no checkpoint is written), and without a
  tokenizer: prompts go in as token ids and responses come back as token ids, so both backends see the same ids;
- full fine-tuning: before an agent's generation, if the engine holds another agent's weights or this agent has
  been updated, the policy's weights are pushed into the engine's model in place (`hf_weights` gives them the names
  a Hugging Face checkpoint has: no value head, no wrapper prefix; 4-bit weights dequantised);
- LoRA: the base weights are pushed once; after each update an agent's adapter is written in PEFT's format and
  served under a fresh adapter id (vLLM caches adapters by id), so the engine's base is never modified;
- sampling settings are the task's `generation_kwargs` translated by `sampling_settings`; a setting vLLM cannot
  reproduce is refused rather than approximated.

The update never sees vLLM's numbers: the agent recomputes every log-prob of the returned tokens with its own
forward (`cory/ppo/backends.py`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from cory import distributed
from cory.errors import ConfigError

# PEFT's adapter parameters (`...q_proj.lora_A.<adapter>.weight`, `lora_magnitude_vector`, ...): never base weights
_ADAPTER_PART = re.compile(r"\.lora_\w+\.")
# the Hugging Face generation settings at which they do nothing (cory.ppo.rollout.NEUTRAL_GENERATION's values)
_NEUTRAL = {
    "num_beams": 1,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "min_p": None,
}
_MAPPED = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "min_p")
# adapter ranks a vLLM engine can be sized for; the engine takes the smallest one that holds the model's rank
_LORA_RANKS = (8, 16, 32, 64, 128, 256, 512)


def sampling_settings(generation_kwargs: dict, max_new_tokens: int, eos_token_id: int) -> dict:
    """vLLM `SamplingParams` keyword arguments equivalent to Hugging Face `generate` with `generation_kwargs`.

    Greedy (`do_sample` false) is temperature 0. Sampling keeps temperature, top-p, repetition penalty (both libraries
    divide positive logits and multiply negative ones of every token in the prompt and the response so far) and top-k,
    where 0 (Hugging Face: off) becomes -1 (vLLM: off). Responses end at the tokenizer's EOS only (`ignore_eos` drops
    any other end token a checkpoint's generation config lists; `stop_token_ids` restores this one), may be just EOS
    (`min_tokens=0`, as `generation_config`), and come back as ids (`detokenize` off).

    Raises:
        ValueError: a setting vLLM does not reproduce (beam search, typical-p, no-repeat n-grams, a logits processor).
    """
    neutral = [k for k, v in generation_kwargs.items() if k in _NEUTRAL and v == _NEUTRAL[k]]
    unsupported = sorted(set(generation_kwargs) - set(_MAPPED) - set(neutral))
    if unsupported:
        raise ValueError(f"rollout=vllm cannot reproduce generation_kwargs {unsupported}; use rollout=hf")
    sample = bool(generation_kwargs.get("do_sample", False))
    top_k = int(generation_kwargs.get("top_k", 0) or 0)
    min_p = generation_kwargs.get("min_p")
    return {
        "n": 1,
        "temperature": float(generation_kwargs.get("temperature", 1.0)) if sample else 0.0,
        "top_k": top_k if sample and top_k > 0 else -1,
        "top_p": float(generation_kwargs.get("top_p", 1.0)) if sample else 1.0,
        "min_p": float(min_p) if sample and min_p is not None else 0.0,
        "repetition_penalty": float(generation_kwargs.get("repetition_penalty", 1.0)),
        "max_tokens": int(max_new_tokens),
        "min_tokens": 0,
        "ignore_eos": True,
        "stop_token_ids": [int(eos_token_id)],
        "detokenize": False,
    }


def response_ids(token_ids: list[int], finish_reason: str | None, eos_token_id: int) -> torch.Tensor:
    """One vLLM completion as the agent's response: cut after the first EOS (kept), and EOS appended when the
    engine stopped on it without returning it (so a stop reads the same as Hugging Face's)."""
    ids = list(token_ids)
    if eos_token_id in ids:
        ids = ids[: ids.index(eos_token_id) + 1]
    elif finish_reason == "stop":
        ids.append(eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def hf_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base language model's weights of an agent's policy under the names of a Hugging Face checkpoint, which is
    what a vLLM model's `load_weights` reads: the value head (outside `pretrained_model`) and LoRA adapters left out,
    PEFT's `base_model.model.` prefix and `.base_layer` removed, 4-bit (bitsandbytes) weights dequantised. Tied
    weights appear once (the engine ties them itself)."""
    for name, param in policy.pretrained_model.named_parameters():
        if _ADAPTER_PART.search(name):
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        quant_state = getattr(param, "quant_state", None)
        if quant_state is not None:
            import bitsandbytes.functional as bnb_functional

            yield name, bnb_functional.dequantize_4bit(param.data, quant_state)
        else:
            yield name, param.detach()


def engine_config(model_config) -> dict:
    """The `config.json` the engine is built from: the model's, without a quantisation block (the engine holds the
    dequantised weights)."""
    config = model_config.to_dict()
    config.pop("quantization_config", None)
    return config


def lora_rank(r: int) -> int:
    """The engine's `max_lora_rank` for adapters of rank `r`."""
    for rank in _LORA_RANKS:
        if r <= rank:
            return rank
    raise ConfigError(f"model.lora.r={r}: vLLM serves adapters up to rank {_LORA_RANKS[-1]}")


class VLLMEngine:
    """One vLLM engine per process, shared by the agents of a run; started on the first generation."""

    def __init__(self, backbone, settings, device, seed: int) -> None:
        if distributed.world_size() > 1:
            raise ConfigError("rollout=vllm runs in one process; data-parallel runs need rollout=hf")
        if distributed.sharded_weights():
            raise ConfigError(
                "rollout=vllm reads whole weights; hardware=deepspeed_zero3|fsdp shard them: use rollout=hf"
            )
        self.backbone, self.settings, self.device, self.seed = backbone, settings, torch.device(device), seed
        self.llm = None
        self.owner: str | None = None  # full fine-tuning: whose weights the engine holds
        self.stale: set[str] = set()  # full fine-tuning: agents updated since their weights were last pushed
        self._next_adapter_id = 1
        self.folder = Path(tempfile.mkdtemp(prefix="cory-vllm-"))

    @property
    def lora(self) -> bool:
        return self.backbone.lora is not None

    def start(self):
        if self.llm is not None:
            return self.llm
        if self.device.type != "cuda":
            raise ConfigError("rollout=vllm needs a CUDA device (hardware=gpu); use rollout=hf")
        # in-process engine: weights are pushed by a direct call on its model, never serialised to another process
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError:
            raise ConfigError("rollout=vllm needs vLLM: pip install -r requirements-gpu.txt") from None
        base = self.folder / "base"
        base.mkdir()
        (base / "config.json").write_text(json.dumps(engine_config(self.backbone.base.config)))
        lora = {}
        if self.lora:
            lora = {"enable_lora": True, "max_lora_rank": lora_rank(self.backbone.lora.r), "max_loras": 2}
        s = self.settings
        self.llm = LLM(
            model=str(base),
            skip_tokenizer_init=True,
            load_format="dummy",  # the learner's weights are pushed before the first generation
            generation_config="vllm",  # no sampling defaults from the model folder
            dtype=s.dtype,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_model_len=s.max_model_len,
            enforce_eager=s.enforce_eager,
            seed=self.seed,
            **lora,
        )
        if self.lora:  # the shared base never changes: pushed once
            handle = next(iter(self.backbone.handles.values()))
            self.push(hf_weights(handle))
        return self.llm

    def push(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Copy weights into the engine's model in place (its `load_weights` maps checkpoint names to its layers)."""
        weights = list(weights)
        self.llm.apply_model(lambda model: model.load_weights(weights))

    def new_adapter(self, name: str, policy) -> object:
        """Write `policy`'s adapter in PEFT's format and return a request that serves it under a fresh id."""
        from vllm.lora.request import LoRARequest

        adapter_id, self._next_adapter_id = self._next_adapter_id, self._next_adapter_id + 1
        folder = self.folder / f"{name}-{adapter_id}"
        folder.mkdir()
        policy.save_weights(folder)  # adapter_model.safetensors + adapter_config.json (+ the value head, unused)
        return LoRARequest(f"{name}-{adapter_id}", adapter_id, str(folder))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class VLLMBackend:
    """One agent's view of the shared engine: its weights (full fine-tuning) or its adapter (LoRA)."""

    def __init__(self, engine: VLLMEngine, name: str) -> None:
        self.engine, self.name = engine, name
        self.policy = None
        self.request = None  # LoRA: the adapter request of the agent's latest weights
        self._folder: str | None = None

    def sync_weights(self, policy: torch.nn.Module) -> None:
        self.policy = policy
        if not self.engine.lora:
            self.engine.stale.add(self.name)  # pushed at this agent's next generation
            return
        self.engine.start()
        old = self._folder
        self.request = self.engine.new_adapter(self.name, policy)
        self._folder = self.request.lora_path
        if old is not None:  # the previous adapter is never requested again
            shutil.rmtree(old, ignore_errors=True)

    def generate(
        self, prompt_ids: list[torch.Tensor], max_new_tokens: int, generation_kwargs: dict, batch_size: int
    ) -> list[torch.Tensor]:
        from vllm import SamplingParams

        engine, eos = self.engine, self.engine.backbone.tokenizer.eos_token_id
        llm = engine.start()
        if not engine.lora and (engine.owner != self.name or self.name in engine.stale):
            engine.push(hf_weights(self.policy))
            engine.owner = self.name
            engine.stale.discard(self.name)
        params = SamplingParams(**sampling_settings(generation_kwargs, max_new_tokens, eos))
        prompts = [{"prompt_token_ids": ids.tolist()} for ids in prompt_ids]
        outputs = llm.generate(prompts, params, lora_request=self.request, use_tqdm=False)
        return [response_ids(o.outputs[0].token_ids, o.outputs[0].finish_reason, eos) for o in outputs]
