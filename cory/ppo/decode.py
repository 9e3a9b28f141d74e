"""A lean decode loop: Hugging Face `generate`'s sampling, token for token, without its per-step overhead.

Why: at a rollout's batch (16 prompts) a decode step is a handful of skinny matrix products that stream every weight
once, so what else a step does shows: `generate`'s dynamic KV cache concatenates every layer's keys and values
into new tensors at every token (the whole cache copied per step: 14 % of a GPT-2-small decode step on one CPU
thread), and its loop re-prepares inputs, masks and stopping criteria each step. Here
- the KV cache is allocated once per call, at the prompt's length plus `max_new_tokens` (`PreallocatedLayer`): a
  step writes its column in place and attention reads the filled prefix, the same numbers in the same order;
- the token ids live in one preallocated buffer; the attention mask is its prefix;
- the logits go through the same logits processors `generate` builds for the supported settings (repetition
  penalty, temperature, top-k, top-p, in `generate`'s order), then the same `softmax` + `multinomial` (or `argmax`),
  finished rows get the pad token, and the loop stops when every row has ended, as `generate` does.
So the same logits give the same tokens and the global RNG advances exactly as under `generate`
(tests/test_decode.py checks tokens and RNG state against `generate` for fixed seeds). Any other generation setting
(beams, min-p, typical-p, n-gram bans, a custom logits processor) is not handled here: `supports` says so and the
caller falls back to `generate`, which stays the reference (`rollout.decode=generate`).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

DECODERS = ("lean", "generate")
# Settings this loop reproduces; every other `GenerationConfig` field must keep its neutral value (`supports`).
HANDLED = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
# Values other than the library defaults that still add no logits processor (`generate` skips them); the rollout's
# explicit `GenerationConfig` spells them out (`cory.ppo.rollout.NEUTRAL_GENERATION`).
INERT = {"num_beams": 1, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "no_repeat_ngram_size": 0}


class PreallocatedLayer(CacheLayerMixin):
    """One layer's keys and values in buffers [B, heads, capacity, head_dim] allocated at the first (prompt) update:
    each later update writes its positions in place and returns a view of the filled prefix, so attention reads the
    same values as from the concatenated cache of `generate`, without copying the whole cache at every token."""

    is_sliding = False

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self._keys = key_states.new_empty(b, h, self.capacity, d)
        self._values = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache of {self.capacity} positions asked for {end}")
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity


def supports(config: GenerationConfig, extra: dict) -> bool:
    """Whether `decode` reproduces `generate` for `config` (and no extra `generate` arguments such as a logits
    processor): one beam, and every setting outside `HANDLED` at its library default."""
    if extra or (config.num_beams or 1) != 1:
        return False
    default = GenerationConfig().to_dict()
    ignore = {*HANDLED, "max_new_tokens", "min_new_tokens", "pad_token_id", "eos_token_id", "bos_token_id"}
    ignore |= {"transformers_version", "_from_model_config", "min_length", "max_length"}
    mine = config.to_dict()
    inert = all(mine.get(k) in (v, INERT.get(k, v)) for k, v in default.items() if k not in ignore)
    return inert and config.min_new_tokens in (None, 0)


def processors(config: GenerationConfig, attention_mask: torch.Tensor) -> LogitsProcessorList:
    """The logits processors `generate` builds for the `HANDLED` settings, in its order: the repetition penalty (on the
    prompt and the generated ids, the left padding ignored), then, when sampling, temperature, top-k and top-p."""
    out = LogitsProcessorList()
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        padding = (attention_mask != 0).int().argmax(dim=1)  # each row's left padding: not penalised
        out.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty, prompt_ignore_length=padding))
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            out.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            out.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    return out


@torch.no_grad()
def decode(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig
) -> torch.Tensor:
    """`model.generate(input_ids=..., attention_mask=..., generation_config=config)` for a decoder-only causal LM and a
    config that `supports` accepts: left-padded prompts [B, P] in, [B, P + n] prompt and response ids out (n ≤
    `max_new_tokens`; rows that ended early are padded with the pad token, as `generate` pads them)."""
    b, p = input_ids.shape
    n_max = config.max_new_tokens
    eos = torch.as_tensor(config.eos_token_id, device=input_ids.device).reshape(-1)
    pad = config.pad_token_id if config.pad_token_id is not None else int(eos[0])
    ids = input_ids.new_full((b, p + n_max), pad)
    ids[:, :p] = input_ids
    mask = attention_mask.new_ones((b, p + n_max))
    mask[:, :p] = attention_mask
    # `generate`'s positions: the count of real tokens before each one, padding at 1 (never read)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    next_position = positions[:, -1:] + 1
    cache = Cache(layers=[PreallocatedLayer(p + n_max) for _ in range(_layers(model))])
    logits_processor = processors(config, attention_mask)
    unfinished = torch.ones(b, dtype=torch.long, device=input_ids.device)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    length = p
    while True:
        scores = logits_processor(ids[:, :length], out.logits[:, -1].to(copy=True, dtype=torch.float32))
        if config.do_sample:
            tokens = torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            tokens = torch.argmax(scores, dim=-1)
        tokens = tokens * unfinished + pad * (1 - unfinished)  # an ended row gets the pad token
        ids[:, length] = tokens
        length += 1
        unfinished = unfinished & ~torch.isin(tokens, eos)
        if length == p + n_max or not unfinished.any():
            return ids[:, :length]
        del out
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask[:, :length],
            position_ids=next_position,
            cache=cache,
            use_cache=True,
        )
        next_position = next_position + 1


def _layers(model: torch.nn.Module) -> int:
    config = model.config.get_text_config(decoder=True)
    return config.num_hidden_layers
