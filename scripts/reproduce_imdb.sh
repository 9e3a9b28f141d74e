#!/usr/bin/env bash
# Every IMDB figure of the paper (docs/method.md §3.1, §3.4, §3.5), one sweep each (cory/conf/sweep/), with W&B logging:
# each sweep's runs share a W&B group named after it, and its end writes frontier.{png,csv,json} into the sweep
# folder plus a summary run in that group. 100 iterations, batch 256, 3 seeds.
# Needs a GPU and the Hub assets (gpt2-large, gpt2-xl, lvwerra/distilbert-imdb, imdb) or local copies:
#   model.name_or_path=/path/gpt2-large  task.reward.name_or_path=/path/distilbert-imdb  task.source=packaged
# Each run: one A100/H100-class GPU; PPO-GPT2-L ≈ 1–2 h, CORY ≈ 2× that (paper: < 12 h on one A6000 for XL).
# Extra arguments go to every sweep, e.g. `hydra/launcher=submitit_slurm hydra.launcher.gpus_per_node=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOGGER=${LOGGER:-wandb}

# Fig. 3: PPO-GPT2-L vs CORY (LLM1, LLM2) on GPT2-L
$PY -m cory.train -m experiment=imdb_gpt2 sweep=fig3_imdb logger="$LOGGER" "$@"
# Fig. 6 ablations: PPO on GPT2-XL (twice the parameters), CORY w/o knowledge transfer, CORY w/o role exchange
$PY -m cory.train -m sweep=fig6_ablations logger="$LOGGER" "$@"
# Cooperative / independent / competitive collective reward [v2]
$PY -m cory.train -m experiment=imdb_gpt2 sweep=coop_vs_comp logger="$LOGGER" "$@"
# Frontier (Fig. 2c on IMDB): PPO and CORY at fixed η
$PY -m cory.train -m experiment=imdb_gpt2 sweep=imdb_kl_frontier logger="$LOGGER" "$@"
