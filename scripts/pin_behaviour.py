"""Pin what every algorithm does: fixed-seed smoke runs of each algorithm config, their logged rows and samples.

A refactoring must not change a number. `record` runs each case (an `experiment=smoke` run, or `maft_smoke`, with
the case's overrides) in this process, one torch thread, and writes every row of `metrics.jsonl` and
`samples.jsonl` except wall times and memory; `compare` runs them again and reports every key that moved.

    python scripts/pin_behaviour.py record --out /tmp/before.json             # on the commit before a change
    python scripts/pin_behaviour.py compare /tmp/before.json                   # after it: exit 1 on any difference
    python scripts/pin_behaviour.py compare /tmp/before.json --rtol 1e-6       # where float rounding may move
    python scripts/pin_behaviour.py compare /tmp/before.json --allow-new-keys  # added metrics listed, not failed

The same machine and thread count on both sides: floats are compared exactly unless `--rtol` says otherwise. Another
CPU's matrix kernels round differently (on a Xeon with AMX, 22 of the 23 cases moved by about 1e-7 relative at the
very commit that recorded them elsewhere), so `record` writes the machine it ran on (`_machine`: the CPU model, its
vector and matrix extensions, torch's version) and `compare` says in one line when it runs on another.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

for _k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("WANDB_MODE", "disabled")

# name → overrides after `experiment=smoke` (a leading `experiment=` replaces it). A case's name is stable; its
# overrides follow the config syntax of the code that runs it (a recorded file compares by name).
CASES: dict[str, list[str]] = {
    "ppo": ["algorithm=ppo"],
    "ppo_lora": ["algorithm=ppo", "model.lora.enabled=true"],
    "ppo_sampled_kl_fixed_beta": [
        "algorithm=ppo",
        "algorithm.agent.kl_penalty=kl",
        "algorithm.agent.adaptive_kl=false",
    ],
    "ppo_score_scaling": [
        "algorithm=ppo",
        "algorithm.agent.use_score_scaling=true",
        "algorithm.agent.use_score_norm=true",
    ],
    "grpo": ["algorithm=grpo"],
    "rloo": ["algorithm=rloo"],
    "cory": ["algorithm=cory"],
    "cory_lora": ["algorithm=cory", "model.lora.enabled=true"],
    "cory_wo_kt": ["algorithm=cory", "algorithm.episode.knowledge_transfer=false"],
    "cory_wo_rex": ["algorithm=cory", "algorithm/schedule=simultaneous"],
    "cory_competitive": ["algorithm=cory", "algorithm.credit.w_other=-1.0"],
    "cory_official_swap": [
        "algorithm=cory",
        "algorithm.schedule.period=1",
        "algorithm.schedule.faithful_official_swap=true",
        "algorithm.agent.use_score_scaling=true",
        "algorithm.agent.use_score_norm=true",
    ],
    "cory_grpo": ["algorithm=cory_grpo"],
    "cory_rloo": ["algorithm=cory_rloo"],
    "cory_cc": ["algorithm=cory_cc"],
    "cory_cc_lora": ["algorithm=cory_cc", "model.lora.enabled=true"],
    "cory_interleaved": ["algorithm=cory_interleaved", "algorithm.schedule.period=1"],
    "cory_interleaved_cc": [
        "algorithm=cory_interleaved",
        "algorithm.schedule.period=1",
        "algorithm/critic=centralized",
    ],
    "cory_simultaneous": ["algorithm=cory_interleaved", "algorithm/schedule=simultaneous"],
    "cory_shared": ["algorithm=cory_shared"],
    "cory_lora_roles": ["algorithm=cory_lora_roles", "model.lora.enabled=true"],
    "cory_lora_roles_interleaved": [
        "algorithm=cory_lora_roles",
        "model.lora.enabled=true",
        "algorithm/schedule=interleaved",
        "algorithm.schedule.period=1",
    ],
    "maft": ["experiment=maft_smoke"],
}

UNPINNED = ("time/", "memory/")  # machine-dependent keys


def run_case(overrides: list[str], folder: Path) -> dict[str, list[dict]]:
    """One case in this process: its metrics rows and sample rows without machine-dependent keys."""
    import torch

    import cory.train
    from cory.cli import compose

    torch.set_num_threads(1)
    experiment = [] if any(o.startswith("experiment=") for o in overrides) else ["experiment=smoke"]
    args = [*experiment, "progress=false", f"cache_dir={folder / 'cache'}", *overrides]
    run_dir = folder / "run"
    cory.train.train(compose(args), run_dir, args)

    def rows(name: str) -> list[dict]:
        path = run_dir / name
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.append({k: v for k, v in row.items() if not k.startswith(UNPINNED)})
        return out

    return {"metrics": rows("metrics.jsonl"), "samples": rows("samples.jsonl")}


# the CPU extensions that choose the matrix kernels (and so their rounding)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def machine() -> dict:
    """What decides the floats besides the code: the CPU model and kernel-choosing extensions, torch's version."""
    import torch

    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:  # not Linux: the model name platform gives
        pass
    return {"cpu": model, "extensions": [f for f in KERNEL_FLAGS if f in flags], "torch": torch.__version__}


def record(names: list[str]) -> dict:
    out = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"[pin] {name}", file=sys.stderr, flush=True)
            out[name] = run_case(CASES[name], Path(tmp))
    return out


def differences(want, got, rtol: float, where: str = "") -> list[str]:
    """Every place where `got` differs from `want` (floats within `rtol`, everything else exactly)."""
    if isinstance(want, float) and isinstance(got, float):
        same = (math.isnan(want) and math.isnan(got)) or math.isclose(want, got, rel_tol=rtol, abs_tol=rtol)
        return [] if same else [f"{where}: {want!r} → {got!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: new" for k in got if k not in want]
        for k in want:
            if k in got:
                out += differences(want[k], got[k], rtol, f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(want)} rows → {len(got)}"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in differences(w, g, rtol, f"{where}[{i}]")]
    return [] if want == got else [f"{where}: {want!r} → {got!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the cases and write their rows")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (default: all)")
    cmp_ = sub.add_parser("compare", help="run the cases of a recorded file again and compare")
    cmp_.add_argument("recorded", type=Path)
    cmp_.add_argument("--case", action="append", help="only these cases (default: all in the file)")
    cmp_.add_argument("--rtol", type=float, default=0.0, help="relative (and absolute) tolerance for floats")
    cmp_.add_argument(
        "--allow-new-keys", action="store_true", help="keys the recorded rows lack are listed, not counted as changes"
    )
    args = parser.parse_args(argv)
    if args.command == "record":
        args.out.write_text(json.dumps({"_machine": machine(), **record(args.case or list(CASES))}, indent=1))
        print(f"[pin] wrote {args.out}")
        return 0
    want = json.loads(args.recorded.read_text())
    here = machine()
    if want.get("_machine", here) != here:  # files recorded before this check name no machine
        print(f"[pin] recorded on {want['_machine']}, compared on {here}: floats may differ in their last digits "
              "on another machine; record the pins here to compare exactly")  # fmt: skip
    names = args.case or [n for n in want if n in CASES]
    got = record(names)
    failed = 0
    for name in names:
        diffs = differences(want[name], got[name], args.rtol, name)
        new = sorted({d.split("].", 1)[-1] for d in diffs if d.endswith(": new")}) if args.allow_new_keys else []
        diffs = [d for d in diffs if not (args.allow_new_keys and d.endswith(": new"))]
        failed += bool(diffs)
        status = "identical" if not diffs else f"{len(diffs)} differences"
        print(
            f"[pin] {name}: {status}"
            + (f" (new keys: {', '.join(k.removesuffix(': new') for k in new)})" if new else "")
        )
        for line in diffs[:10]:
            print(f"        {line}")
    print(f"[pin] {len(names) - failed} of {len(names)} cases identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
