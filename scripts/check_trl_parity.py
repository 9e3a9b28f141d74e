"""Numerical parity of `cory.agent.Agent.learn` with TRL 0.11.4's `PPOTrainer.step` (docs/method.md §2).

TRL ≥ 0.12 has no step-API PPO, so the oracle lives in its own virtual environment:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 pytest
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled \
        PYTHONPATH=. .venv-trl/bin/python scripts/check_trl_parity.py

Both learners start from the same tiny random GPT-2 (`cory.models.build_tiny_gpt2`) and the same value-head
weights, see the same fixed query/response tokens and scores, and draw minibatch permutations from the same
numpy seed. After every step the script compares every policy and value-head parameter, the KL coefficient
and the step statistics, prints a JSON report and exits non-zero when a case fails.

TRL 0.11.4's own bug worked around here: `RunningMoments.update` stores `mean`/`std` as python floats, while
`PPOTrainer.step` calls `self.running.std.to(...)` on them (AttributeError whenever `use_score_scaling=True`).
The script re-exposes them as 0-d float64 tensors between updates; the update arithmetic is TRL's own.

Tolerances: 1e-5 absolute on every parameter except the attention key bias; 1e-4 relative (1e-6 absolute
floor) on statistics. The key bias (the middle third of each `attn.c_attn.bias`) has an analytically zero
gradient, since softmax ignores a constant added to every score of a query row; its gradient is pure float
noise, which Adam's normalisation turns into steps of up to ~lr, so it is compared separately at 1e-4.

`run_case(**settings) -> dict` is importable (tests/test_trl_parity.py loads this file by path).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import warnings
from importlib import metadata

for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
}.items():
    os.environ.setdefault(_k, _v)

TRL_VERSION_PREFIX = "0.11."
INSTALL_HINT = (
    "install trl==0.11.4 in a separate venv: python3 -m venv .venv-trl && "
    '.venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 pytest; then run '
    "PYTHONPATH=. .venv-trl/bin/python scripts/check_trl_parity.py (trl>=0.12 has no PPOTrainer.step)"
)

# (TRL stat key, our `Agent.learn` key). TRL logs the *unscaled* value loss (`ppo/loss/value` = L_vf, not
# vf_coef·L_vf), and zeroes both losses of a minibatch that trips the ratio threshold.
STAT_PAIRS = [
    ("objective/kl", "kl"),
    ("objective/kl_coef", "kl_coef"),
    ("objective/entropy", "sampled_entropy"),
    ("ppo/mean_non_score_reward", "mean_non_score_reward"),
    ("ppo/mean_scores", "scaled_score"),
    ("ppo/loss/policy", "policy_loss"),
    ("ppo/loss/value", "value_loss"),
    ("ppo/policy/clipfrac", "clipfrac"),
    ("ppo/policy/approxkl", "approx_kl"),
    ("ppo/policy/policykl", "policykl"),
    ("ppo/policy/entropy", "train_entropy"),
    ("ppo/val/clipfrac", "value_clipfrac"),
]

DEFAULT_CASES: list[dict] = [
    {
        "name": "full_8-8-1",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 8,
        "gradient_accumulation_steps": 1,
    },
    {
        "name": "full_8-2-2",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 2,
        "gradient_accumulation_steps": 2,
    },
    {
        "name": "full_8-4-1",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 4,
        "gradient_accumulation_steps": 1,
    },
    {"name": "kl_8-8-1", "kl_penalty": "kl", "batch_size": 8, "mini_batch_size": 8, "gradient_accumulation_steps": 1},
    {"name": "kl_8-2-2", "kl_penalty": "kl", "batch_size": 8, "mini_batch_size": 2, "gradient_accumulation_steps": 2},
    {"name": "kl_8-4-1", "kl_penalty": "kl", "batch_size": 8, "mini_batch_size": 4, "gradient_accumulation_steps": 1},
    {
        "name": "full_8-4-1_scorenorm",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "use_score_scaling": True,
        "use_score_norm": True,
    },
    {
        "name": "kl_8-2-2_scorescale",
        "kl_penalty": "kl",
        "batch_size": 8,
        "mini_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "use_score_scaling": True,
        "use_score_norm": False,
    },
    {
        "name": "full_8-2-2_ratio_threshold",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "ratio_threshold": 1.0001,
    },
]

# Not part of the default grid (`--extra`): TRL checks early stopping once per epoch, after all its optimiser
# steps, on the last minibatch's policy KL.
EXTRA_CASES: list[dict] = [
    {
        "name": "full_8-2-2_early_stop",
        "kl_penalty": "full",
        "batch_size": 8,
        "mini_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "early_stopping": True,
        "target_kl": 1e-4,
    },
]


def trl_status() -> tuple[bool, str]:
    """(usable, reason): whether trl 0.11.x is installed in this interpreter."""
    try:
        version = metadata.version("trl")
    except metadata.PackageNotFoundError:
        return False, f"trl is not installed; {INSTALL_HINT}"
    if not version.startswith(TRL_VERSION_PREFIX):
        return False, f"trl {version} is installed but the oracle needs 0.11.x; {INSTALL_HINT}"
    return True, version


# ---------------------------------------------------------------------------------------------------------------------
# fixed data
# ---------------------------------------------------------------------------------------------------------------------
def make_batches(n_steps: int, batch_size: int, eos_id: int, data_seed: int):
    """Per step: queries and responses (lists of 1-D LongTensors, ragged) and float scores.

    Every other response ends with EOS; the others stop mid-text (as if they hit max_new_tokens).
    """
    import numpy as np
    import torch

    rng = np.random.RandomState(data_seed)
    batches = []
    for _ in range(n_steps):
        queries, responses = [], []
        for i in range(batch_size):
            q_len = int(rng.randint(2, 10))
            r_len = int(rng.randint(1, 13))
            queries.append(torch.tensor(rng.randint(0, 256, size=q_len), dtype=torch.long))
            resp = rng.randint(0, 256, size=r_len)
            if i % 2 == 0:
                resp[-1] = eos_id
            responses.append(torch.tensor(resp, dtype=torch.long))
        scores = (rng.randn(batch_size) * 2.0 + 0.5).astype(np.float32)
        batches.append((queries, responses, scores))
    return batches


# ---------------------------------------------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------------------------------------------
def _patch_running_moments(running) -> None:
    """Make TRL 0.11.4's score scaling runnable (its step calls `.to()` on the floats its update stores)."""
    import torch

    original = running.update

    def update(xs):
        running.mean, running.std = float(running.mean), float(running.std)
        out = original(xs)
        running.mean = torch.tensor(running.mean, dtype=torch.float64)
        running.std = torch.tensor(running.std, dtype=torch.float64)
        return out

    running.update = update


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def run_case(
    name: str = "case",
    kl_penalty: str = "full",
    batch_size: int = 8,
    mini_batch_size: int = 8,
    gradient_accumulation_steps: int = 1,
    use_score_scaling: bool = False,
    use_score_norm: bool = False,
    whiten_rewards: bool = False,
    ratio_threshold: float = 10.0,
    early_stopping: bool = False,
    target_kl: float = 1.0,
    ppo_epochs: int = 4,
    learning_rate: float = 1e-3,
    init_kl_coef: float = 0.3,
    kl_target: float = 6.0,
    kl_horizon: float = 10000.0,
    n_steps: int = 3,
    seed: int = 7,
    data_seed: int = 123,
    model_seed: int = 0,
    param_tol: float = 1e-5,
    key_bias_tol: float = 1e-4,
    stat_rtol: float = 1e-4,
    stat_atol: float = 1e-6,
) -> dict:
    """Run TRL and `Agent.learn` side by side for `n_steps` steps; return diffs and `passed`."""
    ok, why = trl_status()
    if not ok:
        raise RuntimeError(why)

    import numpy as np
    import torch
    import trl
    from trl import AutoModelForCausalLMWithValueHead, PPOTrainer
    from trl import PPOConfig as TRLPPOConfig

    from cory.agent import Agent
    from cory.agent import PPOConfig as CoryPPOConfig
    from cory.models import build_tiny_gpt2, make_reference

    torch.set_num_threads(min(4, torch.get_num_threads()))
    base, tokenizer = build_tiny_gpt2(seed=model_seed)
    base.eval()
    tokenizer.padding_side = "right"  # TRL pads query+response on this side; GPT-2's default

    # ---- TRL
    trl_model = AutoModelForCausalLMWithValueHead.from_pretrained(copy.deepcopy(base))
    trl_ref = trl.create_reference_model(trl_model)
    trl_config = TRLPPOConfig(
        exp_name="check_trl_parity",
        batch_size=batch_size,
        mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        ppo_epochs=ppo_epochs,
        learning_rate=learning_rate,
        init_kl_coef=init_kl_coef,
        adap_kl_ctrl=True,
        target=kl_target,
        horizon=kl_horizon,
        kl_penalty=kl_penalty,
        use_score_scaling=use_score_scaling,
        use_score_norm=use_score_norm,
        whiten_rewards=whiten_rewards,
        ratio_threshold=ratio_threshold,
        early_stopping=early_stopping,
        target_kl=target_kl,
        seed=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = PPOTrainer(config=trl_config, model=trl_model, ref_model=trl_ref, tokenizer=tokenizer)
    _patch_running_moments(trainer.running)

    # ---- ours, with TRL's value-head weights
    cfg = CoryPPOConfig.from_yaml(  # conf/algorithm/ppo.yaml's learner (TRL's defaults) with this case's values
        learning_rate=learning_rate,
        init_kl_coef=init_kl_coef,
        adaptive_kl=True,
        kl_target=kl_target,
        kl_horizon=kl_horizon,
        kl_penalty=kl_penalty,
        ppo_epochs=ppo_epochs,
        mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        ratio_threshold=ratio_threshold,
        use_score_scaling=use_score_scaling,
        use_score_norm=use_score_norm,
        whiten_rewards=whiten_rewards,
        early_stopping=early_stopping,
        target_kl=target_kl,
    )
    agent = Agent("ours", copy.deepcopy(base), make_reference(base), tokenizer, cfg, seed=seed)
    with torch.no_grad():
        agent.policy.v_head.summary.weight.copy_(trl_model.v_head.summary.weight)
        agent.policy.v_head.summary.bias.copy_(trl_model.v_head.summary.bias)

    n_embd = base.config.n_embd

    def param_diffs() -> dict:
        """Max |Δ| over all parameters, over all but the attention key bias, over the key bias, over the v_head."""
        theirs = dict(trainer.model.named_parameters())
        ours = dict(agent.policy.named_parameters())
        if set(theirs) != set(ours):
            raise AssertionError(f"parameter names differ: {sorted(set(theirs) ^ set(ours))}")
        out = {
            "all": 0.0,
            "all_name": "",
            "excl_key_bias": 0.0,
            "excl_key_bias_name": "",
            "key_bias": 0.0,
            "v_head": 0.0,
        }
        for k, p in ours.items():
            d = (p.detach() - theirs[k].detach()).abs()
            if k.endswith("attn.c_attn.bias"):  # [q | k | v] biases
                out["key_bias"] = max(out["key_bias"], d[n_embd : 2 * n_embd].max().item())
                d = torch.cat([d[:n_embd], d[2 * n_embd :]])
            m = d.max().item()
            if m >= out["excl_key_bias"]:
                out["excl_key_bias"], out["excl_key_bias_name"] = m, k
            if k.startswith("v_head."):
                out["v_head"] = max(out["v_head"], m)
        out["all"] = max(out["excl_key_bias"], out["key_bias"])
        return out

    init = {k: v.detach().clone() for k, v in agent.policy.named_parameters()}
    d0 = param_diffs()["all"]
    report: dict = {
        "name": name,
        "settings": {
            "kl_penalty": kl_penalty,
            "batch_size": batch_size,
            "mini_batch_size": mini_batch_size,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "use_score_scaling": use_score_scaling,
            "use_score_norm": use_score_norm,
            "whiten_rewards": whiten_rewards,
            "ratio_threshold": ratio_threshold,
            "early_stopping": early_stopping,
            "learning_rate": learning_rate,
            "ppo_epochs": ppo_epochs,
            "seed": seed,
        },
        "initial_param_max_abs_diff": d0,
        "steps": [],
    }
    failures: list[str] = []
    if d0 != 0.0:
        failures.append(f"initial parameters differ by {d0}")

    batches = make_batches(n_steps, batch_size, tokenizer.eos_token_id, data_seed)
    np.random.seed(seed)  # TRL's permutations; Agent uses RandomState(seed): the same sequence
    for step, (queries, responses, scores) in enumerate(batches, start=1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trl_stats = trainer.step(list(queries), list(responses), [torch.tensor(s) for s in scores])
        trl_hits = sum("exceeds threshold" in str(w.message) for w in caught)

        rollout = agent.score_tokens(list(queries), list(responses))
        our_stats = agent.learn(rollout, torch.tensor(scores))

        pd = param_diffs()
        moved = max((p.detach() - init[k]).abs().max().item() for k, p in agent.policy.named_parameters())
        stats = {}
        for trl_key, our_key in STAT_PAIRS:
            a, b = float(np.mean(trl_stats[trl_key])), float(our_stats[our_key])
            stats[f"{trl_key} ~ {our_key}"] = {"trl": a, "ours": b, "abs_diff": abs(a - b)}
            if not _close(a, b, stat_rtol, stat_atol):
                if our_key in ("policy_loss", "value_loss") and trl_hits > 0:
                    stats[f"{trl_key} ~ {our_key}"]["note"] = (
                        "expected: TRL logs 0 for the losses of ratio-threshold minibatches, ours the real loss"
                    )
                else:
                    failures.append(f"step {step}: {trl_key} {a!r} vs {our_key} {b!r}")
        kl_trl, kl_ours = float(trainer.kl_ctl.value), float(agent.kl_ctl.value)
        # TRL's β becomes an np.float32 after its first update (it multiplies by a float32 stat): float32 rounding
        if not _close(kl_trl, kl_ours, 1e-6, 0.0):
            failures.append(f"step {step}: kl_coef after update {kl_trl!r} vs {kl_ours!r}")
        if pd["excl_key_bias"] > param_tol:
            failures.append(
                f"step {step}: param {pd['excl_key_bias_name']} differs by {pd['excl_key_bias']:.3g} > {param_tol}"
            )
        if pd["key_bias"] > key_bias_tol:
            failures.append(f"step {step}: attention key bias differs by {pd['key_bias']:.3g} > {key_bias_tol}")
        if trl_hits != int(our_stats["ratio_threshold_hits"]):
            failures.append(
                f"step {step}: ratio-threshold hits TRL {trl_hits} vs ours {our_stats['ratio_threshold_hits']}"
            )
        report["steps"].append(
            {
                "step": step,
                "param_max_abs_diff": pd["all"],
                "param_max_abs_diff_excl_key_bias": pd["excl_key_bias"],
                "param_max_abs_diff_excl_key_bias_name": pd["excl_key_bias_name"],
                "attn_key_bias_max_abs_diff": pd["key_bias"],
                "v_head_max_abs_diff": pd["v_head"],
                "param_max_abs_change_from_init": moved,
                "kl_coef_after_update": {"trl": kl_trl, "ours": kl_ours, "abs_diff": abs(kl_trl - kl_ours)},
                "ratio_threshold_hits": {"trl": trl_hits, "ours": int(our_stats["ratio_threshold_hits"])},
                "stats": stats,
            }
        )
    report["max_stat_rel_diff"] = max(
        v["abs_diff"] / max(abs(v["trl"]), abs(v["ours"]), 1e-12)
        for s in report["steps"]
        for v in s["stats"].values()
        if "note" not in v
    )
    for label, s in (("step1", report["steps"][0]), ("last", report["steps"][-1])):
        report[f"param_max_abs_diff_excl_key_bias_{label}"] = s["param_max_abs_diff_excl_key_bias"]
        report[f"attn_key_bias_max_abs_diff_{label}"] = s["attn_key_bias_max_abs_diff"]
    report["failures"] = failures
    report["passed"] = not failures
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="run only these case names (repeatable)")
    parser.add_argument("--full", action="store_true", help="print every per-step statistic")
    parser.add_argument("--extra", action="store_true", help="also run EXTRA_CASES (early stopping)")
    args = parser.parse_args(argv)
    ok, why = trl_status()
    if not ok:
        print(why, file=sys.stderr)
        return 2
    pool = DEFAULT_CASES + (EXTRA_CASES if args.extra or args.case else [])
    cases = [c for c in pool if not args.case or c["name"] in args.case]
    results = []
    for c in cases:
        r = run_case(**c)
        if not args.full:
            for s in r["steps"]:
                s["stats"] = {k: v["abs_diff"] for k, v in s["stats"].items()}
        results.append(r)
        print(
            f"{'PASS' if r['passed'] else 'FAIL'} {r['name']}: params Δ (excl. key bias) step 1 "
            f"{r['param_max_abs_diff_excl_key_bias_step1']:.2e}, step {len(r['steps'])} "
            f"{r['param_max_abs_diff_excl_key_bias_last']:.2e}; key bias {r['attn_key_bias_max_abs_diff_last']:.2e}; "
            f"stats max rel Δ {r['max_stat_rel_diff']:.2e}",
            file=sys.stderr,
        )
    summary = {
        "trl_version": why,
        "all_passed": all(r["passed"] for r in results),
        "cases": results,
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
