"""Time one PPO and one CORY iteration on the same config; the target is CORY ≤ 2.2× PPO.

    python scripts/benchmark.py                                   # experiment=smoke, 3 timed iterations
    python scripts/benchmark.py --iterations 3 model=smollm2_135m task=imdb experiment=quickstart

Each algorithm runs `cory.train.train` in its own subprocess (peak memory is per process: `ru_maxrss` on a
CPU never goes down, CUDA's peak is per process too) for `warmup + iterations` iterations with evaluation
and checkpoints kept to the minimum; the first `warmup` iterations are not timed. Prints one JSON object:
seconds per iteration with its generate/learn split, peak memory (MiB), and the CORY/PPO ratio, split into
the ratio of tokens processed (`train/<agent>/tokens`, summed over agents) and the ratio of cost per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")
TARGET_RATIO = 2.2
# benchmark-only settings: no intermediate evaluation or checkpoint, the smallest held-out set, no progress bar
BENCH_OVERRIDES = ["eval_every=0", "save_every=0", "num_eval=2", "progress=false"]


def compose(overrides: list[str], hydra_config: bool = False):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        return hydra_compose("train", overrides=overrides, return_hydra_config=hydra_config)


def child(algorithm: str, total: int, warmup: int, overrides: list[str], threads: int | None) -> dict:
    """Runs in the subprocess: train for `total` iterations, return the timed iterations' means."""
    import torch

    from cory.train import train

    if threads:
        torch.set_num_threads(threads)
    cfg = compose([*overrides, f"algorithm={algorithm}", f"iterations={total}"])
    with tempfile.TemporaryDirectory(prefix=f"cory-bench-{algorithm}-") as run_dir:
        train(cfg, Path(run_dir))
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/iteration_s" in r]
    timed = rows[warmup:] or rows[-1:]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in timed)

    # tokens every forward/backward of the iteration processes, summed over agents (`train/<agent>/tokens`)
    tokens = statistics.fmean(
        sum(v for k, v in r.items() if k.startswith("train/") and k.endswith("/tokens")) for r in timed
    )
    s_per_iter = mean("time/iteration_s")
    return {
        "s_per_iter": s_per_iter,
        "tokens_per_iter": tokens,
        "ms_per_token": 1000 * s_per_iter / tokens,
        "generate_s": mean("time/generate_s"),
        "learn_s": mean("time/learn_s"),
        "peak_mb": max(r["memory/peak_mb"] for r in rows),
        "timed_iterations": len(timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--iterations", type=int, default=None, help="timed iterations (default: an `iterations=N` override, else 3)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations before them (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--child", choices=["ppo", "cory"], help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default experiment=smoke)")
    args = parser.parse_args()

    overrides = [o for o in args.overrides if not o.startswith(("iterations=", "algorithm="))]
    given = [int(o.split("=", 1)[1]) for o in args.overrides if o.startswith("iterations=")]
    iterations = args.iterations or (given[-1] if given else 3)
    if not any(o.startswith("experiment=") for o in overrides):
        overrides.insert(0, "experiment=smoke")
    overrides = [*overrides[:1], *BENCH_OVERRIDES, *overrides[1:]]  # the user's overrides win
    total = args.warmup + iterations

    if args.child:  # the measured process
        print(json.dumps(child(args.child, total, args.warmup, overrides, args.threads)))
        return

    cfg = compose(overrides, hydra_config=True)
    result = {
        "model": cfg.hydra.runtime.choices.get("model"),
        "task": cfg.hydra.runtime.choices.get("task"),
        "device": cfg.hardware.device,
        "batch_size": cfg.batch_size,
        "iterations": iterations,
        "warmup": args.warmup,
    }
    for algorithm in ("ppo", "cory"):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            algorithm,
            "--warmup",
            str(args.warmup),
            "--iterations",
            str(iterations),
            *(["--threads", str(args.threads)] if args.threads else []),
            *overrides,
        ]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            sys.exit(f"benchmark: the {algorithm} run failed (exit {proc.returncode})")
        result[algorithm] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["ratio"] = result["cory"]["s_per_iter"] / result["ppo"]["s_per_iter"]
    # how much of the ratio is the method's extra tokens (the observer's longer prompt) and how much is cost per token
    result["token_ratio"] = result["cory"]["tokens_per_iter"] / result["ppo"]["tokens_per_iter"]
    result["cost_per_token_ratio"] = result["cory"]["ms_per_token"] / result["ppo"]["ms_per_token"]
    result["target_ratio"] = TARGET_RATIO
    result["meets_target"] = result["ratio"] <= TARGET_RATIO
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
