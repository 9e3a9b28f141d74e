"""Tests that pin the meaning of the method, not only its mechanics (docs/method.md §1, §6).

Each check below is a plain function that raises `AssertionError` when the behaviour is wrong. It runs on the
real code, where it must pass, and on every wrong version listed with it in `WRONG_VERSIONS`, where it must fail
with its own message. A wrong version is a monkeypatch or a one-line source mutation of the real function
(`mutated`); if the real code changes so that a mutation no longer applies, that test errors instead of passing
silently, and the wrong version must be rewritten for the new code.

The task rewards the query as well as the response (the toy task with the `echo` reward part), so scoring a response
on the wrong prompt changes the number: the toy task's vowel reward ignores the query and would hide that mistake.
Run: `pytest tests/test_meaning.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations
import __future__

import inspect
import json
import random
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.compose import compose_cfg
from helpers.cory_setup import QUERIES, make_cory
from helpers.from_config import learner, task_kwargs
from helpers.runners import smoke

import cory.algorithms.team
import cory.ppo.backends
import cory.ppo.evaluation
import cory.ppo.learner
import cory.ppo.metrics
from cory.algorithms.agents import AgentSet
from cory.algorithms.credit import Collective
from cory.algorithms.episodes import Chain
from cory.algorithms.team import TEAM_METRICS, Team, role_metrics
from cory.metrics import AGENT_PLACEHOLDER, ROLES, RUN_METRICS, is_known_metric
from cory.models import build_tiny_gpt2, make_reference
from cory.ppo.actor import Actor
from cory.ppo.learner import Batch, PPOLearner, agent_on
from cory.tasks.toy import CharacterShare, ToyTask
from cory.train import train

MAX_NEW = 4
Check = Callable[[Path], None]


def echo(texts: list[str]) -> list[float]:
    """The toy task's reward part, read on q + a (`scored="query_response"`): len(q + a)/10 + share of vowels in
    q + a. Like a real task's reward, it depends on the query."""
    return [len(t) / 10 + v for t, v in zip(texts, CharacterShare("aeiou")(texts), strict=True)]


def mutated(func: Callable, *edits: tuple[str, str]) -> Callable:
    """`func` recompiled from its own source with each `(old, new)` edit applied; `old` must occur exactly once."""
    source = textwrap.dedent(inspect.getsource(func))
    for old, new in edits:
        if source.count(old) != 1:  # not an AssertionError: a stale wrong version must not pass as "caught"
            raise LookupError(f"{func.__qualname__} no longer contains {old!r} once: rewrite this wrong version")
        source = source.replace(old, new)
    flags = __future__.annotations.compiler_flag
    code = compile(source, inspect.getsourcefile(func), "exec", flags=flags, dont_inherit=True)
    namespace: dict = {}
    exec(code, func.__globals__, namespace)
    return namespace[func.__name__]


def one_cory_step(*overrides: str) -> SimpleNamespace:
    """One CORY iteration with real tiny agents on the toy task scored by `echo`: every act (agent, prompts,
    rollout) and learn (agent, scores), and the step output whose sample rows cover the whole batch."""
    calls = SimpleNamespace(act=[], learn=[])
    act, update = Actor.act, PPOLearner.update

    def act_spy(self, prompts, *args, **kwargs):
        rollout = act(self, prompts, *args, **kwargs)
        calls.act.append((self.trainee.name, list(prompts), rollout))
        return rollout

    def update_spy(self, batch):
        calls.learn.append((self.trainee.name, batch.scores.clone()))
        return update(self, batch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Actor, "act", act_spy)
        mp.setattr(PPOLearner, "update", update_spy)
        algorithm = make_cory(overrides, reward=echo, scored="query_response")
        torch.manual_seed(0)
        calls.out = algorithm.step(0)
    calls.task = algorithm.task
    return calls


# ------------------------------------------------------------------------------------------------------ checks
def check_rewards_are_scored_on_the_query(tmp: Path) -> None:
    """r1 = r(q, a1) and r2 = r(q, a2): each response is scored after the original query, never after the
    observer's long prompt and never with the other agent's answer (docs/method.md §1.2 step 5, Alg. 1 l.13)."""
    step = one_cory_step()
    (_, _, pio), (_, _, obs) = step.act
    r1, r2 = step.task.score(QUERIES, pio.responses), step.task.score(QUERIES, obs.responses)
    rows = step.out.samples
    assert [row["pioneer_reward"] for row in rows] == r1, "pioneer reward is not r(q, a1)"
    assert [row["observer_reward"] for row in rows] == r2, "observer reward is not r(q, a2)"
    for agent_id, role, r in (("llm1", "pioneer", r1), ("llm2", "observer", r2)):
        logged = step.out.metrics[f"train/{agent_id}/task_reward"]
        assert logged == pytest.approx(np.mean(r)), f"logged {role} reward is not r(q, a)"


def check_observer_sees_the_pioneers_answer(tmp: Path) -> None:
    """With knowledge transfer the observer's prompt is T_obs(q, a1), holding the pioneer's decoded answer."""
    step = one_cory_step("algorithm.episode.knowledge_transfer=true")
    (_, pio_prompts, pio), (obs_id, obs_prompts, _) = step.act
    assert obs_id == "llm2" and pio_prompts == QUERIES
    expected = [step.task.observer_prompt(q, a1) for q, a1 in zip(QUERIES, pio.responses, strict=True)]
    assert all(a1 for a1 in pio.responses)  # every answer has text, so leaving it out is visible
    assert obs_prompts == expected, "the observer did not see the pioneer's answer"


def check_both_agents_learn_the_collective_reward(tmp: Path) -> None:
    """R = r1 + r2 per sample reaches both PPO updates (paper Eq. 4, weights 1 and 1)."""
    step = one_cory_step("algorithm.credit.w_self=1.0", "algorithm.credit.w_other=1.0")
    (_, _, pio), (_, _, obs) = step.act
    r1 = torch.tensor(step.task.score(QUERIES, pio.responses))
    r2 = torch.tensor(step.task.score(QUERIES, obs.responses))
    assert not torch.allclose(r1, r2)  # own reward and collective reward can be told apart
    for name, scores in step.learn:
        assert torch.allclose(scores, r1 + r2), f"{name} did not learn on the collective reward r1 + r2"


def check_evaluation_samples_in_eval_mode(tmp: Path) -> None:
    """Held-out evaluation samples with dropout off, even where training reproduces TRL's train-mode sampling
    (`generate_in_train_mode=true`, official_code): before and after differ by the policy alone (§1.6)."""
    model, tokenizer = build_tiny_gpt2(seed=0)  # GPT-2 with dropout 0.1, as the real one
    config = learner(("experiment=official_code",), mini_batch_size=4, ppo_epochs=1)
    assert config.generate_in_train_mode
    agent = agent_on("llm1", model, make_reference(model), tokenizer, config, seed=0)
    task = ToyTask(tokenizer, reward=echo, **task_kwargs("toy", scored="query_response"))
    queries, lengths = task.eval_queries()[:8], [6] * 8
    rollout = agent.actor.act(queries[:4], 6, task.generation_kwargs, 4)
    agent.learner.update(Batch(rollout, torch.ones(4)))  # TRL: train mode from now

    modes: list[bool] = []
    generate = cory.ppo.backends.generate_ids  # what the default backend (Hugging Face) samples with

    def generate_spy(model, *args, **kwargs):
        modes.append(model.training)
        return generate(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cory.ppo.backends, "generate_ids", generate_spy)
        torch.manual_seed(0)
        agent.actor.act(queries, 6, task.generation_kwargs, 8)
        assert modes == [True]  # the training-time quirk is live on this agent...
        modes.clear()
        metrics, samples = cory.ppo.evaluation.evaluate(agent.actor, task, queries, lengths, 8, seed=0)
    assert modes == [False], "evaluation sampled with dropout on"
    # ... and evaluation gives exactly what an agent without the quirk gives
    agent.actor.generate_in_train_mode = False
    plain_metrics, plain_samples = cory.ppo.evaluation.evaluate(agent.actor, task, queries, lengths, 8, seed=0)
    assert (metrics, samples) == (plain_metrics, plain_samples), "evaluation sampled with dropout on"


FAITHFUL = ("algorithm=cory", "algorithm.schedule.faithful_official_swap=true", "algorithm.schedule.period=2")


def check_faithful_swap_restarts_rng_streams_and_length_draws(tmp: Path) -> None:
    """The official disk swap reseeds python, numpy and torch with the config seed and restarts each agent's
    permutation stream and the per-iteration length draws (docs/method.md §1.5, item 4): with a swap every 2
    iterations, iterations 2 and 4 start from identical random states, and the lengths repeat with period 2."""
    seen: dict[int, dict] = {}
    step = Team.step

    def step_spy(self, iteration):
        seen[iteration] = {
            "max_new_tokens": self.team.schedule.max_new_tokens(iteration),
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state()[1].copy(),
            "python": random.getstate(),
            "agents": {k: a.trainee.rng.get_state()[1].copy() for k, a in self.agents.items()},
            "fresh": {k: np.random.RandomState(a.trainee.seed).get_state()[1] for k, a in self.agents.items()},
        }
        return step(self, iteration)

    overrides = (*FAITHFUL, "iterations=5", "batch_size=4", "num_eval=2", "eval_every=0", "save_every=0")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Team, "step", step_spy)
        train(smoke(tmp, *overrides, "algorithm.agent.mini_batch_size=4", "task.max_new_tokens=[2,12]"), tmp / "run")
    lengths = [seen[k]["max_new_tokens"] for k in range(5)]
    assert lengths[2:] == lengths[:3], f"length draws did not restart at the swaps: {lengths}"
    a, b = seen[2], seen[4]
    assert torch.equal(a["torch"], b["torch"]), "torch RNG not reseeded at the swap"
    assert np.array_equal(a["numpy"], b["numpy"]) and a["python"] == b["python"], "global RNGs not reseeded"
    for k in a["agents"]:
        for state in (a["agents"][k], b["agents"][k]):
            assert np.array_equal(state, a["fresh"][k]), f"{k}'s permutation stream not restarted at the swap"
    assert not torch.equal(seen[3]["torch"], a["torch"])  # the streams do move between swaps


# The runs whose logs the metric checks read: two smoke iterations with every optional statistic switched on. A
# metric that only some task or option emits needs a run here that emits it.
METRIC_RUNS = (
    {
        algorithm: (
            f"algorithm={algorithm}",
            "iterations=2",
            "eval_every=0",
            "save_every=0",
            "num_eval=4",
            "algorithm.agent.use_score_scaling=true",
            "algorithm.agent.early_stopping=true",
        )
        for algorithm in ("ppo", "cory")
    }
    | {
        # a reasoning task logs what only it defines (the held-out no-number rate)
        "arithmetic": ("experiment=gsm8k_smoke", "iterations=1", "eval_every=0", "save_every=0", "num_eval=2"),
    }
    | {
        # the learners and CORY variants that log names of their own (group statistics, schedules, the critic)
        algorithm: (f"algorithm={algorithm}", "iterations=2", "eval_every=0", "save_every=0", "num_eval=4")
        for algorithm in ("grpo", "cory_cc", "cory_interleaved", "cory_shared", "cory_ccpo", "cory_chain3", "mappo3")
    }
    | {"kl_in_loss": ("algorithm/loss=ppo_kl_in_loss", "iterations=2", "eval_every=0", "save_every=0", "num_eval=4")}
)


def catalogue() -> dict[str, str]:
    """Every name PPO and CORY runs may log: the trainer's, the PPO learner's and the team's catalogues."""
    return RUN_METRICS | cory.ppo.metrics.PPO_METRICS | TEAM_METRICS | role_metrics(ROLES)


_LOGGED: dict[tuple[str, object], frozenset[str]] = {}


def logged_names(tmp: Path, run: str) -> frozenset[str]:
    """Every metric name in metrics.jsonl of the `METRIC_RUNS[run]` smoke run. Each run once per test session for
    the metrics code the team calls: a wrong version that patches it gets runs of its own."""
    key = (run, cory.algorithms.team.agent_metrics)
    if key not in _LOGGED:
        _LOGGED[key] = _run_names(tmp, run)
    return _LOGGED[key]


def _run_names(tmp: Path, run: str) -> frozenset[str]:
    overrides = METRIC_RUNS[run]
    if any(o.startswith("experiment=") for o in overrides):  # its own tiny experiment instead of the smoke one
        cfg = compose_cfg(["progress=false", f"cache_dir={tmp / 'cache'}", *overrides])
    else:
        cfg = smoke(tmp, *overrides)
    train(cfg, tmp / run)
    rows = [json.loads(line) for line in (tmp / run / "metrics.jsonl").read_text().splitlines()]
    return frozenset(k for row in rows for k in row if k != "iteration")


def check_every_emitted_metric_is_defined(tmp: Path) -> None:
    """Every name a run logs has a definition in the metric table (`METRICS`, the README table)."""
    for run in METRIC_RUNS:
        undefined = sorted(n for n in logged_names(tmp, run) if not is_known_metric(n, catalogue()))
        assert not undefined, f"{run} emits metrics the table does not define: {undefined}"


def check_every_defined_metric_is_emitted(tmp: Path) -> None:
    """No definition in the table is dead: the runs together emit every one of them."""
    names = set().union(*(logged_names(tmp, run) for run in METRIC_RUNS))
    dead = [p for p in catalogue() if not any(_matches(n, p) for n in names)]
    assert not dead, f"the metric table defines names no run emits: {dead}"


def _matches(name: str, pattern: str) -> bool:
    parts, want = name.split("/"), pattern.split("/")
    return len(parts) == len(want) and all(w in (p, AGENT_PLACEHOLDER) for p, w in zip(parts, want))


def check_logged_statistics_follow_their_definitions(tmp: Path) -> None:
    """`agent_metrics` computes what the table says: KL_seq/T per response then the batch mean, the combined
    reward with the task's fixed η_eval (not the current β), the mean response length (docs/method.md §6)."""
    kls = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # KL_seq = 2 with T = 1, KL_seq = 3 with T = 3
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    rollout = SimpleNamespace(kls=kls, response_mask=mask, prompt_mask=torch.ones(2, 2), hit_max_tokens=mask[:, 2])
    stats = {"kl_coef": 0.05, "scaled_score": 0.25}
    m = cory.ppo.metrics.agent_metrics("llm1", rollout, [1.0, 0.0], [1.5, 0.5], stats, eval_kl_coef=0.3)
    assert m["train/llm1/kl"] == pytest.approx((2 + 3) / 2)
    assert m["train/llm1/kl_per_token"] == pytest.approx((2 / 1 + 3 / 3) / 2), "kl_per_token is not mean(KL/T)"
    assert m["train/llm1/combined_reward"] == pytest.approx(((1 - 0.3 * 2) + (0 - 0.3 * 3)) / 2), "η_eval"
    assert m["train/llm1/combined_reward_current_beta"] == pytest.approx(((1 - 0.05 * 2) + (0 - 0.05 * 3)) / 2)
    assert m["train/llm1/response_length"] == 2.0 and m["train/llm1/hit_max_tokens"] == 0.5
    assert m["train/llm1/collective_reward"] == 1.0 and m["train/llm1/scaled_collective_reward"] == 0.25


# ------------------------------------------------------------------------------------------------ wrong versions
def _patch_team_step(*edits: tuple[str, str]):
    return lambda mp: mp.setattr(Team, "step", mutated(Team.step, *edits))


def _patch(cls: type, method: str, *edits: tuple[str, str]):
    """`cls.method` (a part's code: the episode's play and prompt, the credit rule) with `edits`."""
    return lambda mp: mp.setattr(cls, method, mutated(getattr(cls, method), *edits))


def _patch_reset(old: str, new: str):
    return lambda mp: mp.setattr(AgentSet, "reset", mutated(AgentSet.reset, (old, new)))


def _extra_metric(mp: pytest.MonkeyPatch) -> None:
    real = cory.ppo.metrics.agent_metrics

    def with_extra(agent_id, *args, **kwargs):
        return real(agent_id, *args, **kwargs) | {f"train/{agent_id}/kl_token_weighted": 0.0}

    mp.setattr(cory.algorithms.team, "agent_metrics", with_extra)


def _stat(old: str, new: str):
    return lambda mp: mp.setattr(
        cory.ppo.metrics, "agent_metrics", mutated(cory.ppo.metrics.agent_metrics, (old, new))
    )


SCORE = "r, failed = scorer(queries, rollout.responses)"
OWN = ("self.w_other * b for a, b", "0 * b for a, b")  # R_k = r_k for every role
OWN_OBS = ("self.w_other * b for a, b", "(self.w_other if k == 0 else 0) * b for a, b")  # R_O = r2
# check → {wrong version: how to install it}
WRONG_VERSIONS: dict[Check, dict[str, Callable[[pytest.MonkeyPatch], None]]] = {
    check_rewards_are_scored_on_the_query: {
        "observer scored on its own prompt": _patch(
            Chain, "play", (SCORE, SCORE.replace("queries", "rollout.prompts"))
        ),
        "observer scored with the pioneer's answer (Alg. 1 l.13 typo)": _patch(
            Chain, "play", (SCORE, SCORE.replace("rollout.responses", "rollouts[0].responses"))
        ),
    },
    check_observer_sees_the_pioneers_answer: {
        "observer prompt without a1 under KT": _patch(
            Chain, "prompt", ("if self.knowledge_transfer else []", "if False else []")
        ),
        "observer prompt with an empty a1": _patch(
            Chain, "prompt", ('self.joiner.join(shown) if self.sees == "all" else shown[-1]', '""')
        ),
    },
    check_both_agents_learn_the_collective_reward: {
        "each agent rewarded with its own r only": _patch(Collective, "__call__", OWN),
        "observer rewarded with its own r only": _patch(Collective, "__call__", OWN_OBS),
    },
    check_evaluation_samples_in_eval_mode: {
        "evaluate() samples like training": lambda mp: mp.setattr(
            cory.ppo.evaluation,
            "evaluate",
            mutated(cory.ppo.evaluation.evaluate, ("evaluation=True", "evaluation=False")),
        ),
        "act() ignores evaluation=True": lambda mp: mp.setattr(
            Actor, "act", mutated(Actor.act, (" and not evaluation", ""))
        ),
    },
    check_faithful_swap_restarts_rng_streams_and_length_draws: {
        "no reseed requested at the swap": _patch_team_step(("self.team.reset(k + 1)", "pass")),
        "global RNGs not reseeded": _patch_reset("runtime.seed_everything(self.seed)", "pass"),
        "agent streams not restarted": _patch_reset("agent.reset(reseed=True)", "agent.reset(reseed=False)"),
        "length draws not restarted": _patch_reset("self.schedule.reseed_at = at", "pass"),
    },
    check_every_emitted_metric_is_defined: {"an undefined metric emitted": _extra_metric},
    check_every_defined_metric_is_emitted: {
        "a definition nothing emits": lambda mp: mp.setitem(
            cory.ppo.metrics.PPO_METRICS, "train/<agent>/unused", "never"
        )
    },
    check_logged_statistics_follow_their_definitions: {
        "kl_per_token as a token-weighted mean": _stat("(kl_seq / lengths).mean()", "kl_seq.sum() / lengths.sum()"),
        "combined reward with the current β": _stat("(r - eval_kl_coef * kl_seq)", "(r - beta * kl_seq)"),
    },
}
MESSAGES = {  # the assertion each wrong version must trip (not just any assertion)
    check_rewards_are_scored_on_the_query: "reward is not r",
    check_observer_sees_the_pioneers_answer: "did not see the pioneer's answer",
    check_both_agents_learn_the_collective_reward: "did not learn on the collective reward",
    check_evaluation_samples_in_eval_mode: "sampled with dropout on",
    check_faithful_swap_restarts_rng_streams_and_length_draws: "at the swap",
    check_every_emitted_metric_is_defined: "does not define",
    check_every_defined_metric_is_emitted: "no run emits",
    check_logged_statistics_follow_their_definitions: "kl_per_token|η_eval",
}
CASES = [(check, name) for check, wrong in WRONG_VERSIONS.items() for name in wrong]


@pytest.mark.parametrize("check", list(WRONG_VERSIONS), ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_real_code_means_what_the_method_says(check: Check, tmp_path: Path) -> None:
    check(tmp_path)


@pytest.mark.parametrize(
    ("check", "wrong"), CASES, ids=[f"{c.__name__.removeprefix('check_')}: {n}" for c, n in CASES]
)
def test_each_wrong_version_fails_its_check(check: Check, wrong: str, tmp_path: Path, monkeypatch) -> None:
    WRONG_VERSIONS[check][wrong](monkeypatch)
    with pytest.raises(AssertionError, match=MESSAGES[check]):
        check(tmp_path)
