"""`Trainee`: one trainable model and its lifecycle, held alike by an actor and by a centralised critic.

A trainee is a model handle (`cory.policy.PolicyWithValueHead`: a full copy or one LoRA adapter, with its value head)
plus everything that belongs to its weights and nothing about how they are updated:
- the engine that steps them (`cory/engines.py`: torch Adam, or a DeepSpeed / FSDP engine that shards them);
- its own minibatch-permutation stream (a numpy `RandomState`, docs/method.md §1.5: every agent keeps its own);
- its files: weights (safetensors), optimiser state (tensors only) and a small JSON of counters;
- the forward module and mixed-precision context every pass over its weights uses.

What updates the weights is another part (`cory.ppo.learner.PPOLearner` for an actor, `cory.ppo.critics` for a
critic); it calls `backward(loss)` on every minibatch and `step()` once per backward batch.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cory import distributed, engines
from cory.checkpoints import tensors_of
from cory.errors import ConfigError
from cory.policy import PolicyWithValueHead

OPTIMIZER_STATE = "optimizer.pt"


@dataclass(frozen=True)
class Optimization:
    """How a trainee's weights are stepped: Adam at `learning_rate` (docs/method.md §2.1), optional gradient-norm
    clipping, and `accumulation` backward calls of `micro_batch` rows per optimiser step (§2.7)."""

    learning_rate: float
    max_grad_norm: float | None
    micro_batch: int
    accumulation: int


class Trainee:
    """One trainable model with its engine, RNG stream, parameters and files.

    Args:
        name: the trainee's id (an agent's `llm1`, the centralised critic's `critic`): its checkpoint folder.
        policy: its handle (`Backbone.policy`), placed and seeded.
        seed: seed of its minibatch-permutation stream.
        optimization: learning rate, gradient clipping and accumulation of its engine.
        train_value_head: whether its value head is among the stepped parameters (an actor whose values come from a
            critic of its own; not a critic-free actor, nor one that reads a centralised critic).
        device, autocast_dtype, forward_batch_size: placement, mixed precision, micro-batch of no-grad forwards.
        length_groups: its forwards in up to this many groups of similar length (`cory.ppo.rollout.forward_logits`);
            one process only (a data-parallel or sharded forward pairs with its own backward and its own gathers).
    """

    def __init__(
        self,
        name: str,
        policy: PolicyWithValueHead,
        seed: int,
        optimization: Optimization,
        train_value_head: bool = True,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
        forward_batch_size: int = 64,
        length_groups: int = 1,
    ) -> None:
        self.name, self.policy, self.seed = name, policy, seed
        self.optimization, self.train_value_head = optimization, train_value_head
        self.device = torch.device(device)
        self.autocast_dtype, self.forward_batch_size = autocast_dtype, forward_batch_size
        self.length_groups = length_groups
        self.engine = self._new_engine()
        if length_groups > 1 and (self.engine.processes.count > 1 or self.engine.sharded):
            raise ConfigError(
                f"hardware.length_groups={length_groups} needs one process: several forwards before one backward "
                "break data-parallel gradient exchange and sharded gathers; use hardware.length_groups=1 here"
            )
        # TRL draws minibatch permutations from numpy's legacy global RNG; a RandomState(seed) gives the same
        # sequence as `np.random.seed(seed)` while keeping each trainee's stream its own (docs/method.md §1.5)
        self.rng = np.random.RandomState(seed)
        self.updates_since_load = 0  # TRL's train-mode sampling starts after the first update (§2.1)
        self.policy.eval()  # dropout off in every PPO forward, as TRL (§2.1)

    # ------------------------------------------------------------------------------------------- the weights
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the engine steps, selected by name (never by `requires_grad`, which PEFT flips with the active
        adapter): the handle's adapter or whole model, with its value head unless `train_value_head` is false."""
        own = {id(p) for p in self.policy.trainable_parameters()}
        return [
            p
            for n, p in self.policy.named_parameters()
            if id(p) in own and (self.train_value_head or not n.startswith("v_head."))
        ]

    def forward_module(self) -> torch.nn.Module:
        """What runs the forward passes over these weights (the handle, or the engine's sharded wrapper)."""
        return self.engine.forward_module(self.policy)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def permutation(self, n: int) -> np.ndarray:
        """The next minibatch order of `n` samples from this trainee's own stream."""
        return self.rng.permutation(n)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate one minibatch's gradient (÷ the backward calls per step, inside the engine)."""
        self.engine.backward(loss)

    def step(self) -> bool:
        """One optimiser step over the accumulated gradients; False when a non-finite gradient skipped it."""
        return self.engine.step()

    def updated(self) -> None:
        """Mark the weights as changed by an update: rollout backends resync before the next generation."""
        self.updates_since_load += 1
        self.policy.weights_version = getattr(self.policy, "weights_version", 0) + 1

    @property
    def processes(self) -> engines.Processes:
        """The data-parallel processes the engine averages over (means and agreements of the update's numbers)."""
        return self.engine.processes

    # ------------------------------------------------------------------------------------------ resets, files
    def reset(self) -> None:
        """A fresh optimiser (the official swap's reload, docs/method.md §1.5)."""
        self.engine.reset(self.optimization.learning_rate)
        self.updates_since_load = 0

    def reseed(self) -> None:
        """The minibatch stream back at its start (the official swap's RNG reset, §1.5)."""
        self.rng = np.random.RandomState(self.seed)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every weight and optimiser tensor, named: what a loaded checkpoint must hold finite. Collective under a
        sharded engine (the Adam state is gathered; under ZeRO-3 the weights too, copied out on the CPU)."""
        with self.engine.whole():
            tensors = {f"weight {n}": engines.held(t) for n, t in self.policy.state_dict(keep_vars=True).items()}
        return tensors | tensors_of(self.engine.state_dict()["state"], "optimizer state")

    def save(self, directory: Path, state_file: str, state: dict) -> None:
        """Weights (safetensors: the adapter and value head, or all weights), optimiser (tensors only), and
        `state_file` (JSON): `state` plus this trainee's RNG and update count. Collective under a sharded engine;
        rank 0 writes."""
        directory.mkdir(parents=True, exist_ok=True)
        optimizer_state = self.engine.state_dict()  # under ZeRO, gathered by every process (collective)
        with self.engine.whole():  # ZeRO-3: the weights gathered on every process (collective), rank 0 writes them
            if distributed.is_main():
                self.policy.save_weights(directory)
        if not distributed.is_main():
            return
        torch.save(optimizer_state, directory / OPTIMIZER_STATE)
        rng_name, keys, pos, has_gauss, gauss = self.rng.get_state()
        own = {
            "rng": [rng_name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
            "steps_since_load": self.updates_since_load,
        }
        (directory / state_file).write_text(json.dumps(state | own))

    def load(self, directory: Path, state_file: str) -> dict:
        """Inverse of `save`; returns the owner's part of `state_file`. The optimiser state is read with
        `weights_only=True` (no pickle execution)."""
        with self.engine.whole(modify=True):  # ZeRO-3: every process reads the file, rank 0's copy is sharded
            self.policy.load_weights(directory)
        self.policy.weights_version = getattr(self.policy, "weights_version", 0) + 1
        self.engine.load_state_dict(torch.load(directory / OPTIMIZER_STATE, weights_only=True))
        state = json.loads((directory / state_file).read_text())
        name, keys, pos, has_gauss, gauss = state.pop("rng")
        self.rng.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        self.updates_since_load = int(state.pop("steps_since_load", 0))
        return state

    def _new_engine(self) -> engines.Engine:
        """Adam over the trainable parameters, on every process or sharded (`cory/engines.py`, the run's hardware
        option): torch defaults, no weight decay, constant learning rate (docs/method.md §2.1)."""
        o = self.optimization
        return engines.new_engine(
            self.policy, self.trainable_parameters(), o.learning_rate, o.max_grad_norm, o.micro_batch, o.accumulation
        )
