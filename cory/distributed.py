"""Data parallel through accelerate, the one distributed engine: no process group or collective is written here.

A launcher (`accelerate launch`, `torchrun`, `srun` + `accelerate launch`) starts one process per device and sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. `setup` hands them to accelerate's `PartialState`,
which joins the process group (NCCL on GPUs, gloo on CPUs) and picks this process's device. Every process holds
full copies of the agents and takes its own slice of each iteration's prompts; before each optimiser step an
agent replaces its gradients by their mean over processes (`average_gradients`: accelerate's `reduce`), so every
process takes the same step and the weights stay identical. Rank 0 alone logs and checkpoints.
As in TRL 0.11's PPOTrainer, `batch_size` is per process, the logged statistics are means over processes
(`mean_metrics`), and the adaptive KL controller is fed the mean KL over processes with `batch_size × world_size`
samples (`mean`). Why gradients are reduced rather than the models wrapped in DDP: docs/implementation-notes.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather, gather_object, reduce

from cory.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent / "conf"
ENGINES = ("accelerate", "deepspeed")  # hardware.engine; absent means accelerate (data parallel by gradient mean)
_STATE: PartialState | None = None  # set by `setup`; before it (tests, scripts) the run is one process


def setup(hardware: Mapping[str, Any], device: torch.device) -> torch.device:
    """Join the launcher's process group through accelerate; returns this process's device.

    One process keeps `device` as configured (so `hardware.device=cuda:1` is honoured); several take accelerate's
    (`cuda:<LOCAL_RANK>` or the CPU). `hardware.engine=deepspeed` is checked, then refused in one line (below)."""
    global _STATE
    engine = hardware.get("engine", "accelerate")
    if engine not in ENGINES:
        raise ConfigError(f"hardware.engine={engine!r}: allowed {', '.join(ENGINES)}")
    if engine == "deepspeed":
        check_deepspeed(hardware)
    _STATE = PartialState(cpu=device.type == "cpu")
    return device if _STATE.num_processes == 1 else _STATE.device


def check_deepspeed(hardware: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config a ZeRO hardware option points to, checked against `hardware.precision`; then the
    refusal: the configs compose and validate, but the learner has no ZeRO path yet (docs/running.md, Scale)."""
    config = deepspeed_config(hardware)
    stage = config["zero_optimization"]["stage"]
    if not torch.cuda.is_available():
        raise ConfigError(f"hardware.engine=deepspeed (ZeRO-{stage}) needs CUDA GPUs; use hardware=cpu")
    raise ConfigError(
        f"hardware.engine=deepspeed (ZeRO-{stage}): configs compose and validate, but the learner's ZeRO path "
        "(engine backward/step, gathered generation) is not implemented; use hardware=multi_gpu (docs/running.md)"
    )


def deepspeed_config(hardware: Mapping[str, Any]) -> dict[str, Any]:
    """`hardware.deepspeed_config` (a JSON file, relative to `cory/conf`), checked: a ZeRO stage of 2 or 3 and the
    same mixed precision as `hardware.precision` (bf16 ↔ `bf16.enabled`, fp16 ↔ `fp16.enabled`, fp32 ↔ neither)."""
    name = hardware.get("deepspeed_config")
    if not name:
        raise ConfigError("hardware.engine=deepspeed needs hardware.deepspeed_config (a JSON file)")
    path = Path(name) if Path(name).is_absolute() else CONF_DIR / name
    if not path.is_file():
        raise ConfigError(f"hardware.deepspeed_config={name}: no such file ({path})")
    config = json.loads(path.read_text(encoding="utf-8"))
    stage = config.get("zero_optimization", {}).get("stage")
    if stage not in (2, 3):
        raise ConfigError(f"hardware.deepspeed_config={name}: zero_optimization.stage={stage}; allowed 2, 3")
    enabled = {p for p in ("bf16", "fp16") if config.get(p, {}).get("enabled", False)}
    precision = hardware.get("precision", "fp32")
    if enabled != ({precision} - {"fp32"}):
        raise ConfigError(
            f"hardware.deepspeed_config={name} enables {sorted(enabled) or 'fp32'} but hardware.precision={precision}"
        )
    return config


def world_size() -> int:
    return _STATE.num_processes if _STATE is not None else 1


def rank() -> int:
    return _STATE.process_index if _STATE is not None else 0


def is_main() -> bool:
    return rank() == 0


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over processes (accelerate's `reduce`: a sum, then ÷ world size).

    Every process must call it at the same step with the same parameters holding gradients (the learners do: one
    call per optimiser step, and a backward on every minibatch). One process: nothing to do, the gradients are
    left untouched (bit-identical single-process runs)."""
    if world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    for g, mean in zip(grads, reduce(grads, reduction="mean")):
        g.copy_(mean)


def mean(value: float) -> float:
    """The mean of a scalar over processes (the KL the adaptive controller sees; TRL's `gather_stats`)."""
    if world_size() == 1:
        return value
    return reduce(torch.tensor([value], dtype=torch.float64), reduction="mean").item()


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Each numeric metric averaged over the processes that report it (TRL logs the mean over processes too); one
    process: `metrics` itself."""
    if world_size() == 1:
        return metrics
    every = gather_object([metrics])
    out = dict(metrics)
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values = [m[k] for m in every if k in m]
            out[k] = sum(values) / len(values)
    return out


def weights_in_sync(tensors: list[torch.Tensor]) -> bool:
    """True when every process holds the same weights (a cheap checksum compared across ranks)."""
    if world_size() == 1:
        return True
    total = torch.stack([p.detach().double().sum() for p in tensors]).sum().reshape(1)
    gathered = gather(total.to(_STATE.device))
    return bool(torch.allclose(gathered, gathered[0].expand_as(gathered), rtol=0, atol=1e-6))


def close() -> None:
    """Leave the process group (accelerate's `destroy_process_group`); a later `setup` starts afresh."""
    global _STATE
    if _STATE is not None:
        _STATE.destroy_process_group()
    _STATE = None
