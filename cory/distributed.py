"""Data-parallel runs through the standard launchers (`accelerate launch`, `torchrun`), never a home-made one.

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; we join the process group they
describe (NCCL on GPUs, gloo on CPUs). Every process holds full copies of the agents, takes its own slice of
each iteration's prompts, and the agent averages gradients across processes before each optimiser step
(`Agent._optimizer_step`), so the weights stay identical everywhere. Rank 0 alone logs and checkpoints.
As in TRL, `batch_size` is per process and the adaptive KL controller counts `batch_size × world_size`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init_from_env(device: torch.device) -> torch.device:
    """Join the launcher's process group when WORLD_SIZE > 1; returns this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or (dist.is_available() and dist.is_initialized()):
        return device
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def weights_in_sync(tensors: list[torch.Tensor]) -> bool:
    """True when every process holds the same weights (a cheap checksum compared across ranks)."""
    if world_size() == 1:
        return True
    total = torch.stack([p.detach().double().sum() for p in tensors]).sum().reshape(1)
    gathered = [torch.zeros_like(total) for _ in range(world_size())]
    dist.all_gather(gathered, total)
    return all(torch.allclose(g, gathered[0], rtol=0, atol=1e-6) for g in gathered)


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
