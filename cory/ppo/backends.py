"""Rollout backends: what samples an agent's responses. The update never depends on which one did.

An agent asks its backend for response token ids only; every log-prob, value and KL of the rollout is then
recomputed by the agent's own Hugging Face forward (`cory.ppo.actor.Actor.score_tokens`), so the PPO update sees the
same numbers whichever engine sampled the tokens (docs/implementation-notes.md, "Rollout backends").

- `hf` (default): the live policy samples, with the lean decode loop (`rollout.decode=lean`, the default) or
  Hugging Face `generate` (`rollout.decode=generate`): the same tokens for the same seed (tests/test_decode.py).
- `vllm` (`rollout=vllm`, a CUDA machine with vLLM installed): one colocated engine per process, weights pushed from
  the learner before each iteration's generation, LoRA adapters served as adapters (`cory/ppo/vllm_backend.py`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from cory.errors import ConfigError
from cory.ppo.rollout import generate_ids

BACKENDS = ("hf", "vllm")


class RolloutBackend(Protocol):
    """Samples responses for one agent.

    `sync_weights(policy)` is called before a generation whenever the agent's weights changed since the last one (an
    update, a loaded checkpoint); `generate` returns, per prompt, the response ids truncated after the first EOS
    (EOS kept), as 1-D CPU tensors.
    """

    def sync_weights(self, policy: torch.nn.Module) -> None: ...

    def generate(
        self, prompt_ids: list[torch.Tensor], max_new_tokens: int, generation_kwargs: dict, batch_size: int
    ) -> list[torch.Tensor]: ...


class HFBackend:
    """The agent's own policy samples (nothing to sync, it samples the live weights): with the lean decode loop
    (`decode="lean"`, `cory/ppo/decode.py`) or Hugging Face `generate` (`"generate"`); the same tokens either way."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, device: torch.device, decode: str = "lean"
    ) -> None:
        self.model, self.tokenizer, self.device, self.decode = model, tokenizer, device, decode

    def sync_weights(self, policy: torch.nn.Module) -> None:
        pass

    def generate(
        self, prompt_ids: list[torch.Tensor], max_new_tokens: int, generation_kwargs: dict, batch_size: int
    ) -> list[torch.Tensor]:
        model, tokenizer, device = self.model, self.tokenizer, self.device
        return generate_ids(
            model, tokenizer, prompt_ids, max_new_tokens, generation_kwargs, device, batch_size, self.decode
        )


def make_backends(
    settings, names: list[str], learner, backbone, device, seed: int
) -> dict[str, RolloutBackend | None]:
    """One backend per agent from the `rollout` settings; None: the agent's own policy samples (`HFBackend`, which
    the caller builds on that policy with `settings.decode`).

    vLLM agents share one engine (one base model in GPU memory; each agent's weights or adapter pushed to it).
    """
    if settings.backend == "hf":
        return dict.fromkeys(names)
    if getattr(learner, "generate_in_train_mode", False):
        raise ConfigError(
            "rollout=vllm samples in eval mode only: algorithm.agent.generate_in_train_mode=true needs rollout=hf"
        )
    from cory.ppo.vllm_backend import VLLMBackend, VLLMEngine

    engine = VLLMEngine(backbone, settings, device, seed)
    return {name: VLLMBackend(engine, name) for name in names}
