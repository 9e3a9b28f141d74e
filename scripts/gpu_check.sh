#!/usr/bin/env bash
# The 4-bit + LoRA path on one GPU in a few minutes: PPO and CORY for 2 iterations on a small Llama-architecture
# model built in memory (no Hub), NF4 weights with bf16 compute, LoRA adapters (CORY's two on one shared base).
# Prints, per algorithm, peak GPU memory (MiB) and seconds per iteration, from each run's metrics.jsonl.
#
#   pip install -r requirements.txt -r requirements-gpu.txt   # bitsandbytes (and a CUDA torch)
#   bash scripts/gpu_check.sh                                 # or: make gpu-check
#
# Extra arguments are Hydra overrides for both runs, e.g. model.hidden_size=1024 model.num_hidden_layers=8.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=${WANDB_MODE:-disabled}
# a small Llama (4 layers, 512 wide, ~13M parameters, byte vocabulary): big enough for real 4-bit kernels
MODEL=(model.hidden_size=512 model.intermediate_size=1376 model.num_hidden_layers=4 model.num_attention_heads=8
  model.num_key_value_heads=8)
for algorithm in ppo cory; do
  "$PY" -m cory.train experiment=gsm8k_smoke hardware=gpu model.load_in_4bit=true algorithm="$algorithm" \
    iterations=2 eval_every=0 num_eval=8 num_eval_final=8 save_every=0 progress=false "${MODEL[@]}" "$@" \
    hydra.run.dir="$OUT/$algorithm"
done
"$PY" - "$OUT" <<'PYTHON'
import json, sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).iterdir()):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/iteration_s" in r]
    peak = max(r["memory/peak_mb"] for r in steps)
    s_iter = sum(r["time/iteration_s"] for r in steps) / len(steps)
    print(f"{run.name}: peak GPU memory {peak:.0f} MiB, {s_iter:.2f} s/iteration over {len(steps)} iterations")
PYTHON
