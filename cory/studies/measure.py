"""`cory-measure`: measurements that build a run and play part of it, without training it to the end.

cory-measure reward-spread --batches 8 experiment=imdb_claim_cory_released   # σ(r1 + r2) / σ(r1), no update
cory-measure stop-latency experiment=smoke                                     # stop signal → checkpoint, seconds
cory-measure kl-optimum --samples 16 experiment=quickstart algorithm=ppo        # the KL-regularised optimum's gain
cory-measure precision-gap experiment=quickstart                                # bf16 autocast against fp32, here
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cory.studies import command

COMMANDS = {
    "reward-spread": ("cory.studies.reward_spread", "how much more CORY's collective reward spreads than one agent's"),
    "stop-latency": ("cory.studies.stop_latency", "seconds from a stop signal mid-update to the checkpoint on disk"),
    "kl-optimum": ("cory.studies.kl_optimum", "what the KL-regularised optimum gains on the held-out prompts, at π0"),
    "precision-gap": ("cory.studies.precision_gap", "what bf16 autocast moves in log π, log π0 and KL, and saves"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(command.dispatch, "cory-measure", COMMANDS, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
