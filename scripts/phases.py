"""Where an iteration's time goes, against what its matrix products alone would cost: one JSON object.

    python scripts/phases.py --threads 1 experiment=bench_gpt2_small model.name_or_path=$(cory-gpt2-small)
    python scripts/phases.py --threads 1 --algorithm ppo experiment=bench_gpt2_small model.name_or_path=...
    python scripts/phases.py experiment=smoke                              # seconds; checks the instrument

Runs `cory.train.train` in this process for `--warmup + --iterations` iterations (no evaluation, no checkpoint) with
timers around each phase of the step, and reports the timed iterations' means:
- `sample`: the decode loop (lean or `generate`), per agent and iteration, with `decode_steps_per_iter` and
  `s_per_decode_step`;
- `rollout_forward`: the rollout-time forwards (policy + value, reference) without gradients; a policy forward the
  rollout keeps for the update's first minibatch (`algorithm.agent.reuse_rollout_forward`) is the learner's first
  forward run earlier, and is counted in `learner_forward`;
- `learner_forward`, `learner_backward`, `optimizer`: the PPO epochs' forward (loss included), backward and
  optimiser steps;
- `other`: the rest of the iteration (rewards, advantages, bookkeeping, logging).
Each timer synchronises CUDA when the run is on a GPU.

The floors. `gemm_gflops` is a plain fp32 GEMM's rate on this machine and thread count, measured here: a
[rows × d] × [d × 4d] product with the weights cycled through a buffer larger than the caches (as a model's weights
stream), the best of three passes, once at the learner's row count (a minibatch's tokens) and once at the decode
step's (the batch).
`learner_gflop` counts the learner's matrix-product FLOPs on each sequence's own tokens (the floor: no padding): per
forward 2·N·n for the N non-embedding weights and n tokens, 2·d·V per LM-head column kept (response + 1),
4·layers·d·n² for attention; a backward is twice its forward. `learner_padded_gflop` counts the same on the padded
rectangles the minibatches multiply (one per length group under `hardware.length_groups`). `learner_floor_s` =
that ÷ the GEMM rate, and `learner_vs_floor` is (forward + backward) ÷ floor — 1.0 would mean nothing but matrix
products. `sample_floor_s` is the same for the whole generation: each call's prompt forward (rows × padded prompt
tokens, at the large-row rate) plus its decode steps (2·N + 2·d·V FLOPs per row and step, attention over the cache, at
the batch's rate); `sample_vs_floor` is `sample` ÷ that. `s_per_decode_step` divides `sample` by the steps (the prompt
forward included), and `decode_floor_s` is one step's matrix products alone, so their ratio `decode_vs_floor` sets a
step plus a share of the prompt forward against a step's products. Per decode step proper (lean loop only; null under
`generate`): `prefill_s` is the time of the loops' prompt forwards, `decode_step_s` = (`sample` − `prefill_s`) ÷ the
decode forwards (`decode_forwards_per_iter`: a loop of n tokens runs n − 1 after its prompt forward; its n samplings
and its setup count here), `decode_step_floor_s` the mean matrix products of those forwards (cache attention
included, at the batch's rate), and `decode_step_vs_floor` their ratio. `padding` is the share of the learner's
forward tokens that are padding.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _benchmark_overrides() -> list[str]:
    """`scripts/benchmark.py`'s settings (no intermediate evaluation or checkpoint, ...), read from it, so that the
    phases are measured on the run the benchmark times."""
    spec = importlib.util.spec_from_file_location("benchmark", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.BENCH_OVERRIDES)


BENCH_OVERRIDES = _benchmark_overrides()


class Clock:
    """Seconds and counts per phase; a phase nested in another is not counted twice (`other` is the remainder)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.seconds, self.counts, self.depth = cuda, collections.Counter(), collections.Counter(), 0

    @contextlib.contextmanager
    def phase(self, name: str):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        start, outer = time.perf_counter(), self.depth == 0
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.cuda:
                torch.cuda.synchronize()
            if outer:
                self.seconds[name] += time.perf_counter() - start
                self.counts[name] += 1

    def wrap(self, owner, attribute: str, name: str, counter=None) -> None:
        """Time `owner.attribute` as phase `name`; `counter(result, *args, **kwargs)` sees every call."""
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.phase(name):
                result = original(*args, **kwargs)
            if counter is not None:
                counter(result, *args, **kwargs)
            return result

        setattr(owner, attribute, timed)


def gemm_gflops(rows: int, d: int, megabytes: int = 512, repeat: int = 3) -> float:
    """fp32 GEMM rate [rows × d] × [d × 4d], weights cycled through `megabytes` of buffers (no cache reuse): the
    best of `repeat` passes, since a floor is what the machine can do (one pass moved by 16 % between two runs)."""
    import torch

    n = max(2, megabytes * 2**20 // (4 * d * 4 * d))
    weights = [torch.randn(d, 4 * d) for _ in range(n)]
    x = torch.randn(rows, d)
    for w in weights[:2]:
        x @ w
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for w in weights:
            x @ w
        best = min(best, time.perf_counter() - start)
    return 2 * rows * d * 4 * d * n / best / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="cory", help="algorithm config (default cory)")
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first iterations (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=bench_gpt2_small")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    import torch
    from hydra import compose, initialize_config_dir

    from cory import trainer as trainer_module
    from cory.ppo import actor, backends, decode, learner, rollout, trainee
    from cory.train import train

    if args.threads:
        torch.set_num_threads(args.threads)
    total = args.warmup + args.iterations
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "cory" / "conf")):
        cfg = compose(
            "train",
            overrides=[*args.overrides, *BENCH_OVERRIDES, f"algorithm={args.algorithm}", f"iterations={total}"],
        )
    clock = Clock(cuda=str(cfg.hardware.device).startswith("cuda"))
    shapes = {"learner": [], "decode_chunks": []}  # per call: the learner forward's and the decode loop's shapes

    def count_forward(result, model, prompt_ids, prompt_mask, response_ids, response_mask, with_values, groups=1):
        if torch.is_grad_enabled():  # the learner's forward, or the one the rollout keeps for it (no-grad: rollout)
            if "config" not in shapes:
                inner = getattr(model, "module", model)  # an engine's wrapped module
                shapes["config"] = getattr(inner, "pretrained_model", inner).config.get_text_config()
            prompts, responses = prompt_mask.sum(1).tolist(), response_mask.sum(1).tolist()
            split = rollout.length_groups(prompts, responses, groups)  # the rectangles the forward multiplies
            if len(split) == 1:
                rectangles = [(prompt_ids.shape[0], prompt_ids.shape[1], response_ids.shape[1])]
            else:
                rectangles = [(len(g), *rollout.group_widths(g, prompts, responses)) for g in split]
            shapes["learner"].append((rectangles, [a + b for a, b in zip(prompts, responses)], responses))

    def count_decode(
        responses, model, tokenizer, prompt_ids, max_new_tokens, generation_kwargs, device, batch_size, *args
    ):
        for start in range(0, len(responses), batch_size):  # one decode loop per chunk, as long as its longest row
            chunk = responses[start : start + batch_size]
            width = max(len(p) for p in prompt_ids[start : start + batch_size])  # the left-padded prompt
            shapes["decode_chunks"].append((len(chunk), width, max(len(r) for r in chunk)))  # rows, width, steps

    clock.wrap(backends, "generate_ids", "sample", count_decode)
    prompt_forwards = {"s": 0.0, "calls": 0}  # the lean loop's prompt forwards (the first model call of each loop)
    original_decode = decode.decode

    def timed_decode(model, *args, **kwargs):
        return original_decode(_FirstCallTimer(model, prompt_forwards, clock.cuda), *args, **kwargs)

    decode.decode = timed_decode
    clock.wrap(actor, "score_forward", "rollout_forward")
    clock.wrap(actor, "forward_logits", "learner_forward", count_forward)  # the kept forward (grad enabled)
    clock.wrap(learner, "forward_logits", "learner_forward", count_forward)
    clock.wrap(trainee.Trainee, "backward", "learner_backward")
    clock.wrap(trainee.Trainee, "step", "optimizer")

    # each iteration's clock totals and counts at its start and end, to keep only the timed iterations' own time
    spans: list[tuple[tuple, tuple]] = []
    original_iteration = trainer_module.Trainer._iteration

    def mark() -> tuple:
        return (
            time.perf_counter(),
            dict(clock.seconds),
            len(shapes["learner"]),
            len(shapes["decode_chunks"]),
            prompt_forwards["s"],
            prompt_forwards["calls"],
        )

    def timed_iteration(self, *a, **kw):
        start = mark()
        result = original_iteration(self, *a, **kw)
        spans.append((start, mark()))
        return result

    trainer_module.Trainer._iteration = timed_iteration
    try:
        with tempfile.TemporaryDirectory(prefix="cory-phases-") as run_dir:
            train(cfg, Path(run_dir))
            rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    finally:
        trainer_module.Trainer._iteration, decode.decode = original_iteration, original_decode
    timed = spans[args.warmup :]
    if not timed:
        raise SystemExit("error: no timed iteration (raise --iterations)")
    iteration_s = [end[0] - start[0] for start, end in timed]
    phases = {}
    for name in ("sample", "rollout_forward", "learner_forward", "learner_backward", "optimizer"):
        phases[name] = statistics.fmean(end[1].get(name, 0.0) - start[1].get(name, 0.0) for start, end in timed)
    phases["other"] = statistics.fmean(iteration_s) - sum(phases.values())

    # the matrix-product FLOPs of the timed iterations' learner forwards and decode steps
    text = _text_config(shapes["config"])
    d, layers, vocab, n_params = text["d"], text["layers"], text["vocab"], text["non_embedding"]
    forwards = [f for start, end in timed for f in shapes["learner"][start[2] : end[2]]]

    def forward_flop(lengths: list[int], kept: list[int]) -> float:
        """Matrix-product FLOPs of one forward over sequences of `lengths` tokens, `kept` LM-head columns each."""
        return sum(2 * n_params * n + 4 * layers * d * n * n + 2 * d * vocab * k for n, k in zip(lengths, kept))

    learner_flop, padded_flop, real, padded = 0.0, 0.0, 0, 0
    for rectangles, lengths, responses in forwards:
        # forward + a backward of twice its cost; the floor counts each sequence's own tokens, the padded count
        # what the batch's rectangles multiply (one, or one per length group: `hardware.length_groups`)
        learner_flop += 3 * forward_flop(lengths, [r + 1 for r in responses])
        for b, p, t in rectangles:
            padded_flop += 3 * forward_flop([p + t] * b, [t + 1] * b)
            padded += b * (p + t)
        real += sum(lengths)
    learner_flop, padded_flop = learner_flop / len(timed), padded_flop / len(timed)
    chunks = [c for start, end in timed for c in shapes["decode_chunks"][start[3] : end[3]]]
    steps = sum(c[2] for c in chunks) / len(timed)
    batch = max((c[0] for c in chunks), default=1)
    mb_rows = max((b * (p + t) for rectangles, _, _ in forwards for b, p, t in rectangles), default=1)
    rate_learner, rate_decode = gemm_gflops(mb_rows, d), gemm_gflops(batch, d)
    learner_s = phases["learner_forward"] + phases["learner_backward"]
    floor_s = learner_flop / rate_learner / 1e9
    decode_flop = 2 * (n_params + d * vocab) * batch
    # the whole generation's matrix products: each chunk's prompt forward (at the learner's large-row rate: it is
    # one forward over rows × width tokens, one LM-head column each) and its decode steps (at the batch's rate)
    sample_floor, step_flop = 0.0, 0.0
    for n_rows, width, steps_c in chunks:
        prefill = n_rows * (2 * n_params * width + 4 * layers * d * width * width + 2 * d * vocab)
        decoding = sum(n_rows * (2 * (n_params + d * vocab) + 4 * layers * d * (width + s)) for s in range(1, steps_c))
        sample_floor += prefill / rate_learner / 1e9 + decoding / rate_decode / 1e9
        step_flop += decoding
    sample_floor /= len(timed)
    s_per_step = phases["sample"] / steps if steps else float("nan")
    decode_floor = decode_flop / rate_decode / 1e9
    # per decode step proper: the prompt forwards taken out of `sample`, over the loops' decode forwards
    prefill_s = statistics.fmean(end[4] - start[4] for start, end in timed)
    lean = sum(end[5] - start[5] for start, end in timed) == len(chunks)  # every chunk ran the lean loop
    step_forwards = sum(steps_c - 1 for _, _, steps_c in chunks)
    step_floor = step_flop / step_forwards / rate_decode / 1e9 if step_forwards else float("nan")
    step_s = (phases["sample"] - prefill_s) * len(timed) / step_forwards if lean and step_forwards else None
    report = {
        "algorithm": args.algorithm,
        "threads": torch.get_num_threads(),
        "iterations_timed": len(timed),
        "s_per_iter": statistics.fmean(iteration_s),
        "phases_s": phases,  # unrounded: they add up to `s_per_iter` (`other` is the remainder)
        "phases_share": {k: round(v / statistics.fmean(iteration_s), 4) for k, v in phases.items()},
        "tokens_per_iter": statistics.fmean(
            sum(v for k, v in r.items() if k.startswith("train/") and k.endswith("/tokens"))
            for r in [r for r in rows if "time/iteration_s" in r][args.warmup :]
        ),
        "padding": 1 - real / padded if padded else 0.0,
        "gemm_gflops": {"learner_rows": mb_rows, "learner": rate_learner, "decode_rows": batch, "decode": rate_decode},
        "learner_gflop": learner_flop / 1e9,
        "learner_padded_gflop": padded_flop / 1e9,
        "learner_floor_s": floor_s,
        "learner_padded_floor_s": padded_flop / rate_learner / 1e9,
        "learner_achieved_gflops": learner_flop / learner_s / 1e9 if learner_s else float("nan"),
        "learner_vs_floor": learner_s / floor_s if floor_s else float("nan"),
        "decode_steps_per_iter": steps,
        "s_per_decode_step": s_per_step,
        "decode_floor_s": decode_floor,
        "decode_vs_floor": s_per_step / decode_floor,
        "prefill_s": prefill_s if lean else None,
        "decode_forwards_per_iter": step_forwards / len(timed),
        "decode_step_s": step_s,
        "decode_step_floor_s": step_floor,
        "decode_step_vs_floor": step_s / step_floor if step_s is not None else None,
        "sample_floor_s": sample_floor,
        "sample_vs_floor": phases["sample"] / sample_floor if sample_floor else float("nan"),
    }
    print(json.dumps(report, indent=2))
    return 0


class _FirstCallTimer:
    """The model as the lean decode loop sees it, timing its first call (the prompt forward) into `total`."""

    def __init__(self, model, total: dict, cuda: bool) -> None:
        self._model, self._total, self._cuda, self._first = model, total, cuda, True

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        if not self._first:
            return self._model(*args, **kwargs)
        import torch

        self._first = False
        if self._cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = self._model(*args, **kwargs)
        if self._cuda:
            torch.cuda.synchronize()
        self._total["s"] += time.perf_counter() - start
        self._total["calls"] += 1
        return out


def _text_config(config) -> dict:
    """Hidden size, layers, vocabulary and non-embedding parameter count of the trained model's text config."""
    d = config.hidden_size
    layers = config.num_hidden_layers
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head = d // config.num_attention_heads
    gated = 3 if getattr(config, "model_type", "") != "gpt2" else 2  # SwiGLU has three MLP matrices
    attention = d * d * 2 + 2 * d * kv * head
    return {
        "d": d,
        "layers": layers,
        "vocab": config.vocab_size,
        "non_embedding": layers * (attention + gated * d * inner),
    }


if __name__ == "__main__":
    sys.exit(main())
