"""The methods the parts compose (docs/method.md §12), each new files only: per-role advantage normalisation,
the KL penalty in the loss, a three-role chain, counterfactual credit, sequential updates within a KL budget, and a
MAPPO-style team of three on a centralised critic.

Hand-computed numbers for the maths; stub agents (instant, deterministic answers) for what each role sees and is
credited with; real tiny agents for what moves; runs through the entry point for exact resumes.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.compose import CONF_DIR, compose_cfg
from helpers.cory_setup import QUERIES, make_cory
from helpers.runners import assert_same_rows, read_rows, resume, resume_run, start, start_run, wait_for_train_row
from hydra.utils import instantiate
from omegaconf import OmegaConf

from cory import figures
from cory.algorithms.agents import AgentSet
from cory.algorithms.credit import Collective, Counterfactual
from cory.algorithms.episodes import Chain
from cory.errors import ConfigError
from cory.ppo import core as ppo_core
from cory.ppo.estimators import GAE, GRPO, EstimatorInputs
from cory.ppo.learner import PPOLearner, Update
from cory.ppo.losses import ClippedPPO, ClippedPPOKLInLoss, LossInputs


# ------------------------------------------------------------------------------------------------ stubs
class StubAgent:
    """Answers instantly and deterministically (`<name>(<prompt>)`); records the batches it learns from. It is its
    own actor and learner."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.kl_coef = name, log, 0.3
        self.actor = self.learner = self

    def act(self, prompts, max_new_tokens, generation_kwargs, batch_size, for_update=False):
        self.log.append(("act", self.name, list(prompts)))
        n = len(prompts)
        return SimpleNamespace(
            prompts=list(prompts),
            responses=[f"{self.name}({p})" for p in prompts],
            kls=torch.ones(n, 2),
            prompt_mask=torch.ones(n, 1),
            response_mask=torch.ones(n, 2),
            hit_max_tokens=torch.zeros(n, dtype=torch.bool),
        )

    def update(self, batch):
        self.log.append(("update", self.name, batch.scores.tolist(), batch.kl_budget))
        return Update({"kl_coef": 0.3}, None, 0.3)

    def context_length(self) -> None:
        return None


class StubLearner:
    init_kl_coef = 0.3

    def __init__(self) -> None:
        self.log: list = []

    def check_batch(self, batch_size: int) -> None:
        pass

    def describe(self) -> dict:
        return {"kl_coef": self.init_kl_coef}

    def build(self, name: str, *args, **kwargs) -> StubAgent:
        return StubAgent(name, self.log)


def sees(texts):
    """The toy task's reward part (on responses): r = 1 for an answer that saw another's (its prompt held a `|`, the
    toy observer template), 0.5 for the pioneer's answer of a query, 0.25 for a later role answering the query
    alone."""
    return [1.0 if "|" in r else (0.5 if r.startswith("llm1(") else 0.25) for r in texts]


def stub_team(*overrides: str, reward=sees):
    learner = StubLearner()
    return make_cory(overrides, reward=reward, learner=learner), learner.log


# ---------------------------------------------------------------------------------------------- per-role normalisation
def test_gae_per_role_whitens_each_role_on_its_own_tokens_by_hand():
    # two roles, two samples each, γ = λ = 1, values 0: A_t = the sum of the rewards from t on
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 10.0], [0.0, 30.0]])
    mask, values = torch.ones(4, 2), torch.zeros(4, 2)
    roles = torch.tensor([0, 0, 1, 1])
    out = GAE(gamma=1.0, lam=1.0, whiten_rewards=False, per_role=True)(EstimatorInputs(rewards, values, mask, roles))
    # role 0 holds A = [1, 1, 3, 3]: mean 2, unbiased variance 4/3; role 1 holds [10, 10, 30, 30]: mean 20, var 400/3
    s0, s1 = math.sqrt(4 / 3 + 1e-8), math.sqrt(400 / 3 + 1e-8)
    want = torch.tensor([[-1 / s0, -1 / s0], [1 / s0, 1 / s0], [-10 / s1, -10 / s1], [10 / s1, 10 / s1]])
    torch.testing.assert_close(out.advantages, want)
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [3.0, 3.0], [10.0, 10.0], [30.0, 30.0]]))
    batch = GAE(gamma=1.0, lam=1.0, whiten_rewards=False, per_role=False)(
        EstimatorInputs(rewards, values, mask, roles)
    )
    assert batch.advantages[:2].abs().max() < 1.0  # over the batch, the small role's advantages all but vanish
    # one role in the batch: per-role whitening is the batch whitening
    one = torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(
        GAE(1.0, 1.0, False, True)(EstimatorInputs(rewards, values, mask, one)).advantages, batch.advantages
    )


def test_grpo_per_role_whitens_the_group_advantages_within_each_role():
    rewards = torch.tensor([[1.0], [3.0], [0.0], [4.0]])  # sequence returns 1, 3 (role 0), 0, 4 (role 1)
    mask, roles = torch.ones(4, 1), torch.tensor([0, 0, 1, 1])
    plain = GRPO(group_size=2, per_role=False)(EstimatorInputs(rewards, None, mask, roles)).advantages[:, 0]
    per_role = GRPO(group_size=2, per_role=True)(EstimatorInputs(rewards, None, mask, roles)).advantages[:, 0]
    for role in (0, 1):
        got = per_role[roles == role]
        assert got.mean().abs() < 1e-6 and got.std() == pytest.approx(1.0, abs=1e-6)
        assert torch.equal(torch.sign(got), torch.sign(plain[roles == role]))


def test_per_role_changes_nothing_with_one_learner_per_role():
    torch.manual_seed(0)
    plain = make_cory(("algorithm.schedule.period=1",))
    torch.manual_seed(0)
    per_role = make_cory(("algorithm.schedule.period=1", "algorithm.advantage.per_role=true"))
    for k in range(2):
        torch.manual_seed(k)
        want = plain.step(k).metrics
        torch.manual_seed(k)
        got = per_role.step(k).metrics
        assert {n: v for n, v in got.items() if not n.startswith("time/")} == {
            n: v for n, v in want.items() if not n.startswith("time/")
        }


def test_a_shared_policy_with_per_role_sees_each_roles_advantages_whitened_apart(monkeypatch):
    seen = []
    real = ppo_core.masked_whiten
    monkeypatch.setattr(ppo_core, "masked_whiten", lambda v, m, *a: seen.append(m.sum().item()) or real(v, m, *a))
    team = make_cory(("algorithm=cory_shared", "algorithm.advantage.per_role=true"))
    update = PPOLearner.update
    roles_seen = []
    monkeypatch.setattr(PPOLearner, "update", lambda self, b: roles_seen.append(b.roles.tolist()) or update(self, b))
    team.step(0)
    B = len(QUERIES)
    assert roles_seen == [[0] * B + [1] * B]  # one update on both roles, each sample labelled with its role
    assert len(seen) == 2  # one whitening per role, none over the whole batch
    assert team.describe()["algorithm"] == "cory_shared_per_role"  # told apart from cory_shared in runs and figures


# ------------------------------------------------------------------------------------------------ KL in the loss
def test_k3_kl_and_the_loss_with_the_kl_term_by_hand():
    logp, ref = torch.tensor([[math.log(0.5), math.log(0.2)]]), torch.tensor([[math.log(0.25), math.log(0.4)]])
    # k3 = exp(ref − logp) − (ref − logp) − 1: (0.5 − ln 0.5 − 1, 2 − ln 2 − 1)
    want = torch.tensor([[0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1]])
    torch.testing.assert_close(ppo_core.k3_kl(logp, ref), want)
    inputs = LossInputs(
        logprobs=logp,
        old_logprobs=logp,
        ref_logprobs=ref,
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.ones(1, 2),
        vpreds=None,
        old_values=torch.zeros(1, 2),
        returns=torch.zeros(1, 2),
        kl_coef=0.5,
    )
    plain, with_kl = ClippedPPO(0.2, 0.2, 0.1)(inputs), ClippedPPOKLInLoss(0.2, 0.2, 0.1)(inputs)
    assert ClippedPPO.kl_in_reward and not ClippedPPOKLInLoss.kl_in_reward
    torch.testing.assert_close(with_kl.total, plain.total + 0.5 * want.mean())  # ρ = 1: L_pg = −mean(A) = 0
    torch.testing.assert_close(with_kl.kl, want.mean())


def test_with_the_kl_in_the_loss_the_rewards_carry_no_penalty():
    team = make_cory(("algorithm=ppo", "algorithm/loss=ppo_kl_in_loss", "algorithm.agent.init_kl_coef=0.5"))
    out = team.step(0)
    assert out.metrics["ppo/llm1/mean_non_score_reward"] == 0.0  # no −β·kl_t in the token rewards
    assert out.metrics["ppo/llm1/kl_loss"] >= 0.0 and "ppo/llm1/value_loss" in out.metrics
    assert out.metrics["train/llm1/kl_coef"] == 0.5


# ------------------------------------------------------------------------------------------------ three-role chain
def test_each_role_of_the_chain_sees_the_answers_before_it_and_roles_rotate_over_three_agents():
    team, log = stub_team("algorithm=cory_chain3", "algorithm.schedule.period=1")
    out = team.step(0)
    acts = [(name, prompts) for kind, name, prompts, *_ in log if kind == "act"]
    assert [name for name, _ in acts] == ["llm1", "llm2", "llm3"]
    task = team.task
    assert acts[1][1] == [task.observer_prompt(q, f"llm1({q})") for q in QUERIES]
    # the second observer sees the pioneer's and the observer's answers, in role order, a blank line between them
    want = [task.observer_prompt(q, f"llm1({q})\n\nllm2({p})") for q, p in zip(QUERIES, acts[1][1])]
    assert acts[2][1] == want
    # collective reward: every role learns r1 + r2 + r3 = 0.5 + 1 + 1
    assert [entry[2] for entry in log if entry[0] == "update"] == [[2.5] * len(QUERIES)] * 3
    assert {"train/second_observer/task_reward", "train/second_observer/kl"} <= set(out.metrics)
    assert [team.roles(k)["pioneer"] for k in range(4)] == ["llm1", "llm2", "llm3", "llm1"]
    assert [team.step(k).metrics["cory/llm1_role"] for k in (1, 2, 3)] == [2.0, 1.0, 0.0]
    assert team.describe()["algorithm"] == "cory_chain3"


def test_a_chain_whose_later_roles_see_only_the_latest_answer_is_named_apart():
    """`sees=latest` changes what the second observer answers from: its runs must not share `cory_chain3`'s name in
    summaries, W&B and figures. With two roles, or without knowledge transfer, the two settings are one."""
    latest = stub_team("algorithm=cory_chain3", "algorithm.episode.sees=latest")[0]
    assert latest.describe()["algorithm"] == "cory_chain3_sees_latest"
    cfg = compose_cfg(["experiment=smoke", "algorithm=cory_chain3", "algorithm.episode.sees=latest"])
    assert figures.algorithm_name(OmegaConf.to_container(cfg, resolve=True)) == "cory_chain3_sees_latest"
    no_kt = ("algorithm=cory_chain3", "algorithm.episode.sees=latest", "algorithm.episode.knowledge_transfer=false")
    assert stub_team(*no_kt)[0].describe()["algorithm"] == "cory_chain3"
    assert stub_team("algorithm=cory", "algorithm.episode.sees=latest")[0].describe()["algorithm"] == "cory"


class TemplateTask:
    """A task with a visible observer template: `[q]` alone, `<q|answers>` with what a role sees."""

    generation_kwargs: dict = {}
    max_new_tokens = (1, 5)

    def pioneer_prompt(self, query: str) -> str:
        return f"[{query}]"

    def observer_prompt(self, query: str, pioneer_response: str) -> str:
        return f"<{query}|{pioneer_response}>"


class CountingActor:
    """Answers `<name><call>` (its `call`-th batch, counted from 1) whatever the prompt, and records the prompts."""

    def __init__(self, name: str) -> None:
        self.name, self.prompts = name, []

    def act(self, prompts, max_new_tokens, generation_kwargs, batch_size, for_update=False):
        self.prompts.append(list(prompts))
        return SimpleNamespace(responses=[f"{self.name}{len(self.prompts)}" for _ in prompts])


def chain(sees: str, roles=("pioneer", "observer", "second_observer"), joiner: str = " + ") -> Chain:
    return Chain(roles, knowledge_transfer=True, frozen_roles=(), name="chain", sees=sees, joiner=joiner)


def play(episode: Chain, queries=("q",)):
    actors = [CountingActor(n) for n in ("a", "b", "c")[: len(episode.roles)]]
    scorer = lambda queries, responses: ([float(len(r)) for r in responses], 0)  # noqa: E731
    played = episode.play(actors, TemplateTask(), scorer, list(queries), max_new_tokens=5, batch_size=1)
    return actors, played


@pytest.mark.parametrize(("sees", "third"), [("all", "<q|a1 + b1>"), ("latest", "<q|b1>")])
def test_the_third_role_sees_every_earlier_answer_or_the_latest_through_the_template(sees, third):
    actors, played = play(chain(sees))
    assert [a.prompts for a in actors] == [[["[q]"]], [["<q|a1>"]], [[third]]]
    assert [r.responses for r in played.rollouts] == [["a1"], ["b1"], ["c1"]]
    # two roles: the observer's prompt is CORY's either way
    assert play(chain(sees, roles=("pioneer", "observer")))[0][1].prompts == [["<q|a1>"]]


@pytest.mark.parametrize(("sees", "replayed"), [("all", "<q|b2>"), ("latest", "<q|b2>")])
def test_without_the_first_answer_later_roles_see_the_answers_still_there(sees, replayed):
    actors, played = play(chain(sees))
    assert played.without(0) == [None, [2.0], [2.0]]  # the observer and the second observer answered again
    assert actors[1].prompts[-1] == ["[q]"]  # the observer on the query alone
    assert actors[2].prompts[-1] == [replayed]  # the observer's new answer, not the removed a1
    actors, played = play(chain(sees))
    played.without(1)
    assert actors[2].prompts[-1] == ["<q|a1>"]  # the pioneer's answer is still there
    assert played.without(2) == [[2.0], [2.0], None] and played.replays == 1  # nothing follows the last role


def test_the_longest_prompt_holds_every_answer_a_role_can_see():
    task = TemplateTask()
    assert chain("all").longest_prompt(task, "q", 5) == ("<q| + >", 10)  # two empty answers joined, 2 × 5 tokens
    assert chain("latest").longest_prompt(task, "q", 5) == ("<q|>", 5)
    for sees in ("all", "latest"):
        assert chain(sees, roles=("pioneer", "observer")).longest_prompt(task, "q", 5) == ("<q|>", 5)
        assert chain(sees, roles=("pioneer",)).longest_prompt(task, "q", 5) is None
        alone = Chain(("actor1", "actor2", "actor3"), False, (), "team3", sees=sees)
        assert alone.longest_prompt(task, "q", 5) is None


@pytest.mark.parametrize(("sees", "needed"), [("latest", 5 + 5 + 5), ("all", 8 + 2 * 5 + 5)])
def test_the_context_check_counts_every_answer_the_last_role_sees(sees, needed):
    # one token a character: `<qq| + >` is 8 tokens, `<qq|>` 5; each answer up to 5 tokens, and the role's own
    actor = SimpleNamespace(context_length=lambda: needed, token_counts=lambda texts: [len(t) for t in texts])
    agents = SimpleNamespace(
        agents={"llm1": SimpleNamespace(actor=actor)},
        schedule=SimpleNamespace(queries=["q", "qq"]),
        final_queries=[],
        task=TemplateTask(),
    )
    episode = chain(sees)
    AgentSet._check_context(agents, episode.longest_prompt)  # fits exactly
    actor.context_length = lambda: needed - 1
    with pytest.raises(ConfigError) as err:
        AgentSet._check_context(agents, episode.longest_prompt)
    assert f"is {needed} tokens, more than the model's context of {needed - 1}" in str(err.value)


def test_an_unknown_sees_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        chain("everything")
    assert str(err.value) == "algorithm.episode.sees='everything': one of ['latest', 'all']"


def test_every_episode_file_builds_a_chain_and_only_the_chain_of_three_shows_every_answer():
    episodes = sorted(p.stem for p in (Path(CONF_DIR) / "algorithm" / "episode").glob("*.yaml"))
    assert {"single", "pioneer_observer", "chain3", "team3"} <= set(episodes)
    for name in episodes:
        built = instantiate(compose_cfg(["experiment=smoke", f"algorithm/episode={name}"]).algorithm.episode)
        assert isinstance(built, Chain) and built.joiner == "\n\n"
        assert built.sees == ("all" if name == "chain3" else "latest"), name


# ---------------------------------------------------------------------------------------------- counterfactual credit
def test_counterfactual_credit_by_hand():
    rewards = [[1.0, 0.0], [2.0, 5.0]]  # r1, r2 per sample
    replays = []

    def without(k):
        replays.append(k)
        return [None, [0.5, 4.0]] if k == 0 else [[1.0, 0.0], None]  # r2' = the observer without the pioneer

    got = Counterfactual()(rewards, without)
    assert got == [[1.0 + 2.0 - 0.5, 0.0 + 5.0 - 4.0], [2.0, 5.0]]  # R_P = r1 + r2 − r2', R_O = r2
    assert replays == [0, 1]
    assert Collective(1.0, 1.0)(rewards, lambda k: pytest.fail("no replay")) == [[3.0, 5.0], [3.0, 5.0]]


def test_the_pioneer_is_credited_with_what_its_answer_added_to_the_observers():
    team, log = stub_team("algorithm=cory_ccpo")
    out = team.step(0)
    acts = [(name, prompts) for kind, name, prompts, *_ in log if kind == "act"]
    # the episode, then the observer again on the query alone (the pioneer's message removed)
    assert [name for name, _ in acts] == ["llm1", "llm2", "llm2"]
    assert acts[2][1] == [team.task.pioneer_prompt(q) for q in QUERIES]
    updates = {name: scores for kind, name, scores, *_ in log if kind == "update"}
    # r1 = 0.5, r2 = 1 (it saw the pioneer), r2' = 0.25: R_P = 0.5 + 1 − 0.25, R_O = 1
    assert updates == {"llm1": [1.25] * len(QUERIES), "llm2": [1.0] * len(QUERIES)}
    assert out.metrics["train/counterfactual_replays"] == 1.0
    assert team.describe()["algorithm"] == "cory_counterfactual" and team.describe()["credit"] == "counterfactual"


def test_without_knowledge_transfer_no_answer_is_replayed():
    team, log = stub_team("algorithm=cory_ccpo", "algorithm.episode.knowledge_transfer=false")
    out = team.step(0)
    assert [name for kind, name, *_ in log if kind == "act"] == ["llm1", "llm2"]
    updates = {name: scores for kind, name, scores, *_ in log if kind == "update"}
    assert updates == {"llm1": [0.5] * len(QUERIES), "llm2": [0.25] * len(QUERIES)}  # each its own r
    assert "train/counterfactual_replays" not in out.metrics


# ------------------------------------------------------------------------------------------------ sequential updates
def test_sequential_updates_each_agent_on_a_fresh_episode_within_its_budget():
    team, log = stub_team("algorithm=cory_teamtr", "algorithm.schedule.kl_budget=0.05")
    out = team.step(0)
    kinds = [(kind, name) for kind, name, *_ in log]
    assert kinds == [
        ("act", "llm1"),
        ("act", "llm2"),
        ("update", "llm1"),  # the pioneer's agent first, on the first episode
        ("act", "llm1"),
        ("act", "llm2"),
        ("update", "llm2"),  # the observer's on a fresh episode played with the updated pioneer
    ]
    assert {entry[3] for entry in log if entry[0] == "update"} == {0.05}  # the budget reaches each update
    assert out.metrics["schedule/llm1/updates"] == out.metrics["schedule/llm2/updates"] == 1.0
    assert all(team.roles(k) == {"pioneer": "llm1", "observer": "llm2"} for k in range(3))


def test_a_tight_kl_budget_stops_the_epochs_of_real_agents():
    team = make_cory(("algorithm=cory_teamtr", "algorithm.schedule.kl_budget=1e-9", "algorithm.agent.ppo_epochs=3"))
    out = team.step(0)
    assert out.metrics["ppo/llm1/early_stopped"] == out.metrics["ppo/llm2/early_stopped"] == 1.0
    loose = make_cory(("algorithm=cory_teamtr", "algorithm.schedule.kl_budget=1e9", "algorithm.agent.ppo_epochs=3"))
    assert loose.step(0).metrics["ppo/llm1/early_stopped"] == 0.0


# ------------------------------------------------------------------------------------------------ MAPPO-style team
def test_three_actors_answer_alone_and_one_critic_reads_all_three():
    team, log = stub_team("algorithm=ppo", "algorithm/episode=team3")
    team.step(0)
    assert [prompts for kind, _, prompts, *_ in log if kind == "act"] == [list(QUERIES)] * 3  # no one sees another
    real = make_cory(("algorithm=mappo3",))
    agents, critic = real.agents, real.critic
    heads = {a: agent.trainee.policy.v_head.summary.weight.detach().clone() for a, agent in agents.items()}
    before = critic.trainee.policy.v_head.summary.weight.detach().clone()
    out = real.step(0)
    assert set(agents) == {"llm1", "llm2", "llm3"}
    for a, agent in agents.items():  # the actors' value heads are untouched: the critic gives the values
        assert torch.equal(heads[a], agent.trainee.policy.v_head.summary.weight)
        assert f"ppo/{a}/value_loss" in out.metrics and f"ppo/{a}/explained_variance" in out.metrics
    assert not torch.equal(before, critic.trainee.policy.v_head.summary.weight)
    assert real.describe()["algorithm"] == "team3_cc" and real.describe()["critic"] == "centralized"


# --------------------------------------------------------------------------------------------- through the entry point
@pytest.mark.slow
# The chain of three (three agents, three roles) in `make test`; the others, 11-15 s each, in `make test-long` (CI too)
@pytest.mark.parametrize(
    "algorithm",
    [pytest.param(a, marks=pytest.mark.long) for a in ("cory_ccpo", "mappo3", "cory_teamtr")] + ["cory_chain3"],
)
def test_a_resumed_run_of_each_new_method_equals_an_uninterrupted_one(tmp_path, algorithm):
    args = (f"algorithm={algorithm}", "eval_every=2", "num_eval=4", "save_every=2")
    start_run(tmp_path, tmp_path / "whole", *args, "iterations=4")
    start_run(tmp_path, tmp_path / "part", *args, "iterations=2")
    resume_run(tmp_path / "part", "iterations=4")
    assert_same_rows(read_rows(tmp_path / "part"), read_rows(tmp_path / "whole"))


def test_every_new_method_is_a_config_of_the_family_sweep():
    cfg = compose_cfg(["experiment=gsm8k_cpu", "sweep=family_parts"], return_hydra_config=True)
    methods = set(str(cfg.hydra.sweeper.params.algorithm).split(","))
    assert {"cory_ccpo", "cory_chain3", "mappo3", "cory_teamtr"} <= methods


# The members of the family whose SIGKILL resume no other test covers (PPO, CORY: test_robustness.py; LoRA CORY:
# test_lora.py; MAFT: test_maft.py).
FAMILY = (
    ("algorithm=grpo",),
    ("algorithm=cory_cc",),
    ("algorithm=cory_interleaved", "algorithm.schedule.period=1"),
    ("algorithm=cory_shared",),
    ("algorithm=cory_lora_roles", "model.lora.enabled=true"),
    ("algorithm=cory_ccpo",),
    ("algorithm=cory_chain3", "algorithm.schedule.period=1"),
    ("algorithm=mappo3",),
    ("algorithm=cory_teamtr",),
)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("overrides", FAMILY, ids=[o[0].removeprefix("algorithm=") for o in FAMILY])
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, overrides):
    """Killed with SIGKILL after its iteration-2 checkpoint, mid-run: the resumed run logs what an uninterrupted one
    logs, every iteration and evaluation."""
    args = (*overrides, "iterations=5", "save_every=2", "eval_every=2", "num_eval=4")
    start_run(tmp_path, tmp_path / "whole", *args)
    run_dir = tmp_path / "killed"
    proc = start(run_dir, list(args))
    try:
        wait_for_train_row(run_dir, proc, 3)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    resume(run_dir)
    assert_same_rows(read_rows(run_dir), read_rows(tmp_path / "whole"))
