"""Run-level and hardware settings: the keys of `cory/conf/train.yaml` and of the `hardware` group, as types.

These dataclasses are the schema of those keys (`cory.config` checks their types from the annotations) and what
the trainer and every algorithm receive. Learner hyperparameters are not here: they belong to the learner's own
config node (`algorithm.agent`), whose constructor is its schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cory.errors import ConfigError


@dataclass(frozen=True)
class RunSettings:
    """Run-level knobs from `cory/conf/train.yaml` (not learner hyperparameters)."""

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "seed": "[0, 2^32); numpy's seed range",
        "iterations": "[1, inf)",
        "batch_size": "[2, inf); advantages are whitened",
        "eval_every": "[0, inf); 0: only before training and at the end",
        "num_eval": "[1, inf)",
        "num_eval_final": "[1, inf)",
        "eval_batch_size": "[1, inf)",
        "save_every": "[0, inf); 0: none, unless save_final",
        "keep_checkpoints": "[1, inf)",
        "max_bad_iterations": "[1, inf)",
    }

    iterations: int  # PPO/CORY iterations; MAFT fine-tuning rounds
    batch_size: int
    seed: int
    eval_every: int = 0  # 0: evaluate only before training and at the end
    num_eval: int | None = None  # held-out prompts per evaluation (None: all the task provides)
    num_eval_final: int | None = None  # held-out prompts before training and at the end (None: all)
    eval_batch_size: int = 64
    save_every: int = 0  # checkpoint cadence, plus the last iteration; 0: none (SIGTERM/SIGINT always save)
    save_final: bool = False  # with save_every=0: still checkpoint the last iteration (so it can be extended)
    keep_checkpoints: int = 2
    # a copy of the state before each iteration, so that a stop signal in the update saves at once (cory/trainer.py)
    snapshot_updates: bool = False
    snapshot_dir: str | None = None  # where that copy goes (None: /dev/shm when it exists, else the run's checkpoints)
    max_bad_iterations: int = 3
    progress: bool = True
    rollout: RolloutSettings | Mapping[str, Any] = dataclasses.field(default_factory=lambda: RolloutSettings())

    def __post_init__(self) -> None:
        if not isinstance(self.rollout, RolloutSettings):  # the `rollout` group's node, as composed
            object.__setattr__(self, "rollout", RolloutSettings.from_config(self.rollout))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RunSettings:
        return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.name in cfg})


@dataclass(frozen=True)
class RolloutSettings:
    """The `rollout` group: what samples the responses (`cory/ppo/backends.py`). The update's log-probs are always the
    learner's own forward, so the backend changes how fast samples come, not the numbers the update uses.

    Attributes:
        backend: `hf` (Hugging Face `generate` on the live policy) or `vllm` (a colocated vLLM engine; CUDA only).
        decode: with `hf`, `lean` (`cory/ppo/decode.py`: `generate`'s tokens for the same seed, without its per-step
            overhead; settings it does not reproduce fall back to `generate`) or `generate` (the reference).
        gpu_memory_utilization: vLLM's share of the GPU for its weights and KV cache (the learner keeps the rest).
        max_model_len: vLLM's context; None = the model's.
        dtype: vLLM's weight dtype (`auto`: the model config's, `bfloat16`, `float32`).
        enforce_eager: no CUDA graphs (faster start, less memory; weights change every iteration anyway).
    """

    backend: str = "hf"
    decode: str = "lean"
    gpu_memory_utilization: float = 0.3
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = True

    def __post_init__(self) -> None:
        if self.backend not in ("hf", "vllm"):
            raise ConfigError(f"rollout.backend={self.backend!r}: allowed hf, vllm")
        if self.decode not in ("lean", "generate"):
            raise ConfigError(f"rollout.decode={self.decode!r}: allowed lean, generate")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ConfigError(f"rollout.gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1)")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RolloutSettings:
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(cfg) - set(names))
        if unknown:
            raise ConfigError(f"rollout.{unknown[0]}: not a rollout setting (allowed {', '.join(names)})")
        return cls(**dict(cfg))


@dataclass(frozen=True)
class HardwareSettings:
    """The `hardware` group: how the work fits the machine, never the learning result."""

    # value ranges, checked before any model loads (cory/config.py `check_ranges`)
    RANGES = {
        "forward_batch_size": "[1, inf)",
        "generation_batch_size": "[1, inf)",
        "length_groups": "[1, inf)",
        "threads": "[1, inf)",
    }

    device: str  # cpu | cuda | cuda:<n> | auto
    precision: str  # fp32 | bf16 | fp16 (autocast; weights and optimiser state stay fp32)
    forward_batch_size: int  # micro-batch of the no-grad rollout forwards
    generation_batch_size: int  # prompts per generate() call
    deterministic: bool = False
    keep_freed_memory: bool = True  # large tensors reuse freed heap within a step (runtime.keep_freed_memory)
    length_groups: int = 1  # forwards in up to this many groups of similar length (cory.ppo.rollout.length_groups)
    threads: int | None = None  # torch's threads; None: the environment's, or on resume the checkpoint's (runtime)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> HardwareSettings:
        return cls(**{f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.name in cfg})
