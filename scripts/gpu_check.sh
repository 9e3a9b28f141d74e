#!/usr/bin/env bash
# The one GPU check (`make gpu-check`): 4-bit + LoRA PPO and CORY, bf16 vs fp32 KL, the vLLM backend against
# Hugging Face generate, data parallel and ZeRO-2 on every visible GPU, and the CORY/PPO time ratio at batch 256,
# in 2-3 minutes on one GPU; one table, and JSON in $OUT/gpu_check.json. Without CUDA it says so in one line and
# exits 0.
#
#   pip install -r requirements.txt -r requirements-gpu.txt   # bitsandbytes, vLLM (and a CUDA torch)
#   bash scripts/gpu_check.sh [--skip vllm,ddp,zero2,zero3,fsdp] [Hydra overrides for the 4-bit runs]
#
# Everything is in scripts/gpu_check.py; this wrapper only picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-.venv/bin/python}" scripts/gpu_check.py "$@"
