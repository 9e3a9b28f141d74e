"""Hand-computed unit tests for every function in `cory.ppo.core` (docs/method.md §1.4, §1.5, §2.3–§2.8).

Pure maths, no model, no network. Every expected number is worked out by hand in the
comments next to it, on small [B=2, T=3] tensors whose masks include padding. Padding positions hold large
garbage values on purpose, so a function that forgets the mask fails loudly. GAE is also checked against a
naive per-sample loop over only the real response tokens.

Run:  HF_HUB_OFFLINE=1 WANDB_MODE=disabled .venv/bin/python -m pytest tests/test_ppo_core.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cory.ppo import core as pc

# two rows, three response columns; row 1 has one padding column
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# a second mask with padding in both rows
MASK22 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def close(actual: torch.Tensor | float, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


# ---------------------------------------------------------------------------------------------- masked statistics
def test_masked_mean_all_dims_and_per_row():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # all dims: (1 + 2 + 4) / 3 = 7/3; the masked 3, 5, 6 are ignored
    close(pc.masked_mean(values, mask), 7 / 3)
    # per row: (1 + 2)/2 = 1.5 and 4/1 = 4
    close(pc.masked_mean(values, mask, dim=1), [1.5, 4.0])
    # per column: (1 + 4)/2 = 2.5, 2/1 = 2 (column 2 is fully masked → 0/0, not tested)
    close(pc.masked_mean(values, mask, dim=0)[:2], [2.5, 2.0])


def test_masked_var_bessel_and_biased():
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -50.0]])
    # masked elements 1, 3, 5, 7: mean 4, squared deviations 9 + 1 + 1 + 9 = 20
    close(pc.masked_var(values, MASK22), 20 / 3)  # Bessel: 20 / (4 − 1)
    close(pc.masked_var(values, MASK22, unbiased=False), 5.0)  # biased: 20 / 4


def test_masked_var_needs_two_elements():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    one = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="at least 2"):
        pc.masked_var(values, one)
    with pytest.raises(ValueError):
        pc.masked_var(values, torch.zeros_like(values))
    # two elements are enough: 2 and 5 → mean 3.5, deviations² 2.25 + 2.25 = 4.5, /(2 − 1) = 4.5
    close(pc.masked_var(values, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])), 4.5)


def test_masked_whiten_shift_mean_true_and_false():
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -50.0]])
    # mean 4, Bessel variance 20/3 → std sqrt(20/3 + 1e-8) = 2.5819889
    std = math.sqrt(20 / 3 + 1e-8)
    expected = torch.tensor([[-3 / std, -1 / std, 0.0], [1 / std, 3 / std, 0.0]])  # ±1.161895, ±0.387298
    white = pc.masked_whiten(values, MASK22)
    close(white * MASK22, expected)
    close(pc.masked_mean(white, MASK22), 0.0)
    close(pc.masked_var(white, MASK22), 1.0, atol=1e-6)
    # shift_mean=False adds the mean (4) back: 4 − 1.161895 = 2.838105, …
    kept = pc.masked_whiten(values, MASK22, shift_mean=False)
    close(kept * MASK22, (expected + 4.0) * MASK22)
    close(pc.masked_mean(kept, MASK22), 4.0)


# -------------------------------------------------------------------------------------- log-probs, entropy, KL
def _logits_from_probs(probs: list[list[list[float]]], shift: float = 0.0) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=torch.float64)) + shift


P = [0.5, 0.25, 0.25]
Q = [0.25, 0.5, 0.25]


def test_gather_logprobs():
    # logits = log p + 7: log_softmax removes the constant, so the log-probs are exactly log p
    logits = _logits_from_probs([[P, Q, P], [Q, Q, P]], shift=7.0)
    tokens = torch.tensor([[0, 1, 2], [0, 2, 1]])
    expected = torch.log(torch.tensor([[0.5, 0.5, 0.25], [0.25, 0.25, 0.25]], dtype=torch.float64))
    close(pc.gather_logprobs(logits, tokens), expected)


def test_entropy_uniform_is_log_v_and_one_hot_is_zero():
    V = 5
    uniform = torch.full((2, 3, V), 3.3)
    close(pc.entropy_from_logits(uniform), torch.full((2, 3), math.log(V)))  # log 5 = 1.609438
    one_hot = torch.zeros(2, 3, V)
    one_hot[..., 2] = 100.0  # p ≈ (e^-100, …, 1, …): H ≈ 4·100·e^-100 ≈ 0
    close(pc.entropy_from_logits(one_hot), torch.zeros(2, 3))
    # p = (1/2, 1/4, 1/4): H = ½ln2 + ¼ln4 + ¼ln4 = 1.5·ln2 = 1.039721
    close(pc.entropy_from_logits(_logits_from_probs([[P]])), [[1.5 * math.log(2)]])


def test_entropy_and_kl_from_a_log_softmax_already_taken():
    # the same hand values through the log-softmax the rollout and the learner take once and reuse
    close(pc.entropy_from_log_probs(torch.log_softmax(_logits_from_probs([[P]]), -1)), [[1.5 * math.log(2)]])
    p, q = torch.log_softmax(_logits_from_probs([[P]]), -1), torch.log_softmax(_logits_from_probs([[Q]]), -1)
    close(pc.full_kl_of(p, q), [[0.25 * math.log(2)]])  # KL(p‖q) = ¼·ln2, as test_full_kl_explicit_distributions
    close(pc.gather(p, torch.tensor([[1]])), [[math.log(0.25)]])
    # the stated tolerance of that reuse: on a GPT-2-sized vocabulary in float32 the entropy moves in its last
    # digits only (both forms within relative 1e-5 of float64, the reused one the closer: 2e-6 against 4e-6 here);
    # the log-probs and the KL are the same numbers
    logits = torch.randn(4, 16, 50257, generator=torch.Generator().manual_seed(0)) * 3
    log_probs = torch.log_softmax(logits, -1)
    exact = pc.entropy_from_logits(logits.double())
    reused, logsumexp = pc.entropy_from_log_probs(log_probs).double(), pc.entropy_from_logits(logits).double()
    assert ((reused - exact) / exact).abs().max() <= ((logsumexp - exact) / exact).abs().max() <= 1e-5
    tokens = torch.randint(0, 50257, (4, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(pc.gather(log_probs, tokens), pc.gather_logprobs(logits, tokens))
    assert torch.equal(pc.full_kl_of(log_probs, log_probs.flip(0)), pc.full_kl(logits, logits.flip(0)))


def test_full_kl_explicit_distributions():
    # KL(p‖q) = ½·ln(0.5/0.25) + ¼·ln(0.25/0.5) + ¼·ln(1) = ½ln2 − ¼ln2 = ¼·ln2 = 0.173287
    # KL(q‖p) = ¼·ln(0.5) + ½·ln(2) + 0 = ¼·ln2 as well (this pair is symmetric), so also check p‖u:
    # KL(p‖uniform3) = ln3 − H(p) = 1.098612 − 1.039721 = 0.058892
    U = [1 / 3, 1 / 3, 1 / 3]
    logits = _logits_from_probs([[P, P, P], [P, Q, P]])
    ref = _logits_from_probs([[Q, P, U], [U, U, P]])
    expected = [
        [0.25 * math.log(2), 0.0, math.log(3) - 1.5 * math.log(2)],
        [math.log(3) - 1.5 * math.log(2), math.log(3) - 1.5 * math.log(2), 0.0],
    ]
    close(pc.full_kl(logits, ref), expected)
    # direction: the expectation is under the policy π (first argument), not under π0
    p_logits = _logits_from_probs([[[0.9, 0.1]]])
    q_logits = _logits_from_probs([[[0.5, 0.5]]])
    # KL(0.9,0.1 ‖ 0.5,0.5) = 0.9 ln1.8 + 0.1 ln0.2 = 0.529008 − 0.160944 = 0.368064
    close(pc.full_kl(p_logits, q_logits), [[0.9 * math.log(1.8) + 0.1 * math.log(0.2)]])
    # KL(0.5,0.5 ‖ 0.9,0.1) = 0.5 ln(0.5/0.9) + 0.5 ln 5 = 0.510826, different
    close(pc.full_kl(q_logits, p_logits), [[0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5)]])


def test_full_kl_zero_when_equal_and_shift_invariant():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    ref = torch.randn(2, 3, 11, generator=g) * 3
    close(pc.full_kl(logits, logits), torch.zeros(2, 3))
    base = pc.full_kl(logits, ref)
    assert (base > 0).all()
    close(pc.full_kl(logits + 5.0, ref), base, atol=1e-5)
    close(pc.full_kl(logits, ref - 7.0), base, atol=1e-5)
    # per-row constants too (softmax is invariant to any constant per position)
    close(pc.full_kl(logits + torch.randn(2, 3, 1, generator=g), ref), base, atol=1e-5)


def test_kl_penalty_estimators():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -1.0]])
    ref_logprobs = torch.tensor([[-1.5, -1.0, -3.0], [-0.25, -5.0, -1.0]])
    # diff = logπ − logπ0 = [[0.5, −1, 0], [−0.25, 1, 0]]
    close(pc.kl_penalty(logprobs, ref_logprobs, "kl"), [[0.5, -1.0, 0.0], [-0.25, 1.0, 0.0]])
    close(pc.kl_penalty(logprobs, ref_logprobs, "abs"), [[0.5, 1.0, 0.0], [0.25, 1.0, 0.0]])
    # mse = ½·diff²: ½·0.25 = 0.125, ½·1 = 0.5, ½·0.0625 = 0.03125
    close(pc.kl_penalty(logprobs, ref_logprobs, "mse"), [[0.125, 0.5, 0.0], [0.03125, 0.5, 0.0]])
    with pytest.raises(ValueError, match="full"):
        pc.kl_penalty(logprobs, ref_logprobs, "full")
    with pytest.raises(ValueError):
        pc.kl_penalty(logprobs, ref_logprobs, "nonsense")


def test_penalized_rewards_score_at_last_real_token():
    scores = torch.tensor([2.0, -1.0])
    kls = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.9]])  # 9.9 sits on padding
    # β = 0.5: −β·kl = [[−0.05, −0.1, −0.15], [−0.2, −0.25, 0 (padding)]]
    rewards, non_score = pc.penalized_rewards(scores, kls, 0.5, MASK)
    close(non_score, [[-0.05, -0.10, -0.15], [-0.20, -0.25, 0.0]])
    # score added at the last unmasked token: row 0 column 2 (−0.15 + 2 = 1.85), row 1 column 1 (−0.25 − 1 = −1.25)
    close(rewards, [[-0.05, -0.10, 1.85], [-0.20, -1.25, 0.0]])
    # a one-token row gets the score on its only token
    rewards, _ = pc.penalized_rewards(scores, kls, 0.5, torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    close(rewards, [[-0.05 + 2.0, 0.0, 0.0], [-0.2, -0.25, -4.95 - 1.0]])


# ------------------------------------------------------------------------------------------------------ GAE
def test_gae_hand_computed_gamma1_lambda095():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, -1.0, 3.0]])  # 3.0 on padding must be ignored
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.6, 7.0]])  # 7.0 on padding must be ignored
    # row 0 (T=3), V_4 = 0:
    #   t=2: δ = 1 + 0 − 0.3 = 0.7;                 A = 0.7
    #   t=1: δ = 0 + 0.3 − 0.2 = 0.1;               A = 0.1 + 0.95·0.7   = 0.765
    #   t=0: δ = 0 + 0.2 − 0.1 = 0.1;               A = 0.1 + 0.95·0.765 = 0.82675
    #   returns G = A + V = [0.92675, 0.965, 1.0]
    # row 1 (T=2), V_3 = 0 (not the padding 7.0):
    #   t=1: δ = −1 + 0 − 0.6 = −1.6;               A = −1.6
    #   t=0: δ = 0.5 + 0.6 − 0.4 = 0.7;             A = 0.7 + 0.95·(−1.6) = −0.82
    #   returns G = [−0.42, −1.0]
    advantages, returns = pc.gae(rewards, values, MASK, gamma=1.0, lam=0.95)
    close(returns * MASK, [[0.92675, 0.965, 1.0], [-0.42, -1.0, 0.0]])
    # advantages are the raw A = [0.82675, 0.765, 0.7, −0.82, −1.6] whitened over those five tokens:
    raw = torch.tensor([0.82675, 0.765, 0.7, -0.82, -1.6], dtype=torch.float64)
    mean = raw.mean()  # −0.025650
    std = math.sqrt(raw.var(unbiased=True).item() + 1e-8)
    white = ((raw - mean) / std).tolist()
    close(advantages * MASK, [white[:3], [*white[3:], 0.0]], atol=1e-5)


def _naive_gae(rewards, values, mask, gamma, lam):
    """Per-sample python loop over only the T_i real tokens, V_{T_i+1} = 0; returns raw A and G lists."""
    advs, rets = [], []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist()):
        n = int(sum(m_row))
        r, v = r_row[:n], v_row[:n]
        a, last = [0.0] * n, 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            a[t] = last
        advs.append(a)
        rets.append([a_t + v_t for a_t, v_t in zip(a, v)])
    return advs, rets


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8)])
def test_gae_matches_naive_loop_on_ragged_batch(gamma, lam):
    g = torch.Generator().manual_seed(1)
    lengths = [7, 1, 4, 7, 2]
    B, T = len(lengths), max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    # garbage on padding: the implementation must not read it
    rewards = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e3))
    values = torch.where(mask.bool(), values, torch.full_like(values, -1e3))
    advantages, returns = pc.gae(rewards, values, mask, gamma, lam)
    naive_a, naive_g = _naive_gae(rewards, values, mask, gamma, lam)
    for i, n in enumerate(lengths):
        close(returns[i, :n], naive_g[i], atol=1e-10)
    flat = torch.tensor([a for row in naive_a for a in row], dtype=torch.float64)
    white = (flat - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8)
    close(torch.cat([advantages[i, :n] for i, n in enumerate(lengths)]), white, atol=1e-8)
    # whitened: masked mean ≈ 0, masked (Bessel) variance ≈ 1
    close(pc.masked_mean(advantages, mask), 0.0, atol=1e-8)
    close(pc.masked_var(advantages, mask), 1.0, atol=1e-6)


def test_gae_whiten_rewards_option_keeps_reward_mean():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, -1.0, 3.0]], dtype=torch.float64)
    values = torch.zeros(2, 3, dtype=torch.float64)
    _, returns_plain = pc.gae(rewards, values, MASK, 1.0, 1.0)
    # γ = λ = 1, V = 0: G_0 of each row is the row's reward sum; plain: 1 and −0.5
    close(returns_plain[:, 0], [1.0, -0.5])
    # whiten_rewards: the five real rewards [0, 0, 1, 0.5, −1] have mean 0.1, deviations² .01+.01+.81+.16+1.21 = 2.2
    # and Bessel var 2.2/4 = 0.55; they become (r − 0.1)/sqrt(0.55 + 1e-8) + 0.1, which sum to 5·0.1 = 0.5,
    # so G_0(row 0) + G_0(row 1) = 0.5.
    # Padding must stay at zero reward, otherwise it leaks into the last real token's advantage.
    _, returns_white = pc.gae(rewards, values, MASK, 1.0, 1.0, whiten_rewards=True)
    real = torch.tensor([0.0, 0.0, 1.0, 0.5, -1.0], dtype=torch.float64)
    white = (real - 0.1) / math.sqrt(0.55 + 1e-8) + 0.1
    close(returns_white * MASK, [[white[:3].sum(), white[1:3].sum(), white[2]], [white[3:].sum(), white[4], 0.0]])
    close(returns_white[0, 0] + returns_white[1, 0], 0.5, atol=1e-6)


def test_gae_whiten_rewards_is_padding_invariant():
    """Extra padding columns must not change anything on real tokens (they do if whitened padding leaks)."""
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    wide = torch.zeros(2, 5)
    a3, g3 = pc.gae(rewards, values, MASK, 1.0, 0.95, whiten_rewards=True)
    a5, g5 = pc.gae(
        torch.cat([rewards, wide[:, :2]], 1),
        torch.cat([values, wide[:, :2]], 1),
        torch.cat([MASK, wide[:, :2]], 1),
        1.0,
        0.95,
        whiten_rewards=True,
    )
    close(g5[:, :3] * MASK, g3 * MASK, atol=1e-6)
    close(a5[:, :3] * MASK, a3 * MASK, atol=1e-6)


# --------------------------------------------------------------------------------------------------- losses
def test_policy_loss_with_clipping_active():
    ln = math.log
    # ratios ρ: row 0 = [1.5, 0.5, 0.5], row 1 = [1.0, 1.1, e^5 (padding)]
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[ln(1.5), ln(0.5), ln(0.5)], [0.0, ln(1.1), 5.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0], [2.0, -1.0, 100.0]])
    # token  ρ    Â   −Âρ    −Â·clip(ρ,0.8,1.2)  max    clipped term active?
    # a      1.5  +1  −1.5   −1.2                −1.2   yes
    # b      0.5  +1  −0.5   −0.8                −0.5   no
    # c      0.5  −1  +0.5   +0.8                +0.8   yes
    # d      1.0  +2  −2.0   −2.0                −2.0   no (equal)
    # e      1.1  −1  +1.1   +1.1                +1.1   no
    # loss = (−1.2 − 0.5 + 0.8 − 2.0 + 1.1)/5 = −1.8/5 = −0.36; clipfrac = 2/5; mean ρ = 4.6/5 = 0.92
    loss, clipfrac, ratio = pc.policy_loss(logprobs, old, advantages, MASK, cliprange=0.2)
    close(loss, -0.36)
    close(clipfrac, 0.4)
    close(ratio, 0.92)


def test_policy_loss_without_clipping_is_plain_surrogate():
    ln = math.log
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    # ρ = [1.0, 1.1, 0.9] and [1.2, 0.8 (padding irrelevant)]: all inside [0.8, 1.2]
    logprobs = old + torch.tensor([[0.0, ln(1.1), ln(0.9)], [0.0, 0.0, 3.0]])
    advantages = torch.tensor([[1.0, -1.0, 2.0], [0.5, 0.0, 9.0]])
    # −Âρ = [−1.0, 1.1, −1.8], [−0.5, 0]: sum −2.2 over 5 tokens → −0.44; no clipping
    loss, clipfrac, ratio = pc.policy_loss(logprobs, old, advantages, MASK, cliprange=0.2)
    close(loss, -0.44)
    close(clipfrac, 0.0)
    close(ratio, (1.0 + 1.1 + 0.9 + 1.0 + 1.0) / 5)  # 1.0
    # the gradient w.r.t. log π is −Â·ρ per token / 5 (unclipped)
    lp = logprobs.clone().requires_grad_(True)
    pc.policy_loss(lp, old, advantages, MASK, 0.2)[0].backward()
    close(lp.grad, [[-1.0 / 5, 1.1 / 5, -1.8 / 5], [-0.5 / 5, 0.0, 0.0]], atol=1e-6)


def test_value_loss_clipped_and_unclipped():
    vpreds = torch.tensor([[1.0, 1.0, 0.6], [-1.0, 0.0, 50.0]])
    old = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 1.0], [-1.0, 0.5, -50.0]])
    # token V     V_old G     clip(V)  (V−G)²  (Vclip−G)²  max    clipped active?
    # a     1.0   0.5   0.0   0.7      1.0     0.49        1.0    no
    # b     1.0   0.5   2.0   0.7      1.0     1.69        1.69   yes
    # c     0.6   0.5   1.0   0.6      0.16    0.16        0.16   no
    # d    −1.0   0.0  −1.0  −0.2      0.0     0.64        0.64   yes
    # e     0.0   0.0   0.5   0.0      0.25    0.25        0.25   no
    # loss = ½·(1 + 1.69 + 0.16 + 0.64 + 0.25)/5 = ½·0.748 = 0.374; clipfrac = 2/5
    loss, clipfrac = pc.value_loss(vpreds, old, returns, MASK, cliprange_value=0.2)
    close(loss, 0.374)
    close(clipfrac, 0.4)
    # inside the clip range the loss is exactly ½·masked MSE: ½·(0.01 + 0.04 + 0.09 + 0.16 + 0)/5 = 0.03
    vpreds = old + torch.tensor([[0.1, -0.1, 0.1], [0.0, 0.0, 0.0]])
    returns = vpreds + torch.tensor([[0.1, 0.2, -0.3], [0.4, 0.0, 7.0]])
    loss, clipfrac = pc.value_loss(vpreds, old, returns, MASK, cliprange_value=0.2)
    close(loss, 0.5 * (0.01 + 0.04 + 0.09 + 0.16) / 5)
    close(clipfrac, 0.0)


def test_explained_variance():
    returns = torch.tensor([[1.0, 3.0, 99.0], [5.0, 7.0, -99.0]])
    # perfect critic → 1; zero critic → 1 − Var(G)/Var(G) = 0
    close(pc.explained_variance(returns, returns, MASK22), 1.0)
    close(pc.explained_variance(torch.zeros_like(returns), returns, MASK22), 0.0)
    # G = [1, 3, 5, 7], V = [1, 3, 5, 5]: G − V = [0, 0, 0, 2], Var = 3/3 = 1; Var(G) = 20/3 → 1 − 0.15 = 0.85
    values = torch.tensor([[1.0, 3.0, 0.0], [5.0, 5.0, 0.0]])
    close(pc.explained_variance(values, returns, MASK22), 0.85)


# ------------------------------------------------------------------------------------- score scaling, KL ctl
def test_running_moments_initial_state_and_hand_case():
    m = pc.RunningMoments()
    assert m.mean == 0.0 and m.std == 1.0
    m.update(torch.tensor([1.0, 2.0, 3.0]))
    # mean 2, Bessel std sqrt(((−1)² + 0 + 1²)/2) = 1
    assert m.mean == pytest.approx(2.0, abs=1e-12)
    assert m.std == pytest.approx(1.0, abs=1e-12)
    m.update(torch.tensor([6.0]))
    # all scores [1, 2, 3, 6]: mean 3, deviations² 4 + 1 + 0 + 9 = 14, Bessel std sqrt(14/3) = 2.160247
    assert m.mean == pytest.approx(3.0, abs=1e-12)
    assert m.std == pytest.approx(math.sqrt(14 / 3), abs=1e-12)


def test_running_moments_match_numpy_over_three_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 8, 3)]
    m = pc.RunningMoments()
    for b in batches:
        m.update(torch.tensor(b, dtype=torch.float32))
    every = np.concatenate([b.astype(np.float32).astype(np.float64) for b in batches])
    assert m.mean == pytest.approx(np.mean(every), abs=1e-9)
    assert m.std == pytest.approx(np.std(every, ddof=1), abs=1e-9)
    assert m.count == pytest.approx(16)


def test_scale_scores_norm_scale_only_and_clip():
    moments = pc.RunningMoments(mean=1.0, std=2.0)
    scores = torch.tensor([5.0, -3.0, 1.0])
    # norm: (R − 1)/(2 + ε) = [2, −2, 0]; scale only: R/(2 + ε) = [2.5, −1.5, 0.5]   (ε = 1.19e-7)
    close(pc.scale_scores(scores, moments, norm=True, clip=None), [2.0, -2.0, 0.0])
    close(pc.scale_scores(scores, moments, norm=False, clip=None), [2.5, -1.5, 0.5])
    close(pc.scale_scores(scores, moments, norm=True, clip=1.0), [1.0, -1.0, 0.0])
    close(pc.scale_scores(scores, moments, norm=False, clip=2.0), [2.0, -1.5, 0.5])
    # the ε is float32's machine epsilon: std = 0 does not divide by zero
    out = pc.scale_scores(scores, pc.RunningMoments(mean=0.0, std=0.0), norm=False, clip=None)
    close(out, scores / torch.finfo(torch.float32).eps, atol=1.0)


@pytest.mark.parametrize(
    "kl,expected",
    [
        (3.0, 0.3 * (1 - 0.2 * 256 / 10000)),  # e = 3/6 − 1 = −0.5 → −0.2: 0.3·0.99488 = 0.298464
        (12.0, 0.3 * (1 + 0.2 * 256 / 10000)),  # e = 1 → +0.2: 0.3·1.00512 = 0.301536
        (6.6, 0.3 * (1 + 0.1 * 256 / 10000)),  # e = 0.1 (in range): 0.3·1.00256 = 0.300768
        (6.0, 0.3),  # e = 0: unchanged
        (0.0, 0.298464),  # e = −1 → −0.2
    ],
)
def test_kl_controller_adaptive(kl, expected):
    ctl = pc.KLController(0.3, adaptive=True, target=6.0, horizon=10000.0)
    ctl.update(kl, 256)
    assert ctl.value == pytest.approx(expected, abs=1e-12)


def test_kl_controller_fixed_stays_constant():
    ctl = pc.KLController(0.3, adaptive=False, target=6.0, horizon=10000.0)
    for kl in (0.0, 3.0, 100.0):
        ctl.update(kl, 256)
    assert ctl.value == 0.3


def paper_controller() -> pc.KLController:
    """β = 1 with the paper's adaptive controller: target 6, horizon 10000 (docs/method.md §2.8)."""
    return pc.KLController(1.0, adaptive=True, target=6.0, horizon=10000.0)


def test_reference_1_5_kl_drift_bounds():
    """docs/method.md §1.5: ±0.2·B/10000 per iteration; B=256 → ±0.512%, ×0.60…×1.67 over 100 iterations."""
    lo, hi = paper_controller(), paper_controller()
    lo.update(0.0, 256)
    hi.update(1e9, 256)
    assert lo.value == pytest.approx(1 - 0.00512, abs=1e-12)
    assert hi.value == pytest.approx(1 + 0.00512, abs=1e-12)
    for _ in range(99):
        lo.update(0.0, 256)
        hi.update(1e9, 256)
    assert round(lo.value, 2) == 0.60 and round(hi.value, 2) == 1.67
    # with a reset every 5 iterations β stays within about ±2.6%
    five = paper_controller()
    for _ in range(5):
        five.update(1e9, 256)
    assert abs(five.value - 1) == pytest.approx(0.026, abs=5e-4)
    # GSM8K (B=32): ±0.064% per iteration, ×0.94 … ×1.07 over 100 iterations
    lo, hi = paper_controller(), paper_controller()
    for _ in range(100):
        lo.update(0.0, 32)
        hi.update(1e9, 32)
    assert round(lo.value, 2) == 0.94 and round(hi.value, 2) == 1.07
