"""No repeated forward (docs/cost.md): when an update takes its batch whole as one minibatch, the first epoch reads
the policy forward the rollout ran, kept with its graph, instead of running it again (`PPOLearner.planned_order`,
`Actor.act(for_update=True)`, `Rollout.live`).

What must hold: the same numbers as the update that runs its own forward (rollout tensors, update statistics, weights,
bit for bit), one policy forward fewer per update, no graph kept with the rollout afterwards, the learner's own stream
not advanced by planning, a draw in between costing the saving and never the numbers, and no kept forward where it
would not be the one the update runs (minibatches smaller than the batch, accumulation, a batch wider than the no-grad
micro-batch, adapters, the switch off). End to end: PPO and CORY teams with and without it give identical metrics.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.cory_setup import QUERIES, make_cory
from helpers.runners import read_rows, resume_run, start_run
from test_agent import CFG, SCORES, make_agent, snapshot, token_lists

from cory.ppo.learner import Batch
from cory.ppo.rollout import concat_rollouts

WHOLE = dataclasses.replace(CFG, mini_batch_size=4)  # B = 4: one minibatch per epoch, 2 epochs


class ForwardCount:
    """Counts the policy's value-head forwards (the rollout's and the learner's; generation does not call it)."""

    def __init__(self, agent) -> None:
        self.n = 0
        agent.trainee.policy.register_forward_hook(lambda *_: setattr(self, "n", self.n + 1))


def _rollout(agent, planned: bool):
    order = agent.actor.planner(4) if planned else None
    return agent.actor.score_tokens(*token_lists(agent.actor.tokenizer.eos_token_id), order=order)


def test_a_whole_batch_update_reads_the_rollouts_forward_and_ends_where_its_own_would():
    kept, own = make_agent(WHOLE), make_agent(dataclasses.replace(WHOLE, reuse_rollout_forward=False))
    assert own.actor.planner(4) is None
    counts = {"kept": ForwardCount(kept), "own": ForwardCount(own)}
    for step in range(3):
        a, b = _rollout(kept, planned=True), _rollout(own, planned=True)
        assert a.live is not None and a.live.logits.requires_grad and b.live is None
        for name in ("logprobs", "ref_logprobs", "values", "kls", "entropy"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (step, name)
        stats_a = kept.learner.update(Batch(a, SCORES)).stats
        stats_b = own.learner.update(Batch(b, SCORES)).stats
        assert stats_a == stats_b, step
        assert a.live is None  # the graph went with the update, not with the rollout
        after_a, after_b = snapshot(kept.trainee.policy), snapshot(own.trainee.policy)
        assert all(torch.equal(after_a[k], after_b[k]) for k in after_a), step
    # per update: the rollout's forward, then one per epoch; the kept one saves epoch 1's
    assert (counts["kept"].n, counts["own"].n) == (3 * 2, 3 * 3)


def test_planning_does_not_advance_the_stream_and_names_the_order_the_update_draws():
    agent = make_agent(WHOLE)
    before = agent.trainee.rng.get_state()[1].copy()
    planned = agent.actor.planner(4)
    assert np.array_equal(agent.trainee.rng.get_state()[1], before)
    assert np.array_equal(planned, agent.trainee.permutation(4))


def test_a_draw_between_the_rollout_and_the_update_costs_the_saving_not_the_numbers():
    kept, own = make_agent(WHOLE), make_agent(dataclasses.replace(WHOLE, reuse_rollout_forward=False))
    count = ForwardCount(kept)
    a, b = _rollout(kept, planned=True), _rollout(own, planned=False)
    kept.trainee.permutation(4), own.trainee.permutation(4)  # e.g. another part drawing from the stream
    assert kept.learner.update(Batch(a, SCORES)).stats == own.learner.update(Batch(b, SCORES)).stats
    assert count.n == 1 + 2  # the planned order was not the one drawn: the update ran its own forwards
    after_a, after_b = snapshot(kept.trainee.policy), snapshot(own.trainee.policy)
    assert all(torch.equal(after_a[k], after_b[k]) for k in after_a)


@pytest.mark.parametrize(
    "change, placement",
    [
        ({"mini_batch_size": 2}, {}),  # two minibatches: the first is not the rollout's rows
        ({"gradient_accumulation_steps": 2, "mini_batch_size": 2}, {}),
        ({}, {"forward_batch_size": 2}),  # the rollout's no-grad forward would have run two micro-batches
        ({"reuse_rollout_forward": False}, {}),
    ],
)
def test_no_kept_forward_where_it_would_not_be_the_one_the_update_runs(change, placement):
    from test_agent import build_tiny_gpt2, make_reference, sharpen

    from cory.ppo.learner import agent_on

    model, tokenizer = build_tiny_gpt2(seed=0)
    sharpen(model, 0)
    agent = agent_on("llm1", model, make_reference(model), tokenizer, dataclasses.replace(WHOLE, **change), seed=0,
                     **placement)  # fmt: skip
    assert agent.actor.planner(4) is None
    assert _rollout(agent, planned=False).live is None


def test_an_adapter_policy_keeps_no_forward():
    agent = make_agent(WHOLE)
    agent.trainee.policy.adapter = "llm1"  # PEFT moves requires_grad between the adapters of a shared model
    assert agent.actor.planner(4) is None


def test_selecting_or_concatenating_a_rollout_drops_its_kept_forward():
    agent = make_agent(WHOLE)
    rollout = _rollout(agent, planned=True)
    assert rollout.live is not None
    assert rollout.select([1, 0]).live is None
    assert concat_rollouts(rollout, rollout, agent.actor.tokenizer.pad_token_id).live is None


@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_a_team_with_and_without_the_kept_forward_trains_identically(algorithm):
    """Two iterations of the smoke team (every batch one minibatch): the same metrics and weights, and the update's
    forwards one fewer per agent and iteration."""
    runs = {}
    for reuse in (True, False):
        team = make_cory(
            (f"algorithm={algorithm}", f"algorithm.agent.mini_batch_size={len(QUERIES)}",
             f"algorithm.agent.reuse_rollout_forward={str(reuse).lower()}")
        )  # fmt: skip
        counts = {a: ForwardCount(agent) for a, agent in team.agents.items()}
        metrics = [{k: v for k, v in team.step(k).metrics.items() if not k.startswith("time/")} for k in range(2)]
        weights = {a: snapshot(agent.trainee.policy) for a, agent in team.agents.items()}
        runs[reuse] = metrics, weights, {a: c.n for a, c in counts.items()}
        epochs = {agent.learner.config.ppo_epochs for agent in team.agents.values()}.pop()
    (m_kept, w_kept, n_kept), (m_own, w_own, n_own) = runs[True], runs[False]
    assert m_kept == m_own
    for a in w_kept:
        assert all(torch.equal(w_kept[a][k], w_own[a][k]) for k in w_kept[a]), a
    for a in n_kept:  # two iterations: a rollout forward and `epochs` update forwards each, less the kept one
        assert n_own[a] - n_kept[a] == 2 and n_own[a] == 2 * (1 + epochs), (a, n_kept, n_own)


def _rows(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in read_rows(run_dir)]


def test_a_run_that_keeps_the_forward_resumes_exactly_and_logs_what_one_without_it_logs(tmp_path, monkeypatch):
    """CORY's smoke run with each batch one minibatch (the kept forward on every update): 4 iterations straight,
    2 then a resume to 4, and 4 with the switch off log the same rows, bit for bit."""
    from cory.ppo.learner import PPOLearner

    kept, minibatch = [], PPOLearner._minibatch

    def counted(self, *args, **kwargs):
        kept.append(args[6] is not None)
        return minibatch(self, *args, **kwargs)

    monkeypatch.setattr(PPOLearner, "_minibatch", counted)
    whole = ("algorithm=cory", "algorithm.agent.mini_batch_size=16", "eval_every=2", "num_eval=4", "save_every=2")
    start_run(tmp_path, tmp_path / "straight", *whole, "iterations=4")
    assert sum(kept) == 4 * 2  # every update of both agents read the rollout's forward in its first epoch
    start_run(tmp_path, tmp_path / "resumed", *whole, "iterations=2")
    resume_run(tmp_path / "resumed", "iterations=4")
    start_run(tmp_path, tmp_path / "off", *whole, "iterations=4", "algorithm.agent.reuse_rollout_forward=false")
    straight = _rows(tmp_path / "straight")
    assert any("train/llm2/kl" in r for r in straight) and len(straight) >= 4
    assert _rows(tmp_path / "resumed") == straight
    assert _rows(tmp_path / "off") == straight
