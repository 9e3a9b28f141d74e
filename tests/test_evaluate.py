"""`python -m cory.evaluate`: pass@k of the base model and every agent of a run (`cory/evaluate.py`).

Covers: the summary's pass@k, greedy accuracy and no-number rate against hand-computed values (n − c < k
included); a CORY run's checkpoint gives rows for base, llm1 and llm2 plus JSON and PNG; the base model of a LoRA
run samples exactly what the adapter-free model samples; a killed evaluation resumes to the results of an
uninterrupted one; wrong targets, other settings in the same folder (an override such as the temperature, the
batch size) and non-numeric tasks fail in one line;
the W&B mirror runs offline. Run: `pytest tests/test_evaluate.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from hydra.utils import instantiate
from safetensors.torch import load_file, save_file

import cory.evaluate
from cory.build import build_backbone
from cory.checkpoints import latest_checkpoint
from cory.errors import ConfigError
from cory.evaluate import evaluate_run, sample_chunk, summarize
from cory.train import train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cory_run(tmp_path_factory) -> Path:
    """A finished two-iteration CORY run of the GSM8K path (tiny Llama, LoRA, arithmetic)."""
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    cfg = compose_cfg(["experiment=gsm8k_smoke", "algorithm=cory", "iterations=2", "progress=false"])
    train(cfg, run_dir)
    return run_dir


def test_summary_against_hand_computed_values():
    rows = [  # n = 4 samples per problem
        {"n": 4, "correct": 0, "no_answer": 4, "greedy_correct": False},
        {"n": 4, "correct": 1, "no_answer": 1, "greedy_correct": True},
        {"n": 4, "correct": 3, "no_answer": 0, "greedy_correct": True},  # n − c = 1 < k for k = 2, 4
    ]
    s = summarize(rows, [1, 2, 4, 8])
    assert math.isclose(s["pass@1"], (0 + 1 / 4 + 3 / 4) / 3)
    # pass@2 = 1 − C(n−c, 2)/C(4, 2): 0, 1 − 3/6, 1
    assert math.isclose(s["pass@2"], (0 + 0.5 + 1) / 3)
    assert math.isclose(s["pass@4"], (0 + 1 + 1) / 3)
    assert "pass@8" not in s  # k > n is not estimable
    assert math.isclose(s["greedy_accuracy"], 2 / 3) and math.isclose(s["no_answer_rate"], 5 / 12)
    assert s["n"] == 4 and s["num_problems"] == 3


def test_every_agent_and_the_base_model_are_evaluated(cory_run, tmp_path):
    summary = evaluate_run(cory_run, [], n=4, ks=[1, 2, 4], num_problems=5, batch_size=8, seed=0, out=tmp_path)
    assert list(summary) == ["base", "llm1", "llm2"]
    for stats in summary.values():
        assert stats["num_problems"] == 5 and 0 <= stats["pass@1"] <= stats["pass@2"] <= stats["pass@4"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["model"], r["index"]) for r in rows) == [(m, i) for m in summary for i in range(5)]
    assert json.loads((tmp_path / "passk.json").read_text()) == summary
    assert (tmp_path / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_only_policy_agents_are_evaluated_not_a_centralised_critic(tmp_path):
    """CORY + centralised critic saves `critic/` beside `llm1/` and `llm2/` (LoRA weights too): the algorithm records
    which folders hold policies (`policies.json`), and only those are evaluated; a damaged record is one line."""
    from helpers.runners import start_run

    from cory.checkpoints import ALGORITHM_DIR, POLICIES, latest_checkpoint
    from cory.errors import CheckpointError

    run = tmp_path / "run"
    start_run(tmp_path, run, "algorithm=cory_cc", "model.lora.enabled=true", "iterations=1", "save_every=1")
    checkpoint = latest_checkpoint(run)
    assert (checkpoint / ALGORITHM_DIR / "critic").is_dir()
    assert cory.evaluate.checkpoint_agents(checkpoint) == ["llm1", "llm2"]
    (checkpoint / ALGORITHM_DIR / POLICIES).write_text('{"llm1": 1}')
    with pytest.raises(CheckpointError, match=r"policies.json: ValueError: not a list of folder names"):
        cory.evaluate.checkpoint_agents(checkpoint)
    (checkpoint / ALGORITHM_DIR / POLICIES).unlink()  # MAFT records none: nothing but the base model to evaluate
    assert cory.evaluate.checkpoint_agents(checkpoint) == []


def test_overrides_instead_of_a_run_evaluate_the_base_model_of_that_config(tmp_path):
    overrides = ["experiment=gsm8k_smoke", "task.num_eval=4"]
    summary = evaluate_run(None, overrides, n=2, ks=[1, 2], num_problems=None, batch_size=8, seed=0, out=tmp_path)
    assert list(summary) == ["base"] and summary["base"]["num_problems"] == 4


def test_the_base_model_of_a_lora_run_is_the_adapter_free_model():
    """A fresh adapter adds exactly zero: the `base` samples equal those of the same model without LoRA."""
    rows = {}
    for lora in ("true", "false"):
        cfg = compose_cfg(["experiment=gsm8k_smoke", f"model.lora.enabled={lora}"])
        backbone = build_backbone(cfg.model, torch.device("cpu"))
        task = instantiate(cfg.task, tokenizer=backbone.tokenizer, _convert_="all")
        policy = cory.evaluate._Policy(backbone, cfg.seed, "fp32")
        torch.manual_seed(0)
        rows[lora] = sample_chunk(policy, task, task.eval_queries()[:3], 4, 16)
    assert rows["true"] == rows["false"] and any(r["sample_response"] for r in rows["true"])


def test_a_killed_evaluation_continues_where_it_stopped(cory_run, tmp_path, monkeypatch):
    args = dict(n=2, ks=[1, 2], num_problems=6, batch_size=4, seed=0)  # 2 problems per chunk
    want = evaluate_run(cory_run, [], out=tmp_path / "whole", **args)
    real, calls = cory.evaluate.sample_chunk, []

    def dies_on_the_fourth_chunk(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(cory.evaluate, "sample_chunk", dies_on_the_fourth_chunk)
    with pytest.raises(KeyboardInterrupt):
        evaluate_run(cory_run, [], out=tmp_path / "cut", **args)
    with (tmp_path / "cut" / "results.jsonl").open("a") as f:
        f.write('{"model": "llm1", "ind')  # a line cut by the kill
    monkeypatch.setattr(cory.evaluate, "sample_chunk", real)
    calls.clear()
    got = evaluate_run(cory_run, [], out=tmp_path / "cut", **args)
    assert got == want

    def lines(folder: str) -> list[str]:
        return sorted((tmp_path / folder / "results.jsonl").read_text().splitlines())

    assert lines("cut") == lines("whole")  # the same samples, not only the same averages


def test_rows_of_other_settings_are_never_reused(cory_run, tmp_path):
    """A second evaluation into the same folder at another temperature (an override of the run's config) or another
    batch size (which chunks and seeds the sampling) would print the first one's pass@k: refused, naming the
    setting. The same settings again reuse the rows."""
    args = dict(ks=[1, 2], num_problems=2, seed=0, out=tmp_path)
    first = evaluate_run(cory_run, [], n=2, batch_size=4, **args)
    temperature = "task.generation_kwargs.temperature"
    with pytest.raises(
        ConfigError, match=rf"holds results of other settings \(config\.{temperature}: 1\.0 there, 0\.5 now"
    ):
        evaluate_run(cory_run, [f"{temperature}=0.5"], n=2, batch_size=4, **args)
    with pytest.raises(ConfigError, match=r"other settings \(batch_size: 4 there, 2 now"):
        evaluate_run(cory_run, [], n=2, batch_size=2, **args)
    assert evaluate_run(cory_run, [], n=2, batch_size=4, **args) == first


def _run(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cory.evaluate", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_errors_are_one_line(cory_run, tmp_path):
    out = _run(str(tmp_path / "nowhere"))
    assert out.returncode == 2 and out.stderr.startswith("error:") and out.stderr.count("\n") == 1, out.stderr
    assert "neither a cory run folder" in out.stderr
    out = _run(str(cory_run), "model.no_such_key=1")
    assert out.returncode == 2 and "model.no_such_key" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "settings.json").write_text(json.dumps({"n": 99}))
    out = _run(str(cory_run), "--n", "2", "--out", str(tmp_path))
    assert out.returncode == 2 and "other settings" in out.stderr


def test_cfg_job_prints_the_config_and_runs_nothing(cory_run):
    for target in (str(cory_run), "experiment=gsm8k_smoke"):
        out = _run(target, "--cfg", "job")
        assert out.returncode == 0 and "_target_: cory.models.build_tiny_llama" in out.stdout, out.stderr
        assert "problems done" not in out.stderr


def test_a_sweep_jobs_folder_is_a_run_although_its_path_holds_an_equals_sign(cory_run, tmp_path):
    job = tmp_path / "algorithm=cory" / "seed=0"  # how `-m` sweeps and cory-sweep name their jobs
    shutil.copytree(cory_run, job)
    out = _run(str(job), "--cfg", "job")
    assert out.returncode == 0 and "_target_: cory.models.build_tiny_llama" in out.stdout, out.stderr


def test_a_task_without_numeric_answers_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    train(compose_cfg(["experiment=smoke", "iterations=1", "progress=false"]), run_dir)
    out = _run(str(run_dir), "--n", "2")
    assert out.returncode == 2 and "pass@k needs a task with numeric answers" in out.stderr


def test_the_wandb_mirror_runs_offline(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    cfg = compose_cfg(["experiment=gsm8k_smoke", "iterations=1", "logger=wandb", "progress=false"])
    train(cfg, run_dir)  # W&B disabled while training (conftest)
    monkeypatch.setenv("WANDB_MODE", "offline")
    evaluate_run(run_dir, [], n=2, ks=[1, 2], num_problems=2, batch_size=4, seed=0, out=tmp_path / "eval")
    assert list((tmp_path / "eval" / "wandb").glob("offline-run-*"))
    logged = json.loads((tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"passk/base/pass@1", "passk/llm1/pass@2", "passk/llm1/greedy_accuracy"} <= set(logged)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n", "4", "--ks", "2", "8"], "error: --ks 8: above --n=4"),
        (["--num-problems", "0"], "error: --num-problems=0: must be >= 1"),
        (["--num-problems", "-1"], "error: --num-problems=-1: must be >= 1"),
        (["--batch-size", "-1"], "error: --batch-size=-1: must be >= 1"),
    ],
)
def test_flags_that_would_give_a_silent_partial_answer_are_refused(tmp_path, flags, message):
    out = _run(str(tmp_path), *flags)  # refused before the folder is even read
    assert out.returncode == 2 and out.stderr.startswith(message) and out.stderr.count("\n") == 1


def test_a_torn_or_repeated_results_file_counts_each_problem_once(tmp_path):
    path = tmp_path / "results.jsonl"
    rows = [{"model": "base", "index": i, "n": 2, "correct": i % 3} for i in range(3)]
    lines = [json.dumps(r) for r in rows]
    # a row written twice (two evaluations at once before the lock) and a tail cut by a kill: a parsable prefix
    path.write_text("\n".join([lines[0], lines[1], lines[1], lines[2]]) + "\n" + json.dumps(rows[0])[:-1] + "}")
    assert cory.evaluate.read_results(path) == rows
    assert path.read_text() == "\n".join(lines) + "\n"  # rewritten whole, so appends start on a clean line


def test_two_evaluations_of_one_folder_do_not_write_at_once(tmp_path):
    from cory.runs import RunLock

    lock = RunLock(tmp_path / "eval")
    (tmp_path / "eval").mkdir()
    lock.acquire()  # another evaluation is writing there
    try:
        with pytest.raises(cory.evaluate.ConfigError, match="being written by another evaluation"):
            evaluate_run(
                None,
                ["experiment=gsm8k_smoke"],
                n=2,
                ks=[1],
                num_problems=1,
                batch_size=2,
                seed=0,
                out=tmp_path / "eval",
            )
    finally:
        lock.release()


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _nan(path: Path) -> None:
    tensors = load_file(str(path))
    first = next(iter(tensors))
    tensors[first] = torch.full_like(tensors[first], math.nan)
    save_file(tensors, str(path))


@pytest.mark.parametrize("damage", [_cut, _nan], ids=["truncated", "nan"])
def test_damaged_weights_are_one_line_naming_the_file_before_any_model_loads(cory_run, tmp_path, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(cory_run, run_dir)
    checkpoint = latest_checkpoint(run_dir)
    weights = sorted((checkpoint / "algorithm" / "llm1").glob("*.safetensors"))[0]
    damage(weights)
    out = _run(str(run_dir), "--n", "2", "--num-problems", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.startswith(f"error: checkpoint {checkpoint} is damaged: {weights.relative_to(checkpoint)} ")
    assert not (run_dir / "evaluation").exists()


def test_an_output_folder_that_cannot_be_written_is_one_line(cory_run, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = _run(str(cory_run), "--n", "2", "--num-problems", "1", "--out", str(blocker / "passk"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr == f"error: cannot write {blocker / 'passk'} (Not a directory); pass another --out\n"
