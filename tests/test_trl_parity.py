"""`Agent.learn` against TRL 0.11.4's `PPOTrainer.step` (the oracle; see scripts/check_trl_parity.py).

Skipped unless trl 0.11.x is installed in the running interpreter: the project's own venv carries trl ≥ 1.13,
which has no PPO. `make parity` builds the separate venv once and runs this file; by hand:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 omegaconf==2.3.1 pytest
    PYTHONPATH=. .venv-trl/bin/python -m pytest -q tests/test_trl_parity.py

About 30 s with trl installed (TRL's import and the 20 cases of the script, several of them twice).
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
