#!/usr/bin/env bash
# Paper §4.1 / Fig. 3 and §4.3 / Fig. 6 on IMDB (docs/method.md §3.1, §3.5): 100 iterations, batch 256, 3 seeds.
# Needs a GPU and the Hub assets (gpt2-large, gpt2-xl, lvwerra/distilbert-imdb, imdb) or local copies:
#   model.name_or_path=/path/gpt2-large  task.reward.name_or_path=/path/distilbert-imdb  task.source=packaged
# Each run: one A100/H100-class GPU; PPO-GPT2-L ≈ 1–2 h, CORY ≈ 2× that (paper: < 12 h on one A6000 for XL).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOGGER=${LOGGER:-wandb}

# Fig. 3: PPO-GPT2-L vs CORY (LLM1, LLM2) on GPT2-L
$PY -m cory.train -m experiment=imdb_gpt2 algorithm=ppo,cory seed=0,1,2 logger=$LOGGER
# Fig. 6 ablations: PPO on GPT2-XL (twice the parameters), CORY w/o knowledge transfer, CORY w/o role exchange
$PY -m cory.train -m experiment=ppo_gpt2_xl seed=0,1,2 logger=$LOGGER
$PY -m cory.train -m experiment=cory_wo_kt seed=0,1,2 logger=$LOGGER
$PY -m cory.train -m experiment=cory_wo_rex seed=0,1,2 logger=$LOGGER
# Cooperative / independent / competitive collective reward [v2]
$PY -m cory.train -m experiment=cory_gpt2_large algorithm.w_other=1,0,-1 seed=0,1,2 logger=$LOGGER
# Frontier (Fig. 2c on IMDB): PPO and CORY at fixed η
$PY -m cory.train experiment=imdb_gpt2 sweep=imdb_kl_frontier logger=$LOGGER
$PY scripts/plot_frontier.py outputs/multiruns --out outputs/frontier_imdb.png
