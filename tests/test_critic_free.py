"""GRPO and RLOO: the group estimators (`cory/ppo/advantages.py`, `cory/ppo/estimators.py`; docs/method.md §9).

Covers: the group baselines against hand-computed numbers (GRPO sums to zero per group, RLOO is the leave-one-out
formula), contiguous groups; the KL-shaped sequence return; the agent team's schedule repeating each query G times
(G = 1 is the schedule of before); the agent's update moves the policy, never its value head, with advantages equal to
the group formula; the estimators' checks; runs through the entry point (PPO and CORY orchestration, exact resume);
and parity with TRL 1.16's own code: the advantages `GRPOTrainer` and `RLOOTrainer` compute in a real training step,
and `GRPOTrainer._compute_loss` on the same log-probs, advantages and masks.

Run:  .venv/bin/python -m pytest -q -p no:xdist tests/test_critic_free.py
"""

from __future__ import annotations

import collections
import math
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.from_config import learner
from helpers.runners import assert_same_rows, read_rows, resume_run, start_run

from cory.algorithms.agents import QuerySchedule
from cory.errors import ConfigError
from cory.models import build_tiny_gpt2, make_reference
from cory.ppo import core as ppo_core
from cory.ppo.advantages import broadcast, group_advantages, sequence_returns, zero_spread_groups
from cory.ppo.estimators import GRPO, RLOO
from cory.ppo.learner import Agent, Batch, agent_on

CONFIG = learner(learning_rate=1e-2, mini_batch_size=4, ppo_epochs=2)
ESTIMATORS = {"grpo": GRPO, "rloo": RLOO}


# ------------------------------------------------------------------------------------------------ pure maths
def test_grpo_advantages_by_hand_and_sum_to_zero_per_group():
    returns = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 4.0, 4.0])
    got = group_advantages(returns, 4, "grpo")
    # group 1: mean 3, unbiased std √((4 + 1 + 0 + 9) / 3); group 2: mean 2, std √((4 + 4 + 4 + 4) / 3)
    s1, s2 = math.sqrt(14 / 3) + 1e-4, math.sqrt(16 / 3) + 1e-4
    want = torch.tensor([-2 / s1, -1 / s1, 0.0, 3 / s1, -2 / s2, -2 / s2, 2 / s2, 2 / s2])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got.view(2, 4).sum(1), torch.zeros(2), atol=1e-6, rtol=0)


def test_rloo_advantages_are_the_leave_one_out_formula():
    returns = torch.tensor([1.0, 2.0, 3.0, 6.0, 5.0, 1.0, 0.0, 2.0])
    got = group_advantages(returns, 4, "rloo")
    # A_0 = 1 − (2 + 3 + 6)/3, A_1 = 2 − (1 + 3 + 6)/3, A_2 = 3 − (1 + 2 + 6)/3, A_3 = 6 − (1 + 2 + 3)/3, ...
    want = torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3, 5 - 3 / 3, 1 - 7 / 3, 0 - 8 / 3, 2 - 6 / 3])
    torch.testing.assert_close(got, want)
    # equivalently G/(G − 1)·(R_i − mean): a zero-sum scaled GRPO numerator
    torch.testing.assert_close(got, 4 / 3 * (returns.view(2, 4) - returns.view(2, 4).mean(1, keepdim=True)).view(-1))


def test_groups_are_contiguous_blocks():
    """Swapping two samples of different groups changes the result: samples g·G … g·G + G − 1 form group g."""
    returns = torch.tensor([0.0, 1.0, 10.0, 11.0])
    torch.testing.assert_close(group_advantages(returns, 2, "rloo"), torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    mixed = returns[[0, 2, 1, 3]]
    torch.testing.assert_close(group_advantages(mixed, 2, "rloo"), torch.tensor([-10.0, 10.0, -10.0, 10.0]))


def test_equal_returns_give_zero_advantage_and_count_as_zero_spread():
    returns = torch.tensor([0.5, 0.5, 0.5, 1.0, 2.0, 3.0])
    for kind in ("grpo", "rloo"):
        assert torch.equal(group_advantages(returns, 3, kind)[:3], torch.zeros(3))
    assert zero_spread_groups(returns, 3).item() == 0.5


def test_bad_group_arguments_are_refused():
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_advantages(torch.zeros(4), 1, "grpo")
    with pytest.raises(ValueError, match=r"\[N·G\]"):
        group_advantages(torch.zeros(5), 2, "grpo")
    with pytest.raises(ValueError, match="advantage must be one of"):
        group_advantages(torch.zeros(4), 2, "ppo")


def test_sequence_return_is_score_minus_beta_kl_and_broadcast_masks_padding():
    kls = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0]])  # second response: 1 token, then padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards, _ = ppo_core.penalized_rewards(torch.tensor([1.0, 2.0]), kls * mask, 0.5, mask)
    torch.testing.assert_close(sequence_returns(rewards, mask), torch.tensor([1.0 - 0.5 * 0.6, 2.0 - 0.5 * 0.5]))
    assert torch.equal(broadcast(torch.tensor([2.0, -1.0]), mask), torch.tensor([[2.0, 2.0, 2.0], [-1.0, 0, 0]]))


# ------------------------------------------------------------------------------------------ the data schedule
def test_schedule_repeats_each_query_group_size_times_and_keeps_the_old_schedule_at_one():
    queries = [f"q{i}" for i in range(12)]
    old = QuerySchedule(queries, 4, seed=3, max_new_tokens=(2, 5))
    one = QuerySchedule(queries, 4, seed=3, max_new_tokens=(2, 5), group_size=1)
    assert [old.batch(k) for k in range(6)] == [one.batch(k) for k in range(6)]
    grouped = QuerySchedule(queries, 8, seed=3, max_new_tokens=(2, 5), group_size=4)
    batches = [grouped.batch(k) for k in range(6)]  # 12 queries, 2 per batch: 6 batches per epoch
    for b in batches:
        assert len(b) == 8 and b[:4] == [b[0]] * 4 and b[4:] == [b[4]] * 4 and b[0] != b[4]
    assert sorted(q for b in batches for q in b[::4]) == sorted(queries)  # each query once per epoch
    assert [grouped.max_new_tokens(k) for k in range(6)] == [one.max_new_tokens(k) for k in range(6)]


# ------------------------------------------------------------------------------------------------ the learner
@pytest.mark.parametrize("estimator", [GRPO, RLOO])
def test_estimators_check_their_values(estimator):
    for bad in (1, 0, True, 2.0):
        with pytest.raises(ConfigError, match=r"^algorithm\.advantage\.group_size=.*: must be an integer >= 2"):
            estimator(group_size=bad, per_role=False)
    assert estimator(group_size=2, per_role=False).uses_values is False


def test_a_batch_of_partial_groups_is_refused_before_the_model_loads(tmp_path):
    from helpers.compose import compose_cfg

    from cory.config import instantiate_target

    cfg = compose_cfg(["experiment=smoke", "algorithm=grpo", "algorithm.advantage.group_size=3", "batch_size=8"])
    with pytest.raises(ConfigError, match=r"group_size=3 must divide batch_size=8"):
        from cory.build import build_context

        context = build_context(cfg, tmp_path)
        context = __import__("dataclasses").replace(context, backbone=lambda: pytest.fail("the model was loaded"))
        instantiate_target(cfg.algorithm, _convert_="all")(context=context)


def make_agent(kind: str) -> Agent:
    model, tokenizer = build_tiny_gpt2()
    estimator = ESTIMATORS[kind](group_size=4, per_role=False)
    return agent_on("llm1", model, make_reference(model), tokenizer, CONFIG, seed=0, advantage=estimator)


def rollout_of(agent: Agent):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (3,), generator=g)] * 4 + [torch.randint(0, 256, (5,), generator=g)] * 4
    responses = [torch.randint(0, 256, (n,), generator=g) for n in (4, 1, 6, 3, 2, 5, 3, 3)]
    return agent.actor.score_tokens(prompts, responses)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_learn_moves_the_policy_never_the_value_head_with_group_advantages(kind, monkeypatch):
    agent = make_agent(kind)
    rollout = rollout_of(agent)
    scores = torch.tensor([1.0, 0.0, 2.0, 0.5, -1.0, 3.0, 0.0, 0.0])
    policy = agent.trainee.policy
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    assert not any(p is policy.v_head.summary.weight for p in agent.trainee.trainable_parameters())
    seen = []
    real = ppo_core.policy_loss
    monkeypatch.setattr(ppo_core, "policy_loss", lambda lp, old, adv, *a: seen.append(adv) or real(lp, old, adv, *a))
    stats = agent.learner.update(Batch(rollout, scores)).stats
    after = policy.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(not k.startswith("v_head.") for k in moved)
    assert {"value_loss", "value_clipfrac", "explained_variance"}.isdisjoint(stats)
    # every minibatch saw A_i on each token of response i, A from R_i − β·KL_seq,i over the two groups of 4
    mask = rollout.response_mask.float()
    returns = scores - stats["kl_coef"] * (rollout.kls * mask).sum(-1)
    want = broadcast(group_advantages(returns, 4, kind), mask)
    order = np.random.RandomState(0).permutation(8)  # the agent's first permutation (seed 0)
    torch.testing.assert_close(seen[0], want[torch.as_tensor(order[:4])])
    assert stats["zero_spread_groups"] == 0.0


# ----------------------------------------------------------------------------------------- through the entry point
@pytest.mark.parametrize("algorithm", ["grpo", "cory_rloo"])
def test_runs_and_resumes_exactly(tmp_path, algorithm):
    """Through `python -m cory.train`'s path, PPO's and CORY's orchestration with G = 4 (smoke batch 16: 4 prompts),
    one baseline each: 2 iterations, then a third from the checkpoint, equal 3 in one go."""
    agents = ["llm1", "llm2"] if algorithm.startswith("cory") else ["llm1"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    start_run(tmp_path, whole, f"algorithm={algorithm}", "iterations=3", "save_every=1")
    start_run(tmp_path, part, f"algorithm={algorithm}", "iterations=2", "save_every=1")
    resume_run(part, "iterations=3")
    rows = read_rows(whole)
    assert_same_rows(read_rows(part), rows)
    train = [r for r in rows if "train/llm1/kl" in r]
    for a in agents:
        assert all(f"ppo/{a}/zero_spread_groups" in r and f"ppo/{a}/value_loss" not in r for r in train)
        assert any(r[f"ppo/{a}/policy_loss"] != 0 for r in train)


# ----------------------------------------------------------------------------------------------- TRL 1.16 parity
def _trl_generation_step(kind: str, group_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """One real training step of TRL's `GRPOTrainer` / `RLOOTrainer` (tiny GPT-2, CPU, β = 0): the rewards our reward
    function returned and the advantages TRL computed from them, both in generation order (read from
    `_generate_and_score_completions`' output, before TRL shuffles the batch into minibatches)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    cfg_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (RLOOConfig, RLOOTrainer)
    model, tokenizer = build_tiny_gpt2()
    rewards: list[torch.Tensor] = []

    def reward(completions, **_):
        r = [float(len(c) % 5) + 0.1 * i * i for i, c in enumerate(completions)]  # ties are unlikely
        rewards.append(torch.tensor(r))
        return r

    args = cfg_cls(
        output_dir=tempfile.mkdtemp(prefix="cory-trl-"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2 * group_size,
        num_generations=group_size,
        max_completion_length=6,
        max_steps=1,
        beta=0.0,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    prompts = Dataset.from_list([{"prompt": p} for p in ("abc", "de", "fgh", "ij")])
    trainer = trainer_cls(
        model=model, reward_funcs=reward, args=args, train_dataset=prompts, processing_class=tokenizer
    )
    outputs = []
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: outputs.append(generate(inputs)) or outputs[-1]
    trainer.train()
    ids = outputs[0]["prompt_ids"]
    assert all(torch.equal(ids[i], ids[i - i % group_size]) for i in range(len(ids)))  # contiguous groups, as ours
    return rewards[0], outputs[0]["advantages"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_advantages_equal_trl_trainers(kind):
    """Our `group_advantages` on the rewards of a real TRL 1.16 step equals the advantages that trainer computed
    (GRPO: `scale_rewards="group"`, ε = 1e-4, unbiased std; RLOO: `normalize_advantages=False`). With β > 0 TRL's RLOO
    subtracts β·Σ_t (log π − log π0) from the reward first: our `sequence_returns` with `kl_penalty: kl`."""
    rewards, trl_advantages = _trl_generation_step(kind)
    torch.testing.assert_close(group_advantages(rewards, 4, kind), trl_advantages, rtol=1e-6, atol=1e-6)


class _OneProcess:
    """The slice of `accelerate.Accelerator` that `GRPOTrainer._compute_loss` uses, for one process."""

    num_processes = 1

    @staticmethod
    def reduce(t, reduction="sum"):
        return t

    @staticmethod
    def gather(t):
        return t

    gather_for_metrics = gather


def _trl_grpo_loss(loss_type: str, logprobs, old_logprobs, advantages, mask) -> torch.Tensor:
    """`GRPOTrainer._compute_loss` called unbound on a minimal `self` (a trainer needs a model, data and an
    accelerator to exist; the loss needs none of them): the policy forward is replaced by the given log-probs, β = 0
    (our KL sits in the reward, not in the loss), one process, no gradient accumulation, token-level ratios."""
    from trl import GRPOTrainer

    B, T = mask.shape
    this = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logprobs, torch.zeros(B, T), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.2,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        _metrics={"train": collections.defaultdict(list)},
        accelerator=_OneProcess(),
        max_completion_length=T,
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old_logprobs,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(this, None, inputs)


@pytest.mark.slow
def test_clipped_loss_equals_trl_grpo_token_level_loss():
    """Our loss (PPO's `policy_loss` on the broadcast sequence advantage: a mean over every response token of the
    minibatch) is TRL's `loss_type="bnpo"`, and `"dapo"` with the whole batch in one backward pass; TRL's default
    `"grpo"` (DeepSeekMath's 1/G Σ_i 1/|o_i| Σ_t: each response weighs the same) differs when lengths differ."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)
    old = -torch.rand(4, 4, generator=g) * 3
    new = old + 0.4 * torch.randn(4, 4, generator=g)  # ratios well outside 1 ± 0.2: clipping is active
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.5, 3.0]), 4, "grpo")
    ours, clipfrac, _ = ppo_core.policy_loss(new, old, broadcast(advantages, mask), mask, 0.2)
    assert 0 < clipfrac < 1
    torch.testing.assert_close(_trl_grpo_loss("bnpo", new, old, advantages, mask), ours)
    torch.testing.assert_close(_trl_grpo_loss("dapo", new, old, advantages, mask), ours)
    assert not torch.isclose(_trl_grpo_loss("grpo", new, old, advantages, mask), ours)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["algorithm=ppo"], "ppo"),
        (["algorithm=grpo"], "grpo"),
        (["algorithm=rloo"], "rloo"),
        (["algorithm=cory"], "cory"),
        (["algorithm=cory_grpo"], "cory_grpo"),
        (["algorithm=cory_rloo"], "cory_rloo"),
    ],
)
def test_a_critic_free_learner_names_its_runs(overrides, name):
    """Runs are grouped by `describe()["algorithm"]` (frontier, W&B, sweep summaries): GRPO must not pool with PPO."""
    from helpers.compose import compose_cfg
    from helpers.cory_setup import make_cory

    identity = make_cory(tuple(overrides)).describe()
    beta = compose_cfg(["experiment=smoke", *overrides]).algorithm.agent.init_kl_coef
    assert identity["algorithm"] == name and identity["kl_coef"] == beta
    assert identity["advantage"] == ("gae" if name in ("ppo", "cory") else name.rsplit("_", 1)[-1])
    assert ("group_size" in identity) == (identity["advantage"] != "gae")
