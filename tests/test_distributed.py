"""Data parallel through accelerate (`cory/distributed.py`): two gloo processes on the CPU, launched by `torchrun`.

1. The engine on fixed rollouts (`helpers/data_parallel.py`): 2 processes × B rows give the same update as
   1 process × 2B rows, for PPO (one agent, full fine-tuning) and CORY (two agents, each its own Adam, two LoRA
   adapters on one base, the shared reference that base without adapters).
   Why fixed rollouts and not two `cory.train` runs: each process samples its own slice with its own RNG stream
   (seed + rank), so sampled tokens, and hence everything after, differ from a 1-process run; only the learn step
   can be compared exactly, and that is where the engine acts (gradient mean, clipping after it, KL controller).
   What makes the two updates equal in exact arithmetic: every row has the same number of response tokens and
   each epoch is one minibatch (the local batch), so the 2B-row masked-mean loss is the mean of the two B-row
   losses and its gradient the mean of theirs; advantages are whitened per process (TRL's semantics), which the
   1-process side reproduces by whitening each B-row slice on its own; the KL controller sees the mean KL and
   counts B × 2 samples in both.
   Tolerance: the float32 sums run in another order (a 2B-row batch vs two B-row batches plus the all-reduce), a
   relative 1e-7 on each gradient. Adam divides by √v̂ + ε, so an element whose gradient is near zero (a few ε or
   less, where rounding is most of it) can move by a fair part of the learning rate on that noise alone: measured,
   36 of 41,921 elements differ by more than 1e-7 and the largest by 9.1e-6 (learning rate 1e-3, 2 Adam steps).
   We allow 2e-5 for any element and 1e-7 for all but 0.5 % of them. An engine that did not average (each
   process stepping on its own half) misses by 4e-3, with 68 % of the elements off by more than 1e-4.
2. `cory.train` end to end: the run finishes, rank 0 alone writes the run folder, both processes end with identical
   weights.
Run: `python -m pytest tests/test_distributed.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg

from cory import distributed
from cory.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "data_parallel.py"
ENV = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
LEARNING_RATE = 1e-3  # experiment=smoke's


def _torchrun() -> str:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun ships with torch"
    return torchrun


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]


def _flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([params[k].flatten() for k in sorted(params, key=int)])


@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_two_processes_update_as_one_process_with_the_whole_batch(tmp_path: Path, algorithm: str) -> None:
    _run([sys.executable, str(WORKER), str(tmp_path / "one"), algorithm, "--emulate", "2"])
    _run([_torchrun(), "--standalone", "--nproc_per_node", "2", str(WORKER), str(tmp_path / "two"), algorithm])
    one = torch.load(tmp_path / "one" / "rank0.pt")
    ranks = [torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1)]
    assert one["world_size"] == 1 and [r["world_size"] for r in ranks] == [2, 2]
    names = ["llm1", "llm2"] if algorithm == "cory" else ["llm1"]
    assert [n for n in one if n != "world_size"] == names
    for name in names:
        ref, got, other = one[name], ranks[0][name], ranks[1][name]
        assert torch.equal(_flat(got["params"]), _flat(other["params"]))  # the same step on every process
        assert got["kl_coef"] == other["kl_coef"] == pytest.approx(ref["kl_coef"], rel=1e-9, abs=0)
        assert got["kl_coef"] != 0.3 * 1.0  # moved from β0 (adaptive controller)
        assert got["adam_steps"] == ref["adam_steps"] == 2.0
        diff = (_flat(got["params"]) - _flat(ref["params"])).abs()
        assert diff.max() <= 2e-2 * LEARNING_RATE, (name, diff.max())
        assert (diff > 1e-7).float().mean() <= 0.005, (name, (diff > 1e-7).sum())


def test_single_process_engine_is_a_no_op() -> None:
    """Outside a launcher: one process, gradients and metrics left as they are (bit-identical runs)."""
    device = distributed.setup(compose_cfg(["experiment=smoke"]).hardware, torch.device("cpu"))
    assert device == torch.device("cpu") and distributed.world_size() == 1 and distributed.is_main()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([0.1, -2.0, 3.0])
    before = p.grad.clone()
    distributed.average_gradients([p])
    assert torch.equal(p.grad, before)
    metrics = {"a": 1.5}
    assert distributed.mean_metrics(metrics) is metrics and distributed.mean(0.25) == 0.25
    distributed.close()


@pytest.mark.parametrize(("option", "stage"), [("deepspeed_zero2", 2), ("deepspeed_zero3", 3)])
def test_zero_options_compose_and_are_refused_in_one_line(option: str, stage: int) -> None:
    """The ZeRO options compose, point to a DeepSpeed config of their stage whose precision is the option's; the
    learner has no ZeRO path, so building one stops with a one-line ConfigError (on a CPU: it needs CUDA)."""
    hardware = compose_cfg([f"hardware={option}"]).hardware
    config = distributed.deepspeed_config(hardware)
    assert config["zero_optimization"]["stage"] == stage
    assert config["bf16"]["enabled"] is (hardware.precision == "bf16")
    with pytest.raises(ConfigError) as err:
        distributed.setup(hardware, torch.device("cpu"))
    assert "\n" not in str(err.value) and f"ZeRO-{stage}" in str(err.value)
    mismatched = compose_cfg([f"hardware={option}", "hardware.precision=fp32"]).hardware
    with pytest.raises(ConfigError, match="enables \\['bf16'\\] but hardware.precision=fp32"):
        distributed.deepspeed_config(mismatched)


@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_two_gloo_processes_stay_in_sync(tmp_path: Path, algorithm: str) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        _torchrun(),
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cory.train",
        "experiment=smoke",
        f"algorithm={algorithm}",
        "iterations=2",
        "progress=false",
        "save_every=0",
        "num_eval=4",
        f"hydra.run.dir={run_dir}",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    _run(cmd)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["weights_in_sync"] is True
    assert summary["completed"] and summary["iterations"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if any(k.startswith("train/") for k in r)]
    assert [r["iteration"] for r in train_rows] == [0, 1]  # one writer: no duplicated rows
