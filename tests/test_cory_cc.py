"""CORY with a centralised critic (`algorithm=cory_cc`: the `CentralizedCritic` part of `cory/ppo/critics.py`;
docs/method.md §10).

Covers: the joint sequence [x_P; a1; a2] and each agent's value columns, by hand; the critic's values of the
observer's tokens change with the pioneer's and the observer's responses, the pioneer's only with what preceded them
(causal); the returns the critic learns are the collective reward minus each agent's own KL (hand-checked with
γ = λ = 1); one step trains the critic and both policies but neither actor's value head; an estimator that ignores
values is refused with it; a smoke run through the entry point resumes exactly, its checkpoint holding the critic.

Run:  .venv/bin/python -m pytest -q -p no:xdist tests/test_cory_cc.py
"""

from __future__ import annotations

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.cory_setup import make_cory
from helpers.runners import assert_same_rows, read_rows, resume_run, start_run
from hydra.utils import instantiate

from cory.algorithms.team import Team
from cory.errors import ConfigError
from cory.ppo.critics import joint_batch
from cory.ppo.rollout import Rollout, pad


def make_cc(*overrides: str) -> Team:
    """CORY with the centralised critic on the smoke model, training every iteration on the fixed queries."""
    return make_cory(("algorithm=cory_cc", "batch_size=4", "algorithm.agent.mini_batch_size=2", *overrides))


def rollout(prompts: list[list[int]], responses: list[list[int]], pad_id: int = 0) -> Rollout:
    p_ids, p_mask = pad([torch.tensor(p) for p in prompts], pad_id, left=True)
    r_ids, r_mask = pad([torch.tensor(r) for r in responses], pad_id, left=False)
    B, T = r_ids.shape
    zeros = torch.zeros(B, T)
    return Rollout(
        ["p"] * B,
        ["r"] * B,
        p_ids,
        p_mask,
        r_ids,
        r_mask,
        zeros,
        zeros,
        zeros,
        zeros,
        zeros,
        torch.zeros(B, dtype=bool),
    )


def test_joint_sequence_and_value_columns_by_hand():
    pio = rollout([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]])
    obs = rollout([[99, 98], [97]], [[20], [21, 22]])  # the observer's own prompt is not part of the joint sequence
    joint = joint_batch([pio, obs], pad_token_id=0)
    # row 0: [5 6 7 | 10 11 | 20], 6 tokens, left-padded to L = 6; row 1: [8 | 12 13 14 | 21 22], 6 tokens
    assert joint.ids.tolist() == [[5, 6, 7, 10, 11, 20], [8, 12, 13, 14, 21, 22]]
    assert joint.mask.tolist() == [[1] * 6, [1] * 6]
    # V of a1 token t at column P − 1 + t; of a2 token t at P + T1 − 1 + t (padded tokens clamped into range)
    assert joint.columns[0].tolist() == [[2, 3, 4], [0, 1, 2]]
    assert joint.columns[1].tolist() == [[4, 5], [3, 4]]
    short = joint_batch([pio.select([0]), obs.select([0])], 0)
    longer = joint_batch([rollout([[5, 6, 7]], [[10, 11]]), rollout([[1]], [[20, 21, 22]])], 0)
    assert longer.ids.tolist() == [[5, 6, 7, 10, 11, 20, 21, 22]] and short.ids.shape == (1, 6)


def test_the_critic_reads_both_responses_causally():
    algorithm = make_cc()
    critic = algorithm.critic
    with torch.no_grad():  # a value head that is not zero-mean noise
        critic.trainee.policy.v_head.summary.weight.normal_(0, 1.0)
    pio = rollout([[40, 41, 42], [43, 44]], [[50, 51, 52], [53, 54]])
    obs = rollout([[1], [1]], [[60, 61, 62], [63, 64]])
    obs_changed = rollout([[1], [1]], [[70, 61, 62], [63, 64]])  # the observer's first token of sample 0
    pio_changed = rollout([[40, 41, 42], [43, 44]], [[50, 51, 80], [53, 54]])  # the pioneer's last token of sample 0
    v1, v2 = critic.values(joint_batch([pio, obs], 0), [pio, obs])
    w1, w2 = critic.values(joint_batch([pio, obs_changed], 0), [pio, obs_changed])
    assert torch.equal(v1, w1)  # the pioneer's states precede a2
    assert torch.equal(v2[0, 0], w2[0, 0]) and not torch.equal(v2[0, 1:], w2[0, 1:])  # a2_{<t} only
    assert torch.equal(v2[1], w2[1])
    u1, u2 = critic.values(joint_batch([pio_changed, obs], 0), [pio_changed, obs])
    assert torch.equal(v1[0, :3], u1[0, :3])  # a1's last token is an action, not part of any of a1's states
    assert not torch.equal(v2[0], u2[0])  # every observer state holds all of a1


def test_critic_learns_the_collective_return_and_actors_keep_their_value_heads(monkeypatch):
    algorithm = make_cc("algorithm.advantage.lam=1.0", "algorithm.advantage.gamma=1.0")
    agents, critic = algorithm.team.agents, algorithm.critic

    def state(module):
        return {k: v.clone() for k, v in module.state_dict().items()}

    heads = {a: state(agent.trainee.policy.v_head) for a, agent in agents.items()}
    policies = {a: state(agent.trainee.policy.pretrained_model) for a, agent in agents.items()}
    critic_before = state(critic.trainee.policy)
    task_rewards, learned, seen = [], {}, {}
    score = algorithm.scorer
    monkeypatch.setattr(algorithm, "scorer", lambda q, r: task_rewards.append(score(q, r)) or task_rewards[-1])
    for agent_id, agent in agents.items():
        real = agent.learner.update
        monkeypatch.setattr(
            agent.learner,
            "update",
            lambda batch, a=agent_id, real=real: learned.update({a: (batch.rollout, batch.scores)}) or real(batch),
        )
    real_update = critic.update
    monkeypatch.setattr(
        critic, "update", lambda j, old, ret, m: seen.update(returns=ret) or real_update(j, old, ret, m)
    )
    out = algorithm.step(0)
    # w_self = w_other = 1: both agents' collective reward is the team's, r1 + r2
    R = torch.tensor(task_rewards[0][0]) + torch.tensor(task_rewards[1][0])
    for k, agent_id in enumerate(("llm1", "llm2")):  # llm1 is the pioneer at iteration 0
        ro, scores = learned[agent_id]
        torch.testing.assert_close(scores, R)
        beta, mask = out.metrics[f"train/{agent_id}/kl_coef"], ro.response_mask.float()
        # γ = λ = 1: the critic's target at the first token is G_0 = R − β·Σ_t kl_t of this agent (values cancel)
        torch.testing.assert_close(seen["returns"][k][:, 0], R - beta * (ro.kls * mask).sum(-1), atol=1e-5, rtol=0)
    for a, agent in agents.items():
        assert all(torch.equal(v, agent.trainee.policy.v_head.state_dict()[k]) for k, v in heads[a].items()), a
        now = agent.trainee.policy.pretrained_model.state_dict()
        assert not all(torch.equal(v, now[k]) for k, v in policies[a].items()), a
        assert not any(p is agent.trainee.policy.v_head.summary.weight for p in agent.trainee.trainable_parameters())
    critic_now = critic.trainee.policy.state_dict()["v_head.summary.weight"]
    assert not torch.equal(critic_before["v_head.summary.weight"], critic_now)
    assert {"ppo/llm1/value_loss", "ppo/llm2/value_loss", "ppo/llm1/explained_variance"} <= set(out.metrics)
    names = [n for n, _ in algorithm.parameters()]
    assert any(n.startswith("critic/") for n in names) and any(n.startswith("llm2/") for n in names)


def test_an_estimator_that_ignores_values_is_refused_with_a_centralised_critic():
    """Refused before any model loads (the team is given no context at all)."""
    built = instantiate(compose_cfg(["experiment=smoke", "algorithm=cory_cc", "algorithm/advantage=grpo"]).algorithm)
    with pytest.raises(ConfigError, match=r"^algorithm/advantage=grpo compares the samples of a prompt"):
        built(context=None)
    built = instantiate(
        compose_cfg(["experiment=smoke", "algorithm=cory_grpo", "algorithm/critic=per_agent"]).algorithm
    )
    with pytest.raises(ConfigError, match=r"algorithm/critic=per_agent would be trained for nothing"):
        built(context=None)
    built = instantiate(compose_cfg(["experiment=smoke", "algorithm=cory", "algorithm/critic=none"]).algorithm)
    with pytest.raises(ConfigError, match=r"^algorithm/advantage=gae needs values"):
        built(context=None)


def test_smoke_run_trains_and_resumes_exactly(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    start_run(tmp_path, whole, "algorithm=cory_cc", "iterations=3", "save_every=1")
    start_run(tmp_path, part, "algorithm=cory_cc", "iterations=2", "save_every=1")
    assert {p.name for p in (part / "checkpoints" / "iter_000002" / "algorithm" / "critic").iterdir()} >= {
        "policy.safetensors",
        "optimizer.pt",
        "critic.json",
    }
    resume_run(part, "iterations=3")
    assert_same_rows(read_rows(part), read_rows(whole))
