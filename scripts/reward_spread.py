"""How much more the collective reward spreads than one agent's, on the initial model: σ(r1 + r2) / σ(r1).

    python scripts/reward_spread.py --batches 8 experiment=imdb_claim_cory_released [--out spread.json]

Builds CORY exactly as `python -m cory.train <overrides>` would (the same model, task, seed and data schedule), then,
without any update, plays the first `--batches` training iterations' rollouts: the pioneer answers, the observer
answers with the pioneer's answer in view, both are scored on the query. It prints (and writes with `--out`) the
standard deviations of r1, r2 and r1 + r2 over those episodes and the ratio.

Why it matters (docs/results.md, "Pre-registration"): score normalisation divides the collective reward by its
running σ, so a normalised CORY's KL penalty, in raw-reward units, is about β·σ(r1 + r2) where PPO's is β·1 on its
raw reward; this ratio, with the two β values, says how much more KL penalty the released script's CORY pays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8, help="training iterations' batches to play (default 8)")
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of a CORY run")
    args = parser.parse_args(argv)

    from cory.build import build_algorithm, build_context
    from cory.cli import compose

    cfg = compose(args.overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        algorithm = build_algorithm(cfg, build_context(cfg, Path(run_dir)))
        team, task = algorithm.team, algorithm.task
        pioneer, observer = team.agents["llm1"], team.agents["llm2"]
        r1, r2 = [], []
        for k in range(args.batches):
            queries, max_new_tokens = team.batch(k)
            gen, batch = task.generation_kwargs, team.generation_batch_size
            pio = pioneer.act([task.pioneer_prompt(q) for q in queries], max_new_tokens, gen, batch)
            obs_prompts = [task.observer_prompt(q, a) for q, a in zip(queries, pio.responses)]
            obs = observer.act(obs_prompts, max_new_tokens, gen, batch)
            r1 += algorithm.scorer(queries, pio.responses)[0]
            r2 += algorithm.scorer(queries, obs.responses)[0]
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
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
