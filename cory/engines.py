"""What steps a learner's parameters: torch Adam on every process, or a DeepSpeed ZeRO engine that shards it.

An agent (and the centralised critic) never touch an optimiser directly: they call `backward(loss)` on every
minibatch, `step()` once per backward batch, and read or write the Adam state in torch's own `state_dict` format.
Whatever reads or writes whole weights (a checkpoint, generation) does it inside `whole()` / `generating()`, which
are no-ops unless the weights themselves are sharded. Which engine a run uses is the `hardware` option's
(`cory.distributed.setup`):

- `AdamStep` (hardware=cpu|gpu|multi_gpu): a torch Adam over the parameters. With several processes every process
  holds the whole Adam state, and before each step the gradients are replaced by their mean over processes
  (accelerate's `reduce`), so every process takes the same step.
- `ZeroStep` (hardware=deepspeed_zero2|deepspeed_zero3): `deepspeed.initialize` wraps the policy with the same torch
  Adam as the client optimiser. ZeRO-2 keeps the weights whole on every process and shards the fp32 master copy,
  the Adam moments and the reduced gradients over the processes; ZeRO-3 shards the weights too, and gathers each
  layer's just before its forward and backward. DeepSpeed averages the gradients, clips by the global norm and
  steps at the accumulation boundary. Its checkpoint is gathered into torch's format (`state_dict`), so a run
  saved under ZeRO resumes on one process and vice versa, and nothing pickled but tensors is read back.
  Under ZeRO-3 generation runs on gathered weights with DeepSpeed's per-layer hooks lifted (`generating`), as TRL
  0.11's PPOTrainer generates under ZeRO-3: one gather per rollout instead of one per layer per token, and the
  processes need not generate in lockstep. The frozen reference is a ZeRO-3 engine without optimiser (`frozen`).
- `FsdpStep` (hardware=fsdp): PyTorch's FSDP2 (`fully_shard`, `shard`) shards the weights, gradients and torch
  Adam's moments over the processes, one unit per transformer block: ZeRO-3's layout without DeepSpeed. Generation,
  the frozen reference, checkpoints and the weight check work as under ZeRO-3.

The numbers are those of `AdamStep` on the whole batch (tests/test_distributed.py measures it); where DeepSpeed
differs (a non-finite gradient is stepped on, not skipped) docs/implementation-notes.md lists it.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from cory import distributed, runtime
from cory.errors import ConfigError


class Processes:
    """The run's data-parallel processes, as an update needs them: the mean of a number over processes and whether
    every process agrees (one process: the value itself). Learners reach the process group only through this."""

    @property
    def count(self) -> int:
        return distributed.world_size()

    def mean(self, value: float) -> float:
        """`value` averaged over processes (the KL the adaptive controller sees, TRL's `gather_stats`)."""
        return distributed.mean(value)

    def all(self, flag: bool) -> bool:
        """True when `flag` holds on every process (an update skipped by one must be skipped by all: its gradient
        exchanges are collective)."""
        return all(distributed.every(flag))


PROCESSES = Processes()


class Engine(Protocol):
    """What steps one trainee's parameters (`AdamStep`, `ZeroStep`, `FsdpStep`): `backward` on every minibatch,
    `step` once per backward batch, the Adam state in torch's `state_dict` format, and the contexts in which whole
    weights are read or written (no-ops unless the weights are sharded)."""

    sharded: bool
    processes: Processes

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def reset(self, learning_rate: float) -> None: ...

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module: ...

    def whole(self, modify: bool = False) -> contextlib.AbstractContextManager: ...

    def generating(self) -> contextlib.AbstractContextManager: ...


def new_engine(
    module: torch.nn.Module,
    params: list[torch.nn.Parameter],
    learning_rate: float,
    max_grad_norm: float | None,
    micro_batch: int,
    accumulation: int,
) -> Engine:
    """The engine this run's hardware option asks for, stepping `params` (of `module`) with Adam at
    `learning_rate`: `accumulation` backward calls of `micro_batch` rows each per optimiser step."""
    if distributed.fsdp():
        return FsdpStep(module, params, learning_rate, max_grad_norm, accumulation)
    config = distributed.deepspeed()
    if config is None:
        return AdamStep(params, learning_rate, max_grad_norm, accumulation)
    return ZeroStep(module, params, learning_rate, max_grad_norm, micro_batch, accumulation, config)


def frozen(module: torch.nn.Module) -> torch.nn.Module:
    """What runs the forward passes of a frozen model (the reference π0): the module itself, or under ZeRO-3 a
    DeepSpeed engine without optimiser that shards its weights like the policies' (TRL 0.11 prepares its reference
    so under ZeRO-3; under ZeRO-2 every process keeps a whole copy, as TRL's stage-0 reference), under FSDP the
    module sharded as the policies are. Collective."""
    if not distributed.sharded_weights():
        return module
    module.requires_grad_(False)
    if distributed.fsdp():
        return shard(module)
    import deepspeed

    engine, *_ = deepspeed.initialize(model=module, config=_engine_config(distributed.deepspeed(), 1, 1))
    engine.eval()  # DeepSpeed's `eval` returns nothing
    return engine


def held(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter's value to keep after a `whole()` context: a CPU copy of a gathered weight (ZeRO-3, FSDP: its
    storage is released on exit), else the tensor itself, detached (no copy)."""
    return tensor.detach().to("cpu", copy=True) if distributed.sharded_weights() else tensor.detach()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a parameter: its ZeRO-3 partition, its FSDP shard, else the whole tensor (finite
    checks read it)."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def adam(params: list[torch.nn.Parameter], learning_rate: float) -> torch.optim.Adam:
    """Adam with torch defaults, no weight decay, constant learning rate (docs/method.md §2.1).

    The fused kernel (one pass over each tensor, no temporaries) where the device has one: the update of the
    default implementation to within float32 rounding, about 4× faster on a CPU (docs/cost.md)."""
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=learning_rate, fused=fused)


class AdamStep:
    """A torch Adam on every process; gradients averaged over processes before each step (data parallel)."""

    processes = PROCESSES
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

    def whole(self, modify: bool = False) -> contextlib.AbstractContextManager:
        """The weights are whole already: nothing to gather."""
        return contextlib.nullcontext()

    def generating(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    max_grad_norm: float | None,
    sharded_grads: bool = False,
) -> bool:
    """Average gradients across processes, clip, step; a non-finite gradient skips the step (False).

    `sharded_grads` (FSDP): each process holds its shard of the already averaged gradient, so nothing is averaged
    here and the step is skipped on every process when any shard is non-finite."""
    if not sharded_grads:
        distributed.average_gradients(params)  # data parallel: accelerate's mean over processes (one process: no-op)
    finite = runtime.all_finite([local(p.grad) for p in params if p.grad is not None])
    if sharded_grads:
        finite = all(distributed.every(finite))
    if not finite:
        optimizer.zero_grad()
        return False
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad()
    return True


class ZeroStep:
    """DeepSpeed ZeRO-2 or ZeRO-3 around one policy: the same torch Adam, its state (ZeRO-3: and the weights)
    sharded over the processes.

    DeepSpeed's own loop is followed: `engine.backward` divides by the accumulation steps and reduces the
    gradients at the accumulation boundary; `engine.step` is called after every backward and steps (clipping by
    `gradient_clipping` = `max_grad_norm` first) only at the boundary. So `step()` here only reports.

    `deepspeed.initialize` runs at the engine's first use, not when it is built: an algorithm builds all its models
    first (a second full-fine-tuning agent or a critic is a copy of the loaded model, which ZeRO-3 would already
    have sharded), and every process reaches the first use at the same point, as the collective start needs."""

    processes = PROCESSES
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
        _whole_model_only(module, params, "deepspeed")
        self.module, self.params, self.learning_rate = module, params, learning_rate
        self.stage = config["zero_optimization"]["stage"]
        self.config = _engine_config(config, micro_batch, accumulation) | {
            "gradient_clipping": 0.0 if max_grad_norm is None else float(max_grad_norm),
            "zero_allow_untested_optimizer": True,  # the client optimiser is torch's Adam, as on one process
        }
        self._engine = None

    @property
    def engine(self):
        """DeepSpeed's engine, started at the first use (collective)."""
        if self._engine is None:
            import deepspeed  # only runs that ask for ZeRO import it (seconds, and a compiled op on first use)

            self._engine, self.zero, _, _ = deepspeed.initialize(
                model=self.module, optimizer=adam(self.params, self.learning_rate), config=self.config
            )
        return self._engine

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch Adam inside DeepSpeed: it steps this process's flat shard of the parameters."""
        return self.engine.optimizer.optimizer

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # ÷ accumulation steps; reduced over processes at the boundary
        self.engine.step()  # DeepSpeed counts micro-steps here; clip + Adam only at the boundary

    def step(self) -> bool:
        """Whether the step just taken had a finite gradient norm (DeepSpeed steps on either way)."""
        norm = self.engine.get_global_grad_norm()
        return norm is None or math.isfinite(float(norm))

    def whole(self, modify: bool = False) -> contextlib.AbstractContextManager:
        """Under ZeRO-3, every weight of the module gathered on every process for the duration (collective);
        `modify`: what rank 0 writes into them is kept (sharded again on exit). A no-op for ZeRO-2, whose weights
        are whole, and before the engine started (the module is still the plain one)."""
        if self.stage != 3 or self._engine is None:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=0 if modify else None)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Under ZeRO-3, generation on gathered weights with DeepSpeed's per-layer hooks lifted (otherwise every
        layer of every token would gather its weights again, and the processes would have to generate in
        lockstep); the hooks are registered again afterwards. TRL 0.11's `unwrap_model_for_generation` does the
        same. A no-op otherwise."""
        if self.stage != 3 or self._engine is None:
            yield
            return
        hooks = self.engine.optimizer.parameter_offload  # DeepSpeed's ZeRO-3 parameter coordinator of this module
        with self.whole():
            for p in self.module.parameters():
                p.ds_active_sub_modules.clear()
            for hook in hooks.forward_hooks + hooks.backward_hooks:
                hook.remove()
            hooks.forward_hooks, hooks.backward_hooks = [], []
            try:
                yield
            finally:
                hooks._register_deepspeed_module(self.module)

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

        self.engine  # noqa: B018 -- started, so that the weights loaded into the module are sharded first
        set_full = self._set_piece if self.stage == 3 else safe_set_full_optimizer_state
        with self.whole():
            for p in self.params:
                if self.stage == 3:
                    self._set_piece(p, p.detach().float(), None)
                else:
                    safe_set_full_fp32_param(p, p.detach().float())
        self.reset(self.learning_rate)
        saved = state["state"]
        if not saved:
            return
        # Adam's state is keyed by DeepSpeed's flat fp32 shards (ZeRO-3 puts them into the param groups only to step)
        flats = (
            self.engine.optimizer.fp32_partitioned_groups_flat
            if self.stage == 3
            else [p for group in self.optimizer.param_groups for p in group["params"]]
        )
        for flat in flats:
            self.optimizer.state[flat] = {
                "step": torch.tensor(float(saved[0]["step"])),
                "exp_avg": torch.zeros_like(flat),
                "exp_avg_sq": torch.zeros_like(flat),
            }
        if self.stage == 2:  # ZeRO-2 links each parameter to its piece of the state; ZeRO-3 looks it up each time
            self.zero._lazy_init_hp_params_optimizer_state()
        for i, p in enumerate(self.params):
            for key in ("exp_avg", "exp_avg_sq"):
                set_full(p, saved[i][key].to(p.device), key)

    def _set_piece(self, param: torch.nn.Parameter, value: torch.Tensor, key: str | None) -> None:
        """ZeRO-3: this process's piece of `value` (the whole tensor) into the fp32 master copy of `param` (`key`
        None) or into its Adam state `key`. DeepSpeed's own `safe_set_full_*` cannot set a parameter whose size is
        not a multiple of the process count (the last process's piece is padded): the value is padded here."""
        zero = self.engine.optimizer
        piece, _ = zero._get_fp32_opt_state_partition(param, release_swap_buffers=False, optim_state_key=key)
        n = piece.numel()
        padded = torch.zeros(n * zero._get_param_partition_world_size(param), dtype=piece.dtype, device=piece.device)
        padded[: value.numel()] = value.flatten()
        piece.data.copy_(padded.narrow(0, n * zero._get_param_partition_rank(param), n))

    def reset(self, learning_rate: float) -> None:
        """A fresh Adam (no moments, step 0) at `learning_rate`: the inner optimiser's state emptied, as torch starts
        one."""
        self.learning_rate = learning_rate
        if self._engine is None:  # not started: its Adam will be created fresh, at this rate
            return
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.state.clear()
        if self.stage == 2:
            self.zero._hp_optimizer_states_linked = False  # DeepSpeed re-links the new state at the next step

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What runs the forward passes of the wrapped module: DeepSpeed's engine."""
        return self.engine


def _whole_model_only(module: torch.nn.Module, params: list[torch.nn.Parameter], engine: str) -> None:
    """A sharding engine wraps one whole model: LoRA agents are refused (their adapters share one base, and their
    Adam states are small), and what the engine never steps (the value head of a learner without value loss) is
    frozen, so that no gradient is reduced or sharded for it."""
    if getattr(module, "adapter", None) is not None:  # a LoRA agent's handle (`cory.policy.PolicyWithValueHead`)
        raise ConfigError(
            f"hardware.engine={engine} trains whole models (model.lora.enabled=false): LoRA adapters share one "
            "base and their Adam states are small; use hardware=multi_gpu with LoRA"
        )
    stepped = {id(p) for p in params}
    for p in module.parameters():
        if id(p) not in stepped:
            p.requires_grad_(False)


def shard(module: torch.nn.Module) -> torch.nn.Module:
    """`module` sharded in place by FSDP2 (`torch.distributed.fsdp.fully_shard`) over every process: each
    transformer block (the classes the model lists in `_no_split_modules`, as accelerate's FSDP auto-wrap picks
    them) is one unit, gathered just before its forward and backward, and the rest (embeddings, tied LM head,
    final norm, value head) the root unit. Parameters become DTensors sharded on their first dimension. Collective."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    blocks = {name for m in module.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    for m in list(module.modules()):
        if type(m).__name__ in blocks:
            fully_shard(m)
    fully_shard(module)
    # FSDP sets up its root (the state every unit shares) at the first forward, taking the unit that runs it for the
    # root. The lean decode runs the causal LM inside the policy, not the policy's forward, so in a process whose
    # first forward is a rollout's (a resumed run's) the first block would become a root of its own and the policy's
    # next forward would fail. Set up here, every process (fresh or resumed) has the same FSDP state whichever
    # forward comes first; torch has no public call for it (only the root's own forward does it).
    module._get_fsdp_state()._lazy_init()
    # FSDP warns once that the policy returns views (logits, values): an in-place op on them would skip its hook.
    # The losses and scores read them out of place only (tests/test_distributed.py: the update equals torch Adam's).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    if hasattr(module, "generate"):  # `generate` (rollout.decode=generate) enters through the root unit, as a
        register_fsdp_forward_method(module, "generate")  # forward does
    return module


def _units(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP units of a sharded module (`shard`), root first."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


class FsdpStep:
    """PyTorch FSDP2 around one policy (`shard`): the weights, gradients and torch Adam's moments sharded over the
    processes (ZeRO-3's layout, in PyTorch itself). Each backward reduce-scatters the gradients (their mean over
    processes, FSDP's default divisor); `step` checks them finite on every process, clips by the global norm and
    steps torch's Adam on each process's shard.

    As `ZeroStep`, the module is sharded at the engine's first use, which every process reaches at the same point,
    generation runs on gathered weights with resharding after each forward turned off (one gather per rollout;
    the processes need not generate in lockstep), and the checkpoint is gathered into torch's formats."""

    processes = PROCESSES
    sharded = True  # the Adam state lives in pieces: every process takes part in a checkpoint (`state_dict`)

    def __init__(
        self,
        module: torch.nn.Module,
        params: list[torch.nn.Parameter],
        learning_rate: float,
        max_grad_norm: float | None,
        accumulation: int,
    ) -> None:
        _whole_model_only(module, params, "fsdp")
        index = {id(p): name for name, p in module.named_parameters()}
        self.names = [index[id(p)] for p in params]  # sharding replaces the parameters: found again by name
        self.module, self.learning_rate, self.max_grad_norm = module, learning_rate, max_grad_norm
        self.accumulation = accumulation
        self._optimizer: torch.optim.Optimizer | None = None

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """torch's Adam over this process's shards; the module is sharded at the first use (collective)."""
        if self._optimizer is None:
            shard(self.module)
            named = dict(self.module.named_parameters())
            self.params = [named[n] for n in self.names]
            self._optimizer = adam(self.params, self.learning_rate)
        return self._optimizer

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one minibatch's loss (÷ the backward calls per step, as TRL); FSDP
        reduce-scatters it, each process keeping the mean over processes of its shard."""
        self.optimizer  # noqa: B018 -- sharded before the first forward (`forward_module` did it already)
        (loss / self.accumulation).backward()

    def step(self) -> bool:
        """Clip by the global norm and step; a non-finite gradient on any process's shard skips the step on every
        process (False), as `AdamStep` skips it."""
        # clipping reads the norm of the whole gradient (FSDP sums the shards' squares)
        return optimizer_step(self.optimizer, self.params, self.max_grad_norm, sharded_grads=True)

    @contextlib.contextmanager
    def whole(self, modify: bool = False) -> Iterator[None]:
        """Every weight of the module whole on every process for the duration (collective): each sharded parameter
        is gathered (`DTensor.full_tensor`) and stands in for it on its modules, so `state_dict`, `named_parameters`
        and loading read and write whole tensors; `modify`: what is written into them is kept (every process must
        write the same values: each keeps its own piece on exit). No forward pass may run inside (FSDP's hooks
        would gather into the sharded parameters). A no-op before the module is sharded."""
        if self._optimizer is None:
            yield
            return
        owners = [
            (m, name, p) for m in self.module.modules() for name, p in m._parameters.items() if isinstance(p, DTensor)
        ]
        stand_ins: dict[int, torch.nn.Parameter] = {}
        for _, _, p in owners:  # a tied weight is one DTensor on two modules: gathered once, stood in on both
            if id(p) not in stand_ins:
                stand_ins[id(p)] = torch.nn.Parameter(p.full_tensor(), requires_grad=p.requires_grad)
        for m, name, p in owners:
            m._parameters[name] = stand_ins[id(p)]
        try:
            yield
        finally:
            for m, name, p in owners:
                m._parameters[name] = p
        if modify:
            with torch.no_grad():
                for _, _, p in owners:
                    full = stand_ins.pop(id(p), None)
                    if full is not None:
                        p.to_local().copy_(distribute_tensor(full.detach(), p.device_mesh, p.placements).to_local())

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Generation on gathered weights: every unit gathered once and not resharded after each forward (otherwise
        every layer of every token would gather again, in lockstep across processes). A no-op before sharding."""
        if self._optimizer is None:
            yield
            return
        units = _units(self.module)
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.set_reshard_after_forward(True, recurse=False)
                unit.reshard()

    def state_dict(self) -> dict[str, Any]:
        """Adam's state gathered into torch's `state_dict` format (parameter i = `params[i]`). Collective."""
        optimizer = self.optimizer
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i, p in enumerate(self.params):
            if p in optimizer.state:
                saved = optimizer.state[p]
                state[i] = {k: _full(v) for k, v in saved.items()}
        group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        return {"state": state, "param_groups": [group | {"params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`: each process keeps its piece of each moment. Collective."""
        self.reset(self.learning_rate)
        optimizer = self.optimizer
        for i, saved in state["state"].items():
            p = self.params[int(i)]
            optimizer.state[p] = {
                k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements) if v.dim() > 0 else v.clone()
                for k, v in saved.items()
            }

    def reset(self, learning_rate: float) -> None:
        """A fresh Adam (no moments, step 0) at `learning_rate`."""
        self.learning_rate = learning_rate
        if self._optimizer is not None:
            self._optimizer = adam(self.params, learning_rate)

    def forward_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What runs the forward passes of the wrapped module: the sharded module itself."""
        self.optimizer  # noqa: B018 -- sharded at the first use
        return module


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A whole CPU copy of an optimiser tensor (gathered from the shards: collective)."""
    whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return whole.detach().to("cpu", copy=True)


def _engine_config(config: dict[str, Any], micro_batch: int, accumulation: int) -> dict[str, Any]:
    """The run's DeepSpeed config with the batch of one engine: DeepSpeed derives its total batch (micro ×
    accumulation × processes) and must not print its own progress lines between ours."""
    out = config | {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "steps_per_print": 2**62,
    }
    out.pop("train_batch_size", None)
    return out
