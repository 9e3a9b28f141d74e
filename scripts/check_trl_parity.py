"""Numerical parity of `cory.ppo.learner.PPOLearner.update` (GAE, clipped loss) with TRL 0.11.4's
`PPOTrainer.step` (docs/method.md §2).

TRL ≥ 0.12 has no step-API PPO, so the oracle lives in its own virtual environment. `make parity` builds it
once and runs this script and tests/test_trl_parity.py; by hand:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 omegaconf==2.3.1 pytest
    PYTHONPATH=. .venv-trl/bin/python scripts/check_trl_parity.py --extra --out outputs/trl_parity.json
    PYTHONPATH=. .venv-trl/bin/python -m pytest -q tests/test_trl_parity.py

Both learners start from the same tiny random GPT-2 and value head, see the same query/response tokens and
scores, and draw minibatch permutations from the same numpy seed. After every step the script compares every
policy and value-head parameter, the KL coefficient and the step statistics, prints a JSON report and exits
non-zero when a case fails. Everything random is seeded, so two runs print the same numbers: the model
(`build_tiny_gpt2(model_seed)`), TRL's value head (drawn from torch's global RNG when
`AutoModelForCausalLMWithValueHead` is built: the global RNG is seeded right before, and ours gets a copy of
its weights), the reference perturbation, the data and the sampled responses.

What the cases exercise beyond the three minibatch layouts of the `full` and `kl` penalties:
- a reference that differs from the policy at step 1 (`ref_noise`: seeded Gaussian noise on π0's weights), so
  the KL, its penalty and the `abs` and `mse` estimators are non-zero from the first step;
- a peaked model (`peak`: the final layer norm scaled, so next-token entropy is about 1.4 nats instead of the
  5.5 of a near-uniform random model) with responses sampled from it, so entropy and KL statistics are
  tested on realistic distributions;
- score scaling, normalisation and clipping, `whiten_rewards`, the ratio threshold, `max_grad_norm`, early
  stopping (`--extra`).

TRL 0.11.4 behaviour the cases are built around (docs/method.md §4; docs/implementation-notes.md):
- `RunningMoments.update` stores python floats that `step` then calls `.to()` on (AttributeError whenever
  `use_score_scaling=True`): the script re-exposes them as 0-d float64 tensors; the arithmetic is TRL's.
- `max_grad_norm`: TRL clips through a `filter` iterator that its first clip consumes, so only the first
  optimiser step of a trainer's life is clipped. The case has exactly one optimiser step, where TRL's
  behaviour is the documented one; a tiny norm (1e-6) makes the clipped update differ from the unclipped one
  even through Adam's normalisation.
- `whiten_rewards`: TRL whitens the padded positions too, and the then non-zero rewards of the padding after a
  shorter sequence leak into its advantages; ours keeps padding at 0. The case gives every sample the same
  query + response length, where no padding follows a response and the two definitions coincide.

Tolerances: 1e-5 absolute on every parameter except the attention key bias; 1e-4 relative (1e-6 absolute
floor) on statistics; the optimiser-step counts and ratio-threshold hits must be equal.

The attention key bias (the middle third b_k of each `attn.c_attn.bias`) is checked by a rule of its own,
because its value is not a quantity two implementations can agree on. It adds q_i·b_k to every score of query
row i, the same for every key, and softmax ignores a constant added to a whole row: b_k has no effect on the
model's output (logits and values), so its true gradient is exactly zero and what autograd returns is float
rounding noise (≤ 4e-9 of the query/value biases' gradients here). Adam divides by the root of the second
moment, so once that noise is not small against ε = 1e-8 (it is not in the peaked model) it becomes steps of
up to ~lr in directions set by rounding, which another BLAS, thread count or summation order changes. After N
optimiser steps the two key biases may differ by anything up to ~2·N·lr (the peaked model's 24 steps: 7.8e-4
on one machine, 1.0–1.4e-3 = 1.0–1.4·lr on others, where the former 1e-3 tolerance failed): no fixed tolerance
below that is a parity claim. The rule checks instead, in BOTH learners and at every optimiser step
(hooks on the torch Adam that steps the weights), three things that hold on any machine:
1. the gradient Adam sees is noise: per layer, max|∇b_k| ≤ KEY_BIAS_GRAD_RATIO · max(|∇b_q|, |∇b_v|), with
   KEY_BIAS_GRAD_RATIO = 1e-4 (~840 float32 machine epsilons; the noise measures ≤ 4e-9 in every case, while
   a key bias that is really learned has a gradient of the size of the others');
2. b_k changes only inside optimiser steps (bit-identical between them: nothing else writes it);
3. each step moves it by no more than Adam can move any parameter: elementwise |Δθ_t| ≤ lr·B_t·(1 + 1e-3),
   ADAM_BOUND_SLACK covering float32 rounding. With bias correction the update is
   lr·m̂_t/(sqrt(v̂_t) + ε) ≤ lr·|m_t|/sqrt(v_t) · sqrt(1 − β2^t)/(1 − β1^t), and Cauchy–Schwarz on
   m_t = (1 − β1)·Σ_i β1^(t−i)·g_i against v_t = (1 − β2)·Σ_i β2^(t−i)·g_i² gives, for any gradients,
       B_t = (1 − β1)/(1 − β1^t) · sqrt((1 − β2^t)/(1 − β2)) · sqrt((1 − γ^t)/(1 − γ)),  γ = β1²/β2,
   reached (up to ε) by g_i ∝ (β1/β2)^(t−i); tests/test_trl_parity.py checks the bound and its tightness on
   torch's Adam. For torch's defaults β1 = 0.9, β2 = 0.999: B_1 = 1, B_8 = 1.028, B_24 = 1.213, and
   B_t → 0.1/sqrt(0.001·(1 − γ)) = 7.27 as t → ∞, so neither 1 nor (1 − β1)/sqrt(1 − β2) = 3.16 bounds every
   step. Both optimisers must have weight decay 0 (checked). β1, β2, lr and t are read from each optimiser.
From 3, each learner's drift from the shared initial value is ≤ lr·Σ_t B_t·(1 + 1e-3) (25.97·lr = 0.026 after
24 steps; checked), and the two key biases differ by at most the sum of their drift bounds (checked, and
reported with the measured diff, the gradient ratios and the largest step in units of lr·B_t under
`key_bias_rule` in each case's report). The rule still fails when b_k is learned or moved differently: the
tests add 10·lr to our key bias within one optimiser step (rule 3) or between two (rule 2), or give it a
coherent gradient of 1% of the query/value biases' (rule 1, the only one that can see it: Adam's bound
holds for any gradient), and each is caught while every other parameter and statistic still agrees.

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
    "run `make parity`, which builds .venv-trl with trl==0.11.4 and runs the check; or by hand: python3 -m venv "
    '.venv-trl && .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 omegaconf==2.3.1 '
    "pytest; then "
    "PYTHONPATH=. .venv-trl/bin/python scripts/check_trl_parity.py (trl>=0.12 has no PPOTrainer.step)"
)

# (TRL stat key, our `PPOLearner.update` key). TRL logs the *unscaled* value loss (`ppo/loss/value` = L_vf, not
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
# our learner's names → TRL's PPOConfig names where they differ
TRL_NAMES = {"adaptive_kl": "adap_kl_ctrl", "kl_target": "target", "kl_horizon": "horizon"}
LAYOUT_8_2_2 = {"batch_size": 8, "mini_batch_size": 2, "gradient_accumulation_steps": 2}
LAYOUT_8_4_1 = {"batch_size": 8, "mini_batch_size": 4, "gradient_accumulation_steps": 1}
LAYOUT_8_8_1 = {"batch_size": 8, "mini_batch_size": 8, "gradient_accumulation_steps": 1}
REF_NOISE = 0.05  # std of the noise added to π0's weights (initial weights have std 0.02)
PEAK = 20.0  # final-layer-norm scale of the peaked model: next-token entropy ≈ 1.4 nats instead of ≈ 5.5
# The attention key bias's rule (see the docstring): its gradient must be this small against the query and value
# biases' in the same layer (noise: measured ≤ 4e-9), and each Adam step stays within lr·B_t·(1 + slack).
KEY_BIAS_GRAD_RATIO = 1e-4
ADAM_BOUND_SLACK = 1e-3
# The self-checks' deliberately wrong key-bias updates (`run_case(tamper=...)`): in lr, in the q/v biases' gradient
TAMPER_LR_MULTIPLE = 10.0
TAMPER_GRAD_FRACTION = 0.01
TAMPERS = ("key_bias_in_step", "key_bias_after_learn", "key_bias_gradient")

DEFAULT_CASES: list[dict] = [
    {"name": "full_8-8-1", "kl_penalty": "full", **LAYOUT_8_8_1},
    {"name": "full_8-2-2", "kl_penalty": "full", **LAYOUT_8_2_2},
    {"name": "full_8-4-1", "kl_penalty": "full", **LAYOUT_8_4_1},
    {"name": "kl_8-8-1", "kl_penalty": "kl", **LAYOUT_8_8_1},
    {"name": "kl_8-2-2", "kl_penalty": "kl", **LAYOUT_8_2_2},
    {"name": "kl_8-4-1", "kl_penalty": "kl", **LAYOUT_8_4_1},
    {
        "name": "full_8-4-1_scorenorm",
        "kl_penalty": "full",
        **LAYOUT_8_4_1,
        "use_score_scaling": True,
        "use_score_norm": True,
    },
    {"name": "kl_8-2-2_scorescale", "kl_penalty": "kl", **LAYOUT_8_2_2, "use_score_scaling": True},
    {"name": "full_8-2-2_ratio_threshold", "kl_penalty": "full", **LAYOUT_8_2_2, "ratio_threshold": 1.0001},
    # the reference differs from the policy at step 1: non-zero KL, penalty and estimators from the start
    {"name": "full_8-4-1_ref_differs", "kl_penalty": "full", **LAYOUT_8_4_1, "ref_noise": REF_NOISE},
    {"name": "kl_8-2-2_ref_differs", "kl_penalty": "kl", **LAYOUT_8_2_2, "ref_noise": REF_NOISE},
    {"name": "abs_8-4-1_ref_differs", "kl_penalty": "abs", **LAYOUT_8_4_1, "ref_noise": REF_NOISE},
    {"name": "mse_8-2-2_ref_differs", "kl_penalty": "mse", **LAYOUT_8_2_2, "ref_noise": REF_NOISE},
    # peaked distributions, responses sampled from the model
    {
        "name": "full_8-4-1_peaked",
        "kl_penalty": "full",
        **LAYOUT_8_4_1,
        "peak": PEAK,
        "sampled_responses": True,
        "ref_noise": REF_NOISE,
    },
    {
        "name": "kl_8-8-1_peaked",
        "kl_penalty": "kl",
        **LAYOUT_8_8_1,
        "peak": PEAK,
        "sampled_responses": True,
    },
    # score clipping alone and after normalisation; whitened rewards; gradient-norm clipping (one step)
    {"name": "kl_8-8-1_score_clip", "kl_penalty": "kl", **LAYOUT_8_8_1, "score_clip": 1.0, "ref_noise": REF_NOISE},
    {
        "name": "full_8-2-2_scorenorm_clip",
        "kl_penalty": "full",
        **LAYOUT_8_2_2,
        "use_score_scaling": True,
        "use_score_norm": True,
        "score_clip": 0.5,
    },
    {
        "name": "full_8-4-1_whiten_rewards",
        "kl_penalty": "full",
        **LAYOUT_8_4_1,
        "whiten_rewards": True,
        "equal_lengths": True,
        "ref_noise": REF_NOISE,
    },
    {
        "name": "full_8-8-1_max_grad_norm",
        "kl_penalty": "full",
        **LAYOUT_8_8_1,
        "max_grad_norm": 1e-6,
        "ppo_epochs": 1,
        "n_steps": 1,
    },
]

# Not part of the default grid (`--extra`): TRL checks early stopping once per epoch, after all its optimiser
# steps, on the last minibatch's policy KL.
EXTRA_CASES: list[dict] = [
    {
        "name": "full_8-2-2_early_stop",
        "kl_penalty": "full",
        **LAYOUT_8_2_2,
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
# fixed models and data
# ---------------------------------------------------------------------------------------------------------------------
def build_models(model_seed: int, peak: float, ref_noise: float):
    """(initial model, reference weights, tokenizer): a tiny random GPT-2, optionally peaked, and its copy,
    optionally perturbed by seeded Gaussian noise."""
    import torch

    from cory.models import build_tiny_gpt2

    base, tokenizer = build_tiny_gpt2(seed=model_seed)
    base.eval()
    with torch.no_grad():
        base.transformer.ln_f.weight.mul_(peak)  # logits scale with it: lower entropy, same argmax
        base.transformer.ln_f.bias.mul_(peak)
    ref_base = copy.deepcopy(base)
    if ref_noise:
        gen = torch.Generator().manual_seed(model_seed + 1000)
        with torch.no_grad():
            for p in ref_base.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * ref_noise)
    tokenizer.padding_side = "right"  # TRL pads query+response on this side; GPT-2's default
    return base, ref_base, tokenizer


def sample_response(model, query, length: int, generator):
    """`length` tokens sampled from `model` after `query` (1-D ids), with a seeded generator."""
    import torch

    ids = query.clone()
    with torch.no_grad():
        for _ in range(length):
            probs = torch.softmax(model(ids[None]).logits[0, -1].float(), dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)])
    return ids[len(query) :]


def make_batches(n_steps: int, batch_size: int, eos_id: int, data_seed: int, equal_lengths=False, model=None):
    """Per step: queries and responses (lists of 1-D LongTensors) and float scores.

    Every other response ends with EOS; the others stop mid-text (as if they hit max_new_tokens). Responses
    are random tokens, or sampled from `model` when given; `equal_lengths` gives every query 5 tokens and
    every response 8.
    """
    import numpy as np
    import torch

    rng = np.random.RandomState(data_seed)
    generator = torch.Generator().manual_seed(data_seed)
    batches = []
    for _ in range(n_steps):
        queries, responses = [], []
        for i in range(batch_size):
            q_len, r_len = (5, 8) if equal_lengths else (int(rng.randint(2, 10)), int(rng.randint(1, 13)))
            query = torch.tensor(rng.randint(0, 256, size=q_len), dtype=torch.long)
            resp = rng.randint(0, 256, size=r_len)
            if model is not None:
                resp = sample_response(model, query, r_len, generator).numpy()
            if i % 2 == 0:
                resp[-1] = eos_id
            queries.append(query)
            responses.append(torch.tensor(resp, dtype=torch.long))
        scores = (rng.randn(batch_size) * 2.0 + 0.5).astype(np.float32)
        batches.append((queries, responses, scores))
    return batches


# ---------------------------------------------------------------------------------------------------------------------
# the two learners
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


def build_trl(base, ref_base, tokenizer, learner: dict, seed: int, value_head_seed: int):
    """TRL's PPOTrainer on copies of the models, its value head drawn right after seeding torch."""
    import torch
    import trl
    from trl import AutoModelForCausalLMWithValueHead, PPOTrainer
    from trl import PPOConfig as TRLPPOConfig

    torch.manual_seed(value_head_seed)  # TRL draws the value head from the global RNG
    model = AutoModelForCausalLMWithValueHead.from_pretrained(copy.deepcopy(base))
    ref = trl.create_reference_model(AutoModelForCausalLMWithValueHead.from_pretrained(copy.deepcopy(ref_base)))
    ours_only = ("ratio_threshold_skip", "generate_in_train_mode", "reuse_rollout_forward")
    names = {k: v for k, v in learner.items() if k not in ours_only}
    config = TRLPPOConfig(exp_name="check_trl_parity", seed=seed, **{TRL_NAMES.get(k, k): v for k, v in names.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = PPOTrainer(config=config, model=model, ref_model=ref, tokenizer=tokenizer)
    _patch_running_moments(trainer.running)
    return trainer


def build_ours(base, ref_base, tokenizer, learner: dict, seed: int, trl_model):
    """Our agent on copies of the same models, with TRL's value-head weights."""
    import torch

    from cory.models import make_reference
    from cory.ppo.estimators import GAE
    from cory.ppo.learner import PPOConfig, agent_on
    from cory.ppo.losses import ClippedPPO

    estimator = {k: learner.pop(k) for k in ("gamma", "lam", "whiten_rewards")} | {"per_role": False}
    loss = {k: learner.pop(k) for k in ("cliprange", "cliprange_value", "vf_coef")}
    agent = agent_on(
        "ours",
        copy.deepcopy(base),
        make_reference(ref_base),
        tokenizer,
        PPOConfig(**learner),
        seed=seed,
        advantage=GAE(**estimator),
        loss=ClippedPPO(**loss),
    )
    with torch.no_grad():
        agent.trainee.policy.v_head.summary.weight.copy_(trl_model.v_head.summary.weight)
        agent.trainee.policy.v_head.summary.bias.copy_(trl_model.v_head.summary.bias)
    return agent


def param_diffs(trl_model, agent, n_embd: int) -> dict:
    """Max |Δ| over all parameters, over all but the attention key bias, over the key bias, over the v_head."""
    import torch

    theirs = dict(trl_model.named_parameters())
    ours = dict(agent.trainee.policy.named_parameters())
    if set(theirs) != set(ours):
        raise AssertionError(f"parameter names differ: {sorted(set(theirs) ^ set(ours))}")
    out = {"all": 0.0, "excl_key_bias": 0.0, "excl_key_bias_name": "", "key_bias": 0.0, "v_head": 0.0}
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


def adam_step_bound(t: int, beta1: float, beta2: float) -> float:
    """B_t: the largest |Δθ|/lr that the t-th step of Adam (bias-corrected, no weight decay) can make, over all
    gradient histories (see the docstring; reached up to ε by g_i ∝ (β1/β2)^(t−i))."""
    gamma = beta1 * beta1 / beta2
    return (
        (1.0 - beta1)
        / (1.0 - beta1**t)
        * ((1.0 - beta2**t) / (1.0 - beta2)) ** 0.5
        * ((1.0 - gamma**t) / (1.0 - gamma)) ** 0.5
    )


def _torch_optimizer(optimizer):
    """The torch optimiser that really steps (accelerate wraps TRL's in an `AcceleratedOptimizer`)."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


class KeyBiasMonitor:
    """One learner's attention key biases across its optimiser steps: the three checks of the key-bias rule.

    Hooks on the torch optimiser record, per step, the largest ratio of the key bias's gradient to the query and
    value biases' in the same layer (rule 1), whether the key bias changed since the previous step (rule 2) and
    its largest change in units of Adam's bound lr·B_t (rule 3); `take()` returns and resets them.
    """

    def __init__(self, model, optimizer, n_embd: int):
        self.optimizer = _torch_optimizer(optimizer)
        self.params = {k: p for k, p in model.named_parameters() if k.endswith("attn.c_attn.bias")}
        if not self.params:
            raise AssertionError("no attn.c_attn.bias parameters: the key-bias rule is written for GPT-2")
        first = next(iter(self.params.values()))
        group = next(g for g in self.optimizer.param_groups if any(q is first for q in g["params"]))
        self.lr, (self.beta1, self.beta2) = float(group["lr"]), tuple(float(b) for b in group["betas"])
        self.weight_decay = float(group.get("weight_decay", 0.0))
        self.n_embd = n_embd
        self.init = self._key()
        self.last, self.before = self.init, None
        self.steps, self.drift_bound = 0, 0.0  # the bound accumulates lr·B_t·(1 + slack) over the steps
        self._reset()
        self._handles = [
            self.optimizer.register_step_pre_hook(self._pre),
            self.optimizer.register_step_post_hook(self._post),
        ]

    def _key(self) -> dict:
        return {k: p.detach()[self.n_embd : 2 * self.n_embd].clone() for k, p in self.params.items()}

    def _reset(self) -> None:
        self.grad_ratio, self.step_ratio, self.outside = 0.0, 0.0, 0.0

    def _note_outside(self, current: dict) -> None:
        """Rule 2: any change since the last optimiser step (the comparison is exact)."""
        for k, v in current.items():
            self.outside = max(self.outside, (v - self.last[k]).abs().max().item())
        self.last = current  # each change is reported once

    def _pre(self, optimizer, args, kwargs) -> None:
        current = self._key()
        self._note_outside(current)
        self.before = current
        n = self.n_embd
        for p in self.params.values():
            if p.grad is None:
                continue
            g = p.grad.detach().abs()
            key, others = g[n : 2 * n].max().item(), max(g[:n].max().item(), g[2 * n :].max().item())
            # a step whose every gradient is exactly 0 (a ratio-threshold hit) has noise 0 ≤ ρ·0
            ratio = 0.0 if key == 0.0 else (key / others if others > 0.0 else float("inf"))
            self.grad_ratio = max(self.grad_ratio, ratio)

    def _post(self, optimizer, args, kwargs) -> None:
        t = int(self.optimizer.state[next(iter(self.params.values()))]["step"])  # Adam's own t (bias correction)
        bound = self.lr * adam_step_bound(t, self.beta1, self.beta2)
        current = self._key()
        for k, v in current.items():
            self.step_ratio = max(self.step_ratio, (v - self.before[k]).abs().max().item() / bound)
        self.steps += 1
        self.drift_bound += bound * (1.0 + ADAM_BOUND_SLACK)
        self.last = current

    def take(self) -> dict:
        """This PPO step's measurements (since the previous `take`), then reset them."""
        self._note_outside(self._key())  # after the last optimiser step of `learn`
        drift = max(
            (p.detach()[self.n_embd : 2 * self.n_embd] - self.init[k]).abs().max().item()
            for k, p in self.params.items()
        )
        out = {
            "optimiser_steps": self.steps,
            "max_grad_ratio": self.grad_ratio,
            "max_step_over_adam_bound": self.step_ratio,
            "max_change_outside_optimiser_steps": self.outside,
            "drift_from_init": drift,
            "drift_bound": self.drift_bound,
        }
        self._reset()
        return out

    def failures(self, m: dict, whose: str) -> list[str]:
        """The key-bias rule's violations in `take()`'s measurements `m`, worded for a learner `whose` ("TRL's")."""
        out = []
        if self.weight_decay != 0.0:
            out.append(f"{whose} Adam has weight decay {self.weight_decay}: the key-bias bound assumes 0")
        if m["max_grad_ratio"] > KEY_BIAS_GRAD_RATIO:
            out.append(
                f"{whose} attention key-bias gradient is not noise: {m['max_grad_ratio']:.3g} of the query/value "
                f"bias gradient > {KEY_BIAS_GRAD_RATIO}"
            )
        if m["max_change_outside_optimiser_steps"] > 0.0:
            out.append(
                f"{whose} attention key bias changed by {m['max_change_outside_optimiser_steps']:.3g} outside its "
                "optimiser steps"
            )
        if m["max_step_over_adam_bound"] > 1.0 + ADAM_BOUND_SLACK:
            out.append(
                f"{whose} attention key bias moved {m['max_step_over_adam_bound']:.3g}× Adam's largest step lr·B_t "
                "in one optimiser step"
            )
        if m["drift_from_init"] > m["drift_bound"]:
            out.append(
                f"{whose} attention key bias drifted {m['drift_from_init']:.3g} > lr·ΣB_t bound {m['drift_bound']:.3g}"
            )
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def compare_stats(trl_stats: dict, our_stats: dict, trl_hits: int, rtol: float, atol: float):
    """Per statistic {trl, ours, abs_diff}, and the failures (a ratio-threshold hit excuses the losses)."""
    import numpy as np

    stats, failures = {}, []
    for trl_key, our_key in STAT_PAIRS:
        a, b = float(np.mean(trl_stats[trl_key])), float(our_stats[our_key])
        stats[f"{trl_key} ~ {our_key}"] = entry = {"trl": a, "ours": b, "abs_diff": abs(a - b)}
        if not _close(a, b, rtol, atol):
            if our_key in ("policy_loss", "value_loss") and trl_hits > 0:
                entry["note"] = (
                    "expected: TRL logs 0 for the losses of ratio-threshold minibatches, ours the real loss"
                )
            else:
                failures.append(f"{trl_key} {a!r} vs {our_key} {b!r}")
    return stats, failures


# ---------------------------------------------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------------------------------------------
def run_case(
    name: str = "case",
    kl_penalty: str = "full",
    batch_size: int = 8,
    mini_batch_size: int = 8,
    gradient_accumulation_steps: int = 1,
    use_score_scaling: bool = False,
    use_score_norm: bool = False,
    score_clip: float | None = None,
    whiten_rewards: bool = False,
    ratio_threshold: float = 10.0,
    max_grad_norm: float | None = None,
    early_stopping: bool = False,
    target_kl: float = 1.0,
    ppo_epochs: int = 4,
    learning_rate: float = 1e-3,
    init_kl_coef: float = 0.3,
    kl_target: float = 6.0,
    kl_horizon: float = 10000.0,
    ref_noise: float = 0.0,
    peak: float = 1.0,
    sampled_responses: bool = False,
    equal_lengths: bool = False,
    n_steps: int = 3,
    seed: int = 7,
    data_seed: int = 123,
    model_seed: int = 0,
    param_tol: float = 1e-5,
    stat_rtol: float = 1e-4,
    stat_atol: float = 1e-6,
    tamper: str | None = None,
) -> dict:
    """Run TRL and `Agent.learn` side by side for `n_steps` steps; return diffs and `passed`.

    `tamper` (one of TAMPERS, for the self-checks only) deliberately mis-updates our attention key bias: +10·lr
    within our first optimiser step, +10·lr right after our first `learn`, or a coherent extra gradient of 1%
    of the query/value biases' largest before each of our optimiser steps.
    """
    ok, why = trl_status()
    if not ok:
        raise RuntimeError(why)
    if tamper is not None and tamper not in TAMPERS:
        raise ValueError(f"tamper={tamper!r}: not one of {TAMPERS}")
    import numpy as np
    import torch

    from cory.ppo.learner import Batch

    torch.set_num_threads(min(4, torch.get_num_threads()))
    # every learner setting is given to both sides explicitly (TRL's defaults are the paper's, §2)
    learner = dict(
        learning_rate=learning_rate,
        init_kl_coef=init_kl_coef,
        adaptive_kl=True,
        kl_target=kl_target,
        kl_horizon=kl_horizon,
        kl_penalty=kl_penalty,
        gamma=1.0,
        lam=0.95,
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        ppo_epochs=ppo_epochs,
        mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        ratio_threshold=ratio_threshold,
        ratio_threshold_skip=False,
        use_score_scaling=use_score_scaling,
        use_score_norm=use_score_norm,
        score_clip=score_clip,
        max_grad_norm=max_grad_norm,
        whiten_rewards=whiten_rewards,
        early_stopping=early_stopping,
        target_kl=target_kl,
        generate_in_train_mode=False,
        reuse_rollout_forward=False,  # the rollout here is scored apart from the update, as TRL's
    )
    base, ref_base, tokenizer = build_models(model_seed, peak, ref_noise)
    trainer = build_trl(base, ref_base, tokenizer, learner | {"batch_size": batch_size}, seed, model_seed + 1)
    agent = build_ours(base, ref_base, tokenizer, dict(learner), seed, trainer.model)
    n_embd = base.config.n_embd
    batches = make_batches(
        n_steps, batch_size, tokenizer.eos_token_id, data_seed, equal_lengths, base if sampled_responses else None
    )

    init = {k: v.detach().clone() for k, v in agent.trainee.policy.named_parameters()}
    tamper_handle = _install_tamper(tamper, agent, n_embd, learning_rate)  # before the monitors: they see its effect
    monitors = {
        "trl": KeyBiasMonitor(trainer.model, trainer.optimizer, n_embd),
        "ours": KeyBiasMonitor(agent.trainee.policy, agent.trainee.engine.optimizer, n_embd),
    }
    d0 = param_diffs(trainer.model, agent, n_embd)["all"]
    left_out = ("gamma", "lam", "cliprange", "cliprange_value", "reuse_rollout_forward")
    settings = {k: v for k, v in learner.items() if k not in left_out}
    settings |= dict(batch_size=batch_size, ref_noise=ref_noise, peak=peak, sampled_responses=sampled_responses)
    report: dict = {"name": name, "settings": settings | {"seed": seed}, "initial_param_max_abs_diff": d0, "steps": []}
    failures: list[str] = [] if d0 == 0.0 else [f"initial parameters differ by {d0}"]

    np.random.seed(seed)  # TRL's permutations; Agent uses RandomState(seed): the same sequence
    for step, (queries, responses, scores) in enumerate(batches, start=1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trl_stats = trainer.step(list(queries), list(responses), [torch.tensor(s) for s in scores])
        trl_hits = sum("exceeds threshold" in str(w.message) for w in caught)
        rollout = agent.actor.score_tokens(list(queries), list(responses))
        our_stats = agent.learner.update(Batch(rollout, torch.tensor(scores))).stats
        if tamper == "key_bias_after_learn" and step == 1:
            _shift_key_bias(agent.trainee.policy, n_embd, TAMPER_LR_MULTIPLE * learning_rate)

        pd = param_diffs(trainer.model, agent, n_embd)
        change = {k: p.detach() - init[k] for k, p in agent.trainee.policy.named_parameters()}
        stats, stat_failures = compare_stats(trl_stats, our_stats, trl_hits, stat_rtol, stat_atol)
        failures += [f"step {step}: {f}" for f in stat_failures]
        kl_trl, kl_ours = float(trainer.kl_ctl.value), float(agent.learner.kl_coef)
        # TRL's β becomes an np.float32 after its first update (it multiplies by a float32 stat): float32 rounding
        if not _close(kl_trl, kl_ours, 1e-6, 0.0):
            failures.append(f"step {step}: kl_coef after update {kl_trl!r} vs {kl_ours!r}")
        if pd["excl_key_bias"] > param_tol:
            failures.append(
                f"step {step}: param {pd['excl_key_bias_name']} differs by {pd['excl_key_bias']:.3g} > {param_tol}"
            )
        key_bias = {who: m.take() for who, m in monitors.items()}
        for who, m in monitors.items():
            failures += [f"step {step}: {f}" for f in m.failures(key_bias[who], {"trl": "TRL's", "ours": "our"}[who])]
        if key_bias["trl"]["optimiser_steps"] != key_bias["ours"]["optimiser_steps"]:
            failures.append(
                f"step {step}: optimiser steps so far TRL {key_bias['trl']['optimiser_steps']} vs ours "
                f"{key_bias['ours']['optimiser_steps']}"
            )
        key_bias_bound = key_bias["trl"]["drift_bound"] + key_bias["ours"]["drift_bound"]
        if pd["key_bias"] > key_bias_bound:
            failures.append(f"step {step}: attention key bias differs by {pd['key_bias']:.3g} > {key_bias_bound:.3g}")
        our_hits = int(our_stats["ratio_threshold_hits"])
        if trl_hits != our_hits:
            failures.append(f"step {step}: ratio-threshold hits TRL {trl_hits} vs ours {our_hits}")
        report["steps"].append(
            {
                "step": step,
                "param_max_abs_diff": pd["all"],
                "param_max_abs_diff_excl_key_bias": pd["excl_key_bias"],
                "param_max_abs_diff_excl_key_bias_name": pd["excl_key_bias_name"],
                "attn_key_bias_max_abs_diff": pd["key_bias"],
                # the key-bias rule: the bound on the diff is the sum of the two learners' drift bounds
                "attn_key_bias_diff_bound": key_bias_bound,
                "key_bias": key_bias,
                "v_head_max_abs_diff": pd["v_head"],
                "param_max_abs_change_from_init": max(c.abs().max().item() for c in change.values()),
                "param_change_norm": torch.sqrt(sum(c.square().sum() for c in change.values())).item(),
                "kl_coef_after_update": {"trl": kl_trl, "ours": kl_ours, "abs_diff": abs(kl_trl - kl_ours)},
                "ratio_threshold_hits": {"trl": trl_hits, "ours": our_hits},
                # the rollout's full-vocabulary entropy of π_old (nats per token): how peaked the model is
                "rollout_entropy": our_stats["entropy"],
                "stats": stats,
            }
        )
    for m in monitors.values():
        m.remove()
    if tamper_handle is not None:
        tamper_handle.remove()
    return _finish(report, failures)


def _shift_key_bias(model, n_embd: int, amount: float) -> None:
    """Add `amount` to every attention key bias of `model` (the self-checks' wrong update)."""
    import torch

    with torch.no_grad():
        for k, p in model.named_parameters():
            if k.endswith("attn.c_attn.bias"):
                p[n_embd : 2 * n_embd] += amount


def _install_tamper(tamper: str | None, agent, n_embd: int, lr: float):
    """The optimiser hook of a step-time `tamper` on our learner (None for none or for `key_bias_after_learn`)."""
    import torch

    optimizer = _torch_optimizer(agent.trainee.engine.optimizer)
    if tamper == "key_bias_in_step":
        calls = []

        def shift_once(opt, args, kwargs) -> None:
            if not calls:
                _shift_key_bias(agent.trainee.policy, n_embd, TAMPER_LR_MULTIPLE * lr)
            calls.append(1)

        return optimizer.register_step_post_hook(shift_once)
    if tamper == "key_bias_gradient":

        def learn_key_bias(opt, args, kwargs) -> None:
            # as if the key bias were learned: a same-sign gradient, a fixed fraction of the query/value biases'
            for k, p in agent.trainee.policy.named_parameters():
                if k.endswith("attn.c_attn.bias") and p.grad is not None:
                    g = p.grad.detach().abs()
                    scale = torch.maximum(g[:n_embd].max(), g[2 * n_embd :].max())
                    p.grad[n_embd : 2 * n_embd] += TAMPER_GRAD_FRACTION * scale

        return optimizer.register_step_pre_hook(learn_key_bias)
    return None


def _finish(report: dict, failures: list[str]) -> dict:
    """Summary fields over the steps, the failures and `passed`."""
    report["max_stat_rel_diff"] = max(
        v["abs_diff"] / max(abs(v["trl"]), abs(v["ours"]), 1e-12)
        for s in report["steps"]
        for v in s["stats"].values()
        if "note" not in v
    )
    first, last = report["steps"][0], report["steps"][-1]
    report["initial_kl"] = first["stats"]["objective/kl ~ kl"]["trl"]
    report["initial_entropy"] = first["rollout_entropy"]
    for label, s in (("step1", first), ("last", last)):
        report[f"param_max_abs_diff_excl_key_bias_{label}"] = s["param_max_abs_diff_excl_key_bias"]
        report[f"attn_key_bias_max_abs_diff_{label}"] = s["attn_key_bias_max_abs_diff"]
        report[f"attn_key_bias_diff_bound_{label}"] = s["attn_key_bias_diff_bound"]
    report["key_bias_rule"] = {
        "grad_ratio_bound": KEY_BIAS_GRAD_RATIO,
        "adam_bound_slack": ADAM_BOUND_SLACK,
        "optimiser_steps": {who: m["optimiser_steps"] for who, m in last["key_bias"].items()},
        "max_grad_ratio": {
            who: max(s["key_bias"][who]["max_grad_ratio"] for s in report["steps"]) for who in last["key_bias"]
        },
        "max_step_over_adam_bound": {
            who: max(s["key_bias"][who]["max_step_over_adam_bound"] for s in report["steps"])
            for who in last["key_bias"]
        },
        "drift_from_init": {who: m["drift_from_init"] for who, m in last["key_bias"].items()},
        "drift_bound": {who: m["drift_bound"] for who, m in last["key_bias"].items()},
        "diff": last["attn_key_bias_max_abs_diff"],
        "diff_bound": last["attn_key_bias_diff_bound"],
    }
    report["failures"] = failures
    report["passed"] = not failures
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="run only these case names (repeatable)")
    parser.add_argument("--full", action="store_true", help="print every per-step statistic")
    parser.add_argument("--extra", action="store_true", help="also run EXTRA_CASES (early stopping)")
    parser.add_argument("--out", help="write the JSON report to this file instead of stdout")
    args = parser.parse_args(argv)
    ok, why = trl_status()
    if not ok:
        print(f"error: {why}", file=sys.stderr)
        return 2
    pool = DEFAULT_CASES + (EXTRA_CASES if args.extra or args.case else [])
    cases = [c for c in pool if not args.case or c["name"] in args.case]
    unknown = sorted(set(args.case or []) - {c["name"] for c in pool})
    if unknown:
        print(
            f"error: --case {', '.join(unknown)}: unknown; known: {', '.join(c['name'] for c in pool)}",
            file=sys.stderr,
        )
        return 2
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
            f"{r['param_max_abs_diff_excl_key_bias_last']:.2e}; key bias {r['attn_key_bias_max_abs_diff_last']:.2e} "
            f"(bound {r['attn_key_bias_diff_bound_last']:.2e}, grad ratio "
            f"{max(r['key_bias_rule']['max_grad_ratio'].values()):.1e}, step/Adam bound "
            f"{max(r['key_bias_rule']['max_step_over_adam_bound'].values()):.2f}); "
            f"stats max rel Δ {r['max_stat_rel_diff']:.2e}; KL at step 1 {r['initial_kl']:.3g}, "
            f"entropy {r['initial_entropy']:.2f} nats",
            file=sys.stderr,
        )
    summary = {"trl_version": why, "all_passed": all(r["passed"] for r in results), "cases": results}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    else:
        print(json.dumps(summary, indent=2))
    print(f"{'all' if summary['all_passed'] else 'NOT all'} {len(results)} cases passed", file=sys.stderr)
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
