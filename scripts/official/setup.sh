#!/usr/bin/env bash
# Builds what `python scripts/benchmark.py --against-official` needs to run the official CORY code on a CPU:
#   .venv-official/  the official code's Python stack (git-ignored)
#   .official/       the official repository's tree at the pinned commit (git-ignored; the benchmark exports its own
#                    copy at run time, this one is for running scripts/official/bench_official.py by hand)
#
#   scripts/official/setup.sh [CLONE]      # CLONE: a git clone of https://github.com/Harry67Hu/CORY
#                                          # (default $CORY_OFFICIAL_CLONE, else the local mirror)
#
# The pins are the official environment file's (trl_environment.yml at that commit: transformers 4.43.3,
# tokenizers 0.19.1, accelerate 0.31.0, datasets 2.20.0, huggingface-hub 0.24.3, peft 0.12.0, tyro 0.8.5, numpy
# 1.26.4, pyarrow 16.1.0, pandas 2.2.2, safetensors 0.4.3, tqdm 4.66.4), except torch: ours (2.13.0, the CPU build
# where pip can find one, as for .venv) instead of their 2.2.2+cu118, so that both sides run the same kernels.
# scipy + scikit-learn score the TF-IDF reward; wandb, openai, rouge_score and matplotlib are not installed (the
# harness stubs them: the training loop does not use them). Override torch with TORCH_SPEC=torch==X.
set -euo pipefail
cd "$(dirname "$0")/../.."

OFFICIAL_COMMIT=710219fc83bf0fc5c618c5bffc5aa00a6250bfc6
CLONE=${1:-${CORY_OFFICIAL_CLONE:-/work/.mirror/Harry67Hu+CORY/repo}}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if ! git -C "$CLONE" rev-parse --verify --quiet "$OFFICIAL_COMMIT^{commit}" >/dev/null; then
    echo "error: $CLONE is not a git clone holding commit $OFFICIAL_COMMIT" >&2
    echo "       git clone https://github.com/Harry67Hu/CORY /path/to/CORY && $0 /path/to/CORY" >&2
    exit 2
fi

[ -x .venv-official/bin/python ] || "$PYTHON" -m venv .venv-official
.venv-official/bin/python -m pip install -q \
    "$TORCH_SPEC" transformers==4.43.3 tokenizers==0.19.1 accelerate==0.31.0 datasets==2.20.0 \
    huggingface-hub==0.24.3 peft==0.12.0 tyro==0.8.5 numpy==1.26.4 pyarrow==16.1.0 pandas==2.2.2 \
    safetensors==0.4.3 tqdm==4.66.4 scipy==1.14.0 scikit-learn==1.5.1

rm -rf .official
mkdir .official
git -C "$CLONE" archive "$OFFICIAL_COMMIT" | tar -x -C .official
echo "$OFFICIAL_COMMIT" > .official/COMMIT

# the official trainer imports on this stack (its scripts themselves run only under the harness)
HF_HUB_OFFLINE=1 .venv-official/bin/python -c "
import sys; sys.path.insert(0, '.official')
import torch, transformers, trl
from trl import PPOTrainer, AutoModelForCausalLMWithValueHead
print(f'[official] trl {trl.__version__} (vendored), transformers {transformers.__version__}, torch {torch.__version__}')"
echo "[official] .venv-official ready; official code at $OFFICIAL_COMMIT in .official/"
