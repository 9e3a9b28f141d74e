"""Behaviour tests for `cory.ppo.learner.Agent` and `cory.ppo.rollout` on the tiny in-memory GPT-2 (method §1.4, §2).

Covers: a `learn` call moves the policy and the value head but never the frozen reference; rollout log-probs,
values and KL are invariant to padding (left-padded prompts, right-padded responses, explicit position ids);
truncation after the first EOS (EOS kept) and `pad`; KL is exactly 0 at step 0 and positive after an update;
TRL's ratio-threshold path (loss × 0 but Adam still steps on its momentum) and the true-skip option; a
save/load round trip that restores everything and contains no pickle but the weights-only optimiser state;
`learn`'s statistics and the adaptive KL update with the β from before the update.

The tiny model's weights are re-drawn with a large scale ("sharpened") so its distributions are far from
uniform; otherwise log-prob comparisons would pass for a near-constant model whatever the positions.

Run:  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled \
      .venv/bin/python -m pytest tests/test_agent.py -q
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.from_config import learner
from transformers import LogitsProcessor, LogitsProcessorList

from cory import engines
from cory.errors import ConfigError
from cory.models import build_tiny_gpt2, make_reference
from cory.ppo import core as ppo_core
from cory.ppo.learner import Agent, Batch, PPOConfig, agent_on
from cory.ppo.rollout import forward_logits, length_groups, pad, truncate_after_eos

# The paper's learner block from the YAML, with B = 4 samples, 2 per minibatch, 2 epochs → 4 optimiser steps per learn
CFG = learner(learning_rate=1e-3, mini_batch_size=2, ppo_epochs=2)
PROMPT_LENS = [3, 5, 2, 4]
RESPONSE_LENS = [4, 1, 6, 3]
SCORES = torch.tensor([1.0, -0.5, 2.0, 0.0])


def sharpen(model: torch.nn.Module, seed: int) -> None:
    """Re-draw weights at a large scale so logits, positions and attention all matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def make_agent(cfg: PPOConfig = CFG, seed: int = 0, model_seed: int = 0, ref=None, **placement) -> Agent:
    model, tokenizer = build_tiny_gpt2(seed=model_seed)
    sharpen(model, model_seed)
    ref = make_reference(model) if ref is None else ref
    return agent_on("llm1", model, ref, tokenizer, cfg, seed=seed, **placement)


def token_lists(eos: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Ragged prompts and responses of byte tokens; the third response ends in EOS like a finished generation."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in PROMPT_LENS]
    responses = [torch.randint(0, 256, (n,), generator=g) for n in RESPONSE_LENS]
    responses[2][-1] = eos
    return prompts, responses


def rollout_for(agent: Agent, seed: int = 0):
    return agent.actor.score_tokens(*token_lists(agent.actor.tokenizer.eos_token_id, seed))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module, prefix: str = "") -> list[str]:
    now = module.state_dict()
    return [k for k in before if k.startswith(prefix) and not torch.equal(before[k], now[k])]


# ------------------------------------------------------------------------------------------------------- (a)
def test_learn_moves_policy_and_value_head_but_not_reference():
    agent = make_agent()
    ref_before = snapshot(agent.actor.reference)
    policy_before = snapshot(agent.trainee.policy)
    agent.learner.update(Batch(rollout_for(agent), SCORES))
    moved = changed(policy_before, agent.trainee.policy)
    assert any(k.startswith("pretrained_model.transformer.h.") for k in moved), moved
    assert "pretrained_model.transformer.wte.weight" in moved
    assert {"v_head.summary.weight", "v_head.summary.bias"} <= set(moved)
    # the reference is bit-identical, frozen and shares no storage with the policy
    assert changed(ref_before, agent.actor.reference) == []
    assert all(not p.requires_grad for p in agent.actor.reference.parameters())
    policy_ptrs = {p.data_ptr() for p in agent.trainee.policy.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in agent.actor.reference.parameters()}


# ------------------------------------------------------------------------------------------------------- (b)
def _single_forward(agent: Agent, prompt: torch.Tensor, response: torch.Tensor):
    """Plain unpadded forward of one sequence: log-probs, ref log-probs, values, full KL of the response."""
    ids = torch.cat([prompt, response])[None]
    P, T = len(prompt), len(response)
    with torch.no_grad():
        logits, values = agent.trainee.policy(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
        ref_logits = agent.actor.reference(input_ids=ids).logits
    logits, ref_logits, values = (
        logits[:, P - 1 : P + T - 1],
        ref_logits[:, P - 1 : P + T - 1],
        values[:, P - 1 : P + T - 1],
    )
    return (
        ppo_core.gather_logprobs(logits, response[None])[0],
        ppo_core.gather_logprobs(ref_logits, response[None])[0],
        values[0],
        ppo_core.full_kl(logits, ref_logits)[0],
    )


def test_score_tokens_is_padding_invariant():
    agent = make_agent()
    agent.learner.update(Batch(rollout_for(agent, seed=5), SCORES))  # policy ≠ reference: KL, ref log-probs differ
    prompts, responses = token_lists(agent.actor.tokenizer.eos_token_id)
    rollout = agent.actor.score_tokens(prompts, responses)
    assert rollout.logprobs.std() > 1.0  # the sharpened model is far from uniform: the comparison has teeth
    for i, (p, r) in enumerate(zip(prompts, responses)):
        T = len(r)
        lp, ref_lp, v, kl = _single_forward(agent, p, r)
        torch.testing.assert_close(rollout.logprobs[i, :T], lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(rollout.ref_logprobs[i, :T], ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(rollout.values[i, :T], v, atol=1e-5, rtol=0)
        torch.testing.assert_close(rollout.kls[i, :T], kl, atol=1e-5, rtol=0)
        assert rollout.response_mask[i].tolist() == [1] * T + [0] * (rollout.response_mask.shape[1] - T)
        assert (rollout.kls[i, T:] == 0).all()
    assert (rollout.kls * rollout.response_mask).sum() > 0
    # sensitivity: the same padded batch without position ids gives different log-probs for left-padded rows
    p_ids, p_mask = pad(prompts, agent.actor.tokenizer.pad_token_id, left=True)
    r_ids, r_mask = pad(responses, agent.actor.tokenizer.pad_token_id, left=False)
    with torch.no_grad():
        out = agent.trainee.policy.pretrained_model(
            input_ids=torch.cat([p_ids, r_ids], 1), attention_mask=torch.cat([p_mask, r_mask], 1)
        ).logits[:, p_ids.shape[1] - 1 : -1]
    no_pos = ppo_core.gather_logprobs(out, r_ids)
    row = PROMPT_LENS.index(min(PROMPT_LENS))  # the most left-padded prompt
    assert (no_pos[row, : RESPONSE_LENS[row]] - rollout.logprobs[row, : RESPONSE_LENS[row]]).abs().max() > 1e-3


def test_forward_logits_aligns_logits_with_response_tokens():
    agent = make_agent()
    prompts, responses = token_lists(agent.actor.tokenizer.eos_token_id)
    p_ids, p_mask = pad(prompts, 0, left=True)
    r_ids, r_mask = pad(responses, 0, left=False)
    with torch.no_grad():
        logits, values = forward_logits(agent.trainee.policy, p_ids, p_mask, r_ids, r_mask, with_values=True)
    assert logits.shape == (4, max(RESPONSE_LENS), agent.trainee.policy.pretrained_model.config.vocab_size)
    assert values.shape == (4, max(RESPONSE_LENS))
    # column 0 is the prediction made at the last prompt token: equal to the next-token logits of the prompt alone
    with torch.no_grad():
        alone = agent.trainee.policy.pretrained_model(input_ids=prompts[0][None]).logits[0, -1]
    torch.testing.assert_close(logits[0, 0], alone, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------ forwards in length groups
def test_length_groups_cuts_rows_where_the_padded_positions_are_fewest():
    # totals 8, 15, 6, 15 → order 1, 3, 0, 2; {1, 3}: 2 × (10 + 5) = 30, {0, 2}: 2 × (4 + 5) = 18; one rectangle: 60
    assert length_groups([3, 10, 4, 10], [5, 5, 2, 5], 2) == [[1, 3], [0, 2]]
    # three: {1, 3}, {0}, {2} hold 30 + 8 + 6 = 44 positions, fewer than the two groups' 48
    assert length_groups([3, 10, 4, 10], [5, 5, 2, 5], 3) == [[1, 3], [0], [2]]
    assert length_groups([3, 10, 4, 10], [5, 5, 2, 5], 1) == [[0, 1, 2, 3]]  # one: every row in its own order
    assert length_groups([3, 3, 3], [5, 5, 5], 3) == [[0, 1, 2]]  # equal lengths: no cut saves a position
    assert length_groups([7], [2], 4) == [[0]]


def _masked_sum(logits: torch.Tensor, values: torch.Tensor, r_ids: torch.Tensor, r_mask: torch.Tensor):
    """A loss that reads every position a PPO loss reads (log-probs of the tokens, values), and no other."""
    logprobs = ppo_core.gather(torch.log_softmax(logits, -1), r_ids)
    return ((logprobs + values) * r_mask).sum()


def test_forward_logits_in_length_groups_is_the_one_rectangle_forward_up_to_rounding():
    """The rows run as 2 or 3 rectangles of their own length and come back in row order at the full width: at every
    position a loss reads, the logits, values and the gradient they send to every weight are the one rectangle's
    within float32 rounding; the positions a group did not compute hold zeros."""
    agent = make_agent()
    policy = agent.trainee.policy
    prompts, responses = token_lists(agent.actor.tokenizer.eos_token_id)
    p_ids, p_mask = pad(prompts, 0, left=True)
    r_ids, r_mask = pad(responses, 0, left=False)
    outs = {}
    for groups in (1, 2, 3):
        policy.zero_grad()
        logits, values = forward_logits(policy, p_ids, p_mask, r_ids, r_mask, True, groups)
        _masked_sum(logits, values, r_ids, r_mask).backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        outs[groups] = (logits.detach(), values.detach(), grads)
    want_logits, want_values, want_grads = outs[1]
    read = r_mask.bool()
    for groups in (2, 3):
        logits, values, grads = outs[groups]
        assert logits.shape == want_logits.shape and values.shape == want_values.shape
        torch.testing.assert_close(logits[read], want_logits[read], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(values[read], want_values[read], atol=2e-5, rtol=1e-5)
        assert grads.keys() == want_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], atol=1e-4, rtol=1e-4, msg=name)
    # with 3 groups the 1-token response (row 1) sits in a group of width 1: its other columns were not computed
    logits, values, _ = outs[3]
    # totals 7, 6, 8, 7 → order 2, 0, 3, 1; {2}: 1 × 8, {0, 3}: 2 × (4 + 4), {1}: 1 × (5 + 1): 30 positions of 40
    assert length_groups(PROMPT_LENS, RESPONSE_LENS, 3) == [[2], [0, 3], [1]]
    assert (logits[1, 1:] == 0).all() and (values[1, 1:] == 0).all()
    assert not (want_logits[1, 1:] == 0).all()  # the one rectangle computed them (padding)


def test_an_update_in_length_groups_learns_what_the_one_rectangle_learns():
    """Two agents from the same weights and seed, one with `length_groups=3`: the rollout numbers, the update's
    losses and the updated policies' log-probs and values agree within float32 rounding; they are not bit-identical,
    because the products' shapes differ. The weights are compared through what they compute: Adam turns the
    rounding noise of a gradient that is zero in exact arithmetic (the attention's key bias, to which softmax is
    blind) into steps of the learning rate's size, which move no output."""
    a, b = make_agent(), make_agent(length_groups=3)
    ra, rb = rollout_for(a), rollout_for(b)
    read = ra.response_mask.bool()
    for key in ("logprobs", "ref_logprobs", "values", "kls", "entropy"):
        torch.testing.assert_close(getattr(rb, key)[read], getattr(ra, key)[read], atol=2e-5, rtol=1e-5, msg=key)
    before = forward_logits(a.trainee.policy, ra.prompt_ids, ra.prompt_mask, ra.response_ids, ra.response_mask, True)
    sa, sb = a.learner.update(Batch(ra, SCORES)).stats, b.learner.update(Batch(rb, SCORES)).stats
    for key in ("policy_loss", "value_loss", "approx_kl", "clipfrac"):
        assert sb[key] == pytest.approx(sa[key], rel=1e-4, abs=1e-6), key
    with torch.no_grad():
        args = (ra.prompt_ids, ra.prompt_mask, ra.response_ids, ra.response_mask, True)
        (la, va), (lb, vb) = forward_logits(a.trainee.policy, *args), forward_logits(b.trainee.policy, *args)
    assert (la[read] - before[0][read]).abs().max() > 1e-2  # the update moved the outputs
    torch.testing.assert_close(lb[read], la[read], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(vb[read], va[read], atol=1e-4, rtol=1e-4)


def test_length_groups_on_several_processes_is_refused_in_one_line(monkeypatch):
    """Several forwards before one backward would break data-parallel gradient exchange (and a sharded engine's
    gathers must pair across processes): refused when the agent is built, naming the option."""
    monkeypatch.setattr(engines.Processes, "count", property(lambda self: 2))
    with pytest.raises(ConfigError, match=r"^hardware.length_groups=2 needs one process"):
        make_agent(length_groups=2)
    make_agent(length_groups=1)  # the default is fine anywhere


# ------------------------------------------------------------------------------------------------------- (c)
def test_truncate_after_eos_and_pad_hand_cases():
    E = 9
    ids = torch.tensor([[5, E, 7, E], [1, 2, 3, 4], [E, 9, 9, 9], [1, 2, 3, E]])
    assert truncate_after_eos(ids, E).tolist() == [
        [1, 1, 0, 0],  # stops after the first EOS, which is kept
        [1, 1, 1, 1],  # no EOS: everything
        [1, 0, 0, 0],  # EOS first: a one-token response
        [1, 1, 1, 1],  # EOS last
    ]
    seqs = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6])]
    left_ids, left_mask = pad(seqs, 0, left=True)
    assert left_ids.tolist() == [[0, 1, 2], [0, 0, 3], [4, 5, 6]]
    assert left_mask.tolist() == [[0, 1, 1], [0, 0, 1], [1, 1, 1]]
    right_ids, right_mask = pad(seqs, 7, left=False)
    assert right_ids.tolist() == [[1, 2, 7], [3, 7, 7], [4, 5, 6]]
    assert right_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert left_ids.dtype == right_mask.dtype == torch.long


class _EosAt(LogitsProcessor):
    """Row 0 must emit EOS at response step `at`; EOS is forbidden everywhere else."""

    def __init__(self, prompt_width: int, eos: int, at: int) -> None:
        self.prompt_width, self.eos, self.at = prompt_width, eos, at

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.eos] = -math.inf
        if input_ids.shape[1] - self.prompt_width == self.at:
            scores[0] = -math.inf
            scores[0, self.eos] = 0.0
        return scores


def test_act_truncates_after_first_eos_and_keeps_it():
    agent = make_agent()
    eos = agent.actor.tokenizer.eos_token_id
    prompts = ["ab", "hello"]  # byte tokens: widths 2 and 5, so the batch is left-padded to 5
    kwargs = {
        "do_sample": True,
        "top_k": 0,
        "top_p": 1.0,
        "logits_processor": LogitsProcessorList([_EosAt(5, eos, 2)]),
    }
    torch.manual_seed(0)
    rollout = agent.actor.act(prompts, max_new_tokens=6, generation_kwargs=kwargs, batch_size=2)
    assert rollout.response_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert rollout.response_ids[0, 2].item() == eos  # EOS kept as the last response token
    assert (rollout.response_ids[1] != eos).all()
    assert rollout.hit_max_tokens.tolist() == [False, True]
    assert rollout.prompt_mask.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    # decoded text drops the EOS
    assert rollout.prompts == prompts
    assert rollout.responses[0] == agent.actor.tokenizer.decode(rollout.response_ids[0, :2])
    assert "<|endoftext|>" not in rollout.responses[0]


# ------------------------------------------------------------------------------------------------------- (d)
def test_kl_is_zero_at_step_zero_and_positive_after_learning():
    agent = make_agent(dataclasses.replace(CFG, learning_rate=1e-2))
    rollout = rollout_for(agent)
    assert rollout.kls.abs().max() <= 1e-6  # policy == π0: full KL is 0
    torch.testing.assert_close(rollout.logprobs, rollout.ref_logprobs, atol=1e-6, rtol=0)
    stats = agent.learner.update(Batch(rollout, SCORES)).stats
    assert abs(stats["kl"]) <= 1e-6
    after = rollout_for(agent)  # the same tokens, re-scored
    kl_seq = (after.kls * after.response_mask).sum(-1)
    assert (kl_seq > 1e-4).all(), kl_seq
    # the sampled estimator too: log π − log π0 is no longer zero
    assert (after.logprobs - after.ref_logprobs).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------- (e)
def _adam_zero_grad_replay(agent: Agent, n_steps: int) -> list[torch.Tensor]:
    """What Adam does with zero gradients for `n_steps`, starting from the agent's current state."""
    params = [
        p.detach().clone().requires_grad_(True) for p in agent.trainee.engine.optimizer.param_groups[0]["params"]
    ]
    opt = torch.optim.Adam(params, lr=agent.learner.config.learning_rate)
    opt.load_state_dict(copy.deepcopy(agent.trainee.engine.optimizer.state_dict()))
    for _ in range(n_steps):
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
    return params


def test_ratio_threshold_hit_zeroes_loss_but_adam_momentum_still_moves_weights():
    agent = make_agent()
    rollout = rollout_for(agent)
    agent.learner.update(Batch(rollout, SCORES))  # 1st call, normal threshold: builds Adam momentum
    agent.learner.config = dataclasses.replace(agent.learner.config, ratio_threshold=1e-9, ratio_threshold_skip=False)
    expected = _adam_zero_grad_replay(agent, n_steps=4)  # 2 epochs × 2 backward batches
    before = snapshot(agent.trainee.policy)
    stats = agent.learner.update(Batch(rollout_for(agent, seed=1), SCORES)).stats
    assert stats["ratio_threshold_hits"] == 4.0  # every minibatch hit
    assert changed(before, agent.trainee.policy), "momentum should still move the weights"
    # and they moved exactly as Adam on zero gradients: the loss really was multiplied by 0
    for p, e in zip(agent.trainee.engine.optimizer.param_groups[0]["params"], expected):
        torch.testing.assert_close(p.detach(), e.detach(), atol=1e-7, rtol=1e-6)


def test_ratio_threshold_skip_leaves_weights_and_optimizer_untouched():
    agent = make_agent()
    agent.learner.update(Batch(rollout_for(agent), SCORES))
    agent.learner.config = dataclasses.replace(agent.learner.config, ratio_threshold=1e-9, ratio_threshold_skip=True)
    before = snapshot(agent.trainee.policy)
    steps_before = [s["step"].clone() for s in agent.trainee.engine.optimizer.state.values()]
    stats = agent.learner.update(Batch(rollout_for(agent, seed=1), SCORES)).stats
    assert stats["ratio_threshold_hits"] == 4.0
    assert changed(before, agent.trainee.policy) == []
    assert [s["step"] for s in agent.trainee.engine.optimizer.state.values()] == steps_before


# ------------------------------------------------------------------------------------------------------- (f)
def _is_pickle_or_torch_zip(path: Path) -> bool:
    """A pickle or a torch zip archive; a safetensors file (an 8-byte header length, then its JSON header) is
    neither, even when the length's first bytes happen to read `PK`."""
    data = path.read_bytes()
    if len(data) > 8 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") < len(data):
        return False
    return data[:1] == b"\x80" or data[:2] == b"PK"


def test_save_load_round_trip(tmp_path: Path):
    cfg = dataclasses.replace(CFG, use_score_scaling=True, use_score_norm=True)
    a = make_agent(cfg, seed=0)
    a.learner.update(Batch(rollout_for(a), SCORES))
    a.save(tmp_path)
    # b starts from different weights, value head, seed and model seed: everything must come from the folder
    b = make_agent(cfg, seed=123, model_seed=1, ref=a.actor.reference)
    b.load(tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.json", "optimizer.pt", "policy.safetensors"]
    json.loads((tmp_path / "agent.json").read_text())
    from safetensors import safe_open

    with safe_open(str(tmp_path / "policy.safetensors"), framework="pt") as f:
        assert "v_head.summary.weight" in set(f.keys())
    for path in tmp_path.iterdir():
        if path.name != "optimizer.pt":
            assert not _is_pickle_or_torch_zip(path), path
    torch.load(tmp_path / "optimizer.pt", weights_only=True)

    sa, sb = a.trainee.policy.state_dict(), b.trainee.policy.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.trainee.engine.optimizer.state_dict(), b.trainee.engine.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for k in oa["state"]:
        for name in oa["state"][k]:
            assert torch.equal(oa["state"][k][name], ob["state"][k][name]), (k, name)
    assert b.learner.kl_ctl.value == a.learner.kl_ctl.value != cfg.init_kl_coef
    assert b.learner.score_moments == a.learner.score_moments
    ra, rb = a.trainee.rng.get_state(), b.trainee.rng.get_state()
    assert ra[0] == rb[0] and np.array_equal(ra[1], rb[1]) and ra[2:] == rb[2:]
    assert b.trainee.updates_since_load == a.trainee.updates_since_load

    # from here on the two agents are indistinguishable
    rollout = rollout_for(a, seed=2)
    assert b.actor.score_tokens(*token_lists(a.actor.tokenizer.eos_token_id, 2)).logprobs.equal(rollout.logprobs)
    stats_a, stats_b = a.learner.update(Batch(rollout, SCORES)).stats, b.learner.update(Batch(rollout, SCORES)).stats
    assert stats_a == stats_b
    sa, sb = a.trainee.policy.state_dict(), b.trainee.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.learner.kl_ctl.value == b.learner.kl_ctl.value


# ------------------------------------------------------------------------------------------------------- (g)
def test_learn_stats_and_adaptive_kl_update():
    agent = make_agent()
    rollout = rollout_for(agent)
    stats = agent.learner.update(Batch(rollout, SCORES)).stats
    for key in ("policy_loss", "value_loss", "clipfrac", "approx_kl", "entropy", "kl", "kl_coef"):
        assert key in stats, key
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert 0.0 <= stats["clipfrac"] <= 1.0 and stats["approx_kl"] >= 0.0
    # entropy is the full-vocabulary entropy of π_old, between 0 and log V
    assert 0.0 < stats["entropy"] < math.log(agent.trainee.policy.pretrained_model.config.vocab_size)
    # step 0: KL = 0 → e = clip(0/target − 1, ±0.2) = −0.2; n = B = 4: β_1 = β_0·(1 − 0.2·4/horizon)
    # (paper values β_0 = 0.3, horizon 10000: 0.3·0.99992 = 0.299976)
    beta0, target, horizon = CFG.init_kl_coef, CFG.kl_target, CFG.kl_horizon
    beta1 = beta0 * (1 - 0.2 * 4 / horizon)
    assert stats["kl_coef"] == beta0  # the β used for this batch, from before the update
    assert agent.learner.kl_ctl.value == pytest.approx(beta1, abs=1e-12)
    # a second batch whose KL is > 0: the returned β is β_1 and the update follows the measured KL
    rollout2 = rollout_for(agent, seed=1)
    stats2 = agent.learner.update(Batch(rollout2, SCORES)).stats
    assert stats2["kl_coef"] == pytest.approx(beta1, abs=1e-12)
    mask = rollout2.response_mask.float()
    assert stats2["kl"] == pytest.approx((rollout2.kls * mask).sum(-1).mean().item(), abs=1e-6)
    assert stats2["kl"] > 0
    e = float(np.clip(stats2["kl"] / target - 1.0, -0.2, 0.2))
    assert agent.learner.kl_ctl.value == pytest.approx(beta1 * (1 + e * 4 / horizon), abs=1e-12)
    # the non-score reward of this batch used the β from before the update, too
    expected = ppo_core.masked_mean(-beta1 * rollout2.kls, mask).item()
    assert stats2["mean_non_score_reward"] == pytest.approx(expected, abs=1e-7)


def test_fixed_kl_coef_does_not_move():
    agent = make_agent(dataclasses.replace(CFG, adaptive_kl=False, init_kl_coef=0.05))
    for seed in range(2):
        stats = agent.learner.update(Batch(rollout_for(agent, seed=seed), SCORES)).stats
        assert stats["kl_coef"] == 0.05
    assert agent.learner.kl_ctl.value == 0.05


# ------------------------------------------------------------------------------------------------------- (h)
def test_learn_reports_the_scaled_score_it_used_and_early_stopping():
    """R̃ is logged as used: R/σ with σ the unbiased std of all scores so far (docs/method.md §2.3); early stopping
    is logged when it cuts the epochs (§2.7)."""
    plain = make_agent().learner.update(Batch(rollout_for(make_agent()), SCORES)).stats
    assert plain["scaled_score"] == pytest.approx(SCORES.mean().item()) and plain["early_stopped"] == 0.0
    agent = make_agent(dataclasses.replace(CFG, use_score_scaling=True))
    stats = agent.learner.update(Batch(rollout_for(agent), SCORES)).stats
    expected = SCORES.mean().item() / np.std(SCORES.numpy(), ddof=1)
    assert stats["scaled_score"] == pytest.approx(expected, rel=1e-6)
    # a threshold every policy KL exceeds: the test fires after the first epoch, which ends the update
    agent = make_agent(dataclasses.replace(CFG, early_stopping=True, target_kl=-1.0, ppo_epochs=3))
    stats = agent.learner.update(Batch(rollout_for(agent), SCORES)).stats
    assert stats["early_stopped"] == 1.0
    assert {float(s["step"]) for s in agent.trainee.engine.optimizer.state.values()} == {
        2.0
    }  # one epoch of 2 steps, not 3 epochs


def test_early_stopping_reads_the_policy_kl_averaged_over_processes(monkeypatch):
    """With several processes every one must stop at the same epoch (TRL all-reduces the policy KL before its
    test): the decision reads `distributed.mean` of the epoch's last policy KL, not the local value."""
    from cory import distributed

    cfg = dataclasses.replace(CFG, early_stopping=True, target_kl=100.0, ppo_epochs=3)
    local = make_agent(cfg).learner.update(Batch(rollout_for(make_agent(cfg)), SCORES)).stats
    assert local["early_stopped"] == 0.0  # its own policy KL is under 1.5 × target_kl: no stop
    seen = []
    monkeypatch.setattr(distributed, "mean", lambda v: seen.append(v) or 1e3)  # the other processes drifted far
    agent = make_agent(cfg)
    stats = agent.learner.update(Batch(rollout_for(agent), SCORES)).stats
    assert stats["early_stopped"] == 1.0 and seen[0] < 150  # stopped on the mean, not on its own KL
    assert {float(s["step"]) for s in agent.trainee.engine.optimizer.state.values()} == {2.0}  # after the first epoch


@pytest.mark.parametrize("precision", ["paper preset", "bf16"])
def test_paper_presets_score_in_fp32_on_the_tiny_model(precision: str):
    """The precision of `experiment=imdb_gpt2` (and every preset built on it) reaches the agent: its log-probs,
    reference log-probs and full KL equal a plain fp32 forward, while bf16 autocast, chosen explicitly, rounds
    them (the paper and the official code train GPT-2 in fp32, docs/method.md §5)."""
    from helpers.compose import compose_cfg
    from helpers.from_config import agent_from

    from cory.policy import Backbone

    overrides = ["experiment=imdb_gpt2", "model=tiny_gpt2", "hardware.device=cpu"]
    cfg = compose_cfg(overrides + (["hardware.precision=bf16"] if precision == "bf16" else []))
    model, tokenizer = build_tiny_gpt2(seed=0)
    sharpen(model, 0)
    ref = make_reference(model)
    sharpen(model, 1)  # the policy has moved away from π0, so the KL is not 0
    backbone = Backbone(model, tokenizer, lora=None, add_special_tokens=False, device="cpu")
    agent = agent_from(cfg, backbone, ref)
    prompts, responses = token_lists(tokenizer.eos_token_id)
    rollout = agent.actor.score_tokens(prompts, responses)
    worst = 0.0
    for i, (p, r) in enumerate(zip(prompts, responses)):
        exact = _single_forward(agent, p, r)  # fp32, no autocast
        got = (rollout.logprobs[i], rollout.ref_logprobs[i], rollout.values[i], rollout.kls[i])
        worst = max(worst, *((g[: len(r)] - e).abs().max().item() for g, e in zip(got, exact)))
    if precision == "bf16":
        assert agent.trainee.autocast_dtype == torch.bfloat16 and worst > 1e-2
    else:
        assert agent.trainee.autocast_dtype is None and worst < 1e-5
