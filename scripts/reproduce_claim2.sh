#!/usr/bin/env bash
# The second IMDB claim study (docs/results.md, "Pre-registration 2"), resumably on one machine, two runs at a time
# with one torch thread each; every finished run's small files (metrics.jsonl, summary.json, run_config.yaml,
# overrides.yaml) are copied to $OUT/.../results/ and committed as they appear (COMMIT=0: copied, not committed).
#   bash scripts/reproduce_claim2.sh pilot    # first: the learning-rate pilot (sweep=imdb_claim2_pilot), its choice
#   bash scripts/reproduce_claim2.sh          # the study: sweep=imdb_claim2, seeds 0–7 × four arms, 100 iterations
#   bash scripts/reproduce_claim2.sh extend   # then: each run missing a deciding level at 100 continues to 200
#   bash scripts/reproduce_claim2.sh report   # the statistics, verdicts and figure into $OUT
# Run any of them again after a stop: finished runs are skipped, stopped ones resume from their last checkpoint.
# Extra arguments are overrides for every run (`bash scripts/reproduce_claim2.sh study iterations=2 seed=0` to try).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/claim2}
JOBS=${JOBS:-2}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-offline}

commit() {  # commit the finished runs' files under $1 (only those paths), if any are new
  [ "${COMMIT:-1}" = 1 ] || return 0
  git add -- "$1" 2>/dev/null || return 0
  git diff --cached --quiet -- "$1" && return 0
  local runs
  runs=$(git diff --cached --name-only -- "$1" | grep 'summary.json$' | sed "s|^$1/||; s|/summary.json$||" | paste -sd ' ')
  git commit -q -m "Second IMDB claim study: finished ${runs:-runs} (small files)" -- "$1"
}

sweep() {  # cory-sweep in the background, committing finished runs every minute and once at the end
  local results=$2
  # --retries: a run killed on its own (out of memory) resumes from its checkpoint at once, not days later
  $PY -m cory.studies.run_sweep --dir "$1" --results "$results" --jobs "$JOBS" --retries 2 "${@:3}" &
  local pid=$!
  # a script's background job ignores Ctrl-C: pass it on, so that every run stops at a checkpoint
  trap 'kill -TERM $pid 2>/dev/null; wait $pid; commit "$results"; exit 130' INT TERM
  while kill -0 "$pid" 2>/dev/null; do sleep 60; commit "$results"; done
  local rc=0
  wait "$pid" || rc=$?
  trap - INT TERM
  commit "$results"
  return "$rc"
}

what=${1:-study}
[ $# -gt 0 ] && shift
case "$what" in
  pilot)
    sweep "$OUT/pilot/runs" "$OUT/pilot/results" sweep=imdb_claim2_pilot "$@"
    $PY -m cory.studies.claim2_report pilot "$OUT/pilot/results"
    echo "set this learning rate in cory/conf/experiment/imdb_claim2.yaml and commit it before the study's first run"
    ;;
  study)
    sweep "$OUT/runs" "$OUT/results" sweep=imdb_claim2 "$@"
    ;;
  extend)  # the rule's one extension: resume each run missing a deciding level to 200 iterations, keep its files
    # an assignment, so that a failing listing stops the script (set -e) instead of extending nothing
    unreached=$($PY -m cory.studies.claim2_report unreached "$OUT/results")
    for run in $unreached; do
      folder="$OUT/runs/$run"
      [ -f "$folder/run_config.yaml" ] || { echo "error: $folder is gone; run the study on this machine first"; exit 2; }
      link="$OUT/runs/.extend"  # resume= takes a path without '=': a link to the folder (cory-sweep's way)
      ln -sfn "$(cd "$folder" && pwd)" "$link"
      OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $PY -m cory.train resume="$link" iterations=200 progress=false "$@"
      for f in metrics.jsonl summary.json run_config.yaml .hydra/overrides.yaml; do
        cp "$folder/$f" "$OUT/results/$run/$(basename "$f")"
      done
      commit "$OUT/results"
    done
    ;;
  report)
    $PY -m cory.studies.claim2_report report "$OUT/results" --out "$OUT"
    ;;
  *)
    echo "error: unknown step '$what'; expected pilot, study, extend or report"
    exit 2
    ;;
esac
