"""`make gpu-check` (`scripts/gpu_check.py`): its no-CUDA line, its table and JSON from faked measurements, and the
wiring of its 4-bit runs on the CPU (without 4 bit, tiny width). The checks themselves need a GPU (`gpu` tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path) -> None:
    env = os.environ | {"CUDA_VISIBLE_DEVICES": "", "PY": sys.executable, "OUT": str(tmp_path / "out")}
    out = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [_gpu_check().NO_CUDA]
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written


def test_table_and_json_from_faked_measurements(tmp_path) -> None:
    gpu_check = _gpu_check()
    results = {
        "lora_4bit_ppo": {"peak_mb": 812.4, "s_per_iter": 1.234, "iterations": 2, "all_finite": True},
        "lora_4bit_cory": {"peak_mb": 1630.0, "s_per_iter": 2.5, "iterations": 2, "all_finite": False},
        "bf16_vs_fp32": {"max_abs_dlogp": 0.0312, "max_rel_dkl_seq": 0.25, "mean_kl_seq_fp32": 1.5},
        "vllm_vs_hf": {"model": "smollm2_135m", "identical": 6, "prompts": 6, "hf_s": 2.0, "vllm_s": 0.5},
        "ddp": {"status": "skipped", "reason": "one GPU visible"},
        "zero2": {"processes": 1, "iterations": 2, "s_per_iter": 0.4, "all_finite": True},
        "zero3": {"processes": 1, "iterations": 2, "s_per_iter": 0.9, "peak_mb": 1234.5, "all_finite": True},
        "fsdp": {"processes": 2, "iterations": 2, "s_per_iter": 0.7, "peak_mb": 999.0, "all_finite": True},
        "cory_ppo_ratio": {"status": "failed", "error": "benchmark.py exited with 1"},
    }
    table = gpu_check.report(results, tmp_path / "out", "1 × NVIDIA H200")
    assert table.splitlines() == [
        "gpu-check on 1 × NVIDIA H200",
        "  lora_4bit_ppo   812 MiB peak, 1.23 s/iteration, finite",
        "  lora_4bit_cory  1630 MiB peak, 2.50 s/iteration, NON-FINITE",
        "  bf16_vs_fp32    max |Δlog π| 0.0312, max rel |ΔKL_seq| 0.25",
        "  vllm_vs_hf      6/6 identical greedy texts (smollm2_135m)",
        "  ddp             skipped: one GPU visible",
        "  zero2           1 processes, 2 iterations, 0.40 s/it, finite",
        "  zero3           1 processes, 2 iterations, 0.90 s/it, 1234 MiB peak, finite",
        "  fsdp            2 processes, 2 iterations, 0.70 s/it, 999 MiB peak, finite",
        "  cory_ppo_ratio  FAILED: benchmark.py exited with 1",
    ]
    saved = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert saved == {"device": "1 × NVIDIA H200", "checks": results}


def test_a_failing_check_is_one_line_and_does_not_stop_the_others() -> None:
    gpu_check = _gpu_check()

    def broken() -> dict:
        raise RuntimeError("vLLM is\nnot installed")

    assert gpu_check.run_check(broken) == {"status": "failed", "error": "vLLM is not installed"}
    assert gpu_check.run_check(lambda: {"ratio": 2.0}) == {"ratio": 2.0}


@pytest.mark.long
def test_four_bit_runs_wiring_on_the_cpu(tmp_path) -> None:
    """The 4-bit check's two runs and what it reads from them, here without 4 bit and with a tiny width."""
    small = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_attention_heads=4"]
    results = _gpu_check().train_runs(
        tmp_path, hardware="cpu", four_bit=False, extra=[*small, "model.num_key_value_heads=2"]
    )
    assert list(results) == ["lora_4bit_ppo", "lora_4bit_cory"]
    for result in results.values():
        assert result["iterations"] == 2 and result["all_finite"] and result["s_per_iter"] > 0


@pytest.mark.gpu
def test_gpu_check_on_a_gpu(tmp_path) -> None:
    """`bash scripts/gpu_check.sh` as `make gpu-check` runs it (needs requirements-gpu.txt)."""
    env = os.environ | {"PY": sys.executable, "OUT": str(tmp_path / "out")}
    command = ["bash", "scripts/gpu_check.sh"]
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    checks = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["checks"]
    assert checks["vllm_vs_hf"]["identical"] == checks["vllm_vs_hf"]["prompts"]


def test_main_skips_vllm_when_absent_and_takes_the_ratio_overrides(tmp_path, monkeypatch) -> None:
    """With CUDA faked and every check stubbed: a missing vLLM is a skipped row (not a failure, exit 0), and
    `--ratio "..."` replaces the batch-256 timing's overrides."""
    import torch

    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name))
    seen = {}
    run = {"peak_mb": 1.0, "s_per_iter": 1.0, "iterations": 2, "all_finite": True}
    monkeypatch.setattr(gpu_check, "train_runs", lambda out, extra=(): {"lora_4bit_ppo": run, "lora_4bit_cory": run})
    monkeypatch.setattr(gpu_check, "bf16_vs_fp32", lambda: {"max_abs_dlogp": 0.01, "max_rel_dkl_seq": 0.1})
    monkeypatch.setattr(gpu_check, "vllm_vs_hf", lambda out: pytest.fail("vLLM check ran without vLLM"))
    iterations = {"zero2": 2, "zero3": 3, "fsdp": 4}
    monkeypatch.setattr(
        gpu_check,
        "sharded",
        lambda out, gpus, name: {
            "processes": gpus,
            "iterations": iterations[name],
            "s_per_iter": 1.0,
            "all_finite": True,
        },
    )
    ratio = {"ratio": 2.0, "ppo_s_per_iter": 1.0, "cory_s_per_iter": 2.0, "ppo_peak_mb": 1.0, "cory_peak_mb": 2.0}
    monkeypatch.setattr(gpu_check, "cory_ppo_ratio", lambda overrides: seen.setdefault("ratio", overrides) and ratio)
    assert (
        gpu_check.main(["--out", str(tmp_path), "--ratio", "experiment=imdb_gpt2 'task.max_new_tokens=[16,16]'"]) == 0
    )
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert checks["vllm_vs_hf"] == {"status": "skipped", "reason": gpu_check.NO_VLLM}
    assert checks["ddp"]["status"] == "skipped"
    assert [checks[name]["iterations"] for name in iterations] == [2, 3, 4]  # each engine its own run
    assert seen["ratio"] == ["experiment=imdb_gpt2", "task.max_new_tokens=[16,16]"]


def test_the_committed_gpu_run_is_the_table_in_the_docs() -> None:
    """outputs/gpu/gpu_check.json (the H200 run) renders, row by row, the table docs/running.md prints."""
    saved = json.loads((REPO / "outputs" / "gpu" / "gpu_check.json").read_text())
    table = _gpu_check().table(saved["checks"], saved["device"])
    docs = (REPO / "docs" / "running.md").read_text()
    for line in table.splitlines()[1:]:
        assert line.strip() in docs, line
