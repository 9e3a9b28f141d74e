#!/usr/bin/env bash
# The small CPU reproduction of the paper's IMDB experiment (docs/results.md): PPO vs CORY
# on SmolLM2-135M, offline IMDB prompts and the TF-IDF sentiment reward (`experiment=cpu_imdb`):
#   1. frontier: sweep=cpu_imdb_frontier (PPO, CORY × fixed η ∈ {0.03, 0.1, 0.3} × seed 0)
#   2. curves:   sweep=cpu_imdb_curves seed=1 (PPO, CORY at η = 0.1: the second seed; seed 0 is a frontier point)
# then draws the curves (η = 0.1, 2 seeds) and the frontier into $OUT (PNG/PDF/JSON/CSV). Two runs at a time, one
# torch thread each (8 runs: about 2–3 hours on 2 idle cores).
# Resumable: run it again after a kill (or Ctrl-C) and finished runs are skipped, stopped ones resume from their
# last checkpoint (`cory-sweep`). Extra arguments are overrides for every run, e.g. a quick trial:
#   bash scripts/reproduce_cpu.sh iterations=2 seed=0          (OUT=... to write elsewhere)
# The pilot that set the learning rate of experiment=cpu_imdb (PPO, β = 0.1, 20 iterations, held-out every 5):
#   cory-sweep --dir outputs/reproduction/pilot experiment=cpu_imdb iterations=20 eval_every=5 \
#     seed=0 algorithm=ppo algorithm.agent.learning_rate=1e-5,3e-5,1e-4
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/reproduction}
JOBS=${JOBS:-2}
EXPERIMENT=${EXPERIMENT:-cpu_imdb}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-offline}

BETA=0.1  # the curves' β: cpu_imdb's, unless the arguments choose another
for arg in "$@"; do case "$arg" in algorithm.agent.init_kl_coef=*) BETA=${arg#*=} ;; esac; done

$PY -m cory.studies.run_sweep --dir "$OUT/runs/frontier" --jobs "$JOBS" experiment="$EXPERIMENT" sweep=cpu_imdb_frontier "$@"
$PY -m cory.studies.run_sweep --dir "$OUT/runs/curves" --jobs "$JOBS" experiment="$EXPERIMENT" sweep=cpu_imdb_curves seed=1 "$@"
$PY -m cory.studies.plot_curves "$OUT/runs/curves" "$OUT/runs/frontier" --where algorithm.agent.init_kl_coef="$BETA" \
  --out "$OUT/curves" | tee "$OUT/curves.txt"
$PY -m cory.studies.plot_frontier "$OUT/runs/frontier" --out "$OUT/frontier.png" --csv "$OUT/frontier.csv" \
  --json "$OUT/frontier.json" | tee "$OUT/frontier.txt"
