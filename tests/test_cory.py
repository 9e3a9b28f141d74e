"""CORY's orchestration (docs/method.md §1): identical agents, knowledge transfer, collective reward, role
exchange that moves no weights, one shared frozen π0, the official swap's resets. (The presets are checked in
`tests/test_configs.py`; what each reward is computed on, in `tests/test_meaning.py`.)

Real agents use the tiny GPT-2 of `experiment=smoke` on 4 queries; the long role schedule uses stub agents.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.cory_setup import QUERIES, make_cory

from cory.algorithms.team import Team
from cory.ppo.actor import Actor
from cory.ppo.core import RunningMoments
from cory.ppo.learner import Agent, PPOLearner, Update
from cory.train import train


@pytest.fixture
def calls(monkeypatch):
    """Records every `Actor.act` (agent, prompts, rollout) and `PPOLearner.update` (agent, scores) in call order."""
    log = SimpleNamespace(act=[], learn=[])
    act, update = Actor.act, PPOLearner.update

    def act_spy(self, prompts, *args, **kwargs):
        rollout = act(self, prompts, *args, **kwargs)
        log.act.append((self.trainee.name, list(prompts), rollout))
        return rollout

    def update_spy(self, batch):
        log.learn.append((self.trainee.name, batch.scores.clone()))
        return update(self, batch)

    monkeypatch.setattr(Actor, "act", act_spy)
    monkeypatch.setattr(PPOLearner, "update", update_spy)
    return log


def params(agent: Agent) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in agent.trainee.policy.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ agents
def test_agents_start_identical_but_share_nothing():
    cory = make_cory()
    a, b = cory.agents["llm1"], cory.agents["llm2"]
    assert any(k.startswith("v_head") for k in a.trainee.policy.state_dict())
    assert same(params(a), params(b))  # same initial weights, value head included
    assert a.trainee.policy is not b.trainee.policy and a.trainee.engine is not b.trainee.engine
    assert a.learner.kl_ctl is not b.learner.kl_ctl and a.learner.score_moments is not b.learner.score_moments
    assert a.trainee.rng is not b.trainee.rng
    ptrs = {p.data_ptr() for p in a.trainee.policy.parameters()}
    assert not ptrs & {p.data_ptr() for p in b.trainee.policy.parameters()}
    optimizer = a.trainee.engine.optimizer
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in a.trainee.policy.parameters()
    }


def test_reference_is_one_shared_frozen_model():
    cory = make_cory()
    a, b = cory.agents["llm1"], cory.agents["llm2"]
    ref = a.actor.reference
    assert b.actor.reference is ref
    assert all(not p.requires_grad for p in ref.parameters())
    ref_ptrs = {p.data_ptr() for p in ref.parameters()}
    for agent in (a, b):
        assert not ref_ptrs & {p.data_ptr() for p in agent.trainee.policy.parameters()}
    before, policy_before = {k: v.clone() for k, v in ref.state_dict().items()}, params(a)
    for k in range(2):
        cory.step(k)
    assert same(before, dict(ref.state_dict()))  # bit-identical after four PPO updates
    assert not same(policy_before, params(a))  # while the policy did move


# ---------------------------------------------------------------------------------------- knowledge transfer
@pytest.mark.parametrize("knowledge_transfer", [True, False])
def test_observer_prompt(calls, knowledge_transfer):
    cory = make_cory((f"algorithm.episode.knowledge_transfer={str(knowledge_transfer).lower()}",))
    out = cory.step(0)
    (pio_name, pio_prompts, pio), (obs_name, obs_prompts, obs) = calls.act
    assert (pio_name, obs_name) == ("llm1", "llm2")
    assert pio_prompts == QUERIES
    if knowledge_transfer:
        assert obs_prompts == [f"{q}{a1}|{q}" for q, a1 in zip(QUERIES, pio.responses, strict=True)]
    else:
        assert obs_prompts == pio_prompts
    assert [row["observer_prompt"] for row in out.samples] == obs_prompts
    # the cost metric counts what each agent's forwards process: its own prompt plus its response
    tok = cory.agents["llm1"].actor.tokenizer
    for name, prompts, rollout in calls.act:
        n_prompt = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        assert out.metrics[f"train/{name}/tokens"] == n_prompt + rollout.response_mask.sum().item()
    if knowledge_transfer:  # x_O quotes q and a1 and repeats q: the observer always processes more tokens
        assert out.metrics["train/llm2/tokens"] > out.metrics["train/llm1/tokens"]
    assert [row["pioneer_response"] for row in out.samples] == pio.responses


# ---------------------------------------------------------------------------------------- collective reward
def test_both_agents_get_the_same_collective_reward(calls):
    cory = make_cory()
    scored = []
    score = cory.task.score
    cory.task.score = lambda q, r: scored.append(score(q, r)) or scored[-1]
    cory.step(0)
    r1, r2 = (torch.tensor(s) for s in scored)  # pioneer's, then observer's task rewards on q + own response
    (n1, s1), (n2, s2) = calls.learn
    assert (n1, n2) == ("llm1", "llm2")
    assert torch.allclose(s1, r1 + r2) and torch.equal(s1, s2)


class StubAgent:
    """Acts instantly with fixed responses; records the scores it learns from. It is its own actor and learner."""

    def __init__(self, name: str) -> None:
        self.name, self.learned = name, []
        self.actor = self.learner = self
        self.kl_coef = 0.3

    def act(self, prompts, max_new_tokens, generation_kwargs, batch_size, for_update=False):
        n = len(prompts)
        return SimpleNamespace(
            prompts=list(prompts),
            responses=[f"{self.name}:{p}" for p in prompts],
            kls=torch.ones(n, 2),
            prompt_mask=torch.ones(n, 1),
            response_mask=torch.ones(n, 2),
            hit_max_tokens=torch.zeros(n, dtype=torch.bool),
        )

    def update(self, batch):
        self.learned.append(batch.scores.clone())
        return Update({"kl_coef": 0.3}, None, 0.3)

    def context_length(self) -> None:
        return None


def saw_the_pioneer(texts):
    """The toy task's reward part (on responses): 1 for any observer-role response that saw the pioneer (prompt has
    '|'), and 0.25 for a pioneer."""
    return [1.0 if "|" in r else 0.25 for r in texts]


class StubLearner:
    """Builds `StubAgent`s in place of the PPO learner's agents."""

    init_kl_coef = 0.3

    def check_batch(self, batch_size: int) -> None:
        pass

    def describe(self) -> dict:
        return {"kl_coef": self.init_kl_coef}

    def build(self, name: str, *args, **kwargs) -> StubAgent:
        return StubAgent(name)


def stub_cory(*overrides: str) -> Team:
    return make_cory(overrides, reward=saw_the_pioneer, learner=StubLearner())


@pytest.mark.parametrize("w_other, pioneer, observer", [(1.0, 1.25, 1.25), (-1.0, -0.75, 0.75), (0.0, 0.25, 1.0)])
def test_collective_reward_weights(w_other, pioneer, observer):
    cory = stub_cory("algorithm.credit.w_self=1.0", f"algorithm.credit.w_other={w_other}")
    cory.step(0)
    assert torch.equal(cory.agents["llm1"].learned[0], torch.full((4,), pioneer))
    assert torch.equal(cory.agents["llm2"].learned[0], torch.full((4,), observer))


# ---------------------------------------------------------------------------------------- role exchange
@pytest.mark.parametrize("role_exchange", [True, False])
def test_role_schedule_period_5(role_exchange):
    cory = stub_cory("algorithm.schedule.period=5" if role_exchange else "algorithm/schedule=simultaneous")
    out = [cory.step(k).metrics for k in range(20)]
    expected = [0.0] * 5 + [1.0] * 5 + [0.0] * 5 + [1.0] * 5 if role_exchange else [0.0] * 20
    assert [m["cory/llm1_role"] for m in out] == expected
    assert [m["cory/swaps"] for m in out] == ([float(k // 5) for k in range(20)] if role_exchange else [0.0] * 20)


def test_role_swap_with_real_agents(calls):
    cory = make_cory(("algorithm.schedule.period=2",))
    roles = [cory.step(k).metrics["cory/llm1_role"] for k in range(3)]
    assert roles == [0.0, 0.0, 1.0]
    assert [name for name, *_ in calls.act] == ["llm1", "llm2", "llm1", "llm2", "llm2", "llm1"]  # pioneer first
    assert calls.act[4][1] == QUERIES  # llm2, now pioneer, gets the query-only prompt


def adam_snapshot(agent: Agent) -> dict[int, dict]:
    state = agent.trainee.engine.optimizer.state
    return {id(p): {k: (id(v), v.clone()) for k, v in s.items()} for p, s in state.items()}


@pytest.mark.parametrize("faithful", [False, True])
def test_swap_keeps_or_resets_training_state(monkeypatch, faithful):
    overrides = ("algorithm.agent.use_score_scaling=true", "algorithm.schedule.period=1")
    cory = make_cory((*overrides, f"algorithm.schedule.faithful_official_swap={str(faithful).lower()}"))
    agents = list(cory.agents.values())
    before = {}
    update = PPOLearner.update

    def update_then_snapshot(self, batch):  # the state right before the swap at the end of `step`
        out = update(self, batch)
        agent = cory.agents[self.trainee.name]
        before[agent.name] = (
            adam_snapshot(agent),
            params(agent),
            self.kl_ctl.value,
            RunningMoments(**vars(self.score_moments)),
            self.trainee.engine.optimizer,
        )
        return out

    monkeypatch.setattr(PPOLearner, "update", update_then_snapshot)
    cory.step(0)
    assert cory.roles(1) == {"pioneer": "llm2", "observer": "llm1"}  # roles exchanged after iteration 0
    assert cory.team.schedule.reseed_at == (1 if faithful else 0)  # the official swap restarts the length draws
    for agent in agents:
        adam, weights, kl_coef, moments, optimizer = before[agent.name]
        learner, trainee = agent.learner, agent.trainee
        init = learner.config.init_kl_coef
        assert len(adam) == len(list(trainee.policy.parameters())) and kl_coef != init and moments.count >= 4
        assert same(weights, params(agent))  # the swap itself moves no weights
        # whatever happened, the optimiser steps exactly this agent's own parameters
        assert [id(p) for g in trainee.engine.optimizer.param_groups for p in g["params"]] == [
            id(p) for p in trainee.policy.parameters()
        ]
        if faithful:  # the official disk swap: fresh Adam, KL controller, score moments, reloaded model
            assert trainee.engine.optimizer is not optimizer and len(trainee.engine.optimizer.state) == 0
            assert learner.kl_coef == init and learner.score_moments == RunningMoments()
            assert trainee.updates_since_load == 0
        else:  # the role-map swap: everything stays with its agent, the Adam tensors are the very same
            assert trainee.engine.optimizer is optimizer and adam_snapshot(agent).keys() == adam.keys()
            for pid, state in adam_snapshot(agent).items():
                for k, (tid, value) in state.items():
                    assert tid == adam[pid][k][0] and torch.equal(value, adam[pid][k][1])
            assert learner.kl_coef == kl_coef and learner.score_moments == moments
            assert trainee.updates_since_load == 1
    # the next update continues (or restarts) Adam's step count: 2 epochs × 1 backward batch per update
    cory.step(1)
    steps = {float(s["step"][1]) for name in cory.agents for s in before[name][0].values()}
    assert steps == ({2.0} if faithful else {4.0})


# ---------------------------------------------------------------------------------------- end to end
def test_train_cory_end_to_end(tmp_path):
    cfg = compose_cfg(
        [
            "experiment=smoke",
            "algorithm=cory",
            "progress=false",
            "iterations=2",
            "batch_size=8",
            "num_eval=4",
            "eval_every=0",
            "save_every=0",
            "algorithm.schedule.period=1",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    summary = train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "cory/llm1_role" in r]
    assert [r["cory/llm1_role"] for r in train_rows] == [0.0, 1.0]
    for key in (
        "train/pioneer/task_reward",
        "train/observer/task_reward",
        "train/pioneer/kl",
        "train/observer/kl",
        "train/llm1/task_reward",
        "train/llm2/kl",
        "time/generate_s",
        "time/learn_s",
    ):
        assert all(key in r for r in train_rows), key
    # the per-role views follow the role map: in iteration 1 llm2 is the pioneer
    assert train_rows[1]["train/pioneer/task_reward"] == train_rows[1]["train/llm2/task_reward"]
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(saved["agents"]) == set(summary["agents"]) == {"llm1", "llm2"}
    assert saved["algorithm"] == "cory" and saved["completed"]
