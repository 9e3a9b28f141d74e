#!/usr/bin/env bash
# The small CPU reproduction of the paper's IMDB experiment (README "Reproducing the paper on a CPU"): PPO vs CORY
# on SmolLM2-135M, offline IMDB prompts and the TF-IDF sentiment reward (`experiment=cpu_imdb`):
#   1. curves:   sweep=cpu_imdb_curves   (PPO, CORY × 2 seeds, adaptive KL as in the paper)
#   2. frontier: sweep=cpu_imdb_frontier (PPO, CORY × 3 fixed η, 1 seed)
# then draws the curves and the frontier into $OUT (PNG/PDF/JSON/CSV). Two runs at a time, one torch thread each.
# Resumable: run it again after a kill (or Ctrl-C) and finished runs are skipped, stopped ones resume from their
# last checkpoint (scripts/run_sweep.py). Extra arguments are overrides for every run, e.g. a quick trial:
#   bash scripts/reproduce_cpu.sh iterations=2 seed=0          (OUT=... to write elsewhere)
# The pilot that sets the learning rate and initial β of experiment=cpu_imdb: a short sweep, then plot_curves.py:
#   python scripts/run_sweep.py --dir outputs/reproduction/pilot experiment=cpu_imdb iterations=10 seed=0 \
#     algorithm=ppo,cory algorithm.agent.learning_rate=1e-5,3e-5,1e-4
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/reproduction}
JOBS=${JOBS:-2}
EXPERIMENT=${EXPERIMENT:-cpu_imdb}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-offline}

$PY scripts/run_sweep.py --dir "$OUT/runs/curves" --jobs "$JOBS" experiment="$EXPERIMENT" sweep=cpu_imdb_curves "$@"
$PY scripts/run_sweep.py --dir "$OUT/runs/frontier" --jobs "$JOBS" experiment="$EXPERIMENT" sweep=cpu_imdb_frontier "$@"
$PY scripts/plot_curves.py "$OUT/runs/curves" --out "$OUT/curves" | tee "$OUT/curves.txt"
$PY scripts/plot_frontier.py "$OUT/runs/frontier" --out "$OUT/frontier.png" --csv "$OUT/frontier.csv" \
  --json "$OUT/frontier.json" | tee "$OUT/frontier.txt"
