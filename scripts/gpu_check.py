"""The one GPU check a person runs once on a CUDA machine (`make gpu-check`, about 2–3 minutes on one GPU).

    pip install -r requirements.txt -r requirements-gpu.txt   # bitsandbytes, vLLM (and a CUDA torch)
    python scripts/gpu_check.py [--out DIR] [--skip vllm,ddp,zero2,zero3,fsdp] [--ratio "OVERRIDES"] [overrides]

Checks, each reported as one row of a table (and all of it as JSON in `DIR/gpu_check.json`; `DIR` defaults to
`$OUT`, else `outputs/gpu_check/<time>`):

1. `lora_4bit_ppo`, `lora_4bit_cory`: PPO and CORY for 2 iterations on a small Llama (4 layers, 512 wide, byte
   vocabulary, built in memory) with real bitsandbytes NF4 weights and LoRA adapters: peak GPU memory, s/iteration,
   every logged number finite.
2. `bf16_vs_fp32`: the same weights and tokens scored in fp32 and with bf16 autocast on IMDB's shapes (a
   GPT-2-small-sized model, 256 prompts of 2–8 tokens, responses of 4–15): the largest |Δ log π| and the largest
   relative change of a sequence's KL (why the paper presets pin fp32, docs/method.md §5).
3. `vllm_vs_hf`: the vLLM rollout backend against Hugging Face `generate`, same prompts, greedy, fp32 in both, on
   SmolLM2-135M (the tiny Llama when its files are not available): how many responses have identical text.
4. `ddp`: with more than one visible GPU, a smoke run launched data-parallel on all of them (`accelerate launch`).
   `zero2`, `zero3`, `fsdp`: a CORY smoke run (two fully fine-tuned agents) under DeepSpeed ZeRO-2 / ZeRO-3 /
   PyTorch FSDP2 with bf16 on every visible GPU (`torchrun`; one GPU is a group of one): iterations done,
   s/iteration, peak GPU memory of rank 0, every logged number finite.
5. `cory_ppo_ratio`: `scripts/benchmark.py` at the paper's batch of 256 (SmolLM2-135M on IMDB, 16 new tokens, one
   minibatch of 256): CORY's s/iteration over PPO's, and both peaks of GPU memory. `--ratio "..."` replaces those
   overrides (another model or task at the same batch). Without vLLM installed its row says so and is skipped.

Without CUDA it prints one line and exits 0 (nothing to check). Exit code 1 when a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "gpu-check: no CUDA device on this machine, nothing to check (run `make gpu-check` on a GPU machine)"
NO_VLLM = "vllm is not installed (pip install -r requirements-gpu.txt)"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
# a small Llama (4 layers, 512 wide, ~13M parameters): big enough for the real 4-bit kernels
SMALL_LLAMA = [
    "model.hidden_size=512",
    "model.intermediate_size=1376",
    "model.num_hidden_layers=4",
    "model.num_attention_heads=8",
    "model.num_key_value_heads=8",
]
RUN = ["iterations=2", "eval_every=0", "num_eval=8", "num_eval_final=8", "save_every=0", "progress=false"]
# the paper's batch (256 queries, one minibatch of 256) on the offline default model and task
RATIO = ["experiment=quickstart", "hardware=gpu", "batch_size=256", "algorithm.agent.mini_batch_size=256",
         "task.max_new_tokens=[16,16]"]  # fmt: skip


def _python(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = os.environ | OFFLINE
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"`python {' '.join(args[:3])} ...` failed: {out.stderr.strip().splitlines()[-1:]}")
    return out


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------------ the checks
def train_runs(out: Path, hardware: str = "gpu", four_bit: bool = True, extra: list[str] = ()) -> dict[str, dict]:
    """PPO and CORY, 2 iterations each, 4-bit + LoRA on the small Llama: peak MiB, s/iteration, all finite."""
    results = {}
    for algorithm in ("ppo", "cory"):
        run_dir = out / f"lora_4bit_{algorithm}"
        _python(
            [
                "-m",
                "cory.train",
                "experiment=gsm8k_smoke",
                f"hardware={hardware}",
                f"model.load_in_4bit={str(four_bit).lower()}",
                f"algorithm={algorithm}",
                *RUN,
                *SMALL_LLAMA,
                *extra,
                f"hydra.run.dir={run_dir}",
            ]
        )
        rows = _rows(run_dir)
        steps = [r for r in rows if "time/iteration_s" in r]
        numbers = [v for r in rows for v in r.values() if isinstance(v, float)]
        results[f"lora_4bit_{algorithm}"] = {
            "peak_mb": max(r["memory/peak_mb"] for r in steps),
            "s_per_iter": sum(r["time/iteration_s"] for r in steps) / len(steps),
            "iterations": len(steps),
            "all_finite": all(math.isfinite(v) for v in numbers),
        }
    return results


def bf16_vs_fp32() -> dict:
    """fp32 and bf16-autocast scores of the same tokens on IMDB's shapes (GPT-2-small-sized random model)."""
    import copy

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from cory.models import byte_tokenizer, make_reference
    from cory.ppo.learner import PPOConfig, agent_on

    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id))
    ref = make_reference(model)
    with torch.no_grad():  # a policy a little away from π0, so that the KL is not 0
        for p in model.parameters():
            p.add_(0.02 * p.abs().mean() * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (int(n),), generator=g) for n in torch.randint(2, 9, (256,), generator=g)]
    responses = [torch.randint(0, 256, (int(n),), generator=g) for n in torch.randint(4, 16, (256,), generator=g)]
    scored = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        agent = agent_on(
            "llm1", copy.deepcopy(model), copy.deepcopy(ref).cuda(), tokenizer, PPOConfig.from_yaml(), seed=0,
            device="cuda", autocast_dtype=dtype,
        )  # fmt: skip
        scored[name] = agent.actor.score_tokens(prompts, responses)
    fp32, bf16 = scored["fp32"], scored["bf16"]
    mask = fp32.response_mask.bool()
    kl32, kl16 = fp32.kls.sum(-1), bf16.kls.sum(-1)
    return {
        "max_abs_dlogp": (bf16.logprobs - fp32.logprobs)[mask].abs().max().item(),
        "max_rel_dkl_seq": ((kl16 - kl32).abs() / kl32).max().item(),
        "mean_kl_seq_fp32": kl32.mean().item(),
    }


def vllm_vs_hf(out: Path) -> dict:
    """Greedy responses of the vLLM backend and of Hugging Face `generate`, same prompts and weights, fp32."""
    import torch

    from cory.models import build_tiny_llama, load_smollm2_135m
    from cory.policy import Backbone
    from cory.ppo.backends import HFBackend
    from cory.ppo.rollout import encode_prompts
    from cory.ppo.vllm_backend import VLLMBackend, VLLMEngine
    from cory.settings import RolloutSettings

    try:
        model, tokenizer = load_smollm2_135m(str(out / "cache"))
        name = "smollm2_135m"
    except Exception:  # noqa: BLE001 - its files are an optional asset: fall back to the in-memory model
        model, tokenizer = build_tiny_llama(hidden_size=256, intermediate_size=512)
        name = "tiny_llama"
    prompts = [
        "This movie was",
        "The plot of the film",
        "I rented this DVD because",
        "Honestly, the acting",
        "Question: what is 12 plus 30?\nAnswer:",
        "Once upon a time",
    ]
    device = torch.device("cuda")
    backbone = Backbone(model, tokenizer, None, add_special_tokens=False, device=device)
    policy = backbone.policy("llm1", init_seed=0)
    ids = encode_prompts(tokenizer, prompts)
    engine = VLLMEngine(backbone, RolloutSettings(backend="vllm", dtype="float32"), device, seed=0)
    texts = {}
    for backend_name, backend in (("hf", HFBackend(policy, tokenizer, device)), ("vllm", VLLMBackend(engine, "llm1"))):
        backend.sync_weights(policy)
        start = time.perf_counter()
        responses = backend.generate(ids, 32, {"do_sample": False}, batch_size=len(prompts))
        seconds = time.perf_counter() - start
        texts[backend_name] = (tokenizer.batch_decode(responses, skip_special_tokens=True), seconds)
    engine.close()
    same = sum(a == b for a, b in zip(texts["hf"][0], texts["vllm"][0]))
    return {
        "model": name,
        "identical": same,
        "prompts": len(prompts),
        "hf_s": texts["hf"][1],
        "vllm_s": texts["vllm"][1],
        "mismatches": [[a, b] for a, b in zip(texts["hf"][0], texts["vllm"][0]) if a != b],
    }


def ddp(out: Path, gpus: int) -> dict:
    """A data-parallel smoke run on every visible GPU."""
    run_dir = out / "ddp"
    args = ["-m", "accelerate.commands.launch", "--num_processes", str(gpus), "-m", "cory.train"]
    _python([*args, "experiment=smoke", "hardware=multi_gpu", *RUN, f"hydra.run.dir={run_dir}"])
    steps = [r for r in _rows(run_dir) if "time/iteration_s" in r]
    return {"processes": gpus, "iterations": len(steps), "s_per_iter": sum(r["time/iteration_s"] for r in steps) / 2}


SHARDED = {"zero2": "deepspeed_zero2", "zero3": "deepspeed_zero3", "fsdp": "fsdp"}  # check → hardware option


def sharded(out: Path, gpus: int, name: str) -> dict:
    """CORY's smoke run under the sharding engine `name` (`SHARDED`; bf16) on every visible GPU."""
    run_dir = out / name
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus), "-m", "cory.train"]
    overrides = ["experiment=smoke", "algorithm=cory", "model.lora.enabled=false", f"hardware={SHARDED[name]}"]
    _python([*args, *overrides, *RUN, f"hydra.run.dir={run_dir}"])
    rows = _rows(run_dir)
    steps = [r for r in rows if "time/iteration_s" in r]
    return {
        "processes": gpus,
        "iterations": len(steps),
        "s_per_iter": sum(r["time/iteration_s"] for r in steps) / max(len(steps), 1),
        "peak_mb": max((r["memory/peak_mb"] for r in steps), default=0.0),
        "all_finite": all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)),
    }


def cory_ppo_ratio(overrides: list[str] = RATIO) -> dict:
    """`scripts/benchmark.py` at batch 256: CORY's and PPO's median s/iteration, their ratio and peak memory."""
    out = _python(["scripts/benchmark.py", "--iterations", "2", "--warmup", "1", *overrides], timeout=900)
    result = json.loads(out.stdout)
    return {
        "overrides": overrides,
        "ppo_s_per_iter": result["ppo"]["s_per_iter"],
        "cory_s_per_iter": result["cory"]["s_per_iter"],
        "ratio": result["ratio"],
        "ppo_peak_mb": result["ppo"]["peak_mb"],
        "cory_peak_mb": result["cory"]["peak_mb"],
        "tokens_per_iter": [result["ppo"]["tokens_per_iter"], result["cory"]["tokens_per_iter"]],
    }


# ------------------------------------------------------------------------------------------------------ the report
def summary(name: str, result: dict) -> str:
    """One readable cell per check."""
    if result.get("status") == "skipped":
        return f"skipped: {result['reason']}"
    if result.get("status") == "failed":
        return f"FAILED: {result['error']}"
    if name.startswith("lora_4bit"):
        finite = "finite" if result["all_finite"] else "NON-FINITE"
        return f"{result['peak_mb']:.0f} MiB peak, {result['s_per_iter']:.2f} s/iteration, {finite}"
    if name == "bf16_vs_fp32":
        return f"max |Δlog π| {result['max_abs_dlogp']:.3g}, max rel |ΔKL_seq| {result['max_rel_dkl_seq']:.3g}"
    if name == "vllm_vs_hf":
        return f"{result['identical']}/{result['prompts']} identical greedy texts ({result['model']})"
    if name == "ddp":
        return f"{result['processes']} processes, {result['iterations']} iterations, {result['s_per_iter']:.2f} s/it"
    if name in SHARDED:
        finite = "finite" if result["all_finite"] else "NON-FINITE"
        speed = f"{result['iterations']} iterations, {result['s_per_iter']:.2f} s/it"
        memory = f", {result['peak_mb']:.0f} MiB peak" if "peak_mb" in result else ""  # older runs did not say
        return f"{result['processes']} processes, {speed}{memory}, {finite}"
    if name == "cory_ppo_ratio":
        seconds = f"{result['cory_s_per_iter']:.2f} / {result['ppo_s_per_iter']:.2f} s"
        memory = f"peak {result['cory_peak_mb']:.0f} / {result['ppo_peak_mb']:.0f} MiB"
        return f"CORY/PPO {result['ratio']:.2f} ({seconds}; {memory})"
    return json.dumps(result)


def table(results: dict[str, dict], device: str) -> str:
    """One row per check, under the device's name."""
    width = max(len(name) for name in results)
    lines = [f"gpu-check on {device}", *(f"  {name:<{width}}  {summary(name, r)}" for name, r in results.items())]
    return "\n".join(lines)


def report(results: dict[str, dict], out: Path, device: str) -> str:
    """The table, printed by `main`, and `out/gpu_check.json` (the device and every check's numbers)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps({"device": device, "checks": results}, indent=2))
    return table(results, device)


def run_check(check: Callable[[], dict]) -> dict:
    """A check's numbers, or how it failed (one line): one failure never hides the other checks."""
    try:
        return check()
    except Exception as err:  # noqa: BLE001 - reported in the table and the JSON, exit code 1
        return {"status": "failed", "error": " ".join(str(err).split())[:300] or type(err).__name__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder of the JSON and the runs (default $OUT)")
    parser.add_argument(
        "--skip", default="", help="comma-separated checks to leave out: lora,bf16,vllm,ddp,zero2,zero3,fsdp,ratio"
    )
    parser.add_argument(
        "--ratio",
        default=None,
        help="Hydra overrides of the batch-256 timing, one string (default: " + " ".join(RATIO) + ")",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the 4-bit runs")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    default = ROOT / "outputs" / "gpu_check" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out = args.out or Path(os.environ.get("OUT") or default)
    skip = set(filter(None, args.skip.split(",")))
    gpus = torch.cuda.device_count()
    device = f"{gpus} × {torch.cuda.get_device_name(0)}"
    results: dict[str, dict] = {}
    if "lora" not in skip:
        lora = run_check(lambda: train_runs(out, extra=args.overrides))
        results |= lora if "status" not in lora else {"lora_4bit_ppo": lora, "lora_4bit_cory": lora}
    if "bf16" not in skip:
        results["bf16_vs_fp32"] = run_check(bf16_vs_fp32)
    if "vllm" not in skip and importlib.util.find_spec("vllm") is None:
        results["vllm_vs_hf"] = {"status": "skipped", "reason": NO_VLLM}
    elif "vllm" not in skip:
        results["vllm_vs_hf"] = run_check(lambda: vllm_vs_hf(out))
    if "ddp" not in skip:
        one = {"status": "skipped", "reason": "one GPU visible"}
        results["ddp"] = run_check(lambda: ddp(out, gpus)) if gpus > 1 else one
    for name in SHARDED:
        if name not in skip:
            results[name] = run_check(lambda name=name: sharded(out, gpus, name))
    if "ratio" not in skip:
        ratio = shlex.split(args.ratio) if args.ratio is not None else RATIO
        results["cory_ppo_ratio"] = run_check(lambda: cory_ppo_ratio(ratio))
    print(report(results, out, device))
    print(f"gpu-check: details in {out / 'gpu_check.json'}")
    return int(any(r.get("status") == "failed" for r in results.values()))


if __name__ == "__main__":
    sys.exit(main())
