"""What bf16 autocast does to the log-probabilities and the KL of a run's first agent, and what it saves, here.

    cory-measure precision-gap --noise 0.02 experiment=bench_gpt2_small model.name_or_path=DIR [--out gap.json]

Builds the run exactly as `cory-train <overrides>` would, samples one answer to each held-out prompt from the first
agent's initial policy π0 (in fp32, as its evaluation samples them), then moves the policy away from π0 by adding
`noise`·mean|w|·N(0, 1) to every weight of the language model (seeded; so that the KL is not 0 and its relative gap
means something; `--noise 0` scores π0 against itself). The same (prompt, answer) tokens are then scored twice,
as a rollout scores them (`Actor.score_tokens`: log π, log π0, the per-token KL of the configured estimator),
once in fp32 and once under `torch.autocast(<device>, bfloat16)`, which is what `hardware.precision=bf16` selects.

Prints, as JSON: the bf16 − fp32 gaps over the answers' tokens (max and mean |Δ log π|, |Δ log π0|, |Δ kl_t|; max and
mean |ΔKL_seq| / KL_seq per answer), the mean KL_seq, the seconds of each scoring pass (the median of `--repeat`
passes after one untimed pass each) and the CPU's bf16 features (`amx_bf16`, `avx512_bf16` from /proc/cpuinfo) or
the CUDA device's name. The paper presets stay fp32 (docs/implementation-notes.md, note 16); this measures what the
option costs in exactness on the machine at hand.

Overrides that do not compose or validate, a negative or NaN `--noise`, a LoRA run (its π0 is the adapters' base,
which the noise would move too), a run without held-out prompts or an unwritable `--out` are one line and exit
code 2. The same command: `python -m cory.studies.precision_gap`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command
from cory.studies.command import StudyError


def gaps(base, other, mask) -> dict[str, float]:
    """bf16 − fp32 gaps between two scorings of the same tokens (`Rollout`s: logprobs, ref_logprobs, kls [B, T]) over
    the answer tokens `mask` [B, T] (bool): max and mean absolute differences per token, and of KL_seq (the per-answer
    sum of kl_t) relative to fp32's, over answers whose fp32 KL_seq is not 0."""
    out: dict[str, float] = {}
    for name, key in (("logp", "logprobs"), ("ref_logp", "ref_logprobs"), ("kl_t", "kls")):
        diff = (getattr(other, key) - getattr(base, key))[mask].abs()
        out[f"max_abs_{name}"], out[f"mean_abs_{name}"] = diff.max().item(), diff.mean().item()
    kl_seq, other_seq = (base.kls * mask).sum(-1), (other.kls * mask).sum(-1)
    nonzero = kl_seq != 0
    if bool(nonzero.any()):
        rel = ((other_seq - kl_seq).abs() / kl_seq.abs())[nonzero]
        out["max_rel_kl_seq"], out["mean_rel_kl_seq"] = rel.max().item(), rel.mean().item()
    else:  # π = π0 in fp32: no relative gap is defined
        out["max_rel_kl_seq"] = out["mean_rel_kl_seq"] = float("nan")
    out["mean_kl_seq"] = kl_seq.mean().item()
    return out


def bf16_features() -> list[str]:
    """The CPU's bf16 instruction sets as /proc/cpuinfo names them (empty where it does not exist)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in ("amx_bf16", "amx_tile", "avx512_bf16") if f in flags]


def run(argv: Sequence[str] | None = None, prog: str = "cory-measure precision-gap") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument(
        "--noise",
        type=command.non_negative_float,
        default=0.02,
        help="policy = π0 + noise·mean|w|·N(0,1) per weight (default 0.02)",
    )
    parser.add_argument("--repeat", type=command.positive_int, default=3, help="timed scoring passes (default 3)")
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of a run")
    args = parser.parse_args(argv)

    import torch

    from cory.build import build_algorithm, build_context

    cfg = command.compose(args.overrides)
    if cfg.model.get("lora", {}).get("enabled", False):
        raise StudyError(
            "model.lora.enabled=true: π0 is the adapters' base, which the noise would move too; measure "
            "with full fine-tuning (model.lora.enabled=false)"
        )
    with tempfile.TemporaryDirectory() as run_dir:
        algorithm = build_algorithm(cfg, build_context(cfg, Path(run_dir)))
        team, task = getattr(algorithm, "team", None), getattr(algorithm, "task", None)
        if team is None or task is None or not getattr(team, "eval_queries", None):
            raise StudyError(f"{type(algorithm).__name__} has no agents evaluated on held-out prompts to measure")
        agent = next(iter(team.agents.values()))
        actor, trainee = agent.actor, agent.trainee
        if trainee.autocast_dtype is not None:
            raise StudyError("the run already autocasts (hardware.precision=bf16): measure from its fp32 setting")
        queries, lengths = team.eval_queries, team.eval_lengths
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            rollout = actor.act(
                [task.pioneer_prompt(q) for q in queries],
                max(lengths),
                task.generation_kwargs,
                team.eval_batch_size,
                lengths=lengths,
                evaluation=True,
            )
        prompts = [ids[mask.bool()] for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]
        answers = [ids[mask.bool()] for ids, mask in zip(rollout.response_ids, rollout.response_mask)]
        generator = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():  # the value head is not scored against anything: only the language model moves
            for p in trainee.policy.pretrained_model.parameters():
                p.add_(args.noise * p.abs().mean() * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))

        def score(dtype):
            trainee.autocast_dtype = dtype
            result = actor.score_tokens(prompts, answers)  # one untimed pass: allocator, kernels' first calls
            seconds = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                actor.score_tokens(prompts, answers)
                seconds.append(time.perf_counter() - start)
            trainee.autocast_dtype = None
            return result, statistics.median(seconds)

        fp32, fp32_s = score(None)
        bf16, bf16_s = score(torch.bfloat16)
        mask = fp32.response_mask.bool()
        device = trainee.device
    result: dict = {
        "overrides": args.overrides,
        "answers": len(answers),
        "tokens": int(mask.sum()),
        "noise": args.noise,
    }
    result.update(gaps(fp32, bf16, mask))
    result["fp32_s"], result["bf16_s"] = fp32_s, bf16_s
    result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result["cpu_bf16"] = bf16_features()
    result["threads"] = torch.get_num_threads()
    command.emit_json(result, args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
