"""Every option of every config group composes, validates and binds to its `_target_`; the paper presets hold
the paper's values, precision included; PPO and CORY share one learner block.

No model is loaded: targets are resolved with `hydra.utils.get_object` and their keys bound to the signature.
Run: `pytest tests/test_configs.py` (about 10 s; one subprocess for `--cfg job`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.compose import CONF_DIR, compose_cfg
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from cory.config import validate
from cory.errors import ConfigError
from cory.policy import HANDLE_KEYS, LoraSettings
from cory.ppo.learner import PPOConfig

REPO = Path(__file__).resolve().parents[1]
# Every option file of every group, found on disk: a config added later (a new algorithm, model or task) is composed,
# validated and bound below with no edit of this file.
GROUPS = {
    group: sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))
    for group in ("model", "task", "algorithm", "hardware", "logger")
}
EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
REWARDS = sorted(p.stem for p in (Path(CONF_DIR) / "task" / "reward").glob("*.yaml"))  # nested group of task
SWEEPS = sorted(p.stem for p in (Path(CONF_DIR) / "sweep").glob("*.yaml"))
GPU_HARDWARE = {"gpu", "multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "fsdp"}
CUDA_MESSAGE = "hardware.device=cuda but CUDA is not available; use hardware=cpu"
FOUR_BIT_MESSAGE = "model.load_in_4bit=true needs CUDA"  # the Llama-2 configs are 4-bit (docs/method.md §3.3)
# Learner values PPO and CORY may set differently, per task, each from a `cory/conf/tuning/<algorithm>_<task>.yaml`
# file (paper Table 2: GSM8K's learning rate is 1e-5 for PPO, 1e-4 for CORY). Everything else is shared.
LEARNER_DIFFERENCES = {"gsm8k": {"learning_rate"}}
TUNINGS = sorted(p.stem for p in (Path(CONF_DIR) / "tuning").glob("*.yaml"))
OPTIONS = [(g, o) for g, opts in GROUPS.items() for o in opts]


def test_every_group_has_options():
    assert all(GROUPS.values()) and {"ppo", "cory", "maft"} <= set(GROUPS["algorithm"])


def _fields(node: DictConfig) -> set[str]:
    """The keys of a config node that its `_target_` receives (Hydra's own `_target_`, `_partial_` left out)."""
    return {str(k) for k in node if not str(k).startswith("_")}


def _kwargs(node: DictConfig) -> dict:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}


def _bind(node: DictConfig, *args, **runtime) -> inspect.BoundArguments:
    """Resolve `node._target_` and bind its keys plus the run-time arguments `train.py` passes."""
    target = get_object(node._target_)
    return inspect.signature(target).bind(*args, **_kwargs(node), **runtime)


def _check_targets(cfg: DictConfig) -> None:
    model = _kwargs(cfg.model)
    inspect.signature(get_object(cfg.model._target_)).bind(**{k: model[k] for k in model if k not in HANDLE_KEYS})
    LoraSettings.from_block(model["lora"])  # the keys that say how agents attach to the loaded model
    task = cfg.task
    if "reward" in task:  # a nested `_target_` built by instantiate before the task
        _bind(task.reward)
        kwargs = {k: v for k, v in _kwargs(task).items() if k != "reward"}  # resolved in place: `${seed}` included
        inspect.signature(get_object(task._target_)).bind(tokenizer=None, reward=None, **kwargs)
    else:
        _bind(task, tokenizer=None)
    assert cfg.algorithm._partial_ is True
    # the algorithm node builds (its learner and settings nodes too) and binds with the entry point's `context`
    algorithm = instantiate(cfg.algorithm, _convert_="all")
    inspect.signature(algorithm.func).bind(*algorithm.args, **algorithm.keywords, context=None)
    runtime = {"run_dir": "/tmp/x"}
    if cfg.logger._target_.endswith("WandbLogger"):
        runtime |= {"config": {}, "run_id": None, "name": "n", "tags": []}
    _bind(cfg.logger, **runtime)
    hardware = set(cfg.hardware)
    assert {"device", "precision", "forward_batch_size", "generation_batch_size"} <= hardware


def _expect_valid(cfg: DictConfig, gpu: bool) -> None:
    if (gpu or cfg.model.get("load_in_4bit")) and not torch.cuda.is_available():
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        assert str(err.value) == CUDA_MESSAGE or str(err.value).startswith(FOUR_BIT_MESSAGE)
    else:
        validate(cfg)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_composes_validates_and_binds(group, option):
    cfg = compose_cfg([f"{group}={option}"])
    assert OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    _check_targets(cfg)
    _expect_valid(cfg, gpu=group == "hardware" and option in GPU_HARDWARE)


@pytest.mark.parametrize("reward", REWARDS)
def test_every_task_reward_option_composes_validates_and_binds(reward):
    cfg = compose_cfg(["task=imdb", f"task/reward={reward}"])
    assert "_target_" in cfg.task.reward
    _check_targets(cfg)
    validate(cfg)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_validates_and_binds(experiment):
    cfg = compose_cfg([f"experiment={experiment}"])
    _check_targets(cfg)
    _expect_valid(cfg, gpu=str(cfg.hardware.device).startswith("cuda"))


# Every experiment with PPO and CORY, and every algorithm with the smoke experiment, in `make test`; the rest of the
# product (420 pairs, about two minutes) in `make test-long`, which CI runs too.
PAIRS = [
    pytest.param(e, a, marks=() if a in ("ppo", "cory") or e == "smoke" else pytest.mark.long)
    for e in EXPERIMENTS
    for a in GROUPS["algorithm"]
]


@pytest.mark.parametrize(("experiment", "algorithm"), PAIRS)
def test_every_experiment_with_each_algorithm_runs_or_is_refused_in_one_line(experiment, algorithm):
    """Most experiments leave the algorithm free; one that sets CORY-only keys must be refused for PPO by
    `validate`, naming the key, not crash inside Hydra's instantiate."""
    cfg = compose_cfg([f"experiment={experiment}", f"algorithm={algorithm}"])
    try:
        validate(cfg)
    except ConfigError as err:
        if str(err) == CUDA_MESSAGE or str(err).startswith(FOUR_BIT_MESSAGE):
            return
        assert str(err).startswith("algorithm.") and "unknown key" in str(err), err
        return
    _check_targets(cfg)


@pytest.mark.parametrize("sweep", SWEEPS or [pytest.param(None, marks=pytest.mark.skip(reason="no sweep files"))])
def test_every_sweep_composes(sweep):
    cfg = compose_cfg([f"sweep={sweep}"])
    _check_targets(cfg)


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_ppo_and_cory_share_the_learner_block(experiment):
    """Any difference between PPO and CORY must come from the orchestration (docs/method.md §1.2), so the learner
    block is the same for both, key for key, except where `LEARNER_DIFFERENCES` lists and documents one."""
    extra = [f"experiment={experiment}"] if experiment else []
    ppo, cory = compose_cfg([*extra, "algorithm=ppo"]), compose_cfg([*extra, "algorithm=cory"])
    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    assert fields == _fields(ppo.algorithm.agent) == _fields(cory.algorithm.agent)
    allowed = LEARNER_DIFFERENCES.get(ppo.task.name, set())
    differ = {k for k in _fields(ppo.algorithm.agent) if ppo.algorithm.agent[k] != cory.algorithm.agent[k]}
    assert differ <= allowed, f"{experiment}: PPO and CORY learners differ in {sorted(differ - allowed)}"


def test_learner_block_read_without_hydra_equals_the_composed_one():
    """`PPOConfig.from_yaml` (scripts that run without Hydra) reads the same numbers Hydra composes."""
    composed = PPOConfig(**_kwargs(compose_cfg(["~experiment"]).algorithm.agent))
    assert PPOConfig.from_yaml() == composed
    assert PPOConfig.from_yaml(ppo_epochs=1) == dataclasses.replace(composed, ppo_epochs=1)
    with pytest.raises(TypeError):
        PPOConfig.from_yaml(lr=1.0)


# ------------------------------------------------------------------------------------------- paper presets
# The paper's IMDB setting (docs/method.md §3.1, Table 1) and what each preset changes (§3.5, §5).
PAPER_IMDB = {
    "model.name_or_path": "gpt2-large",
    "task.source": "hub",
    "hardware.device": "cuda",
    "hardware.precision": "fp32",  # paper and official code train in fp32 (docs/method.md §5)
    "iterations": 100,
    "batch_size": 256,
    "eval_every": 10,
    "num_eval": 256,
    "algorithm.agent.mini_batch_size": 256,
    "algorithm.agent.gradient_accumulation_steps": 1,
    "algorithm.agent.learning_rate": 1.41e-5,
    "algorithm.agent.init_kl_coef": 0.3,
    "algorithm.agent.ppo_epochs": 4,
    "algorithm.agent.kl_penalty": "full",
    "algorithm.agent.use_score_scaling": False,
    "algorithm.agent.generate_in_train_mode": False,
    "task.max_new_tokens": [4, 15],
    "task.min_review_chars": 200,
    "task.query_tokens": [2, 8],
    "task.generation_kwargs.repetition_penalty": 1.1,
    "task.eval_kl_coef": 0.3,
    "task.reward._target_": "cory.tasks.rewards.ClassifierReward",
    "task.reward.name_or_path": "lvwerra/distilbert-imdb",
}
PPO_ON = {
    "algorithm._target_": "cory.algorithms.team.Team",
    "algorithm.episode.roles": ["pioneer"],
    "algorithm.schedule._target_": "cory.algorithms.schedules.Simultaneous",
}
CORY_ON = {
    "algorithm._target_": "cory.algorithms.team.Team",
    "algorithm.episode.roles": ["pioneer", "observer"],
    "algorithm.episode.knowledge_transfer": True,
    "algorithm.schedule._target_": "cory.algorithms.schedules.RoleSwap",
    "algorithm.schedule.period": 5,
    "algorithm.credit._target_": "cory.algorithms.credit.Collective",
    "algorithm.credit.w_self": 1.0,
    "algorithm.credit.w_other": 1.0,
    "algorithm.schedule.faithful_official_swap": False,
}
PAPER_PRESETS = {
    "imdb_gpt2": {**PAPER_IMDB, **PPO_ON},  # the default algorithm
    "cory_gpt2_large": {**PAPER_IMDB, **CORY_ON},
    "ppo_gpt2_xl": {**PAPER_IMDB, **PPO_ON, "model.name_or_path": "gpt2-xl"},
    "cory_wo_kt": {**PAPER_IMDB, **CORY_ON, "algorithm.episode.knowledge_transfer": False},
    "cory_wo_rex": {
        **PAPER_IMDB,
        **{k: v for k, v in CORY_ON.items() if not k.startswith("algorithm.schedule.")},
        "algorithm.schedule._target_": "cory.algorithms.schedules.Simultaneous",
    },
    "official_code": {
        **PAPER_IMDB,
        **CORY_ON,
        "model.name_or_path": "gpt2",
        "iterations": 97,
        "algorithm.agent.init_kl_coef": 0.4,
        "algorithm.agent.use_score_scaling": True,
        "algorithm.agent.use_score_norm": True,
        "task.query_tokens": [2, 7],
        "task.min_review_chars": 100,
        "algorithm.schedule.faithful_official_swap": True,
        "algorithm.agent.generate_in_train_mode": True,
    },
}


def test_every_imdb_gpt2_preset_is_listed():
    """A new preset built on the paper's IMDB setting must state its values here (precision included)."""
    tasks = {e: compose_cfg([f"experiment={e}"]).task for e in EXPERIMENTS}
    built_on_imdb = {e for e, task in tasks.items() if task.name == "imdb" and task.get("source") == "hub"}
    assert built_on_imdb == set(PAPER_PRESETS)


@pytest.mark.parametrize("experiment", sorted(PAPER_PRESETS))
def test_paper_presets_hold_the_papers_values(experiment):
    cfg = compose_cfg([f"experiment={experiment}"])
    for key, value in PAPER_PRESETS[experiment].items():
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, (key, got, value)
    # the reward block was replaced, not merged into the packaged TF-IDF one: no stale keys reach the classifier
    assert dict(cfg.task.reward) == dict(OmegaConf.load(Path(CONF_DIR) / "task" / "reward" / "distilbert_imdb.yaml"))
    _check_targets(cfg)


@pytest.mark.parametrize("hardware", GROUPS["hardware"])
@pytest.mark.parametrize("experiment", sorted(PAPER_PRESETS))
def test_paper_presets_train_in_fp32_whatever_the_hardware_option(experiment, hardware):
    """The paper trained GPT-2 in fp32; `hardware=gpu` alone means bf16 autocast, but not for a paper preset.
    bf16 stays available as an explicit choice, and only as one."""
    assert compose_cfg([f"hardware={hardware}"]).hardware.precision == ("fp32" if hardware == "cpu" else "bf16")
    assert compose_cfg([f"experiment={experiment}", f"hardware={hardware}"]).hardware.precision == "fp32"
    chosen = compose_cfg([f"experiment={experiment}", f"hardware={hardware}", "hardware.precision=bf16"])
    assert chosen.hardware.precision == "bf16"


GSM8K_PAPER = sorted(e for e in EXPERIMENTS if e.startswith("gsm8k_llama2"))


@pytest.mark.parametrize("hardware", GROUPS["hardware"])
@pytest.mark.parametrize("experiment", GSM8K_PAPER)
def test_gsm8k_paper_presets_keep_what_is_not_quantized_in_fp32(experiment, hardware):
    """TRL's 4-bit + LoRA PPO (PEFT's `prepare_model_for_kbit_training`) holds the LM head, embeddings and norms in
    fp32 and runs no autocast; only the NF4 layers compute in `compute_dtype`. The GSM8K presets do the same on
    every hardware option, and bf16 autocast stays an explicit choice."""
    cfg = compose_cfg([f"experiment={experiment}", f"hardware={hardware}"])
    assert cfg.model.load_in_4bit is True and cfg.model.dtype == "float32"
    assert cfg.hardware.precision == "fp32"
    chosen = compose_cfg([f"experiment={experiment}", f"hardware={hardware}", "hardware.precision=bf16"])
    assert chosen.hardware.precision == "bf16"


def test_paper_experiments_override_from_the_command_line():
    cfg = compose_cfg(["experiment=cory_gpt2_large", "model=gpt2", "task.reward.name_or_path=/tmp/clf", "seed=2"])
    assert cfg.model.name_or_path == "gpt2" and cfg.seed == 2
    assert cfg.task.reward.name_or_path == "/tmp/clf"
    assert cfg.algorithm._target_ == "cory.algorithms.team.Team" and cfg.algorithm.episode.name == "cory"


@pytest.mark.parametrize("task", GROUPS["task"])
def test_ppo_and_cory_share_the_learner_block_but_for_listed_differences(task):
    ppo, cory = (compose_cfg(["~experiment", f"task={task}", f"algorithm={a}"]) for a in ("ppo", "cory"))
    assert {f.name for f in dataclasses.fields(PPOConfig)} == _fields(ppo.algorithm.agent)
    differ = {k for k in _fields(ppo.algorithm.agent) if ppo.algorithm.agent[k] != cory.algorithm.agent[k]}
    assert differ == LEARNER_DIFFERENCES.get(task, set())


@pytest.mark.parametrize("tuning", TUNINGS)
def test_tuning_files_set_only_listed_learner_values(tuning):
    """`tuning/<algorithm>_<task>.yaml` is picked for that pair only and touches only the listed keys."""
    algorithm, task = tuning.rsplit("_", 1)  # algorithm names may hold underscores (cory_shared), task names do not
    values = OmegaConf.load(Path(CONF_DIR) / "tuning" / f"{tuning}.yaml")
    assert set(values) == {"algorithm"} and set(values.algorithm) == {"agent"}
    assert _fields(values.algorithm.agent) <= LEARNER_DIFFERENCES[task]
    cfg = compose_cfg(["~experiment", f"task={task}", f"algorithm={algorithm}"])
    assert all(cfg.algorithm.agent[k] == v for k, v in values.algorithm.agent.items())


def test_an_experiment_value_wins_over_the_tuning_file():
    """A robustness cell sets one learning rate for both algorithms: experiments come after `tuning`."""
    cell = "experiment=gsm8k_llama2_7b_lr1e-4"
    ppo, cory = (compose_cfg([cell, f"algorithm={a}"]).algorithm.agent for a in ("ppo", "cory"))
    assert ppo == cory
    assert compose_cfg(["experiment=gsm8k_llama2", "algorithm=ppo"]).algorithm.agent != ppo


def test_trust_remote_code_is_off_in_every_model_config():
    for option in GROUPS["model"]:
        cfg = compose_cfg([f"model={option}"])
        assert cfg.model.get("trust_remote_code", False) is False, option
        default = inspect.signature(get_object(cfg.model._target_)).parameters.get("trust_remote_code")
        assert default is None or default.default is False, option


def test_hydra_run_dir_interpolation_resolves():
    cfg = compose_cfg(["experiment=smoke", "algorithm=cory"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what @hydra.main does before resolving `${hydra:...}`
    run_dir = OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]
    assert run_dir.startswith("outputs/runs/toy/cory/") and "$" not in run_dir
    assert cfg.hydra.sweep.dir.startswith("outputs/multiruns/")  # resolved in tests/test_sweeps.py


def test_unknown_keys_and_targets_are_config_errors():
    with pytest.raises(ConfigError, match=r"^algorithm\.agent\.lr: unknown key .*allowed: learning_rate"):
        validate(compose_cfg(["experiment=smoke", "+algorithm.agent.lr=0.1"]))
    with pytest.raises(ConfigError, match=r"^task\.reward\._target_=cory\.tasks\.rewards\.Nope: cannot be imported"):
        validate(compose_cfg(["task=imdb", "task.reward._target_=cory.tasks.rewards.Nope"]))
    with pytest.raises(ConfigError, match=r"^model\.n_layers: unknown key for cory\.models\.build_tiny_gpt2"):
        validate(compose_cfg(["experiment=smoke", "+model.n_layers=3"]))


def test_cfg_job_prints_the_config_without_loading_a_model():
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "cory.train", "experiment=smoke", "algorithm=cory", "--cfg", "job"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.algorithm._target_ == "cory.algorithms.team.Team" and cfg.algorithm.episode.name == "cory"
    assert cfg.model._target_ == "cory.models.build_tiny_gpt2"
    assert "Error" not in out.stderr


def test_slurm_launcher_composes() -> None:
    """Scale-out goes through Hydra's submitit launcher: `-m hydra/launcher=submitit_slurm ...` on a cluster."""
    cfg = compose_cfg(["hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=1"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert cfg.hydra.launcher.gpus_per_node == 1
