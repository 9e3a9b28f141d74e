"""The parts a team is composed of (`cory/algorithms/team.py`; docs/method.md §11, §12): schedules
(`cory/algorithms/schedules.py`) and layouts (`cory/algorithms/layouts.py`) with the critics. A frozen agent is
untouched bit for bit, the turns alternate on time, one shared policy learns from both roles' 2B samples, one LoRA
adapter per role stays in its role, a centralised critic composes with the schedules (it learns from the agents that
learned), combinations that cannot work are refused in one line before any model loads, and resumes are exact.

Real agents use the tiny GPT-2 of `experiment=smoke` on 4 fixed queries; the long turn schedule uses stub agents.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.compose import compose_cfg
from helpers.cory_setup import QUERIES, make_cory
from helpers.runners import assert_same_rows, read_rows, resume_run, start_run

import cory.ppo.metrics
from cory.algorithms.team import TEAM_METRICS, role_metrics
from cory.config import instantiate_target
from cory.errors import ConfigError
from cory.metrics import ROLES, RUN_METRICS, is_known_metric, markdown_table
from cory.ppo import core as ppo_core
from cory.ppo.actor import Actor
from cory.ppo.learner import Agent, PPOLearner, Update
from cory.ppo.rollout import concat_rollouts, forward_logits

DOCS = Path(__file__).resolve().parents[1] / "docs"


def make_variant(config: str, *overrides: str, learner=None):
    """The team of `algorithm=<config>` with `overrides` on the smoke model, training every iteration on `QUERIES`
    with `MAX_NEW` new tokens."""
    return make_cory((f"algorithm={config}", *overrides), learner=learner)


def agent_state(agent: Agent) -> dict:
    """Everything of an agent an update may move: weights, Adam state, β, score statistics, RNG, step count."""
    trainee, learner = agent.trainee, agent.learner
    adam = {
        f"{i}/{k}": v.clone()
        for i, s in enumerate(trainee.engine.optimizer.state_dict()["state"].values())
        for k, v in s.items()
    }
    rng = trainee.rng.get_state()
    return {
        "weights": [p.detach().clone() for p in trainee.trainable_parameters()],  # its own: adapter + head with LoRA
        "adam": adam,
        "kl_coef": learner.kl_coef,
        "moments": dataclasses.asdict(learner.score_moments),
        "rng": (rng[0], rng[1].copy(), rng[2:]),
        "steps": trainee.updates_since_load,
    }


def same_state(a: dict, b: dict) -> bool:
    def same(x, y) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (tuple, list)):
            return len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        if isinstance(x, np.ndarray):
            return np.array_equal(x, y)
        return x == y

    return same(a, b)


@pytest.fixture
def calls(monkeypatch):
    """Every `Actor.act` (agent, policy module, prompts) and `PPOLearner.update` (agent, rollout, scores) in call
    order."""
    log = SimpleNamespace(act=[], learn=[])
    act, update = Actor.act, PPOLearner.update

    def act_spy(self, prompts, *args, **kwargs):
        log.act.append((self.trainee.name, self.trainee.policy, list(prompts)))
        return act(self, prompts, *args, **kwargs)

    def update_spy(self, batch):
        log.learn.append((self.trainee.name, batch.rollout, batch.scores.clone()))
        return update(self, batch)

    monkeypatch.setattr(Actor, "act", act_spy)
    monkeypatch.setattr(PPOLearner, "update", update_spy)
    return log


# ------------------------------------------------------------------------------------------------ interleaved
def test_interleaved_frozen_agent_is_bit_identical_while_its_partner_learns(calls):
    cory = make_variant("cory_interleaved", "algorithm.agent.use_score_scaling=true", "algorithm.schedule.period=2")
    agents = cory.agents
    learned = []
    for k in range(5):
        before = {name: agent_state(agent) for name, agent in agents.items()}
        out = cory.step(k)
        learned.append([out.metrics[f"schedule/{name}/learned"] for name in agents])
        for name, agent in agents.items():
            after = agent_state(agent)
            if out.metrics[f"schedule/{name}/learned"]:  # the learner moved (weights and Adam state)
                assert not same_state(before[name]["weights"], after["weights"])
                assert after["adam"] and not same_state(before[name]["adam"], after["adam"])
            else:  # the frozen partner: nothing of it moved, its non-empty Adam state included
                assert same_state(before[name], after), (k, name)
                assert f"ppo/{name}/policy_loss" not in out.metrics
                assert f"train/{name}/task_reward" in out.metrics  # still acted and was scored
    # llm1 learns in iterations 0-1 and 4, llm2 in 2-3; the roles never exchange
    assert learned == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]
    assert [name for name, *_ in calls.learn] == ["llm1", "llm1", "llm2", "llm2", "llm1"]
    assert [name for name, *_ in calls.act] == ["llm1", "llm2"] * 5  # the frozen agent still acts, in its role
    assert all(cory.roles(k) == {"pioneer": "llm1", "observer": "llm2"} for k in range(5))
    assert cory.updates == {"llm1": 3, "llm2": 2}


def test_interleaved_with_a_centralised_critic_trains_the_critic_on_the_learners_tokens_only(monkeypatch):
    """`critic=centralized` under `interleaved`: the frozen actor stays bit-identical (its own value head too), the
    critic moves every iteration, and its loss sees the learning agent's returns and tokens only."""
    cory = make_variant("cory_interleaved", "algorithm/critic=centralized", "algorithm.schedule.period=1")
    assert cory.describe()["algorithm"] == "cory_cc_interleaved" and cory.describe()["critic"] == "centralized"
    seen = []
    real = cory.critic.update
    monkeypatch.setattr(cory.critic, "update", lambda j, old, ret, m: seen.append((ret, m)) or real(j, old, ret, m))
    updates = {}
    for name, agent in cory.agents.items():
        real_update = agent.learner.update
        monkeypatch.setattr(
            agent.learner, "update", lambda b, n=name, r=real_update: updates.__setitem__(n, r(b)) or updates[n]
        )
    for k in range(2):
        before = {name: agent_state(agent) for name, agent in cory.agents.items()}
        head = {name: a.trainee.policy.v_head.summary.weight.detach().clone() for name, a in cory.agents.items()}
        critic_before = cory.critic.trainee.policy.v_head.summary.weight.detach().clone()
        out = cory.step(k)
        learner, frozen = ("llm1", "llm2") if k == 0 else ("llm2", "llm1")
        assert same_state(before[frozen], agent_state(cory.agents[frozen]))
        assert not same_state(before[learner]["weights"], agent_state(cory.agents[learner])["weights"])
        for name, agent in cory.agents.items():  # no actor's value head moves: the critic gives the values
            assert torch.equal(head[name], agent.trainee.policy.v_head.summary.weight)
        assert not torch.equal(critic_before, cory.critic.trainee.policy.v_head.summary.weight)
        returns, masks = seen[-1]
        side = 0 if learner == "llm1" else 1  # llm1 is the pioneer throughout (no role exchange)
        assert masks[side].sum() > 0 and masks[1 - side].sum() == 0 and torch.count_nonzero(returns[1 - side]) == 0
        assert torch.equal(returns[side], updates[learner].returns)  # the returns travel in the update's output
        assert f"ppo/{learner}/value_loss" in out.metrics and f"ppo/{frozen}/value_loss" not in out.metrics
    assert cory.updates == {"llm1": 1, "llm2": 1}


def test_lora_per_role_with_a_centralised_critic_puts_three_adapters_on_one_base():
    cory = make_variant("cory_lora_roles", "model.lora.enabled=true", "algorithm/critic=centralized")
    base = cory.agents["llm1"].trainee.policy.pretrained_model
    assert set(base.peft_config) == {"pioneer", "observer", "critic"}
    assert cory.critic.trainee.policy.pretrained_model is base
    before = cory.critic.trainee.policy.v_head.summary.weight.detach().clone()
    cory.step(0)
    assert not torch.equal(before, cory.critic.trainee.policy.v_head.summary.weight)
    assert cory.describe()["algorithm"] == "cory_cc_lora_per_role"


def test_one_shared_policy_refuses_a_centralised_critic_in_one_line():
    with pytest.raises(ConfigError) as err:
        make_variant("cory_shared", "algorithm/critic=centralized")
    assert str(err.value).startswith("algorithm/critic=centralized: one shared policy") and "\n" not in str(err.value)


class StubAgent:
    """Acts instantly; counts its updates. It is its own actor and learner."""

    def __init__(self, name: str) -> None:
        self.name, self.learned, self.kl_coef = name, 0, 0.3
        self.actor = self.learner = self

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
        self.learned += 1
        return Update({"kl_coef": 0.3}, None, 0.3)

    def context_length(self) -> None:
        return None


class StubLearner:
    init_kl_coef = 0.3

    def check_batch(self, batch_size: int) -> None:
        pass

    def describe(self) -> dict:
        return {"kl_coef": self.init_kl_coef}

    def build(self, name: str, *args, **kwargs) -> StubAgent:
        return StubAgent(name)


@pytest.mark.parametrize(("period", "llm1_turns"), [(3, [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]), (1, [1, 0] * 6)])
def test_turns_alternate_every_interleave_period(period, llm1_turns):
    cory = make_variant("cory_interleaved", f"algorithm.schedule.period={period}", learner=StubLearner())
    rows = [cory.step(k).metrics for k in range(12)]
    assert [row["schedule/llm1/learned"] for row in rows] == llm1_turns
    assert [row["schedule/llm2/learned"] for row in rows] == [1 - t for t in llm1_turns]  # exactly one learns
    assert [row["schedule/llm1/updates"] for row in rows] == list(np.cumsum(llm1_turns))
    assert cory.agents["llm1"].learned == 6 and cory.agents["llm2"].learned == 6
    assert {row["cory/llm1_role"] for row in rows} == {0.0}


def test_simultaneous_updates_both_every_iteration_in_fixed_roles():
    cory = make_variant("cory_interleaved", "algorithm/schedule=simultaneous", learner=StubLearner())
    rows = [cory.step(k).metrics for k in range(4)]
    assert all(row["schedule/llm1/learned"] == row["schedule/llm2/learned"] == 1.0 for row in rows)
    assert [row["cory/llm1_role"] for row in rows] == [0.0] * 4
    assert [row["cory/swaps"] for row in rows] == [0.0] * 4
    assert cory.describe()["algorithm"] == "cory_simultaneous"


def test_a_variant_config_with_cory_s_parts_is_cory_bit_for_bit():
    """`algorithm=cory_interleaved algorithm/schedule=role_swap` names exactly CORY's parts: the same numbers."""
    torch.manual_seed(0)
    cory = make_variant("cory", "algorithm.schedule.period=1")
    torch.manual_seed(0)
    variant = make_variant("cory_interleaved", "algorithm/schedule=role_swap", "algorithm.schedule.period=1")
    for k in range(2):
        torch.manual_seed(k)
        want = cory.step(k).metrics
        torch.manual_seed(k)
        got = variant.step(k).metrics
        assert {n: v for n, v in got.items() if not n.startswith("time/")} == {
            n: v for n, v in want.items() if not n.startswith("time/")
        }
    assert same_state(agent_state(cory.agents["llm2"]), agent_state(variant.agents["llm2"]))
    assert variant.describe() == cory.describe() and variant.roles(1) == cory.roles(1)


# ------------------------------------------------------------------------------------------------ shared policy
def test_shared_policy_is_one_parameter_set_that_learns_from_both_roles(calls):
    cory = make_variant("cory_shared")
    assert list(cory.agents) == ["llm1"] and cory.roles(0) == {"pioneer": "llm1", "observer": "llm1"}
    agent = cory.agents["llm1"]
    names = [name for name, _ in cory.parameters()]
    assert names and all(name.startswith("llm1/") for name in names)
    assert [id(t) for _, t in cory.parameters()] == [id(p) for p in agent.trainee.trainable_parameters()]
    before = agent_state(agent)
    out = cory.step(0)
    # both roles acted through the very same module: the pioneer on the query, the observer on T_obs(q, a1)
    (n1, m1, p1), (n2, m2, p2) = calls.act
    assert n1 == n2 == "llm1" and m1 is m2 is agent.trainee.policy
    assert p1 == [cory.task.pioneer_prompt(q) for q in QUERIES] and p2 != p1
    # one update on the 2B samples: the pioneer's then the observer's, with their collective rewards (Eq. 4)
    [(name, rollout, scores)] = calls.learn
    B = len(QUERIES)
    assert name == "llm1" and len(rollout) == len(scores) == 2 * B
    assert rollout.prompts == p1 + p2
    r1 = torch.tensor(cory.scorer(QUERIES, rollout.responses[:B])[0])
    r2 = torch.tensor(cory.scorer(QUERIES, rollout.responses[B:])[0])
    assert torch.allclose(scores, torch.cat([r1 + r2, r2 + r1]))
    assert out.metrics["train/pioneer/task_reward"] == pytest.approx(r1.mean().item())
    assert out.metrics["train/observer/task_reward"] == pytest.approx(r2.mean().item())
    assert out.metrics["train/llm1/task_reward"] == pytest.approx(torch.cat([r1, r2]).mean().item())
    assert not same_state(before["weights"], agent_state(agent)["weights"])
    assert out.metrics["schedule/llm1/updates"] == 1.0


def test_concatenated_rollouts_keep_every_logprob_and_mask(calls):
    cory = make_variant("cory_shared")
    cory.step(0)
    [(_, both, _)] = calls.learn
    B = len(QUERIES)
    pio, obs = both.select(range(B)), both.select(range(B, 2 * B))
    assert both.prompt_ids.shape[1] == max(pio.prompt_mask.sum(-1).max(), obs.prompt_mask.sum(-1).max())
    assert (both.prompt_mask[:, -1] == 1).all()  # left padding: every prompt ends at the last column
    assert (both.response_mask[:, 0] == 1).all()  # right padding: every response starts at the first column
    assert not (both.kls * (1 - both.response_mask)).any()
    # the log-probs the update starts from are what the policy gives on the re-padded batch (before its step)
    fresh = make_variant("cory_shared").agents["llm1"]
    with torch.no_grad():
        logits, _ = forward_logits(
            fresh.trainee.policy,
            both.prompt_ids,
            both.prompt_mask,
            both.response_ids,
            both.response_mask,
            with_values=True,
        )
    logprobs = ppo_core.gather_logprobs(logits, both.response_ids)
    mask = both.response_mask.bool()
    assert torch.allclose(logprobs[mask], both.logprobs[mask], atol=1e-5)


def test_concat_rollouts_pads_each_side_to_the_wider_batch():
    def rollout(prompt_width: int, response_width: int, n: int, fill: float):
        from cory.ppo.rollout import Rollout

        ones = torch.ones(n, response_width)
        return Rollout(
            prompts=[f"p{fill}"] * n,
            responses=[f"r{fill}"] * n,
            prompt_ids=torch.full((n, prompt_width), 7),
            prompt_mask=torch.ones(n, prompt_width, dtype=torch.long),
            response_ids=torch.full((n, response_width), 9),
            response_mask=torch.ones(n, response_width, dtype=torch.long),
            logprobs=ones * fill,
            ref_logprobs=ones * fill,
            values=ones * fill,
            kls=ones * fill,
            entropy=ones * fill,
            hit_max_tokens=torch.tensor([True] * n),
        )

    both = concat_rollouts(rollout(2, 3, 1, 1.0), rollout(4, 1, 2, 2.0), pad_token_id=0)
    assert both.prompts == ["p1.0", "p2.0", "p2.0"]
    assert both.prompt_ids.tolist() == [[0, 0, 7, 7], [7, 7, 7, 7], [7, 7, 7, 7]]
    assert both.prompt_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert both.response_ids.tolist() == [[9, 9, 9], [9, 0, 0], [9, 0, 0]]
    assert both.response_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert both.values.tolist() == [[1.0, 1.0, 1.0], [2.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    assert both.hit_max_tokens.tolist() == [True, True, True]


# ------------------------------------------------------------------------------------------------ LoRA per role
def test_one_lora_adapter_per_role_stays_in_its_role():
    cory = make_variant(
        "cory_lora_roles", "model.lora.enabled=true", "algorithm/schedule=interleaved", "algorithm.schedule.period=1"
    )
    llm1, llm2 = cory.agents["llm1"].trainee.policy, cory.agents["llm2"].trainee.policy
    assert (llm1.adapter, llm2.adapter) == ("pioneer", "observer")
    assert llm1.pretrained_model is llm2.pretrained_model  # one base
    assert set(llm1.pretrained_model.peft_config) == {"pioneer", "observer"}
    for k in range(2):
        before = {name: agent_state(agent) for name, agent in cory.agents.items()}
        out = cory.step(k)
        assert out.metrics["cory/llm1_role"] == 0.0  # the pioneer adapter stays pioneer
        learner, frozen = ("llm1", "llm2") if k == 0 else ("llm2", "llm1")
        assert same_state(before[frozen], agent_state(cory.agents[frozen]))
        assert not same_state(before[learner]["weights"], agent_state(cory.agents[learner])["weights"])
    assert cory.describe()["algorithm"] == "cory_lora_per_role_interleaved"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((), "model.lora.enabled=false (full fine-tuning)"),
        (("model.lora.enabled=true", "model.lora.share_base=false"), "model.lora.share_base=false"),
    ],
)
def test_lora_per_role_refuses_full_fine_tuning_or_separate_bases_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        make_variant("cory_lora_roles", *overrides)
    assert str(err.value).startswith("algorithm/layout=lora_per_role ") and message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm=cory_lora_roles", "algorithm/schedule=role_swap"), "algorithm/layout=lora_per_role keeps"),
        (("algorithm=cory_shared", "algorithm/schedule=interleaved"), "algorithm/layout=shared has one policy"),
        (("algorithm=cory_shared", "algorithm/schedule=sequential"), "algorithm/layout=shared has one policy"),
        (("algorithm=cory_shared", "algorithm/critic=centralized"), "algorithm/critic=centralized: one shared"),
        (("algorithm=cory", "algorithm/critic=none"), "algorithm/advantage=gae needs values"),
        (("algorithm=grpo", "algorithm/critic=per_agent"), "algorithm/advantage=grpo compares the samples"),
        (("algorithm=cory_interleaved", "algorithm.schedule.period=0"), "algorithm.schedule.period=0: must be"),
        (("algorithm=cory", "algorithm.schedule.period=0"), "algorithm.schedule.period=0: must be"),
        (("algorithm=cory_teamtr", "algorithm.schedule.kl_budget=0"), "algorithm.schedule.kl_budget=0"),
        (
            ("algorithm=cory", "algorithm.episode.roles=[pioneer,judge]"),
            "algorithm.episode.roles=['pioneer', 'judge']",
        ),
        (("algorithm=cory", "algorithm.episode.frozen_roles=[pioneer,observer]"), "every role is frozen"),
        (("algorithm=cory_chain3", "algorithm.episode.sees=every"), "algorithm.episode.sees='every': one of"),
        (("algorithm=grpo", "algorithm.advantage.group_size=1"), "algorithm.advantage.group_size=1"),
        (("algorithm=cory", "algorithm.advantage.lam=1.5"), "algorithm.advantage.lam=1.5"),
        (("algorithm=cory", "algorithm.loss.vf_coef=-1"), "algorithm.loss.vf_coef=-1"),
    ],
)
def test_parts_that_cannot_work_together_are_refused_in_one_line_before_any_model_loads(overrides, message):
    """Each value is checked by its part's constructor, each combination by the team before it asks for the model:
    `context=None` proves no model was loaded (validation builds the parts exactly so)."""
    cfg = compose_cfg(["experiment=smoke", *overrides])
    with pytest.raises(ConfigError) as err:
        instantiate_target(cfg.algorithm, _convert_="all")(context=None)
    assert message in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ runs and resume
def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_rows(run_dir) if any(k.startswith("train/") for k in r)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ("algorithm=cory_interleaved", "algorithm.schedule.period=3"),  # turns flip after the checkpoint
        ("algorithm=cory_shared",),
        ("algorithm=cory_interleaved", "algorithm.schedule.period=3", "algorithm/critic=centralized"),
    ],
    ids=["interleaved", "shared", "interleaved-centralised-critic"],
)
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, overrides):
    args = (*overrides, "eval_every=0", "num_eval=4", "save_every=2")
    start_run(tmp_path, tmp_path / "reference", *args, "iterations=4")
    run_dir = tmp_path / "run"
    start_run(tmp_path, run_dir, *args, "iterations=2")  # checkpoint after iteration 1, mid-turn (K=3)
    state = json.loads((run_dir / "checkpoints" / "iter_000002" / "algorithm" / "team.json").read_text())
    assert state["algorithm"]["updates"] == ({"llm1": 2, "llm2": 0} if "interleaved" in overrides[0] else {"llm1": 2})
    resume_run(run_dir, "iterations=4")  # the schedule continues: iteration 2 llm1's turn, iteration 3 llm2's
    want, got = read_rows(tmp_path / "reference"), read_rows(run_dir)
    assert_same_rows(train_rows(run_dir), train_rows(tmp_path / "reference"))
    assert_same_rows([got[-1]], [want[-1]])  # the final held-out evaluation
    if "interleaved" in overrides[0]:
        assert [r["schedule/llm2/learned"] for r in train_rows(run_dir)] == [0.0, 0.0, 0.0, 1.0]
    catalogue = RUN_METRICS | cory.ppo.metrics.PPO_METRICS | TEAM_METRICS | role_metrics(ROLES)
    names = {k for row in got for k in row if k != "iteration"}
    assert not [n for n in names if not is_known_metric(n, catalogue)]  # every logged name is defined


def test_docs_metric_table_lists_the_team_metrics():
    page = (DOCS / "metrics.md").read_text()
    assert markdown_table(TEAM_METRICS) in page, "paste markdown_table(TEAM_METRICS) into docs/metrics.md"
