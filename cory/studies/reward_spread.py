"""How much more the collective reward spreads than one agent's, on the initial model: σ(r1 + r2) / σ(r1).

    cory-measure reward-spread --batches 8 experiment=imdb_claim_cory_released [--out spread.json]

Builds CORY exactly as `cory-train <overrides>` would (the same model, task, seed and data schedule), then,
without any update, plays the first `--batches` training iterations' rollouts: the pioneer answers, the observer
answers with the pioneer's answer in view, both are scored on the query. It prints (and writes with `--out`) the
standard deviations of r1, r2 and r1 + r2 over those episodes and the ratio.

Why it matters (docs/results.md, "Pre-registration"): score normalisation divides the collective reward by its
running σ, so a normalised CORY's KL penalty, in raw-reward units, is about β·σ(r1 + r2) where PPO's is β·1 on its
raw reward; this ratio, with the two β values, says how much more KL penalty the released script's CORY pays.

Overrides that do not compose or validate, a run that is not CORY's (no pioneer and observer), fewer than two
episodes, a reward that is NaN, or an unwritable `--out` are one line and exit code 2. The same command:
`python -m cory.studies.reward_spread`.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command
from cory.studies.command import StudyError


def run(argv: Sequence[str] | None = None, prog: str = "cory-measure reward-spread") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument(
        "--batches", type=command.positive_int, default=8, help="training iterations' batches to play (default 8)"
    )
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of a CORY run")
    args = parser.parse_args(argv)

    from cory.build import build_algorithm, build_context

    cfg = command.compose(args.overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        algorithm = build_algorithm(cfg, build_context(cfg, Path(run_dir)))
        team, task = getattr(algorithm, "team", None), getattr(algorithm, "task", None)
        episode = getattr(algorithm, "episode", None)
        if team is None or episode is None or len(episode.roles) != 2 or not {"llm1", "llm2"} <= set(team.agents):
            raise StudyError(
                f"{type(algorithm).__name__} has no pioneer and observer (llm1, llm2); measure a CORY run "
                "(algorithm=cory)"
            )
        actors = [team.agents["llm1"].actor, team.agents["llm2"].actor]
        r1, r2 = [], []
        for k in range(args.batches):
            queries, max_new_tokens = team.batch(k)
            # CORY's episode (docs/method.md §1.2): the pioneer answers, the observer with its answer in view
            played = episode.play(actors, task, algorithm.scorer, queries, max_new_tokens, team.generation_batch_size)
            r1 += played.rewards[0]
            r2 += played.rewards[1]
    if len(r1) < 2:
        raise StudyError(f"{len(r1)} episode: a spread needs two or more; raise --batches or the batch size")
    if not all(math.isfinite(v) for v in (*r1, *r2)):
        raise StudyError("the reward scored NaN or infinity on some episode; check the task's reward")
    total = [a + b for a, b in zip(r1, r2)]
    result = {
        "overrides": args.overrides,
        "episodes": len(r1),
        "std_r1": statistics.stdev(r1),
        "std_r2": statistics.stdev(r2),
        "std_r1_plus_r2": statistics.stdev(total),
        "ratio": statistics.stdev(total) / statistics.stdev(r1),
        "mean_r1": statistics.fmean(r1),
        "mean_r2": statistics.fmean(r2),
    }
    command.emit_json(result, args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
