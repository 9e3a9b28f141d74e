#!/usr/bin/env bash
# The IMDB claim study (docs/results.md, "Pre-registration"): `sweep=imdb_claim` — PPO, CORY on the raw reward (arm A)
# and CORY with the released script's score normalisation and β 0.4 (arm B), seeds 0–2, 100 iterations of batch 32 —
# run resumably on one machine, two runs at a time with one torch thread each. Each finished run's small files
# (metrics.jsonl, summary.json, run_config.yaml, overrides.yaml) are copied to $OUT/results/<run>/ to be committed;
# the run folders under $OUT/runs/ (checkpoints) are not. Run it again after any stop: finished runs are skipped,
# stopped ones resume from their last checkpoint, lost ones start again from their command.
#   bash scripts/reproduce_claim.sh                  # arms A and B
#   ARM_C=1 bash scripts/reproduce_claim.sh          # also arm C (PPO with the released normalisation)
# Cost on two CPU cores (docs/results.md): about 35 min per PPO run and 105 min per CORY run, alone on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/claim}
JOBS=${JOBS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-offline}

ARMS=()
if [ "${ARM_C:-0}" = 1 ]; then  # the same sweep with a fourth experiment (same folders: finished runs are kept)
  ARMS=(experiment=imdb_claim_ppo,imdb_claim_cory_released,imdb_claim_cory,imdb_claim_ppo_released)
fi
$PY -m cory.studies.run_sweep --dir "$OUT/runs" --results "$OUT/results" --jobs "$JOBS" sweep=imdb_claim "${ARMS[@]}" "$@"
$PY -m cory.studies.claim_report "$OUT/results" --out "$OUT"
