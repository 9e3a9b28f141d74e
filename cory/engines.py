"""What steps a learner's parameters: torch Adam on every process, or a DeepSpeed ZeRO engine that shards it.

An agent (and the centralised critic) never touch an optimiser directly: they call `backward(loss)` on every
minibatch, `step()` once per backward batch, and read or write the Adam state in torch's own `state_dict` format.
Which engine a run uses is the `hardware` option's (`cory.distributed.setup`):

- `AdamStep` (hardware=cpu|gpu|multi_gpu): a torch Adam over the parameters. With several processes every process
  holds the whole Adam state, and before each step the gradients are replaced by their mean over processes
  (accelerate's `reduce`), so every process takes the same step.
- `ZeroStep` (hardware=deepspeed_zero2): `deepspeed.initialize` wraps the policy with the same torch Adam as the
  client optimiser. ZeRO-2 keeps the weights whole on every process and shards the fp32 master copy, the Adam
  moments and the reduced gradients over the processes; DeepSpeed averages the gradients, clips by the global norm
  and steps at the accumulation boundary. Its checkpoint is gathered into torch's format (`state_dict`), so a run
  saved under ZeRO resumes on one process and vice versa, and nothing pickled but tensors is read back.

The numbers are those of `AdamStep` on the whole batch (tests/test_distributed.py measures it); where DeepSpeed
differs (a non-finite gradient is stepped on, not skipped) docs/implementation-notes.md lists it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from cory import distributed, runtime
from cory.errors import ConfigError


def new_engine(
    module: torch.nn.Module,
    params: list[torch.nn.Parameter],
    learning_rate: float,
    max_grad_norm: float | None,
    micro_batch: int,
    accumulation: int,
) -> AdamStep | ZeroStep:
    """The engine this run's hardware option asks for, stepping `params` (of `module`) with Adam at
    `learning_rate`: `accumulation` backward calls of `micro_batch` rows each per optimiser step."""
    config = distributed.deepspeed()
    if config is None:
        return AdamStep(params, learning_rate, max_grad_norm, accumulation)
    return ZeroStep(module, params, learning_rate, max_grad_norm, micro_batch, accumulation, config)


def adam(params: list[torch.nn.Parameter], learning_rate: float) -> torch.optim.Adam:
    """Adam with torch defaults, no weight decay, constant learning rate (docs/method.md §2.1).

    The fused kernel (one pass over each tensor, no temporaries) where the device has one: the update of the
    default implementation to within float32 rounding, about 4× faster on a CPU (docs/cost.md)."""
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=learning_rate, fused=fused)


class AdamStep:
    """A torch Adam on every process; gradients averaged over processes before each step (data parallel)."""

    sharded = False  # every process holds the whole state: rank 0 alone can write a checkpoint

    def __init__(
        self, params: list[torch.nn.Parameter], learning_rate: float, max_grad_norm: float | None, accumulation: int
    ) -> None:
        self.params, self.learning_rate, self.max_grad_norm = params, learning_rate, max_grad_norm
        self.accumulation = accumulation
        self.optimizer = adam(params, learning_rate)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one minibatch's loss (÷ the backward calls per step, as TRL)."""
        (loss / self.accumulation).backward()

    def step(self) -> bool:
        """Average gradients across processes, clip, step; a non-finite gradient skips the step (False)."""
        return optimizer_step(self.optimizer, self.params, self.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for group, saved in zip(self.optimizer.param_groups, state["param_groups"]):
            saved["fused"] = group["fused"]  # the kernel is this machine's choice (`adam`), not the file's
        self.optimizer.load_state_dict(state)

    def reset(self, learning_rate: float) -> None:
        """A fresh Adam (no moments, step 0) at `learning_rate`."""
        self.learning_rate = learning_rate
        self.optimizer = adam(self.params, learning_rate)

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What runs the forward passes of `module`: the module itself."""
        return module


def optimizer_step(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_grad_norm: float | None
) -> bool:
    """Average gradients across processes, clip, step; a non-finite gradient skips the step (False)."""
    distributed.average_gradients(params)  # data parallel: accelerate's mean over processes (one process: no-op)
    if not runtime.all_finite([p.grad for p in params if p.grad is not None]):
        optimizer.zero_grad()
        return False
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad()
    return True


class ZeroStep:
    """DeepSpeed ZeRO-2 around one policy: the same torch Adam, its state sharded over the processes.

    DeepSpeed's own loop is followed: `engine.backward` divides by the accumulation steps and reduces the
    gradients at the accumulation boundary; `engine.step` is called after every backward and steps (clipping by
    `gradient_clipping` = `max_grad_norm` first) only at the boundary. So `step()` here only reports."""

    sharded = True  # the Adam state lives in pieces: every process takes part in a checkpoint (`state_dict`)

    def __init__(
        self,
        module: torch.nn.Module,
        params: list[torch.nn.Parameter],
        learning_rate: float,
        max_grad_norm: float | None,
        micro_batch: int,
        accumulation: int,
        config: dict[str, Any],
    ) -> None:
        if len(params) != sum(1 for _ in module.parameters()):
            raise ConfigError(
                "hardware.engine=deepspeed trains whole models (model.lora.enabled=false): LoRA adapters share one "
                "base and their Adam states are small; use hardware=multi_gpu with LoRA"
            )
        import deepspeed  # only runs that ask for ZeRO import it (seconds, and a compiled op on first use)

        self.params, self.learning_rate = params, learning_rate
        ds_config = config | {
            "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accumulation,
            "gradient_clipping": 0.0 if max_grad_norm is None else float(max_grad_norm),
            "zero_allow_untested_optimizer": True,  # the client optimiser is torch's Adam, as on one process
            "steps_per_print": 2**62,  # DeepSpeed's own progress lines would interleave with ours
        }
        ds_config.pop("train_batch_size", None)  # micro × accumulation × processes: DeepSpeed derives it
        self.engine, self.zero, _, _ = deepspeed.initialize(
            model=module, optimizer=adam(params, learning_rate), config=ds_config
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch Adam inside DeepSpeed: it steps this process's flat shard of the parameters."""
        return self.zero.optimizer

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # ÷ accumulation steps; reduced over processes at the boundary
        self.engine.step()  # DeepSpeed counts micro-steps here; clip + Adam only at the boundary

    def step(self) -> bool:
        """Whether the step just taken had a finite gradient norm (DeepSpeed steps on either way)."""
        norm = self.engine.get_global_grad_norm()
        return norm is None or math.isfinite(float(norm))

    def state_dict(self) -> dict[str, Any]:
        """Adam's state gathered into torch's `state_dict` format (parameter i = `params[i]`). Collective: every
        process calls it; each gets the whole state."""
        from deepspeed.utils import safe_get_full_optimizer_state

        step = next((float(s["step"]) for s in self.optimizer.state.values() if "step" in s), 0.0)
        state: dict[int, dict[str, torch.Tensor]] = {}
        if step > 0:  # before the first step Adam has no state, as torch's
            for i, p in enumerate(self.params):
                state[i] = {
                    "step": torch.tensor(step),
                    "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").detach().cpu().clone(),
                    "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").detach().cpu().clone(),
                }
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {"state": state, "param_groups": [group | {"params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`, after the weights were loaded into the module: the fp32 master shard is set from
        them, then the moments and the step count."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        for p in self.params:
            safe_set_full_fp32_param(p, p.detach().float())
        self.reset(self.learning_rate)
        saved = state["state"]
        if not saved:
            return
        for flat in (p for group in self.optimizer.param_groups for p in group["params"]):
            self.optimizer.state[flat] = {
                "step": torch.tensor(float(saved[0]["step"])),
                "exp_avg": torch.zeros_like(flat),
                "exp_avg_sq": torch.zeros_like(flat),
            }
        self.zero._lazy_init_hp_params_optimizer_state()  # link each parameter to its piece of the new state
        for i, p in enumerate(self.params):
            for key in ("exp_avg", "exp_avg_sq"):
                safe_set_full_optimizer_state(p, saved[i][key].to(p.device), key)

    def reset(self, learning_rate: float) -> None:
        """A fresh Adam (no moments, step 0) at `learning_rate`: the inner optimiser's state emptied, as torch starts
        one."""
        self.learning_rate = learning_rate
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.state.clear()
        self.zero._hp_optimizer_states_linked = False  # DeepSpeed re-links the new state at the next step

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What runs the forward passes of the wrapped module: DeepSpeed's engine."""
        return self.engine
