"""Seconds per iteration of the official CORY code (its `imdb_train/ppo.py` or `imdb_train/cory.py`), as one JSON line.

Runs inside `.venv-official` (scripts/official/setup.sh), on a tree of the official repository exported at a pinned
commit (`--official DIR`); `scripts/benchmark.py --against-official` calls it once per run, interleaved with ours:

    .venv-official/bin/python scripts/official/bench_official.py --official .official --algorithm ppo \\
        --model $(cory-gpt2-small) --reward-dir ~/.cache/cory/tfidf-sentiment-<digest> \\
        --prompts <the packaged IMDB CSV> --warmup 1 --iterations 3 --threads 1

Nothing of the official code is copied here: its script runs unmodified (`runpy`), with these substitutions made
at run time, before it starts, so that it runs offline on a CPU at the benchmark's shape:

- model: the offline GPT-2-small-shaped folder, its tokenizer rewritten as GPT-2's `vocab.json` + `merges.txt`
  (the same vocabulary and merges; the tokenizers release the official stack pins cannot read the newer
  `tokenizer.json` layout) in a scratch folder, the weights linked, not copied;
- prompts: `datasets.load_dataset` returns exactly (warmup + iterations) x batch IMDB reviews of more than 200
  characters from our packaged CSV (the script's own filter and 2..8-token truncation then apply), so its data
  loader (drop_last) yields exactly warmup + iterations batches and its loop ends there;
- reward: `transformers.pipeline` returns a stand-in sentiment pipeline whose POSITIVE score is our TF-IDF reward's
  logit (the same arrays, the same formula as `cory.tasks.rewards.TfidfSentimentReward`), at about zero cost;
- response length: the script's `LengthSampler(4, 16)` (max_new_tokens ~ U{4..15} per iteration) draws from
  `--max-new-tokens LO HI` instead (16 16 at the benchmark shape); `min_length` stays the script's -1 (EOS may end
  a response early, as on our side);
- `PPOTrainer.generate` is called with `batch_size=--gen-batch-size` (the batch, 16, by default; the library
  default the script leaves is 4, i.e. four generate calls per batch) and, unless `--ref-response generate`, the
  reference model's responses, which the script only logs, are not generated (the policy's are returned in their
  place): one batched call, as ours, and less work for the official side;
- configuration: `--ppo_config.*` arguments for batch size, minibatch size, PPO epochs, seed and model folder,
  `log_with=None` (no wandb); `wandb`, `openai`, `rouge_score` and `matplotlib` are stub modules when absent (imported
  at the top of the scripts, unused by the training loop); cory.py's `nvidia-smi` probe answers "0", and the
  folders it creates under /home/trl/... are redirected into the scratch folder;
- timing: `tqdm.tqdm`, which wraps the script's training loop, is replaced by a timer (one row per iteration, from
  fetching its batch to fetching the next), and `PPOTrainer.generate` / `PPOTrainer.step` are timed (generate_s /
  learn_s) and `step` counts prompt + response tokens (tokens, summed over agents as our `train/<agent>/tokens`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

SCRIPTS = {"ppo": "imdb_train/ppo.py", "cory": "imdb_train/cory.py"}
STUBS = ("wandb", "openai", "rouge_score", "matplotlib", "matplotlib.pyplot")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, required=True, help="the official repository's exported tree")
    parser.add_argument("--algorithm", choices=sorted(SCRIPTS), required=True)
    parser.add_argument("--model", type=Path, required=True, help="model folder (cory-gpt2-small's)")
    parser.add_argument("--reward-dir", type=Path, required=True, help="our TF-IDF reward's cache folder")
    parser.add_argument("--reward-ngram", type=int, nargs=2, default=(1, 2), metavar=("LO", "HI"))
    parser.add_argument("--prompts", type=Path, required=True, help="CSV with columns text[,label,source]")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--mini-batch-size", type=int, default=16)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, nargs=2, default=(16, 16), metavar=("LO", "HI"))
    parser.add_argument("--gen-batch-size", type=int, default=None, help="generate batch (default: --batch-size)")
    parser.add_argument("--ref-response", choices=("skip", "generate"), default="skip")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be >= 1, --warmup >= 0")
    args.gen_batch_size = args.gen_batch_size or args.batch_size
    return args


# ---------------------------------------------------------------------------------------------------------------------
# inputs the official scripts expect from the Hub, made from local files
# ---------------------------------------------------------------------------------------------------------------------
def legacy_tokenizer_folder(model: Path, dest: Path) -> Path:
    """`model` with its tokenizer as GPT-2's vocab.json + merges.txt (same vocabulary, same merges, in order)."""
    dest.mkdir(parents=True)
    tok = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["merges"]]
    (dest / "vocab.json").write_text(json.dumps(tok["vocab"], ensure_ascii=False), encoding="utf-8")
    (dest / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    special = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": special, "eos_token": special, "unk_token": special}
    (dest / "tokenizer_config.json").write_text(json.dumps(config | {"model_max_length": 1024}), encoding="utf-8")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (model / name).exists():
            (dest / name).symlink_to((model / name).resolve())
    return dest


def prompt_rows(csv: Path, count: int) -> list[str]:
    """The first `count` IMDB reviews of more than 200 characters (the official scripts filter > 200 / > 100)."""
    import pandas as pd

    frame = pd.read_csv(csv)
    if "source" in frame.columns:
        frame = frame[frame["source"] == "imdb"]
    texts = [t for t in frame["text"].astype(str) if len(t) > 200][:count]
    if len(texts) < count:
        raise SystemExit(f"error: {csv} has {len(texts)} reviews over 200 characters, {count} needed")
    return texts


class TfidfLogit:
    """Our TF-IDF sentiment reward's logit from its cache folder (vocabulary.json + arrays.safetensors)."""

    def __init__(self, folder: Path, ngram_range: tuple[int, int]) -> None:
        import numpy as np
        from safetensors.numpy import load_file
        from scipy import sparse
        from sklearn.feature_extraction.text import CountVectorizer

        vocabulary = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
        arrays = load_file(str(folder / "arrays.safetensors"))
        self.counter = CountVectorizer(vocabulary=vocabulary, ngram_range=tuple(ngram_range), dtype=np.float64)
        self.idf = sparse.diags(arrays["idf"])
        self.coef, self.intercept = arrays["coef"], float(arrays["intercept"][0])

    def __call__(self, texts: list[str]) -> list[float]:
        import numpy as np
        from sklearn.preprocessing import normalize

        counts = self.counter.transform(texts)
        counts.data = np.log(counts.data) + 1.0  # sublinear tf
        features = normalize(counts @ self.idf, norm="l2")
        return np.asarray(features @ self.coef + self.intercept, dtype=np.float64).tolist()


class SentimentPipe:
    """What the scripts read of a `sentiment-analysis` pipeline: per text [NEGATIVE, POSITIVE] scores (logits)."""

    def __init__(self, score, pad_token_id: int) -> None:
        self.score = score
        self.tokenizer = types.SimpleNamespace(pad_token_id=pad_token_id)
        self.model = types.SimpleNamespace(config=types.SimpleNamespace(pad_token_id=pad_token_id))

    def __call__(self, texts, **_kwargs):
        return [[{"label": "NEGATIVE", "score": -s}, {"label": "POSITIVE", "score": s}] for s in self.score(texts)]


# ---------------------------------------------------------------------------------------------------------------------
# the timer
# ---------------------------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.reset()

    def reset(self) -> None:
        self.generate = self.learn = 0.0
        self.tokens = 0

    def loop(self, iterable, *_args, **_kwargs):
        """Stands in for `tqdm(iterable)`: one row per iteration, from fetching its batch to fetching the next."""
        start = time.perf_counter()
        self.reset()
        for item in iterable:
            yield item
            now = time.perf_counter()
            row = {"iteration_s": now - start, "generate_s": self.generate, "learn_s": self.learn}
            self.rows.append(row | {"tokens": self.tokens})
            start = now
            self.reset()


def install_stubs() -> list[str]:
    """Empty modules for imports the scripts make but the training loop never uses, where they are not installed."""
    import importlib.machinery
    import importlib.util

    class Nothing:
        """Accepts any call and any attribute, and does nothing (`wandb.Artifact(...).add_file(...)`)."""

        def __call__(self, *args, **kwargs):
            return self

        def __getattr__(self, name):
            return self

    class Anything(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Nothing()

    stubbed = []
    for name in STUBS:
        if name in sys.modules or (("." not in name) and importlib.util.find_spec(name) is not None):
            continue
        module = Anything(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
        stubbed.append(name)
    if "matplotlib" in stubbed:
        sys.modules["matplotlib"].pyplot = sys.modules["matplotlib.pyplot"]
    return stubbed


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_MODE", "disabled")
    official = args.official.resolve()
    script = official / SCRIPTS[args.algorithm]
    if not script.is_file():
        raise SystemExit(f"error: {script} is missing (export the official tree: scripts/official/setup.sh)")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix=f"cory-official-{args.algorithm}-"))
    try:
        result = run(args, official, script, scratch)
        written = sum(f.stat().st_size for f in scratch.rglob("*") if f.is_file() and not f.is_symlink())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["checkpoint_mb"] = max(0.0, written - result.pop("setup_bytes")) / 2**20
    print(json.dumps(result))


def run(args: argparse.Namespace, official: Path, script: Path, scratch: Path) -> dict:
    model = legacy_tokenizer_folder(args.model, scratch / "model")
    setup_bytes = sum(f.stat().st_size for f in scratch.rglob("*") if f.is_file() and not f.is_symlink())
    stubbed = install_stubs()
    sys.path.insert(0, str(official))  # `trl` and `utils` are the official tree's

    # everything that imports tqdm is imported before tqdm.tqdm is replaced (only the scripts' loop is timed)
    import datasets
    import peft  # noqa: F401
    import torch
    import tqdm
    import transformers
    import trl
    import trl.core
    import tyro  # noqa: F401
    from trl import PPOTrainer

    if Path(trl.__file__).resolve().parents[1] != official:
        raise SystemExit(f"error: imported trl from {trl.__file__}, expected the one under {official}")

    total = args.warmup + args.iterations
    reviews = prompt_rows(args.prompts, total * args.batch_size)
    rows = {"text": reviews, "label": [1] * len(reviews)}
    datasets.load_dataset = lambda *_a, **_k: datasets.Dataset.from_dict(rows)
    score = TfidfLogit(args.reward_dir, args.reward_ngram)
    transformers.pipeline = lambda *_a, **_k: SentimentPipe(score, pad_token_id=50256)

    lo, hi = args.max_new_tokens
    real_sampler = trl.core.LengthSampler

    class ResponseLength(real_sampler):
        """The scripts' response-length sampler, LengthSampler(4, 16), draws from [lo, hi] instead."""

        def __init__(self, low, high):
            super().__init__(low, high)
            self.response = (low, high) == (4, 16)

        def __call__(self):
            return random.randint(lo, hi) if self.response else super().__call__()

    trl.core.LengthSampler = ResponseLength

    clock = Clock()
    real_generate, real_step = PPOTrainer.generate, PPOTrainer.step

    def generate(self, query_tensor, *rest, generate_ref_response=False, batch_size=4, **kwargs):
        start = time.perf_counter()
        kwargs["batch_size"] = args.gen_batch_size
        if generate_ref_response and args.ref_response == "skip":
            response = real_generate(self, query_tensor, *rest, **kwargs)
            out = (response, response)
        else:
            out = real_generate(self, query_tensor, *rest, generate_ref_response=generate_ref_response, **kwargs)
        clock.generate += time.perf_counter() - start
        return out

    def step(self, queries, responses, scores, *rest, **kwargs):
        start = time.perf_counter()
        out = real_step(self, queries, responses, scores, *rest, **kwargs)
        clock.learn += time.perf_counter() - start
        clock.tokens += sum(len(q) + len(r) for q, r in zip(queries, responses))
        return out

    PPOTrainer.generate, PPOTrainer.step = generate, step
    tqdm.tqdm = clock.loop
    clock.loop.__func__.pandas = lambda *a, **k: None  # the scripts call tqdm.pandas()

    # cory.py: its GPU probe, and its role-swap folders under /home/trl
    real_check_output, real_makedirs = subprocess.check_output, os.makedirs
    subprocess.check_output = lambda cmd, *a, **k: (
        b"0\n" if cmd and cmd[0] == "nvidia-smi" else real_check_output(cmd, *a, **k)
    )
    os.makedirs = lambda name, *a, **k: real_makedirs(
        str(scratch / str(name).lstrip("/")) if str(name).startswith("/home/trl/") else name, *a, **k
    )

    argv = [
        f"--ppo_config.model_name={model}",
        f"--ppo_config.batch_size={args.batch_size}",
        f"--ppo_config.mini_batch_size={args.mini_batch_size}",
        f"--ppo_config.ppo_epochs={args.ppo_epochs}",
        f"--ppo_config.seed={args.seed}",
        "--ppo_config.log_with=None",
        "--ppo_config.query_dataset=imdb",
        "--ppo_config.reward_model=sentiment-analysis:tfidf",
    ]
    if args.algorithm == "cory":
        argv += [f"--model_name={model}", f"--temp_model_name_1={scratch / 'swap-1'}"]
        argv += [f"--temp_model_name_2={scratch / 'swap-2'}"]
    sys.argv = [str(script), *argv]
    cwd = os.getcwd()
    os.chdir(official)  # cory.py imports `utils` relative to the tree
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        os.chdir(cwd)
        subprocess.check_output, os.makedirs = real_check_output, real_makedirs

    if len(clock.rows) != total:
        raise SystemExit(f"error: the official loop ran {len(clock.rows)} iterations, {total} expected")
    timed = clock.rows[args.warmup :]
    return {
        "iteration_s": [r["iteration_s"] for r in timed],
        "generate_s": [r["generate_s"] for r in timed],
        "learn_s": [r["learn_s"] for r in timed],
        "tokens": [r["tokens"] for r in timed],
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "setup_bytes": setup_bytes,
        "stubbed": stubbed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    main()
