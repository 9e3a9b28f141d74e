"""`Agent.learn` against TRL 0.11.4's `PPOTrainer.step` (the oracle; see scripts/check_trl_parity.py).

Skipped unless trl 0.11.x is installed in the running interpreter: the project's own venv carries trl ≥ 1.13,
which has no PPO. To run it:

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 pytest
    PYTHONPATH=. .venv-trl/bin/python -m pytest tests/test_trl_parity.py
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

CASES = {c["name"]: c for c in parity.DEFAULT_CASES if c["name"] in ("full_8-2-2", "kl_8-4-1")}


@pytest.mark.skipif(not _TRL_OK, reason=_TRL_WHY)
@pytest.mark.parametrize("name", sorted(CASES))
def test_learn_matches_trl_step(name: str) -> None:
    report = parity.run_case(**CASES[name], n_steps=2)
    assert report["passed"], report["failures"]
    assert report["initial_param_max_abs_diff"] == 0.0
    # the update really moved the weights, so the agreement is not trivial
    assert report["steps"][-1]["param_max_abs_change_from_init"] > 1e-3


def test_script_runs_without_trl_message() -> None:
    """Without trl 0.11.x the script explains how to install it (checked only where it is missing)."""
    if _TRL_OK:
        pytest.skip("trl 0.11.x is installed here")
    assert "trl==0.11.4" in _TRL_WHY
