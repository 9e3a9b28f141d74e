"""Learning tests: on the toy task (reward = share of vowels) the tiny random GPT-2 learns within a bounded
number of CPU iterations, for PPO and for CORY, measured on held-out prompts (mbrl-lib style).

Marked `slow` (about a minute each); `make test` runs them, `make test-fast` skips them.
Run: `python -m pytest tests/test_learning.py -m slow`.
"""

from __future__ import annotations

import json

import pytest
from helpers.compose import compose_cfg

from cory.train import train


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_reward_rises_on_the_toy_task(tmp_path, algorithm: str) -> None:
    cfg = compose_cfg(
        [
            "experiment=smoke",
            f"algorithm={algorithm}",
            "progress=false",
            "iterations=25",
            "batch_size=32",
            "eval_every=0",
            "save_every=0",
            "num_eval=32",
            "algorithm.agent.learning_rate=1e-3",
            "algorithm.agent.init_kl_coef=0.05",
            "algorithm.agent.ppo_epochs=4",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    summary = train(cfg, tmp_path / "run")
    agents = ["llm1"] if algorithm == "ppo" else ["llm1", "llm2"]
    for agent in agents:
        before, after = summary["initial"][agent]["task_reward"], summary["agents"][agent]["task_reward"]
        # the initial policy puts ~2% of its mass on vowels; a learner must at least multiply that many-fold
        assert after > before + 0.15, (agent, before, after)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rewards = [r["train/llm1/task_reward"] for r in rows if "train/llm1/task_reward" in r]
    assert sum(train_rewards[-5:]) / 5 > sum(train_rewards[:5]) / 5 + 0.1
