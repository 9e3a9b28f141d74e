"""`cory-plot`: the figures of finished runs.

cory-plot curves SWEEP_DIR [MORE_DIRS ...] --out PREFIX      # training curves over seeds (paper Figs. 3, 4, 6)
cory-plot frontier RUN_OR_SWEEP_DIR [...] --out frontier.png # the KL-reward frontier (paper Fig. 2c)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cory.studies import command

COMMANDS = {
    "curves": ("cory.studies.plot_curves", "training curves: mean over seeds with a min-max band"),
    "frontier": ("cory.studies.plot_frontier", "KL-reward frontier: seed means and each method's Pareto front"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(command.dispatch, "cory-plot", COMMANDS, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
