"""`cory-measure precision-gap`: the bf16 − fp32 gaps by hand, and the tool on the tiny model.

Run: `pytest tests/test_precision_gap.py` (about 15 s on 2 CPUs).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from cory.studies.precision_gap import gaps, main


def test_gaps_by_hand():
    """Two answers of two tokens, the second answer's last token padding (masked out):
    Δlogπ = (0.1, −0.2, 0.3 | 5.0 masked): max 0.3, mean 0.2; Δkl_t = (0.01, 0.02, 0.03); KL_seq fp32 = (0.3, 0.1),
    bf16 = (0.33, 0.13): relative gaps 0.1 and 0.3."""
    mask = torch.tensor([[True, True], [True, False]])
    base = SimpleNamespace(
        logprobs=torch.zeros(2, 2),
        ref_logprobs=torch.zeros(2, 2),
        kls=torch.tensor([[0.1, 0.2], [0.1, 9.0]]),
    )
    other = SimpleNamespace(
        logprobs=torch.tensor([[0.1, -0.2], [0.3, 5.0]]),
        ref_logprobs=torch.tensor([[0.0, 0.0], [-0.4, 0.0]]),
        kls=torch.tensor([[0.11, 0.22], [0.13, 1.0]]),
    )
    out = gaps(base, other, mask)
    assert out["max_abs_logp"] == pytest.approx(0.3) and out["mean_abs_logp"] == pytest.approx(0.2)
    assert out["max_abs_ref_logp"] == pytest.approx(0.4) and out["mean_abs_ref_logp"] == pytest.approx(0.4 / 3)
    assert out["max_abs_kl_t"] == pytest.approx(0.03) and out["mean_abs_kl_t"] == pytest.approx(0.02)
    assert out["max_rel_kl_seq"] == pytest.approx(0.3) and out["mean_rel_kl_seq"] == pytest.approx(0.2)
    assert out["mean_kl_seq"] == pytest.approx(0.2)


def test_on_the_tiny_model_bf16_moves_log_probs_and_the_noise_sets_the_kl(tmp_path):
    """experiment=smoke (16 held-out prompts): with noise the fp32 KL is positive and bf16 moves both log π and the
    KL; without noise π = π0 in either precision, so every KL is exactly 0 while bf16 still moves log π."""
    out = tmp_path / "gap.json"
    assert main(["--noise", "0.05", "--repeat", "1", "--out", str(out), "experiment=smoke"]) == 0
    moved = json.loads(out.read_text())
    assert moved["answers"] == 16 and moved["tokens"] > 16
    assert moved["mean_kl_seq"] > 0 and moved["max_abs_logp"] > 0 and moved["max_rel_kl_seq"] > 0
    assert moved["mean_abs_logp"] <= moved["max_abs_logp"] and moved["fp32_s"] > 0 and moved["bf16_s"] > 0
    assert main(["--noise", "0", "--repeat", "1", "--out", str(out), "experiment=smoke"]) == 0
    still = json.loads(out.read_text())
    assert still["mean_kl_seq"] == 0 and still["max_abs_kl_t"] == 0 and math.isnan(still["max_rel_kl_seq"])
    assert still["max_abs_logp"] > 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--noise", "-1", "experiment=smoke"], "--noise: -1 is not a finite number of 0 or more"),
        (["experiment=smoke", "model.lora.enabled=true"], "model.lora.enabled=true"),
        (["experiment=smoke", "hardware.precision=bf16"], "already autocasts"),
    ],
)
def test_what_it_cannot_measure_is_one_line(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
