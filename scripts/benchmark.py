"""Seconds per iteration of PPO and CORY on the same config, each run in its own process, as one JSON object.

    python scripts/benchmark.py                                   # experiment=smoke, 3 timed iterations
    python scripts/benchmark.py --iterations 3 experiment=quickstart
    python scripts/benchmark.py --repeat 3 experiment=bench_gpt2_small \
        model.name_or_path=$(cory-gpt2-small)
    python scripts/benchmark.py --repeat 3 --compare-ref main ...          # this checkout against commit `main`
    python scripts/benchmark.py --repeat 3 --against-official experiment=bench_gpt2_small \
        model.name_or_path=$(cory-gpt2-small)                              # ... against the official code

Each run is `cory.train.train` for `warmup + iterations` iterations in a fresh subprocess (peak memory is per
process: `ru_maxrss` never goes down on a CPU, CUDA's peak is per process too), in a temporary run folder that
is deleted afterwards, with no intermediate evaluation, a 2-prompt held-out set and `save_every=0` (no
checkpoint). The first `warmup` iterations of each run are not timed. `--repeat N` runs PPO, CORY, PPO, CORY, …
so that a slow spell of a shared machine hits both; `--compare-ref GITREF` also runs the code of that commit
(exported with `git archive` to a temporary folder, same interpreter, same overrides) right after each run of
this checkout: PPO here, PPO at GITREF, CORY here, CORY at GITREF, … That is how before/after numbers are
measured in one session. `--against-official` also runs the official CORY code (`imdb_train/ppo.py`,
`imdb_train/cory.py`) at the pinned commit `OFFICIAL_COMMIT`, exported from a clone of its repository
(`--official-clone CLONE`, default the local mirror) into a temporary folder, in `.venv-official`
(scripts/official/setup.sh) through scripts/official/bench_official.py (what that harness changes at run time is
in its docstring), at the same shape (model folder, batch, minibatch, PPO epochs, response length, TF-IDF reward,
threads), right after each run of this checkout: PPO here, PPO official, CORY here, CORY official, …

Output, per algorithm (`ppo`, `cory`; under `ref` for GITREF's runs): `s_per_iter` is the **median** over all
timed iterations of all repeats, with `s_per_iter_mean`, `s_per_iter_min`, `s_per_iter_max`,
`s_per_iter_per_repeat` (each repeat's median) and the raw `iteration_s` (one list per repeat);
`generate_s`/`learn_s` split the median iteration(s); `tokens_per_iter` (prompt + response tokens of every
forward, summed over agents: `train/<agent>/tokens`) and `ms_per_token`; `peak_mb` (largest over repeats);
`checkpoint_mb` (what the run wrote under `checkpoints/`). At the top: `ratio` = CORY/PPO median s/iter, split
into `token_ratio × cost_per_token_ratio`; with `--compare-ref`, `vs_ref` = this checkout's s/iter ÷ GITREF's;
with `--against-official`, the official runs' statistics under `official` and `vs_official` = this checkout's
s/iter ÷ the official code's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.2  # an earlier CORY/PPO cost target (on the tiny model), kept as information
ALGORITHMS = ("ppo", "cory")
# benchmark-only settings: no intermediate evaluation or checkpoint, the smallest held-out set, no progress bar
BENCH_OVERRIDES = ["eval_every=0", "save_every=0", "num_eval=2", "progress=false"]
# the official CORY code (github.com/Harry67Hu/CORY) at the commit timed; a clone of it, or the local mirror
OFFICIAL_COMMIT = "710219fc83bf0fc5c618c5bffc5aa00a6250bfc6"
OFFICIAL_CLONE = os.environ.get("CORY_OFFICIAL_CLONE", "/work/.mirror/Harry67Hu+CORY/repo")
OFFICIAL_PYTHON = ROOT / ".venv-official" / "bin" / "python"
OFFICIAL_HARNESS = ROOT / "scripts" / "official" / "bench_official.py"


def compose(conf_dir: Path, overrides: list[str], hydra_config: bool = False):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir)):
        return hydra_compose("train", overrides=overrides, return_hydra_config=hydra_config)


# ---------------------------------------------------------------------------------------------------------------------
# the measured process
# ---------------------------------------------------------------------------------------------------------------------
def child(root: Path, algorithm: str, total: int, warmup: int, overrides: list[str], threads: int | None) -> dict:
    """Train `total` iterations with the code and configs under `root`; the timed iterations' raw numbers."""
    sys.path.insert(0, str(root))
    import torch

    import cory
    from cory.train import train

    if Path(cory.__file__).resolve().parents[1] != root.resolve():
        raise RuntimeError(f"imported cory from {cory.__file__}, expected {root}")
    if threads:
        torch.set_num_threads(threads)
    cfg = compose(root / "cory" / "conf", [*overrides, f"algorithm={algorithm}", f"iterations={total}"])
    with tempfile.TemporaryDirectory(prefix=f"cory-bench-{algorithm}-") as run_dir:
        train(cfg, Path(run_dir))
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        written = sum(f.stat().st_size for f in (Path(run_dir) / "checkpoints").rglob("*") if f.is_file())
    rows = [r for r in rows if "time/iteration_s" in r]
    timed = rows[warmup:] or rows[-1:]
    return {
        "iteration_s": [r["time/iteration_s"] for r in timed],
        "generate_s": [r["time/generate_s"] for r in timed],
        "learn_s": [r["time/learn_s"] for r in timed],
        # tokens every forward/backward of the iteration processes, summed over agents
        "tokens": [sum(v for k, v in r.items() if k.startswith("train/") and k.endswith("/tokens")) for r in timed],
        "peak_mb": max(r["memory/peak_mb"] for r in rows),
        "checkpoint_mb": written / 2**20,
    }


# ---------------------------------------------------------------------------------------------------------------------
# pure helpers: run order and statistics
# ---------------------------------------------------------------------------------------------------------------------
def schedule(repeat: int, sides: list[str]) -> list[tuple[str, str]]:
    """Run order as (side, algorithm): each repeat runs PPO then CORY, every side right after the other."""
    return [(side, algorithm) for _ in range(repeat) for algorithm in ALGORITHMS for side in sides]


def summarise(runs: list[dict]) -> dict:
    """Statistics of one algorithm over its repeats (`runs`: one `child` result per repeat)."""
    times = [t for run in runs for t in run["iteration_s"]]
    generate = [g for run in runs for g in run["generate_s"]]
    learn = [x for run in runs for x in run["learn_s"]]
    tokens = [n for run in runs for n in run["tokens"]]
    # the generate/learn split of the median iteration (the mean of the two middle ones for an even count),
    # so that generate_s + learn_s <= s_per_iter holds as it does for every single iteration
    order = sorted(range(len(times)), key=times.__getitem__)
    middle = order[(len(order) - 1) // 2 : len(order) // 2 + 1]
    s_per_iter = statistics.median(times)
    tokens_per_iter = statistics.fmean(tokens)
    return {
        "s_per_iter": s_per_iter,
        "s_per_iter_mean": statistics.fmean(times),
        "s_per_iter_min": min(times),
        "s_per_iter_max": max(times),
        "s_per_iter_per_repeat": [statistics.median(run["iteration_s"]) for run in runs],
        "iteration_s": [run["iteration_s"] for run in runs],
        "tokens_per_iter": tokens_per_iter,
        "ms_per_token": 1000 * s_per_iter / tokens_per_iter,
        "generate_s": statistics.fmean(generate[i] for i in middle),
        "learn_s": statistics.fmean(learn[i] for i in middle),
        "peak_mb": max(run["peak_mb"] for run in runs),
        "peak_mb_per_repeat": [run["peak_mb"] for run in runs],
        "checkpoint_mb": max(run["checkpoint_mb"] for run in runs),
        "timed_iterations": len(times),
    }


def compare(ppo: dict, cory: dict) -> dict:
    """CORY against PPO: the time ratio and its split into tokens processed × cost per token."""
    ratio = cory["s_per_iter"] / ppo["s_per_iter"]
    return {
        "ratio": ratio,
        "token_ratio": cory["tokens_per_iter"] / ppo["tokens_per_iter"],
        "cost_per_token_ratio": cory["ms_per_token"] / ppo["ms_per_token"],
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
    }


# ---------------------------------------------------------------------------------------------------------------------
# the parent: run the children in order, print one JSON object
# ---------------------------------------------------------------------------------------------------------------------
def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def export(repo: Path | str, rev: str, dest: Path, refused: str) -> str:
    """Write the tree of commit `rev` of the git repository at `repo` to `dest` (`git archive`: no worktree, nothing
    changes in that repository) and return the commit's full hash; `refused` is the one-line error when there is no
    such commit."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        fail(refused)
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def export_ref(gitref: str, dest: Path) -> str:
    """This checkout's tree at `gitref`, for `--compare-ref`."""
    return export(ROOT, gitref, dest, f"--compare-ref {gitref}: not a commit of the git checkout at {ROOT}")


def export_official(clone: str, commit: str, dest: Path) -> str:
    """The official repository's tree at `commit`, from the clone (or bare mirror) at `clone`."""
    refused = f"--official-clone {clone}: no git clone there with commit {commit} (clone the official repository)"
    return export(clone, commit, dest, refused)


def official_settings(overrides: list[str], algorithm: str) -> dict:
    """The benchmark shape of our config, as the official harness's arguments (it supports what it can time)."""
    from hydra.utils import instantiate

    from cory.assets import packaged_imdb_csv
    from cory.tasks.rewards import _TFIDF, TfidfSentimentReward

    cfg = compose(ROOT / "cory" / "conf", [*overrides, f"algorithm={algorithm}"])
    model = Path(str(cfg.model.name_or_path)).expanduser()
    if cfg.task.name != "imdb" or not (model / "tokenizer.json").is_file():
        fail("--against-official times the IMDB task on a local model folder (model.name_or_path=$(cory-gpt2-small))")
    if not str(cfg.task.reward._target_).endswith("TfidfSentimentReward") or cfg.task.reward.bound != "none":
        fail("--against-official scores with the TF-IDF reward, unbounded (task/reward=tfidf, bound=none)")
    reward = instantiate(cfg.task.reward)  # trains and caches it on first use
    assert isinstance(reward, TfidfSentimentReward)
    return {
        "model": str(model.resolve()),
        "reward_dir": str(reward.path),
        "reward_ngram": list(_TFIDF["ngram_range"]),
        "prompts": str(cfg.task.data_files or packaged_imdb_csv()),
        "batch_size": int(cfg.batch_size),
        "mini_batch_size": int(cfg.algorithm.agent.mini_batch_size),
        "ppo_epochs": int(cfg.algorithm.agent.ppo_epochs),
        "max_new_tokens": [int(n) for n in cfg.task.max_new_tokens],
        "seed": int(cfg.seed),
    }


def run_official(tree: Path, algorithm: str, args: argparse.Namespace, settings: dict) -> dict:
    cmd = [str(OFFICIAL_PYTHON), str(OFFICIAL_HARNESS), "--official", str(tree), "--algorithm", algorithm]
    cmd += ["--warmup", str(args.warmup), "--iterations", str(args.iterations)]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    for key, value in settings.items():
        cmd += [f"--{key.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env | {"WANDB_MODE": "disabled"})
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"the official {algorithm} run under {tree} failed (exit {proc.returncode}); its output is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(root: Path, algorithm: str, args: argparse.Namespace, overrides: list[str]) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        algorithm,
        "--root",
        str(root),
        "--warmup",
        str(args.warmup),
        "--iterations",
        str(args.iterations),
        *(["--threads", str(args.threads)] if args.threads else []),
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)  # the caller's folder: relative paths keep meaning
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"the {algorithm} run under {root} failed (exit {proc.returncode}); its output is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="timed iterations per run (default: an `iterations=N` override, else 3)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations before them (default 1)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per algorithm, interleaved PPO, CORY, … (default 1)"
    )
    parser.add_argument("--compare-ref", metavar="GITREF", help="also run the code of this commit, interleaved")
    parser.add_argument(
        "--against-official",
        action="store_true",
        help=f"also run the official code at {OFFICIAL_COMMIT[:7]}, interleaved (needs .venv-official: "
        "scripts/official/setup.sh)",
    )
    parser.add_argument(
        "--official-clone",
        metavar="CLONE",
        default=OFFICIAL_CLONE,
        help=f"a git clone of the official repository (default: $CORY_OFFICIAL_CLONE, else {OFFICIAL_CLONE})",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--child", choices=ALGORITHMS, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=smoke)")
    args = parser.parse_args(argv)
    given = [int(o.split("=", 1)[1]) for o in args.overrides if o.startswith("iterations=")]
    args.iterations = args.iterations or (given[-1] if given else 3)
    if args.repeat < 1 or args.iterations < 1 or args.warmup < 0:
        parser.error("--repeat and --iterations must be >= 1, --warmup >= 0")
    overrides = [o for o in args.overrides if not o.startswith(("iterations=", "algorithm="))]
    if not any(o.startswith("experiment=") for o in overrides):
        overrides.insert(0, "experiment=smoke")
    args.overrides = [*overrides[:1], *BENCH_OVERRIDES, *overrides[1:]]  # the user's overrides win
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:  # the measured process
        total = args.warmup + args.iterations
        print(json.dumps(child(args.root, args.child, total, args.warmup, args.overrides, args.threads)))
        return

    from cory.cli import check_composes
    from cory.errors import ConfigError

    try:
        check_composes(args.overrides)  # a mistyped override: one line, as cory.train says it
    except ConfigError as err:
        fail(str(err))
    cfg = compose(ROOT / "cory" / "conf", args.overrides, hydra_config=True)
    result: dict = {
        "model": cfg.hydra.runtime.choices.get("model"),
        "task": cfg.hydra.runtime.choices.get("task"),
        "device": cfg.hardware.device,
        "batch_size": cfg.batch_size,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "threads": args.threads,
        "overrides": args.overrides,
        "commit": _describe_checkout(),
    }
    ref_dir = Path(tempfile.mkdtemp(prefix="cory-bench-ref-")) if args.compare_ref else None
    official_dir = Path(tempfile.mkdtemp(prefix="cory-bench-official-")) if args.against_official else None
    try:
        roots = {"here": ROOT}
        if ref_dir is not None:
            ref = {"gitref": args.compare_ref, "commit": export_ref(args.compare_ref, ref_dir)}
            roots["ref"] = ref_dir
        if official_dir is not None:
            if not OFFICIAL_PYTHON.is_file():
                fail(f"--against-official: {OFFICIAL_PYTHON} is missing; run scripts/official/setup.sh first")
            commit = export_official(args.official_clone, OFFICIAL_COMMIT, official_dir)
            settings = {a: official_settings(args.overrides, a) for a in ALGORITHMS}
            official = {"clone": args.official_clone, "commit": commit, "settings": settings["ppo"]}
            roots["official"] = official_dir
        order = schedule(args.repeat, list(roots))
        result["order"] = [f"{algorithm}:{side}" for side, algorithm in order]
        runs: dict[tuple[str, str], list[dict]] = {(s, a): [] for s in roots for a in ALGORITHMS}
        for n, (side, algorithm) in enumerate(order, start=1):
            if side == "official":
                run = run_official(roots[side], algorithm, args, settings[algorithm])
            else:
                run = run_child(roots[side], algorithm, args, args.overrides)
            runs[side, algorithm].append(run)
            median = statistics.median(run["iteration_s"])
            print(f"[benchmark] {n}/{len(order)} {algorithm} ({side}): {median:.3f} s/iter", file=sys.stderr)
    finally:
        for folder in (ref_dir, official_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    for side in roots:
        stats = {a: summarise(runs[side, a]) for a in ALGORITHMS}
        stats |= compare(stats["ppo"], stats["cory"])
        if side == "here":
            result |= stats
        elif side == "ref":
            result["ref"] = ref | stats
            result["vs_ref"] = {a: result[a]["s_per_iter"] / stats[a]["s_per_iter"] for a in ALGORITHMS}
        else:
            first = runs["official", "ppo"][0]  # the official stack, as its harness reports it
            stack = {k: first[k] for k in ("torch", "transformers", "stubbed") if k in first}
            result["official"] = official | {"stack": stack} | stats
            result["vs_official"] = {a: result[a]["s_per_iter"] / stats[a]["s_per_iter"] for a in ALGORITHMS}
    print(json.dumps(result, indent=2))


def _describe_checkout() -> str | None:
    """HEAD's commit, with `+dirty` when tracked files differ from it (the benchmark times the working tree)."""
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
