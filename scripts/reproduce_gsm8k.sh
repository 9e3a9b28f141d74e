#!/usr/bin/env bash
# Every GSM8K figure of the paper (docs/method.md §3.2, §3.4, §3.6), one sweep each (cory/conf/sweep/), with W&B logging.
# Needs `experiment=gsm8k_llama2` (4-bit Llama-2-7b-chat with LoRA), a GPU per run and the Hub assets (or local
# copies via model.name_or_path=...). Extra arguments go to every sweep (e.g. the SLURM launcher).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOGGER=${LOGGER:-wandb}

# Fig. 4: PPO vs CORY training curves, 3 seeds
$PY -m cory.train -m experiment=gsm8k_llama2 sweep=gsm8k_curves logger="$LOGGER" "$@"
# Fig. 2c: the KL-vs-reward frontier at fixed η ∈ {1e-5, 1e-4, 1e-3, 1e-2}
$PY -m cory.train -m experiment=gsm8k_llama2 sweep=gsm8k_kl_frontier logger="$LOGGER" "$@"
# Figs. 7–10: robustness, Llama-2-7b/13b-chat × learning rate 1e-4/1e-5
$PY -m cory.train -m sweep=gsm8k_robustness logger="$LOGGER" "$@"
