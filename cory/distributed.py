"""Data parallel through accelerate (DeepSpeed for ZeRO, PyTorch FSDP2 for FSDP: `cory/engines.py`): no collective
is written here.

A launcher (`accelerate launch`, `torchrun`, `srun` + `accelerate launch`) starts one process per device and sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. `setup` hands them to accelerate's `PartialState`,
which joins the process group (NCCL on GPUs, gloo on CPUs) and picks this process's device. Every process holds
full copies of the agents (under ZeRO-3 and FSDP a shard of each weight: `cory/engines.py`) and takes its own
slice of each iteration's prompts; before each optimiser step an agent replaces its gradients by their mean over
processes (`average_gradients`: accelerate's `reduce`; DeepSpeed's or FSDP's own reduction under those engines), so
every process takes the same step. Rank 0 alone logs and writes checkpoints.
As in TRL 0.11's PPOTrainer, `batch_size` is per process, the logged statistics are means over processes
(`mean_metrics`), and the adaptive KL controller is fed the mean KL over processes with `batch_size × world_size`
samples (`mean`). Why gradients are reduced rather than the models wrapped in DDP: docs/implementation-notes.md.
"""

from __future__ import annotations

import gc
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather, gather_object, reduce

from cory.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent / "conf"
ENGINES = ("accelerate", "deepspeed", "fsdp")  # hardware.engine; absent: accelerate (data parallel by gradient mean)
_STATE: PartialState | None = None  # set by `setup`; before it (tests, scripts) the run is one process
_DEEPSPEED: dict[str, Any] | None = None  # the DeepSpeed config of a ZeRO run (`setup`)
_ENGINE = "accelerate"  # hardware.engine of this run (`setup`)
_SET_ENV: list[str] = []  # launcher variables `_join_alone` set for a one-process ZeRO run


def setup(hardware: Mapping[str, Any], device: torch.device) -> torch.device:
    """Join the launcher's process group through accelerate; returns this process's device.

    One process keeps `device` as configured (so `hardware.device=cuda:1` is honoured); several take accelerate's
    (`cuda:<LOCAL_RANK>` or the CPU). `hardware.engine=deepspeed` also reads and checks the DeepSpeed config (ZeRO-2 or
    ZeRO-3), which the learners' engines then use (`cory/engines.py`); DeepSpeed joins the same process group.
    `hardware.engine=fsdp` shards with PyTorch's FSDP2 (`cory/engines.py`) over the same group."""
    global _STATE, _DEEPSPEED, _ENGINE
    engine = hardware.get("engine", "accelerate")
    if engine not in ENGINES:
        raise ConfigError(f"hardware.engine={engine!r}: allowed {', '.join(ENGINES)}")
    _DEEPSPEED = deepspeed_config(hardware) if engine == "deepspeed" else None
    _ENGINE = engine
    _STATE = PartialState(cpu=device.type == "cpu")
    if engine != "accelerate" and not torch.distributed.is_initialized():
        _join_alone(device)
    return device if _STATE.num_processes == 1 else _STATE.device


def _join_alone(device: torch.device) -> None:
    """DeepSpeed and FSDP need a process group even for one process started without a launcher: a group of one,
    joined with the variables a launcher would have set (a free local port; through DeepSpeed for ZeRO, torch's
    `init_process_group` for FSDP, as `torchrun` would); `close` removes them."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launcher = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    for key, value in launcher.items():
        if key not in os.environ:
            os.environ[key] = value
            _SET_ENV.append(key)
    backend = "gloo" if device.type == "cpu" else "nccl"
    if _ENGINE == "fsdp":
        torch.distributed.init_process_group(backend)
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)


def deepspeed() -> dict[str, Any] | None:
    """The checked DeepSpeed config of a `hardware.engine=deepspeed` run (None otherwise, and before `setup`)."""
    return _DEEPSPEED


def deepspeed_config(hardware: Mapping[str, Any]) -> dict[str, Any]:
    """`hardware.deepspeed_config` (a JSON file, relative to `cory/conf`), checked: a ZeRO stage of 2 or 3, and its
    mixed precision that of `hardware.precision`: set from it when the file leaves `bf16`/`fp16` out (ours do, so
    `hardware.precision=fp32` runs the same file on a CPU), refused when the file says otherwise."""
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
    precision = hardware.get("precision", "fp32")
    wanted = {p: {"enabled": p == precision} for p in ("bf16", "fp16")}
    if any(p in config for p in wanted):
        enabled = {p for p in wanted if config.get(p, {}).get("enabled", False)}
        if enabled != ({precision} - {"fp32"}):
            raise ConfigError(
                f"hardware.deepspeed_config={name} enables {sorted(enabled) or 'fp32'} but "
                f"hardware.precision={precision}"
            )
    return wanted | config


def fsdp() -> bool:
    """Whether this run shards with FSDP (`hardware.engine=fsdp`)."""
    return _ENGINE == "fsdp"


def sharded() -> bool:
    """Whether the learners' state is sharded over the processes (ZeRO, FSDP): then saving a checkpoint is
    collective, every process calls the algorithm's `save` and rank 0 alone keeps what it wrote."""
    return _DEEPSPEED is not None or fsdp()


def sharded_weights() -> bool:
    """Whether the weights themselves are sharded (ZeRO-3, FSDP): then every forward pass is collective, so every
    process takes part in the evaluation too, and a weight's finiteness is checked on every process's shard of it."""
    return fsdp() or (_DEEPSPEED is not None and _DEEPSPEED["zero_optimization"]["stage"] == 3)


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


def every(value: Any) -> list[Any]:
    """`value` of every process, by rank (accelerate's `gather_object`); one process: `[value]`."""
    if world_size() == 1:
        return [value]
    return gather_object([value])


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
    global _STATE, _DEEPSPEED, _ENGINE
    if _STATE is not None:
        _STATE.destroy_process_group()
    if _ENGINE != "accelerate" and torch.distributed.is_initialized():  # the group of one `_join_alone` joined
        torch.distributed.destroy_process_group()
    if _DEEPSPEED is not None:
        from deepspeed.utils import groups

        groups._WORLD_GROUP = None  # DeepSpeed's cached clone of the world group: a later run here needs its own
    while _SET_ENV:
        os.environ.pop(_SET_ENV.pop(), None)
    _STATE, _DEEPSPEED, _ENGINE = None, None, "accelerate"
    gc.collect()  # free the groups' pending work while the interpreter is whole, not during its finalisation
