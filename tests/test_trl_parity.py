"""`Agent.learn` against TRL 0.11.4's `PPOTrainer.step` (the oracle; see scripts/check_trl_parity.py).

Skipped unless trl 0.11.x is installed in the running interpreter: the project's own venv carries trl ≥ 1.13,
which has no PPO. `make parity` builds the separate venv once and runs this file; by hand:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 omegaconf==2.3.1 pytest
    PYTHONPATH=. .venv-trl/bin/python -m pytest -q tests/test_trl_parity.py

About 30 s with trl installed (TRL's import and the 20 cases of the script, several of them twice). The
attention key bias is compared by the script's key-bias rule (noise gradient, Adam-bounded steps, see its
docstring); the tests below check that rule's Adam bound on torch's Adam and that deliberately wrong key-bias
updates are caught. The two Adam-bound tests need only torch and run without trl too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_trl_parity.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("check_trl_parity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parity = _load_script()  # imports neither trl nor torch at module level
_TRL_OK, _TRL_WHY = parity.trl_status()
needs_trl = pytest.mark.skipif(not _TRL_OK, reason=_TRL_WHY)
CASES = {c["name"]: c for c in parity.DEFAULT_CASES + parity.EXTRA_CASES}


@needs_trl
@pytest.mark.parametrize("name", sorted(CASES))
def test_learn_matches_trl_step(name: str) -> None:
    report = parity.run_case(**CASES[name])
    assert report["passed"], report["failures"]
    assert report["initial_param_max_abs_diff"] == 0.0
    # the updates really moved the weights, so the agreement is not trivial
    assert report["steps"][-1]["param_change_norm"] > 1e-2
    if CASES[name].get("ref_noise"):  # π0 differs from the policy: the penalty is live from the first step
        assert report["initial_kl"] > 0.1
    else:
        assert report["initial_kl"] == 0.0
    if CASES[name].get("peak"):  # far from the 5.5 nats of a near-uniform 257-token model
        assert report["initial_entropy"] < 2.0
    else:
        assert report["initial_entropy"] > 5.0


# what each deliberately wrong key-bias update must trip (scripts/check_trl_parity.py, the key-bias rule)
TAMPER_CAUGHT_BY = {
    "key_bias_in_step": "Adam's largest step",  # rule 3: +10·lr within one optimiser step
    "key_bias_after_learn": "outside its optimiser steps",  # rule 2: +10·lr between optimiser steps
    "key_bias_gradient": "is not noise",  # rule 1: a coherent gradient, 1% of the q/v biases'
}


@needs_trl
@pytest.mark.parametrize("tamper", sorted(TAMPER_CAUGHT_BY))
def test_key_bias_rule_catches_a_key_bias_learned_differently(tamper: str) -> None:
    """The key bias is compared by a rule, not a tolerance; a wrong update of ours must still fail it, on the
    peaked model where Adam's noise steps are largest. Nothing else notices: the key bias cannot change the
    model's output, so every other parameter and statistic still agrees."""
    assert set(TAMPER_CAUGHT_BY) == set(parity.TAMPERS)
    report = parity.run_case(**CASES["full_8-4-1_peaked"], tamper=tamper)
    assert not report["passed"]
    assert any(TAMPER_CAUGHT_BY[tamper] in f for f in report["failures"]), report["failures"]
    assert all("key bias" in f or "key-bias" in f for f in report["failures"]), report["failures"]
    if tamper == "key_bias_gradient":  # a bounded, coherent drift: only the gradient check can tell
        assert all(TAMPER_CAUGHT_BY[tamper] in f for f in report["failures"]), report["failures"]
        assert report["key_bias_rule"]["diff"] <= report["key_bias_rule"]["diff_bound"]


@needs_trl
def test_key_bias_rule_reports_its_numbers() -> None:
    """The peaked case, where the key biases differ by more than lr: the report says by how much and why that
    passes (noise gradients, Adam-bounded steps, the bound on the diff)."""
    rule = parity.run_case(**CASES["full_8-4-1_peaked"])["key_bias_rule"]
    steps = rule["optimiser_steps"]["ours"]
    assert steps == rule["optimiser_steps"]["trl"] == 3 * 4 * 2  # PPO steps × epochs × backward batches
    lr = 1e-3
    assert rule["diff"] > 0.1 * lr  # Adam made the noise visible: the reason for the rule
    assert rule["diff"] <= rule["diff_bound"]
    expected = lr * sum(parity.adam_step_bound(t, 0.9, 0.999) for t in range(1, steps + 1))
    assert rule["drift_bound"]["ours"] == pytest.approx(expected * (1 + parity.ADAM_BOUND_SLACK))
    assert rule["diff_bound"] == pytest.approx(rule["drift_bound"]["ours"] + rule["drift_bound"]["trl"])
    for who in ("trl", "ours"):
        assert rule["max_grad_ratio"][who] <= parity.KEY_BIAS_GRAD_RATIO
        assert 0.0 < rule["max_step_over_adam_bound"][who] <= 1.0 + parity.ADAM_BOUND_SLACK
        assert rule["drift_from_init"][who] <= rule["drift_bound"][who]


def test_adam_step_bound_values() -> None:
    """B_t for torch's defaults, as the script's docstring states them (pure arithmetic, no trl needed)."""
    bound = parity.adam_step_bound
    assert bound(1, 0.9, 0.999) == pytest.approx(1.0, abs=1e-12)
    assert bound(8, 0.9, 0.999) == pytest.approx(1.028, abs=5e-4)
    assert bound(24, 0.9, 0.999) == pytest.approx(1.213, abs=5e-4)
    assert sum(bound(t, 0.9, 0.999) for t in range(1, 25)) == pytest.approx(25.94, abs=5e-3)
    assert bound(10**6, 0.9, 0.999) == pytest.approx(0.1 / (0.001 * (1 - 0.81 / 0.999)) ** 0.5, rel=1e-9)
    assert bound(10**6, 0.9, 0.999) == pytest.approx(7.27, abs=5e-3)


def test_adam_step_bound_holds_and_is_reached_by_torch_adam() -> None:
    """The per-step bound lr·B_t that the key-bias rule relies on, checked on torch's own Adam: no gradient
    history exceeds it, and g_i ∝ (β1/β2)^(t−i) reaches it (so it cannot be tightened)."""
    torch = pytest.importorskip("torch")
    lr, betas = 1e-3, (0.9, 0.999)

    def steps(grads: list[float]) -> list[float]:
        x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([x], lr=lr, betas=betas)
        out = []
        for g in grads:
            before = x.detach().clone()
            x.grad = torch.tensor([g], dtype=torch.float64)
            opt.step()
            out.append((x.detach() - before).abs().item() / (lr * parity.adam_step_bound(len(out) + 1, *betas)))
        return out

    for t in (1, 2, 8, 24, 200):
        worst = [(betas[0] / betas[1]) ** (t - i) for i in range(1, t + 1)]
        assert steps(worst)[-1] == pytest.approx(1.0, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = 40
        grads = torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp(
            4 * torch.randn(n, generator=gen, dtype=torch.float64)
        )
        grads[torch.rand(n, generator=gen) < 0.2] = 0.0  # zero gradients (e.g. ratio-threshold hits)
        grads[0] = 1.0  # v stays positive
        assert max(steps(grads.tolist())) <= 1.0 + 1e-9


@needs_trl
def test_every_random_part_is_seeded_so_two_runs_agree_exactly() -> None:
    """TRL's value head, the reference noise, the sampled responses: all seeded (the old script was not)."""
    first = parity.run_case(**CASES["full_8-4-1_peaked"], n_steps=2)
    second = parity.run_case(**CASES["full_8-4-1_peaked"], n_steps=2)
    assert first == second


@needs_trl
def test_the_max_grad_norm_case_really_clips() -> None:
    """Adam normalises the gradient, so a mild clip would change nothing; the case's norm must show."""
    case = CASES["full_8-8-1_max_grad_norm"]
    clipped = parity.run_case(**case)["steps"][0]["param_change_norm"]
    free = parity.run_case(**(case | {"max_grad_norm": None}))["steps"][0]["param_change_norm"]
    assert clipped < 0.5 * free


@needs_trl
def test_trl_clips_only_its_first_optimiser_step() -> None:
    """Why the max_grad_norm case has one optimiser step: beyond it TRL 0.11.4 no longer clips (its parameter
    `filter` is consumed by the first clip) while we clip every step, so the two must disagree there."""
    report = parity.run_case(**(CASES["full_8-8-1_max_grad_norm"] | {"ppo_epochs": 2}))
    assert not report["passed"]


@needs_trl
def test_trl_whitened_rewards_leak_from_padding() -> None:
    """Why the whiten_rewards case has equal lengths: with ragged ones TRL's whitened padding rewards leak into
    the advantages of shorter sequences, ours keep padding at 0, so the two must disagree."""
    report = parity.run_case(**(CASES["full_8-4-1_whiten_rewards"] | {"equal_lengths": False, "n_steps": 1}))
    assert not report["passed"]


def test_script_without_trl_says_how_to_get_it() -> None:
    """Without trl 0.11.x the script explains how to install it (checked only where it is missing)."""
    if _TRL_OK:
        pytest.skip("trl 0.11.x is installed here")
    assert "make parity" in _TRL_WHY and "trl==0.11.4" in _TRL_WHY
    assert parity.main([]) == 2
