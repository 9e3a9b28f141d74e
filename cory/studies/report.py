"""`cory-report`: the statistics of finished studies, from their committed results.

cory-report claim outputs/claim/results --out outputs/claim            # the IMDB claim study's verdicts
cory-report claim2 report outputs/claim2/results --out outputs/claim2  # the second one's (also plan, pilot)
cory-report family outputs/family/results --out outputs/family         # the multi-agent family's table
cory-report paired RUN_A [--iteration K] RUN_B [--iteration K']        # paired test of two MAFT evaluations
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cory.studies import command

COMMANDS = {
    "claim": ("cory.studies.claim_report", "the IMDB claim study: paired per-seed differences, t intervals, verdicts"),
    "claim2": ("cory.studies.claim2_report", "the second IMDB claim study: its report, plan, unreached runs, pilot"),
    "family": ("cory.studies.family_report", "the family sweep's table: spreads over seeds, Welch intervals"),
    "paired": ("cory.studies.paired_test", "two MAFT evaluations of the same problems: paired test and McNemar"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(command.dispatch, "cory-report", COMMANDS, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
