"""The contract between the trainer and an algorithm: the `Algorithm` protocol and the `RunContext` it is built with.

The trainer (`cory.trainer`), the checkpoints and the entry point know an algorithm only through this protocol; they
never read its agents, learners or hyperparameters. An algorithm is a `_target_` with `_partial_: true` in
`cory/conf/algorithm/<name>.yaml`; the entry point completes it with `context=RunContext(...)`. Everything the
algorithm needs from the run (settings, hardware, the run folder, the model, the task) comes through that context,
lazily: the model loads only when the algorithm first asks for it, after it has checked its own settings, so a bad
value costs seconds, not a model load.

    algorithm = instantiate(cfg.algorithm)(context=context)     # cory.build.build_algorithm
    algorithm.evaluate(0, final=True, ...)                      # before training
    for k in range(iterations):
        out = algorithm.step(k)                                 # one iteration: metrics, samples, nonfinite flag
        algorithm.evaluate(k + 1, ...) when due                 # held-out metrics
        algorithm.save(folder) when due                         # checkpoint contents (resume: algorithm.load)
    algorithm.report(rows, run_dir)                             # summary fields, console lines, figures

Pre-emption (optional): a stop signal (SIGTERM, SIGUSR1, ...) ends the run within seconds only where the algorithm
marks the work that changes nothing a checkpoint holds, generation, scoring and held-out evaluation, with
`cory.preemption.abandonable()`: a signal there drops that iteration (or evaluation) at once, and the resumed run
redoes it identically. Unmarked work is never interrupted: an algorithm that marks nothing finishes every iteration
it began before the run saves and stops, as before.

docs/extending.md shows how to add an algorithm, a learner, a task or a reward with new files only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from cory.settings import HardwareSettings, RunSettings


@dataclass
class StepOutput:
    """One training iteration, as the algorithm reports it.

    Attributes:
        metrics: every logged scalar of the iteration (names defined in the algorithm's metric catalogue).
        samples: a few rows for the `train/samples` table.
        nonfinite: the iteration met a non-finite loss, reward or KL (its update was skipped); the trainer counts
            consecutive ones against `max_bad_iterations` and never checkpoints such an iteration.
        headline: the few numbers for the progress bar and the per-iteration log line (reward, KL, β per agent).
    """

    metrics: dict[str, float]
    samples: list[dict] = field(default_factory=list)
    nonfinite: bool = False
    headline: dict[str, float] = field(default_factory=dict)


@dataclass
class EvalOutput:
    """One held-out evaluation: its metrics (`eval/...`), named sample tables, and the few numbers of its log line."""

    metrics: dict[str, float]
    tables: list[tuple[str, list[dict]]] = field(default_factory=list)
    headline: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    """What a finished (or stopped) run reports: fields merged into `summary.json` and lines for the console."""

    summary: dict[str, Any]
    lines: list[str] = field(default_factory=list)


@dataclass
class RunContext:
    """What the entry point hands an algorithm (`cory.build`). The callables load on first use and cache.

    Attributes:
        settings: run-level keys (iterations, batch size, seed, evaluation sizes).
        hardware: device, precision, micro-batch sizes.
        device: the resolved torch device.
        run_dir: the run folder (an algorithm may keep its own files under it; the trainer owns the rest).
        load_model: `() -> (model, tokenizer)`, the `model` group's loader output (loaded once).
        backbone: `() -> cory.policy.Backbone`, the loaded model with the agents' handles (LoRA or full copies).
        task: `() -> Task`, the `task` group built with the model's tokenizer.
    """

    settings: RunSettings
    hardware: HardwareSettings
    device: torch.device
    run_dir: Path
    load_model: Callable[[], tuple[Any, Any]]
    backbone: Callable[[], Any]
    task: Callable[[], Any]


class Algorithm(Protocol):
    """What the trainer calls, and nothing else."""

    def describe(self) -> dict[str, Any]:
        """The run's identity for names, tags and `summary.json`: at least `{"algorithm": <name>}` plus the few
        values that tell runs of a sweep apart (CORY/PPO: `kl_coef`)."""
        ...

    def step(self, iteration: int) -> StepOutput:
        """Training iteration `iteration` (0-based); everything it draws is seeded by (seed, iteration) or held
        in the algorithm's saved state, so a resumed run continues exactly. Optional: the part before its update
        inside `with cory.preemption.abandonable():`, so that a stop signal drops the iteration at once there."""
        ...

    def evaluate(self, iteration: int, final: bool, should_stop: Callable[[], bool]) -> EvalOutput | None:
        """Held-out evaluation after `iteration` completed iterations (`final`: the first or the last one, which
        may be larger); None when `should_stop()` became true meanwhile (the evaluation stays owed). Optional: its
        work inside `cory.preemption.abandonable()`, so that a stop signal drops it at once (it stays owed too)."""
        ...

    def parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The trainable tensors, named; the trainer checks them for finiteness after every step."""
        ...

    def save(self, directory: Path) -> None:
        """Write everything a resumed run needs into the (new, empty) `directory`: weights, optimiser states,
        controllers, the algorithm's own RNG streams and counters. Nothing pickled but tensors. With several
        processes rank 0's folder is the checkpoint; when the learners' state is sharded (ZeRO,
        `cory.distributed.sharded()`) every process calls `save` (gathering is collective) and the others' folders
        are thrown away."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote; raise `cory.errors.CheckpointError` (one line naming the file) on a
        damaged, foreign or non-finite checkpoint, before changing anything that cannot be rolled back."""
        ...

    def report(self, rows: list[dict], run_dir: Path) -> Report:
        """The run's summary from its logged rows (`metrics.jsonl`), and its figures written into `run_dir`."""
        ...


def named_parameters(groups: dict[str, Iterable[torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """`(group/index, tensor)` for each group's tensors: a helper for `Algorithm.parameters`."""
    for name, tensors in groups.items():
        for i, tensor in enumerate(tensors):
            yield f"{name}/{i}", tensor
