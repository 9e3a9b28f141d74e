"""The learner's forward + backward in length groups against one padded rectangle, timed in turn: one JSON object.

    M=$(cory-gpt2-small)
    python scripts/length_groups.py --threads 1 --shape imdb model=gpt2 model.name_or_path=$M
    python scripts/length_groups.py --threads 1 --shape observer model=gpt2 model.name_or_path=$M
    python scripts/length_groups.py --threads 1 --shape ragged --rows 8 --repeat 4 model=gpt2 model.name_or_path=$M
    python scripts/length_groups.py --repeat 1 experiment=smoke                 # seconds; checks the instrument

`hardware.length_groups` (docs/cost.md, "Padding") trades padded positions for more, smaller forwards. Whether that
pays depends on how ragged the rows are and on what a forward costs whatever its size, so this script times it on
one batch of fixed lengths: `--rows` rows of random tokens whose lengths are drawn (seeded) from one of three shapes,
- `imdb`: prompts of 2-8 tokens and 16-token answers, two of them ended early (a PPO agent's batch on IMDB);
- `observer`: the query twice (2-8 tokens each), a 16-token answer and 6 template tokens, answers as `imdb`
  (CORY's observer on IMDB);
- `ragged`: problems of 40-120 tokens and answers of 30-200 tokens (answers that end at EOS, as on GSM8K).
For each `--groups` value in turn, `--repeat` times after one untimed round (so that a slow spell of a shared machine
hits every setting), it runs the learner's forward (`cory.ppo.rollout.forward_logits`, with values), the log-probs
of the tokens and a backward through their masked sum with the values. Reports per setting the median, min and max
seconds, the forwards and the padded positions they multiply, the padding share, and `vs_first`, the median's ratio
to the first setting's (one rectangle, by default).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cory.errors import entry_point, fail  # noqa: E402 - light (no torch); the boundary must wrap the slow imports
from cory.studies import command  # noqa: E402 - light too: what every study command writes its output with

SHAPES = ("imdb", "observer", "ragged")


def lengths(shape: str, rows: int, seed: int) -> tuple[list[int], list[int]]:
    """(prompt lengths, response lengths) of one batch of `shape` (module docstring)."""
    r = random.Random(seed)
    if shape == "ragged":
        return [r.randint(40, 120) for _ in range(rows)], [r.randint(30, 200) for _ in range(rows)]
    if shape == "imdb":
        prompts = [r.randint(2, 8) for _ in range(rows)]
    else:
        prompts = [2 * r.randint(2, 8) + 16 + 6 for _ in range(rows)]
    responses = [16] * rows
    for i, n in zip(r.sample(range(rows), min(2, rows)), (9, 5)):  # two answers ended early by EOS
        responses[i] = n
    return prompts, responses


def _counts(text: str) -> list[int]:
    """`--groups 1,2,4` → [1, 2, 4]."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole numbers separated by commas") from None


# a mistyped override, a missing model, an unwritable --out, Ctrl-C: one line (exit 2, or 130); a bug: its traceback
@entry_point(expected=(command.StudyError,))
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="observer", help="the rows' lengths (default observer)")
    parser.add_argument(
        "--groups", type=_counts, default=[1, 2, 4], help="settings to time, comma-separated (default 1,2,4)"
    )
    parser.add_argument("--rows", type=int, default=16, help="rows in the batch (default 16)")
    parser.add_argument("--repeat", type=int, default=6, help="timed rounds (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and tokens (default 0)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides naming the model, e.g. experiment=smoke")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.rows < 1 or min(args.groups) < 1:
        fail("--repeat, --rows and every --groups value must be >= 1")
    if args.out is not None:  # before minutes of timing, not after them
        with command.output(args.out):
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.touch()

    from cory.cli import check_composes

    check_composes(args.overrides)  # a mistyped override is a ConfigError: one line, as cory.train says it
    import torch
    from hydra import compose, initialize_config_dir

    from cory.build import load_model
    from cory.policy import PolicyWithValueHead
    from cory.ppo import core as ppo_core
    from cory.ppo.rollout import forward_logits, group_widths, length_groups, pad

    if args.threads:
        torch.set_num_threads(args.threads)
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "cory" / "conf")):
        cfg = compose("train", overrides=args.overrides)
    model, _ = load_model(cfg.model)
    policy = PolicyWithValueHead(model)
    policy.eval()  # dropout off, as in every PPO forward
    prompts, responses = lengths(args.shape, args.rows, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    vocab = model.config.get_text_config().vocab_size
    p_ids, p_mask = pad([torch.randint(0, vocab, (n,), generator=g) for n in prompts], 0, left=True)
    r_ids, r_mask = pad([torch.randint(0, vocab, (n,), generator=g) for n in responses], 0, left=False)
    mask = r_mask.float()

    def step(groups: int) -> float:
        policy.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logits, values = forward_logits(policy, p_ids, p_mask, r_ids, r_mask, True, groups)
        logprobs = ppo_core.gather(torch.log_softmax(logits, dim=-1), r_ids)
        ((logprobs + values) * mask).sum().backward()
        return time.perf_counter() - start

    for groups in args.groups:  # untimed: first calls allocate and warm the kernels
        step(groups)
    seconds: dict[int, list[float]] = {k: [] for k in args.groups}
    for _ in range(args.repeat):
        for groups in args.groups:
            seconds[groups].append(step(groups))
    real = sum(prompts) + sum(responses)
    settings = {}
    for groups, ts in seconds.items():
        split = length_groups(prompts, responses, groups)
        positions = sum(len(s) * sum(group_widths(s, prompts, responses)) for s in split)
        settings[str(groups)] = {
            "forwards": len(split),
            "positions": positions,
            "padding": 1 - real / positions,
            "s_median": statistics.median(ts),
            "s_min": min(ts),
            "s_max": max(ts),
            "seconds": ts,
        }
    base = settings[str(args.groups[0])]["s_median"]
    for s in settings.values():
        s["vs_first"] = s["s_median"] / base
    report = {
        "shape": args.shape,
        "rows": args.rows,
        "threads": torch.get_num_threads(),
        "repeat": args.repeat,
        "model": str(cfg.model.get("name_or_path") or cfg.model["_target_"]),
        "tokens": real,
        "settings": settings,
    }
    command.emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
