"""The speed instruments: `scripts/benchmark.py` and `cory-gpt2-small` (no timing is asserted here).

`benchmark.py` runs each algorithm in its own process; the end-to-end test below spawns 4 of them (about 30 s
of CPU). `cory-gpt2-small` (`cory/studies/make_gpt2_small.py`) is tested with a hand-made byte-level vocabulary
instead of GPT-2's (no npm in tests) and a 2-layer model instead of 124M parameters.
"""

from __future__ import annotations

import ast
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

from cory.models import build_tiny_gpt2
from cory.ppo.rollout import length_groups
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


# ---------------------------------------------------------------------------------------------------------------------
# --against-official and its harness (scripts/official/bench_official.py runs in .venv-official; its pure parts and
# its parser import with the standard library alone, so they are tested here without that venv)
# ---------------------------------------------------------------------------------------------------------------------
def _load_official_harness():
    spec = importlib.util.spec_from_file_location(
        "bench_official", REPO / "scripts" / "official" / "bench_official.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


official = _load_official_harness()
OFFICIAL_VENV = REPO / ".venv-official" / "bin" / "python"
needs_official_venv = pytest.mark.skipif(
    not OFFICIAL_VENV.is_file(), reason="no .venv-official (scripts/official/setup.sh builds it)"
)


def test_against_official_parses_with_or_without_a_clone():
    args = benchmark.parse_args([])
    assert (args.against_official, args.official_clone) == (False, benchmark.OFFICIAL_CLONE)
    args = benchmark.parse_args(["--against-official", "experiment=bench_gpt2_small"])  # the flag takes no value
    assert args.against_official and args.overrides[0] == "experiment=bench_gpt2_small"
    args = benchmark.parse_args(["--against-official", "--official-clone", "/x/CORY", "--threads", "1"])
    assert (args.against_official, args.official_clone, args.threads) == (True, "/x/CORY", 1)
    assert len(benchmark.OFFICIAL_COMMIT) == 40 and int(benchmark.OFFICIAL_COMMIT, 16)
    assert benchmark.OFFICIAL_COMMIT in (REPO / "scripts" / "official" / "setup.sh").read_text()


def test_official_harness_parser_needs_no_official_stack():
    args = official.parse_args(
        ["--official", "t", "--algorithm", "cory", "--model", "m", "--reward-dir", "r", "--prompts", "p.csv"]
    )
    assert (args.batch_size, args.mini_batch_size, args.ppo_epochs) == (16, 16, 4)
    assert tuple(args.max_new_tokens) == (16, 16)
    assert (args.warmup, args.iterations, args.gen_batch_size, args.ref_response) == (1, 3, 16, "skip")
    assert set(official.SCRIPTS) == set(benchmark.ALGORITHMS)
    # at module level it imports the standard library only: the official stack is imported inside `run`
    tree = ast.parse((REPO / "scripts" / "official" / "bench_official.py").read_text())
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert top and all(name.split(".")[0] in sys.stdlib_module_names for name in top), top


def test_official_harness_rewrites_the_tokenizer_without_changing_it(tmp_path, tiny_gpt2_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer

    folder = official.legacy_tokenizer_folder(tiny_gpt2_dir, tmp_path / "legacy")
    assert (folder / "model.safetensors").is_symlink() and (folder / "config.json").is_symlink()
    # GPT-2's tokenizer from the rewritten files (what GPT2TokenizerFast builds from vocab.json + merges.txt)
    legacy = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    legacy.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ours = AutoTokenizer.from_pretrained(str(tiny_gpt2_dir))
    for text in ("hello world", " he hello", "héllo, wörld!\n"):
        assert legacy.encode(text).ids == ours(text)["input_ids"]


def test_official_harness_scores_with_our_tfidf_reward(tmp_path):
    from helpers.fakes import write_reviews_csv

    from cory.tasks.rewards import _TFIDF, TfidfSentimentReward

    reward = TfidfSentimentReward(cache_dir=str(tmp_path), data_files=str(write_reviews_csv(tmp_path / "r.csv")))
    texts = ["a wonderful, moving film", "boring and awful", "I rented it", ""]
    pipe = official.SentimentPipe(official.TfidfLogit(reward.path, _TFIDF["ngram_range"]), pad_token_id=0)
    out = pipe(texts, return_all_scores=True, function_to_apply="none", batch_size=16)
    assert [o[1]["score"] for o in out] == pytest.approx(reward(texts), abs=1e-12)
    assert [o[1]["label"] for o in out] == ["POSITIVE"] * 4 and pipe.tokenizer.pad_token_id == 0


def test_official_harness_clock_rows_one_per_iteration():
    clock = official.Clock()
    for n in clock.loop(range(3)):
        clock.generate, clock.learn, clock.tokens = 0.5 * n, 1.0 * n, 10 * n
    assert [(r["generate_s"], r["learn_s"], r["tokens"]) for r in clock.rows] == [(0, 0, 0), (0.5, 1, 10), (1, 2, 20)]
    assert all(r["iteration_s"] >= 0 for r in clock.rows)


def test_against_official_without_its_venv_or_clone_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--against-official", "--official-clone", str(tmp_path / "no")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --"), lines
    if OFFICIAL_VENV.is_file():
        assert lines[0] == f"error: --official-clone {tmp_path / 'no'}: no git clone there with commit " + (
            f"{benchmark.OFFICIAL_COMMIT} (clone the official repository)"
        )
    else:
        assert lines[0].startswith("error: --against-official") and "setup.sh" in lines[0]


@pytest.mark.long
@needs_official_venv
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_official_harness_runs_the_official_script_on_a_toy_gpt2(tmp_path, tiny_gpt2_dir, algorithm):
    """One untimed + one timed iteration of the official script on the 2-layer model (about 20 s each)."""
    from cory.assets import packaged_imdb_csv
    from cory.tasks.rewards import TfidfSentimentReward

    clone = Path(benchmark.OFFICIAL_CLONE)
    if not clone.exists():
        pytest.skip(f"no clone of the official repository at {clone} (set CORY_OFFICIAL_CLONE)")
    tree = tmp_path / "official"
    tree.mkdir()
    assert benchmark.export_official(str(clone), benchmark.OFFICIAL_COMMIT, tree) == benchmark.OFFICIAL_COMMIT
    from helpers.fakes import write_reviews_csv

    reward = TfidfSentimentReward(cache_dir=str(tmp_path), data_files=str(write_reviews_csv(tmp_path / "r.csv")))
    cmd = [str(OFFICIAL_VENV), str(REPO / "scripts" / "official" / "bench_official.py"), "--official", str(tree)]
    cmd += ["--algorithm", algorithm, "--model", str(tiny_gpt2_dir), "--reward-dir", str(reward.path)]
    cmd += ["--prompts", str(packaged_imdb_csv()), "--warmup", "1", "--iterations", "1", "--threads", "1"]
    cmd += ["--batch-size", "4", "--mini-batch-size", "2", "--ppo-epochs", "1", "--max-new-tokens", "3", "3"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["iteration_s"]) == len(out["generate_s"]) == len(out["learn_s"]) == len(out["tokens"]) == 1
    assert 0 < out["generate_s"][0] + out["learn_s"][0] <= out["iteration_s"][0]
    agents = 2 if algorithm == "cory" else 1
    assert out["tokens"][0] >= agents * 4 * (2 + 1)  # each response is 1..3 tokens after a 2..8-token prompt
    assert out["threads"] == 1 and out["peak_mb"] > 0 and out["checkpoint_mb"] == 0


@pytest.mark.long
@needs_official_venv
def test_against_official_interleaves_the_official_scripts_on_a_saved_gpt2(tmp_path, tiny_gpt2_dir):
    """`--against-official` end to end at toy scale: ours and the official scripts on the same 2-layer model."""
    if not Path(benchmark.OFFICIAL_CLONE).exists():
        pytest.skip(f"no clone of the official repository at {benchmark.OFFICIAL_CLONE} (set CORY_OFFICIAL_CLONE)")
    shape = ["batch_size=4", "algorithm.agent.mini_batch_size=2", "algorithm.agent.ppo_epochs=1"]
    shape += ["task.max_new_tokens=[3,3]", f"model.name_or_path={tiny_gpt2_dir}"]
    out = _run_benchmark(tmp_path, "--iterations", "1", "--against-official", "experiment=bench_gpt2_small", *shape)
    assert out["order"] == ["ppo:here", "ppo:official", "cory:here", "cory:official"]
    official_side = out["official"]
    assert official_side["commit"] == benchmark.OFFICIAL_COMMIT
    settings = official_side["settings"]
    assert (settings["batch_size"], settings["mini_batch_size"], settings["ppo_epochs"]) == (4, 2, 1)
    assert settings["max_new_tokens"] == [3, 3] and settings["model"] == str(tiny_gpt2_dir.resolve())
    assert official_side["stack"]["torch"] == torch.__version__  # both sides on the same torch
    for side in (out, official_side):
        for algorithm in ("ppo", "cory"):
            _check_algorithm(side[algorithm], repeats=1, iterations=1)
        assert side["cory"]["tokens_per_iter"] > 2 * side["ppo"]["tokens_per_iter"]
    for algorithm in ("ppo", "cory"):
        assert out["vs_official"][algorithm] == pytest.approx(
            out[algorithm]["s_per_iter"] / official_side[algorithm]["s_per_iter"]
        )


@pytest.mark.long  # a training run and two 512 MB GEMM-rate measurements: with the long end-to-end tests
def test_phases_accounts_for_the_iteration_and_prices_its_matrix_products(capsys):
    """`scripts/phases.py` on the smoke run: the phases add up to the iteration, the learner's FLOPs match its
    forwards (the padded count above the sequences' own), and every floor and ratio is a positive number."""
    phases = _load("phases")
    assert phases.main(["--threads", "1", "--iterations", "1", "--warmup", "1", "experiment=smoke"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{\n") :])
    assert report["iterations_timed"] == 1 and report["algorithm"] == "cory"
    parts = report["phases_s"]
    assert set(parts) == {"sample", "rollout_forward", "learner_forward", "learner_backward", "optimizer", "other"}
    assert all(v > 0 for k, v in parts.items() if k != "other")
    assert sum(parts.values()) == pytest.approx(report["s_per_iter"], rel=1e-3)  # `other` is the remainder
    assert 0 <= report["padding"] < 1
    assert 0 < report["learner_gflop"] < report["learner_padded_gflop"]  # the smoke batch has padding
    assert report["learner_floor_s"] > 0 and report["learner_vs_floor"] > 0 and report["sample_vs_floor"] > 0
    assert report["decode_steps_per_iter"] >= 2  # two agents, at least one token each
    # per decode step proper: the lean loop's prompt forwards timed apart, the rest of sampling over its forwards
    assert 0 < report["prefill_s"] < parts["sample"]
    assert 0 < report["decode_forwards_per_iter"] < report["decode_steps_per_iter"]  # n tokens: n - 1 forwards
    steps_s = report["decode_step_s"] * report["decode_forwards_per_iter"]
    assert steps_s + report["prefill_s"] == pytest.approx(parts["sample"], rel=1e-9)
    assert report["decode_step_vs_floor"] == pytest.approx(report["decode_step_s"] / report["decode_step_floor_s"])
    # under `generate` the prompt forward is not timed apart: no per-step figure rather than a wrong one
    argv = ["--threads", "1", "--iterations", "1", "--warmup", "0", "experiment=smoke", "rollout.decode=generate"]
    assert phases.main(argv) == 0
    out = capsys.readouterr().out
    reference = json.loads(out[out.index("{\n") :])
    assert reference["prefill_s"] is None and reference["decode_step_vs_floor"] is None
    assert reference["sample_vs_floor"] > 0
    # the tiny model's text config, as the script prices it: 2 layers of GPT-2's shape at width 32
    text = phases._text_config(build_tiny_gpt2()[0].config)
    assert text == {"d": 32, "layers": 2, "vocab": 257, "non_embedding": 2 * (4 * 32 * 32 + 2 * 32 * 128)}


@pytest.mark.long
def test_phases_prices_the_rectangles_of_length_groups(capsys):
    """Under `hardware.length_groups=4` the learner multiplies one rectangle per length group: the first iteration
    (the same sampled tokens either way: sampling does not go through the grouped forward) has the same floor and
    fewer padded FLOPs and positions than in one rectangle."""
    phases = _load("phases")
    reports = {}
    for groups in (1, 4):
        argv = ["--threads", "1", "--iterations", "1", "--warmup", "0", "experiment=smoke"]
        assert phases.main([*argv, f"hardware.length_groups={groups}"]) == 0
        out = capsys.readouterr().out
        reports[groups] = json.loads(out[out.index("{\n") :])
    one, grouped = reports[1], reports[4]
    assert grouped["learner_gflop"] == pytest.approx(one["learner_gflop"], rel=1e-12)
    assert grouped["learner_gflop"] <= grouped["learner_padded_gflop"] < one["learner_padded_gflop"]
    assert 0 <= grouped["padding"] < one["padding"]


def test_length_groups_times_each_setting_on_one_batch_and_counts_its_rectangles(capsys, tmp_path):
    """`scripts/length_groups.py` on the tiny model: every setting is timed `--repeat` times on the same batch, and
    its forwards, positions and padding are those of `cory.ppo.rollout.length_groups` on the batch's lengths (one
    rectangle: rows × (longest prompt + longest answer)); the JSON it prints is the one it writes."""
    script = _load("length_groups")
    out_file = tmp_path / "ab.json"
    argv = ["--repeat", "2", "--groups", "1,2,4", "--shape", "observer", "--out", str(out_file)]
    assert script.main([*argv, "experiment=smoke"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{\n") :])
    assert json.loads(out_file.read_text()) == report
    prompts, responses = script.lengths("observer", 16, 0)
    assert all(2 * 2 + 22 <= p <= 2 * 8 + 22 for p in prompts) and sorted(responses)[:3] == [5, 9, 16]
    assert report["tokens"] == sum(prompts) + sum(responses) and list(report["settings"]) == ["1", "2", "4"]
    one = report["settings"]["1"]
    assert one["forwards"] == 1 and one["positions"] == 16 * (max(prompts) + 16) and one["vs_first"] == 1.0
    for k in ("2", "4"):
        split = length_groups(prompts, responses, int(k))
        got = report["settings"][k]
        assert got["forwards"] == len(split) > 1
        assert got["positions"] == sum(
            len(s) * (max(prompts[i] for i in s) + max(responses[i] for i in s)) for s in split
        )
        assert got["positions"] < one["positions"] and got["padding"] < one["padding"]
    for got in report["settings"].values():
        assert len(got["seconds"]) == 2 and got["s_min"] <= got["s_median"] <= got["s_max"] and got["s_min"] > 0
        assert got["padding"] == pytest.approx(1 - report["tokens"] / got["positions"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["model=gpt2", "model.name_or_path=/nonexistent"], "error: Cannot load the model '/nonexistent'"),
        (["experiment=smok"], "error: experiment=smok: no such option; did you mean experiment=smoke?"),
        (
            ["--out", "/proc/none/ab.json", "experiment=smoke"],
            "error: cannot write /proc/none (No such file or directory); choose a writable --out",
        ),
        (
            ["--groups", "0", "--rows", "4", "experiment=smoke"],
            "error: --repeat, --rows and every --groups value must be >= 1",
        ),
    ],
)
def test_length_groups_refuses_what_it_cannot_run_in_one_line(args, says):
    """A missing model, a mistyped override, an unwritable output (checked before any timing) or a setting out of
    range: one line on stderr, exit code 2, no traceback."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "length_groups.py"), "--repeat", "1", *args],
        capture_output=True,
        text=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr[-2000:]
