"""`cory-measure kl-optimum`: the KL-regularised optimum over K answers per prompt, by hand and on the tiny model.

Run: `pytest tests/test_kl_optimum.py` (about 15 s on 2 CPUs).
"""

from __future__ import annotations

import json
import math

import pytest

from cory.studies.kl_optimum import main, tilted


def test_two_answers_by_hand():
    """r = (0, 1), η = 1: w = (1, e)/(1 + e); gain w₂ − ½ = 0.23106; KL = Σ w log(2w) = 0.11094; combined gain
    0.12011 = log((1 + e)/2) − ½."""
    out = tilted([0.0, 1.0], 1.0)
    assert out["reward_gain"] == pytest.approx(0.2310586, abs=1e-7)
    assert out["kl"] == pytest.approx(0.1109441, abs=1e-7)
    assert out["combined_gain"] == pytest.approx(math.log((1 + math.e) / 2) - 0.5, abs=1e-12)


def test_equal_answers_leave_nothing_to_gain_and_a_small_eta_picks_the_best():
    assert tilted([0.7, 0.7, 0.7], 0.3) == pytest.approx({"reward_gain": 0.0, "kl": 0.0, "combined_gain": 0.0})
    best = tilted([0.0, 1.0, 2.0], 1e-3)  # all weight on r = 2: gain 2 − 1, KL log 3
    assert best["reward_gain"] == pytest.approx(1.0) and best["kl"] == pytest.approx(math.log(3))
    big = tilted([500.0, -500.0], 0.3)  # shifted by the maximum: no overflow
    assert big["reward_gain"] == pytest.approx(500.0) and big["kl"] == pytest.approx(math.log(2))


def test_the_tool_samples_every_held_out_prompt_and_never_loses(tmp_path):
    """On experiment=smoke (16 held-out prompts): K answers each, the optimum's combined gain ≥ 0, its KL ≤ log K, and
    the combined gain is the reward gain less η·KL (means of a linear function)."""
    out = tmp_path / "optimum.json"
    assert main(["--samples", "3", "--out", str(out), "experiment=smoke"]) == 0
    result = json.loads(out.read_text())
    assert (result["prompts"], result["samples"], result["eta"]) == (16, 3, 0.3)
    assert result["within_prompt_sd"] > 0  # the tiny model's answers differ, so there is something to tilt
    assert 0 <= result["combined_gain"] and 0 <= result["kl"] <= math.log(3)
    assert result["combined_gain"] == pytest.approx(result["reward_gain"] - 0.3 * result["kl"])
