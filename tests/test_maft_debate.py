"""Multiagent Finetuning without a model: the debate's prompts, the vote, the per-agent data and the metrics
(`cory/maft/debate.py`, `cory/maft/metrics.py`, `cory/algorithms/maft.py` driven by a scripted agent pool and a run
context without a model).
Run: `pytest tests/test_maft_debate.py` (a few seconds)."""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import partial

import numpy as np
import pytest
import torch
from helpers.maft_fakes import Problems, fake_context, maft_cfg, no_model, scripted_agent_models
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import save_file

from cory.errors import ConfigError
from cory.maft.debate import DebateRecord, critic_data, generation_data, majority_vote, mix, pick_others
from cory.maft.metrics import (
    consensus,
    debate_metrics,
    disagreement,
    is_maft_metric,
    mean_and_se,
    pairwise_dissimilarity,
)
from cory.maft.outcomes import read_outcomes
from cory.tasks.problems import Problem

PROBLEMS = [Problem("What is the result of 2+3?", "5"), Problem("What is the result of 4+4?", "8")]


def tagged_answer(name: str | None, chat: list[dict]) -> str:
    """A response that names who wrote it, for which problem and in which round: 'gen1@p0#r1 ... \\boxed{5}'.

    Generation agent a is wrong on problem p when a + p is even (gen1 and gen3 on the first problem, gen2 on the
    second); critics are always right, so every critic has one corrected and one kept conversation."""
    problem = 0 if "2+3" in chat[0]["content"] else 1
    if name is None:
        return f"summary@p{problem}"
    rounds = sum(m["role"] == "user" for m in chat)
    wrong = name.startswith("gen") and (int(name[-1]) - 1 + problem) % 2 == 0
    return f"{name}@p{problem}#r{rounds} so \\boxed{{{0 if wrong else PROBLEMS[problem].answer}}}"


def make_maft(tmp_path, answer, overrides: list[str] | None = None, load_model=lambda: (None, None)):
    """MAFT as the entry point builds it (`algorithm` node + context), its agents a `ScriptedPool`."""
    cfg = maft_cfg(tmp_path, ["algorithm.num_agents=3", *(overrides or [])])
    node = OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k != "agent_models"])
    context = fake_context(tmp_path, Problems(PROBLEMS), load_model=load_model)
    return instantiate(node, _convert_="all")(agent_models=scripted_agent_models(answer), context=context)


@pytest.mark.parametrize("summarize", [False, True])
def test_round_two_shows_the_other_agents_answers_and_the_own_answer_once(tmp_path, summarize):
    maft = make_maft(tmp_path, tagged_answer, [f"algorithm.summarize={str(summarize).lower()}"])
    records = maft.debate(PROBLEMS, "eval", 0)
    for p, record in enumerate(records):
        for a in range(3):
            chat = record.chat(a, rounds=2)
            assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
            assert chat[0]["content"].endswith(PROBLEMS[p].question) and "\\boxed{}" in chat[0]["content"]
            assert chat[1]["content"].startswith(f"gen{a + 1}@p{p}#r1")  # its own round-1 answer, once
            assert chat[3]["content"].startswith(f"critic{a + 1}@p{p}#r2")
            assert f"gen{a + 1}@" not in chat[2]["content"]  # ... and not a second time in the user turn
            if summarize:
                assert f"summary@p{p}" in chat[2]["content"]
            else:
                others = {f"gen{b + 1}@p{p}#r1" for b in range(3) if b != a}
                assert set(re.findall(r"gen\d@p\d#r1", chat[2]["content"])) == others
    if summarize:  # the base model (name None) summarised exactly the other agents' round-1 answers
        requests = [chats for name, chats in maft.pool.calls if name is None][0]
        assert len(requests) == len(PROBLEMS) * 3
        for i, request in enumerate(requests):
            p, a = divmod(i, 3)
            shown = set(re.findall(r"gen\d@p\d#r1", request[0]["content"]))
            assert shown == {f"gen{b + 1}@p{p}#r1" for b in range(3) if b != a}
    assert {name for name, _ in maft.pool.calls} == {"gen1", "gen2", "gen3", "critic1", "critic2", "critic3"} | (
        {None} if summarize else set()
    )


def test_without_summary_at_most_max_others_shuffled_with_the_seed():
    responses = [f"answer {i}" for i in range(8)]
    picks = [tuple(pick_others(responses, 2, np.random.default_rng(s), 5)) for s in range(20)]
    assert all(len(p) == 5 and "answer 2" not in p for p in picks)
    assert len(set(picks)) > 10  # shuffled and subsampled differently per seed
    assert picks[3] == tuple(pick_others(responses, 2, np.random.default_rng(3), 5))  # and reproducibly


def test_vote_on_hand_made_cases():
    rng = np.random.default_rng(0)
    assert majority_vote(["5", "5", "7"], rng) == "5"
    assert majority_vote([None, "7", None], rng) == "7"  # no answer is no vote for anything
    assert majority_vote([None, None, None], rng) is None  # no number at all: no vote
    assert majority_vote(["-3", "4", "-3", "4", "4"], rng) == "4"


def test_vote_ties_are_broken_by_the_seed_not_by_order_or_string_order():
    tie = ["10", "9", None]
    picks = [majority_vote(tie, np.random.default_rng(s)) for s in range(200)]
    assert 60 < Counter(picks)["9"] < 140  # both tied answers win about half the time ("10" < "9" as strings)
    for s in range(20):  # the same seed picks the same answer whatever the agents' order
        assert majority_vote(["10", "9", None], np.random.default_rng(s)) == majority_vote(
            [None, "9", "10"], np.random.default_rng(s)
        )


def record(truth: str, round1: list[str], round2: list[str]) -> DebateRecord:
    r = DebateRecord("q", truth)
    r.add_round(["solve"] * len(round1), [f"a{i} \\boxed{{{x}}}" for i, x in enumerate(round1)])
    r.add_round(["update"] * len(round2), [f"c{i} \\boxed{{{x}}}" for i, x in enumerate(round2)])
    return r


def test_generation_and_critic_data_keep_only_the_agents_own_agreeing_answers():
    records = [
        record("5", ["5", "4", "5"], ["5", "5", "5"]),  # agent 1 corrected itself; 0 and 2 kept
        record("8", ["8", "9", "1"], ["8", "9", "8"]),  # agent 2 corrected; agent 1 stayed wrong
        record("3", ["2", "2", "2"], ["2", "2", "3"]),  # vote 2 (wrong): agreeing with the vote is what counts
    ]
    labels = ["5", "8", "2"]
    for a in range(3):
        gen = generation_data(records, labels, a)
        assert all(len(chat) == 2 and chat[1]["content"].startswith(f"a{a} ") for chat in gen)
    assert len(generation_data(records, labels, 0)) == 3 and len(generation_data(records, labels, 1)) == 1
    critic = critic_data(records, labels, 1, w=1.0, rng=np.random.default_rng(0))
    assert (critic.corrected, critic.kept) == (1, 1)  # problem 0 corrected; problem 2 kept; problem 1 disagrees
    assert [m["content"][:3] for m in critic.chats[0] if m["role"] == "assistant"] == ["a1 ", "c1 "]
    critic2 = critic_data(records, labels, 2, w=0.5, rng=np.random.default_rng(0))
    assert (critic2.corrected, critic2.kept, len(critic2.chats)) == (1, 1, 2)
    truth = [r.truth for r in records]  # filter=ground_truth: problem 2 now counts for agent 2 only
    assert (
        len(generation_data(records, truth, 0)) == 2
        and len(critic_data(records, truth, 2, 1.0, np.random.default_rng(0)).chats) == 2
    )


@pytest.mark.parametrize(
    ("corrected", "kept", "w", "expected"),
    [(2, 10, 2 / 3, (2, 1)), (10, 2, 2 / 3, (10, 2)), (3, 3, 0.5, (3, 3)), (0, 5, 0.67, (0, 0)), (4, 0, 0.67, (4, 0))],
)
def test_critic_mix_keeps_every_correction_and_caps_the_kept_ones_at_the_ratio(corrected, kept, w, expected):
    minus = [[{"role": "assistant", "content": f"-{i}"}] for i in range(corrected)]
    plus = [[{"role": "assistant", "content": f"+{i}"}] for i in range(kept)]
    mixed = mix(minus, plus, w, np.random.default_rng(0))
    signs = Counter(chat[0]["content"][0] for chat in mixed)
    assert (signs["-"], signs["+"]) == expected
    assert mixed == mix(minus, plus, w, np.random.default_rng(0))  # seeded


def test_each_agent_is_finetuned_on_its_own_responses_only(tmp_path):
    maft = make_maft(tmp_path, tagged_answer)
    metrics = maft.finetune_round(1, PROBLEMS)
    assert set(maft.pool.finetuned) == {"gen1", "gen2", "gen3", "critic1", "critic2", "critic3"}
    for name, chats in maft.pool.finetuned.items():
        assert chats, name
        a = int(name[-1])
        for chat in chats:
            own = [f"gen{a}@", f"critic{a}@"][: len(chat) // 2]
            assert [m["content"][: len(o)] for m, o in zip(chat[1::2], own)] == own
    assert metrics["maft/data/gen1/examples"] == 1 and metrics["maft/data/critic1/kept"] == 1
    assert metrics["maft/data/critic1/corrected"] == 1 and metrics["maft/data/critic1/examples"] == 1  # w = 0.67
    assert metrics["maft/train/accuracy"] == 1.0 and metrics["maft/sft/gen1/loss"] == 1.0
    assert (tmp_path / "rounds" / "1" / "data" / "critic2.jsonl").exists()


@pytest.mark.parametrize("start", ["previous", "base"])
def test_each_round_starts_from_the_previous_weights_or_from_the_base(tmp_path, start):
    maft = make_maft(tmp_path, tagged_answer, [f"algorithm.finetune_from={start}"])
    maft.finetune_round(1, PROBLEMS)
    assert maft.pool.resets == ([] if start == "previous" else list(maft.pool.finetuned))


def test_single_agent_ft_trains_one_shared_model_on_everyones_data(tmp_path):
    maft = make_maft(tmp_path, tagged_answer, ["algorithm.single_agent_ft=true"])
    maft.finetune_round(1, PROBLEMS)
    assert set(maft.pool.finetuned) == {"shared"} and len(maft.pool.finetuned["shared"]) == 6
    assert {name for name, _ in maft.pool.calls} == {"shared", None}  # it plays every role; the base summarises


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.filter=votes", r"^algorithm\.filter='votes': allowed vote, ground_truth$"),
        ("algorithm.critic_mix_w=0", r"^algorithm\.critic_mix_w=0: must lie in \(0, 1\]$"),
        ("algorithm.num_agents=1", r"^algorithm\.debate_rounds > 1 needs num_agents >= 2"),
        ("algorithm.finetune_from=scratch", r"^algorithm\.finetune_from='scratch': previous, base$"),
    ],
)
def test_bad_settings_are_one_line_config_errors_before_the_model_loads(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message) as err:
        make_maft(tmp_path, tagged_answer, [override], load_model=no_model)
    assert "\n" not in str(err.value)


def test_a_task_without_problems_is_refused_in_one_line(tmp_path):
    class Prompts:  # a task of prompts and a reward (IMDB), not of problems
        name = "imdb"

    cfg = maft_cfg(tmp_path)
    node = OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k != "agent_models"])
    build = partial(instantiate(node, _convert_="all"), agent_models=scripted_agent_models(tagged_answer))
    with pytest.raises(ConfigError, match=r"^task imdb provides no problems .* needs a reasoning task"):
        build(context=fake_context(tmp_path, Prompts()))
    with pytest.raises(ConfigError, match=r"^task: no held-out problems to evaluate on$"):
        build(context=fake_context(tmp_path, Problems(PROBLEMS, [])))


def test_one_iteration_is_one_round_and_the_evaluation_after_k_rounds_is_round_k(tmp_path):
    """`step(k)` runs fine-tuning round k + 1 (its stages under rounds/<k + 1>/), `evaluate(k)` the held-out debate
    after k rounds; a stop requested between two debate rounds returns None and keeps the finished one."""
    maft = make_maft(tmp_path, tagged_answer)
    out = maft.step(0)
    assert out.metrics["maft/train/accuracy"] == 1.0 and out.headline["train_accuracy"] == 1.0
    assert not out.nonfinite and maft.rounds_done == 1
    assert (tmp_path / "rounds" / "1" / "train_debate_r2.jsonl").exists()
    assert not (tmp_path / "rounds" / "0").exists()
    stops = iter([False, True])
    assert maft.evaluate(1, final=True, should_stop=lambda: next(stops)) is None
    assert sorted(p.name for p in (tmp_path / "rounds" / "1").glob("eval_*")) == ["eval_debate_r1.jsonl"]
    calls = len(maft.pool.calls)
    evaluation = maft.evaluate(1, final=True, should_stop=lambda: False)
    assert len(maft.pool.calls) == calls + 4  # only debate round 2 was left: the base's summaries, three critics
    assert evaluation.metrics["maft/eval/accuracy"] == 1.0 and evaluation.tables[0][0] == "maft/debates"
    assert maft.describe() == {"algorithm": "maft", "num_agents": 3, "single_agent_ft": False}


def test_each_evaluation_writes_its_outcomes_once_and_whole_across_resumes(tmp_path):
    """eval_outcomes.jsonl gets one row per held-out problem and evaluation, whose means are the logged accuracies;
    a resumed start that evaluates again (its debate read back) adds nothing, one that finds the last line cut by a
    kill completes it, and the evaluation after round 1 follows round 0's."""
    maft = make_maft(tmp_path, tagged_answer)
    metrics = maft.evaluate(0, final=True, should_stop=lambda: False).metrics
    path = tmp_path / "eval_outcomes.jsonl"
    rows = read_outcomes(path)
    # tagged_answer: gen1 and gen3 wrong on problem 0 (round-1 vote "0": wrong), gen2 on problem 1; critics right
    assert [(r["iteration"], r["problem"], r["truth"]) for r in rows] == [(0, 0, "5"), (0, 1, "8")]
    assert [[r[k] for k in ("vote", "round1_majority", "gen1", "gen2", "gen3", "critic1")] for r in rows] == [
        [1, 0, 0, 1, 0, 1],
        [1, 1, 1, 0, 1, 1],
    ]
    assert [r["single_sample"] for r in rows] == [1 / 3, 2 / 3]
    assert metrics["maft/eval/round1_majority_accuracy"] == 0.5 and metrics["maft/eval/gen2/accuracy"] == 0.5
    whole = path.read_bytes()

    again = make_maft(tmp_path, tagged_answer)  # a resumed start: the held-out debate of round 0 is saved
    repeated = again.evaluate(0, final=True, should_stop=lambda: False).metrics
    assert {k: v for k, v in repeated.items() if k != "time/eval_s"} == {
        k: v for k, v in metrics.items() if k != "time/eval_s"
    }
    assert not again.pool.calls and path.read_bytes() == whole  # read back, nothing written twice
    path.write_bytes(whole[:-20])  # killed while appending problem 1's row
    make_maft(tmp_path, tagged_answer).evaluate(0, final=True, should_stop=lambda: False)
    assert path.read_bytes() == whole

    maft.step(0)
    maft.evaluate(1, final=True, should_stop=lambda: False)
    after = read_outcomes(path)
    assert path.read_bytes().startswith(whole) and [(r["iteration"], r["problem"]) for r in after[2:]] == [
        (1, 0),
        (1, 1),
    ]
    assert [r["id"] for r in after[2:]] == [r["id"] for r in rows]  # the same problems: a paired test applies


def test_metrics_on_hand_made_debates():
    records = [
        record("5", ["5", "4", "5"], ["5", "5", "5"]),
        record("8", ["8", "9", "1"], ["8", "9", "8"]),
        record("3", ["2", "2", "2"], ["2", "2", "3"]),
        record("1", ["7", "6", "6"], ["6", "6", "6"]),
    ]
    votes = ["5", "8", "2", "6"]
    m = debate_metrics(records, votes, ["5", "8", "2", "6"], "eval")
    assert m["maft/eval/accuracy"] == 0.5 and m["maft/eval/accuracy_se"] == pytest.approx(math.sqrt(0.25 / 4))
    assert m["maft/eval/single_sample_accuracy"] == pytest.approx((2 / 3 + 1 / 3) / 4)
    assert m["maft/eval/round1_accuracy"] == pytest.approx(3 / 12) and m["maft/eval/round2_accuracy"] == 0.5
    assert m["maft/eval/gen1/accuracy"] == 0.5 and m["maft/eval/critic3/accuracy"] == 0.75
    assert m["maft/eval/disagreement_round1"] == 0.75 and m["maft/eval/disagreement_round2"] == 0.5
    assert m["maft/eval/consensus"] == 0.5 and m["maft/eval/no_vote_rate"] == 0.0
    assert all(is_maft_metric(name) for name in m) and not is_maft_metric("maft/eval/gen1/accuracies")


def test_statistics_against_hand_computed_values():
    assert mean_and_se([1, 0, 1, 1]) == (0.75, pytest.approx(math.sqrt(0.75 * 0.25 / 4)))
    assert disagreement([["1", "1"], ["1", None], [None, None]]) == pytest.approx(1 / 3)
    assert consensus([["1", "1"], ["1", None], [None, None]]) == pytest.approx(1 / 3)
    e = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]]])  # pairs: cos 1, 0, 0 → dissimilarity (0 + 1 + 1) / 3
    assert pairwise_dissimilarity(e) == pytest.approx(2 / 3)


def _cut(path):
    path.write_bytes(path.read_bytes()[:-7])


def _drop_last_row(path):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


def _nan_weights(path):
    save_file({"weight": torch.tensor([math.nan])}, str(path))


@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("train_debate_r1.jsonl", _cut),
        ("train_debate_r1.jsonl", _drop_last_row),  # still valid JSON lines: one problem short
        ("weights/gen1.safetensors", _cut),
        ("weights/gen1.safetensors", _nan_weights),
        ("weights/gen1.json", _cut),
    ],
    ids=["debate-cut", "debate-row-missing", "weights-cut", "weights-nan", "weights-stats-cut"],
)
def test_a_damaged_stage_file_is_named_in_one_line_and_its_stage_computed_again(tmp_path, capsys, file, damage):
    """A start that finds a stage file of round 1 damaged (a disk error, an edit) says so naming it and computes
    that stage again, which gives what the file held; the stages whose files are whole are read back."""
    first = make_maft(tmp_path, tagged_answer).finetune_round(1, PROBLEMS)
    path = tmp_path / "rounds" / "1" / file
    damage(path)
    capsys.readouterr()
    again = make_maft(tmp_path, tagged_answer)  # a resumed start: every stage file of round 1 is there
    second = again.finetune_round(1, PROBLEMS)
    said = [line for line in capsys.readouterr().out.splitlines() if "damaged" in line]
    shown = path.with_suffix(".safetensors") if file.endswith(".json") else path  # the stats go with their weights
    assert len(said) == 1 and said[0].startswith(f"[maft] {shown} is damaged (")
    assert said[0].endswith("; computing its stage again")
    if "debate" in file:  # round 1 of the debate asked again, round 2's file read back
        assert {name for name, _ in again.pool.calls} == {"gen1", "gen2", "gen3"}
    else:  # only that agent fine-tuned again
        assert list(again.pool.finetuned) == ["gen1"] and not again.pool.calls
    assert {k: v for k, v in second.items() if not k.startswith("time/")} == {
        k: v for k, v in first.items() if not k.startswith("time/")
    }
