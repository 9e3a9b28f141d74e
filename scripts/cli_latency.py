"""Seconds the command line takes to answer `--help` and a TAB (Hydra's shell completion), median of several runs.

    python scripts/cli_latency.py                 # 5 runs of each command
    python scripts/cli_latency.py --runs 10

Each command is a fresh process, as a shell starts it, through the console command next to this Python
(`cory-train`, when installed) and through `python -m cory.train`: `--help`, and `-sc query=bash` as bash's
completion asks it (installed for `cory-train` only), for a config group (`cory-train algorithm=<TAB>`) and for a
key (`cory-train algorithm.agent.le<TAB>`). Prints one JSON
object: per command the median and every run's wall seconds, and whether the process imported torch (read from
`python -X importtime`; the answer should need neither torch nor transformers). Speed is measured here, never in a
timed unit test; tests/test_console.py checks that help and completion import no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSOLE = Path(sys.executable).parent / "cory-train"


def commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    """name → (argv after the interpreter or console command, extra environment)."""

    def completion(line: str) -> dict[str, str]:
        return {"COMP_LINE": line, "COMP_POINT": str(len(line))}

    return {
        "help": (["--help"], {}),
        "complete_group": (["-sc", "query=bash"], completion("cory-train algorithm=")),
        "complete_key": (["-sc", "query=bash"], completion("cory-train algorithm.agent.le")),
    }


def run(argv: list[str], extra: dict[str, str]) -> float:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} | extra
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - t0
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"error: {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return seconds


def imports_torch(args: list[str], extra: dict[str, str]) -> bool:
    env = os.environ | {"HF_HUB_OFFLINE": "1"} | extra
    argv = [sys.executable, "-X", "importtime", "-m", "cory.train", *args]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # `import time: <self us> | <cumulative us> | <indent><module>`, one line per module imported
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return bool(imported & {"torch", "transformers"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"error: --runs={args.runs}: must be >= 1")
    starts = {"cory-train": [str(CONSOLE)]} if CONSOLE.is_file() else {}
    starts["python -m cory.train"] = [sys.executable, "-m", "cory.train"]
    report = {}
    for start, prefix in starts.items():
        for name, (argv, extra) in commands().items():
            times = [run(prefix + argv, extra) for _ in range(args.runs)]
            report[f"{start} {name}"] = {
                "median_s": round(statistics.median(times), 3),
                "runs_s": [round(t, 3) for t in times],
                "imports_torch": imports_torch(argv, extra),
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
