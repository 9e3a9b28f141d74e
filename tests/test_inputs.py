"""Bad inputs a user may type or leave lying around: each is one `error:` line naming the key or path, exit code 2.

Values of the wrong type or out of range (checked against the targets' own annotations), non-finite numbers,
an unknown device, an observer template with an unknown field, prompts longer than the model's context, data
files that are missing, empty, header-only or lack the needed columns, a corrupt `run_config.yaml`, a run
folder that cannot be created, and corrupt caches (the message names them and says to delete them). Through
the command line, a refused run leaves no run folder behind. Also: Hydra's own composition errors, the real
entrypoint (subprocesses, two at a time) on bad values, a damaged checkpoint, an unreachable Hub model (fast,
naming a local folder as the way out) and W&B without a key or network (falls back to metrics.jsonl).

Run: `pytest tests/test_inputs.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import signal
import subprocess
import sys
import time
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.fakes import write_reviews_csv
from helpers.runners import REPO, cli, env, finished_run, one_error_line, run_main, smoke, start_run

import cory.models
from cory.algorithms.schedules import Interleaved, RoleSwap, Sequential
from cory.checkpoints import latest_checkpoint
from cory.config import SAMPLING, declared_ranges, type_problem
from cory.errors import AssetUnavailableError, ConfigError, entry_point
from cory.maft.agents import GenerationSettings as Generation
from cory.maft.sft import SFTSettings
from cory.ppo.critics import CentralizedCritic
from cory.ppo.estimators import GAE, GRPO, RLOO
from cory.ppo.learner import PPOConfig
from cory.ppo.losses import ClippedPPO, ClippedPPOKLInLoss
from cory.settings import HardwareSettings, RunSettings
from cory.tasks.rewards import TfidfSentimentReward
from cory.train import train

# A bad input must fail at start-up cost: no model load, no Hub retry (each costs >= 25 s). Start-up itself takes
# ~10 s on an idle 2-CPU machine and 30 s or more on a loaded one, so the bound is relative: the slowest of two
# runs of `--cfg job` (the same interpreter, imports and composition, no training) timed in the same pool, plus
# less than one Hub retry. That no model is built is proven in-process
# (`test_bad_config_fails_before_any_model_loads`).
FAIL_FAST_MARGIN_S = 20.0
EXPECTED_COLUMNS = "expected a CSV with columns text,label[,source]"
TYPED = {  # override → the one-line message starts with
    "seed=abc": "seed=abc: expected an integer",
    "seed=1.5": "seed=1.5: expected an integer",
    "seed=-1": "seed=-1: must be in [0, 2^32)",
    "batch_size=abc": "batch_size=abc: expected an integer",
    "iterations=2.5": "iterations=2.5: expected an integer",
    "algorithm.agent.learning_rate=fast": "algorithm.agent.learning_rate=fast: expected a number",
    "algorithm.agent.learning_rate=inf": "algorithm.agent.learning_rate=inf: must be a finite number",
    "algorithm.agent.init_kl_coef=nan": "algorithm.agent.init_kl_coef=nan: must be a finite number",
    "algorithm.advantage.gamma=1.5": "algorithm.advantage.gamma=1.5: must be in [0, 1]",
    "algorithm.advantage.lam=-0.1": "algorithm.advantage.lam=-0.1: must be in [0, 1]",
    "task.max_new_tokens=0": "task.max_new_tokens=0: expected [min, max], two integers",
    "task.max_new_tokens=[5,2]": "task.max_new_tokens=[5, 2]: need 1 <= min <= max",
    "algorithm=cory algorithm.credit.w_other=abc": "algorithm.credit.w_other=abc: expected a number",
    "hardware.device=tpu": "hardware.device=tpu: not a device; use cpu, cuda, cuda:<n> or auto",
    "task.observer_template='{query}{foo}'": "task.observer_template='{query}{foo}': unknown field {foo}",
}


@pytest.mark.parametrize("override", list(TYPED))
def test_a_value_of_the_wrong_type_or_range_is_one_line_before_any_model_loads(tmp_path, monkeypatch, override):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for an invalid configuration")

    monkeypatch.setattr(cory.models, "build_tiny_gpt2", no_model)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, *override.split()), tmp_path / "run")
    assert str(err.value).startswith(TYPED[override]) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def _csv(tmp_path: Path, content: str | None) -> Path:
    path = tmp_path / "reviews.csv"
    if content is not None:
        path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("", "the file is empty"),
        ("text,label,source\n", "a header but no rows"),
        ("review,score\nGreat film,1\n", "no column text (header: review,score)"),
    ],
    ids=["missing", "empty", "header-only", "wrong-columns"],
)
def test_a_bad_data_file_names_the_path_and_the_expected_columns(tmp_path, content, problem):
    path = _csv(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, "task=imdb", f"task.data_files={path}"), tmp_path / "run")
    assert str(err.value) == f"task.data_files={path}: {problem}; {EXPECTED_COLUMNS}"


def _outputs(tmp_path: Path) -> list[Path]:
    """Run folders under the default `outputs/` (those Hydra wrote a snapshot into)."""
    return sorted(p.parent for p in (tmp_path / "outputs").rglob(".hydra"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["seed=abc"], "seed=abc: expected an integer"),
        (["iterations=2.5"], "iterations=2.5: expected an integer"),
        (["model.n_positions=12"], "the longest prompt plus a response of task.max_new_tokens=10 is 16 tokens"),
        (["task=imdb", "task.data_files={tmp}/header.csv"], "task.data_files={tmp}/header.csv: a header but no rows"),
        (["hydra.run.dir={tmp}/afile/run"], "hydra.run.dir={tmp}/afile/run: cannot create the run folder"),
        (["resume={tmp}/broken"], "resume={tmp}/broken: {tmp}/broken/run_config.yaml is unreadable"),
        (["task.num_eval=0"], "task.num_eval=0: must be >= 1"),
        (["num_eval=0"], "num_eval=0: must be >= 1 or null"),
        (["task=imdb", "task.reward._target_=builtins.int"], "task.reward._target_=builtins.int: a Python builtin"),
    ],
    ids=[
        "type",
        "integer",
        "context",
        "data-file",
        "unwritable-folder",
        "corrupt-run-config",
        "no-task-eval",
        "no-eval",
        "builtin-target",
    ],
)
def test_through_the_command_line_a_refused_run_is_one_line_and_leaves_no_folder(
    tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "header.csv").write_text("text,label,source\n")
    (tmp_path / "afile").write_text("a file where a folder is expected")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run_config.yaml").write_text("seed: [unclosed\n")
    argv = ["experiment=smoke", "progress=false", *(a.format(tmp=tmp_path) for a in args)]
    code, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: " + message.format(tmp=tmp_path))
    assert _outputs(tmp_path) == []  # Hydra created a folder for it; the refusal removed it


def test_a_corrupt_reward_cache_is_named_with_the_way_out(tmp_path):
    data = write_reviews_csv(tmp_path / "reviews.csv")
    reward = TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    arrays = reward.path / "arrays.safetensors"
    arrays.write_bytes(arrays.read_bytes()[:100])
    with pytest.raises(AssetUnavailableError) as err:
        TfidfSentimentReward(cache_dir=str(tmp_path / "cache"), data_files=str(data))
    text = str(err.value)
    assert text.startswith(f"the cached TF-IDF reward {reward.path} is corrupt") and "delete that folder" in text


def test_a_corrupt_model_cache_is_named_with_the_way_out(tmp_path):
    model, tokenizer = cory.models.build_tiny_gpt2()
    cached = tmp_path / "cache" / "smollm2-135m"  # where `model=smollm2_135m` keeps its converted weights
    model.save_pretrained(cached)
    tokenizer.save_pretrained(cached)
    weights = cached / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(AssetUnavailableError) as err:
        start_run(tmp_path, tmp_path / "run", "model=smollm2_135m")
    text = " ".join(str(err.value).split())
    assert f"Cannot load the model from the local folder {cached}" in text and "delete it" in text


# ------------------------------------------------------------------------------------------- bad configuration
BAD = {  # override → key the one-line message must name
    "algorithm.agent.mini_batch_size=5": "algorithm.agent.mini_batch_size",
    "algorithm.agent.learning_rate=-1e-3": "algorithm.agent.learning_rate",
    "algorithm.agent.init_kl_coef=-0.1": "algorithm.agent.init_kl_coef",
    "algorithm.agent.kl_penalty=kl2": "algorithm.agent.kl_penalty",
    "+algorithm.agent.lr=0.1": "algorithm.agent.lr",
    "iterations=0": "iterations",
    "save_every=-1": "save_every",
    "model=gpt2 model.name_or_path=/nonexistent/dir": "model.name_or_path",
    "task=imdb task.reward._target_=cory.tasks.rewards.NoSuchReward": "task.reward._target_",
    "task=imdb task.source=web": "task.source",
    "task=imdb task.scored=query": "task.scored",
    "task=toy task.scored=answer": "task.scored",
    "algorithm=cory algorithm.schedule.period=0": "algorithm.schedule.period=0: must be >= 1",
}
if not torch.cuda.is_available():
    BAD |= {"+model.load_in_4bit=true": "model.load_in_4bit", "hardware=gpu": "hardware.device"}


@pytest.mark.parametrize("override", list(BAD))
def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch, override):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for an invalid configuration")

    for builder in ("build_tiny_gpt2", "load_pretrained", "load_smollm2_135m"):
        monkeypatch.setattr(cory.models, builder, no_model)
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, *override.split()), tmp_path / "run")
    message = str(err.value)
    assert BAD[override] in message and "\n" not in message
    if "kl_penalty" in override:
        assert "allowed" in message and "'full'" in message


def test_a_batch_larger_than_the_training_set_is_one_line(tmp_path):
    """The task's size is known once it is built (after the tokenizer loads): still one line, before any step."""
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, "batch_size=1024"), tmp_path / "run")
    message = str(err.value)
    assert message.startswith("batch_size=1024: the task has only") and "\n" not in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("task/reward=nope", "task/reward=nope: no such option (available: constant, distilbert_imdb, tfidf)"),
        ("model=nope", "model=nope: no such option (available: gpt2,"),
        ("algorithm.agent.lr=1", "algorithm.agent.lr"),
    ],
)
def test_unknown_option_or_key_is_one_error_line(monkeypatch, capsys, override, named):
    """Composition errors (Hydra's own) get the same one-line treatment, before anything is built."""
    monkeypatch.setattr(sys, "argv", ["cory.train", "experiment=smoke", "task=imdb", override])
    monkeypatch.setattr(cory.train, "_hydra_main", lambda: pytest.fail("Hydra's run was reached"))
    with pytest.raises(SystemExit) as exit_:
        cory.train.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and named in err


CLI_BAD = [
    "algorithm.agent.mini_batch_size=5",
    "model=gpt2 model.name_or_path=/nonexistent/dir",
    "+model.load_in_4bit=true",
]


@pytest.fixture(scope="module")
def entrypoint(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """The entrypoint checks that need no interaction, run two at a time (2 CPUs): name → (result, seconds)."""
    tmp = tmp_path_factory.mktemp("entrypoint")
    corrupt = finished_run(tmp)
    (latest_checkpoint(corrupt) / "trainer.json").write_text("{not json")
    no_wandb = {k: v for k, v in env().items() if not k.startswith("WANDB_")}
    no_wandb |= {
        "WANDB_MODE": "online",
        "NETRC": str(tmp / "no-netrc"),
        "WANDB_DIR": str(tmp),
        "WANDB_CONFIG_DIR": str(tmp),
    }
    jobs = {
        o: (cli("experiment=smoke", f"hydra.run.dir={tmp / str(i)}", *o.split()), env())
        for i, o in enumerate(CLI_BAD)
        if o in BAD
    }
    jobs["gpt2"] = (cli("experiment=smoke", "model=gpt2", f"hydra.run.dir={tmp / 'gpt2'}"), env(HF_HUB_OFFLINE="1"))
    jobs["corrupt"] = (cli(f"resume={corrupt}", "iterations=3"), env())
    # first and last in the pool: the start-up cost around the checks. `--cfg job` alone no longer imports torch and
    # transformers (`cory.train` imports them lazily), which a run's validation does: they are imported first
    startup = (
        "import sys, cory.build, cory.config, cory.trainer, cory.train; sys.argv[0] = 'cory.train'; cory.train.main()"
    )
    for k in ("startup_first", "startup_last"):
        jobs[k] = ([sys.executable, "-c", startup, "experiment=smoke", "--cfg", "job"], env())
    jobs = {"startup_first": jobs.pop("startup_first"), **jobs}
    jobs["wandb"] = (
        cli("experiment=smoke", "progress=false", "logger=wandb", "iterations=2", f"hydra.run.dir={tmp / 'wandb'}"),
        no_wandb,
    )

    def run(cmd: list[str], environ: dict) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        out = subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
        return out, time.monotonic() - t0

    jobs["startup_last"] = jobs.pop("startup_last")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, *job) for name, job in jobs.items()}
    results = {name: f.result() for name, f in futures.items()}
    for k in ("startup_first", "startup_last"):
        assert results[k][0].returncode == 0, results[k][0].stderr[-2000:]
    startup = max(results["startup_first"][1], results["startup_last"][1])
    return results | {"wandb_dir": (None, tmp / "wandb"), "fail_fast_s": (None, startup + FAIL_FAST_MARGIN_S)}


@pytest.mark.parametrize("override", CLI_BAD)
def test_bad_config_through_the_entrypoint_is_one_error_line(entrypoint, override):
    if override not in BAD:
        pytest.skip("valid on a CUDA machine")
    out, seconds = entrypoint[override]
    assert seconds < entrypoint["fail_fast_s"][1]
    assert BAD[override] in one_error_line(out)


def test_corrupt_checkpoint_through_the_entrypoint_is_one_error_line(entrypoint):
    out, _ = entrypoint["corrupt"]
    assert "iter_000002 is unreadable" in one_error_line(out)


# -------------------------------------------------------------------------------------- unreachable services
def test_unreachable_hub_model_fails_fast_naming_a_local_folder(entrypoint):
    out, seconds = entrypoint["gpt2"]
    assert seconds < entrypoint["fail_fast_s"][1]
    line = one_error_line(out)
    assert "'gpt2'" in line and "local folder" in line


def test_wandb_online_without_key_or_network_falls_back_to_jsonl(entrypoint):
    out, _ = entrypoint["wandb"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "W&B init failed" in out.stderr and "continuing with" in out.stderr
    assert json.loads((entrypoint["wandb_dir"][1] / "summary.json").read_text())["completed"] is True


def test_resume_of_a_missing_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["cory.train", f"resume={tmp_path / 'nope'}"])
    with pytest.raises(SystemExit) as exit_:
        cory.train.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: resume={tmp_path / 'nope'}: no such run folder"
    assert not (tmp_path / "nope").exists()


# ------------------------------------------------------------------------------------------ Hydra-level mistakes
HYDRA_MISTAKES = {  # id → (command line after `experiment=smoke`, the one line starts with)
    "key-typo": (["algoritm=ppo"], "algoritm=ppo: no key algoritm in the config; did you mean algorithm=ppo?"),
    "nested-key-typo": (
        ["algorithm.agent.lerning_rate=1e-5"],
        "algorithm.agent.lerning_rate=1e-5: no key algorithm.agent.lerning_rate in the config; did you mean "
        "algorithm.agent.learning_rate=1e-5?",
    ),
    "key-elsewhere": (["learning_rate=1e-5"], "learning_rate=1e-5: no key learning_rate in the config; did you mean"),
    "group-typo": (["task=imdb", "task/rewrd=tfidf"], "task/rewrd=tfidf: no key task/rewrd in the config; did you"),
    "option-typo": (["algorithm=ppoo"], "algorithm=ppoo: no such option; did you mean algorithm=ppo? (available: "),
    "added-key-typo": (["+algoritm=ppo"], "algoritm: not a key of the config, nothing would read it; did you mean"),
    "sweep-option-typo": (["-m", "algorithm=ppo,coryy"], "algorithm=coryy: no such option; did you mean algorithm="),
    "sweep-key-typo": (["-m", "iteratons=1,2"], "iteratons=1: no key iteratons in the config; did you mean"),
    "multirun-with-cfg": (["-m", "--cfg", "job", "seed=0,1"], "-m and --cfg cannot go together: --cfg prints"),
    "comma-list-without-m": (["seed=0,1"], "seed=0,1: a comma list is a sweep; add -m to run one job per value"),
    "unclosed-quote": (
        ["task.observer_template='{query}"],
        "task.observer_template='{query}: Hydra cannot read this override (an unclosed quote); quote the value for "
        "Hydra and the whole override for the shell: \"task.observer_template='{query}'\"",
    ),
    "split-by-the-shell": (
        ["task.observer_template={query}", "{response}|{query}"],
        "task.observer_template={query} {response}|{query}: Hydra cannot read this override (the shell split its "
        "value at a space); quote the value for Hydra and the whole override for the shell: "
        "\"task.observer_template='{query} {response}|{query}'\"",
    ),
    # a {...} value is merged into the node key by key: the node exists, the refused key is one inside it
    "dict-value-new-key": (
        ["algorithm.agent={lr:1}"],
        "algorithm.agent={lr:1}: algorithm.agent has no key lr (algorithm.agent has _target_, adaptive_kl, ",
    ),
    "dict-value-key-typo": (
        ["algorithm.agent={lerning_rate:1}"],
        "algorithm.agent={lerning_rate:1}: algorithm.agent has no key lerning_rate (algorithm.agent has _target_, ",
    ),
    "bad-flag-value": (["--cfg", "jobs"], "argument --cfg/-c: invalid choice: 'jobs'"),
    "not-an-override": (["seed"], "seed: not an override; write key=value"),
}


@pytest.mark.parametrize("mistake", list(HYDRA_MISTAKES))
def test_a_hydra_level_mistake_is_one_line_with_the_right_hint(tmp_path, monkeypatch, capsys, mistake):
    """A key or option that does not exist, a flag that does not fit, a value Hydra's grammar cannot read: one line,
    exit code 2, nothing written, and the hint points the right way: the key a typo meant, never Hydra's
    "To append to your config use +key=" (which adds the typo as a new key), and how to quote a value."""
    monkeypatch.chdir(tmp_path)
    args, line = HYDRA_MISTAKES[mistake]
    folders = [f"hydra.sweep.dir={tmp_path / 'sweep'}"] if "-m" in args else []
    code, err = run_main(monkeypatch, capsys, "experiment=smoke", "progress=false", *folders, *args)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {line}"), err
    assert "To append" not in err and "+algoritm" not in err and "+iteratons" not in err
    if mistake == "dict-value-new-key":  # the way to replace the node whole: delete it, then add the new one
        assert err.rstrip().endswith("delete the old one first: ~algorithm.agent '+algorithm.agent={lr:1}'"), err
    if mistake == "dict-value-key-typo":
        assert "; did you mean learning_rate? A {...} value is merged into algorithm.agent key by key" in err, err
    assert _outputs(tmp_path) == [] and not (tmp_path / "sweep").exists()


# ------------------------------------------------------------------------------ degenerate learner and sampling
A, G, L = "algorithm.agent", "task.generation_kwargs", "algorithm.loss"
DEGENERATE = {  # overrides → the one-line message starts with
    f"{L}.cliprange=5": f"{L}.cliprange=5: must be in (0, 1] (the ratio is clipped to [1 - cliprange, 1 + cliprange])",
    f"{L}.cliprange=0": f"{L}.cliprange=0: must be in (0, 1]",
    f"{L}.cliprange_value=0": f"{L}.cliprange_value=0: must be > 0",
    f"{L}.vf_coef=-1": f"{L}.vf_coef=-1: must be >= 0",
    f"{A}.ratio_threshold=0.5": f"{A}.ratio_threshold=0.5: must be > 1",
    f"{A}.score_clip=-1": f"{A}.score_clip=-1: must be > 0 or null",
    f"{A}.max_grad_norm=0": f"{A}.max_grad_norm=0: must be > 0 or null",
    f"{A}.target_kl=-1": f"{A}.target_kl=-1: must be > 0",
    f"{A}.kl_horizon=0": f"{A}.kl_horizon=0: must be > 0",
    f"{A}.ppo_epochs=0": f"{A}.ppo_epochs=0: must be >= 1",
    f"{A}.gradient_accumulation_steps=0": f"{A}.gradient_accumulation_steps=0: must be >= 1",
    "algorithm=grpo algorithm.advantage.group_size=1": (
        "algorithm.advantage.group_size=1: must be >= 2 (a group baseline)"
    ),
    "algorithm.advantage.gamma=1.5": "algorithm.advantage.gamma=1.5: must be in [0, 1]",
    "algorithm=cory algorithm.schedule.period=0": "algorithm.schedule.period=0: must be >= 1",
    "algorithm=cory_interleaved algorithm.schedule.period=0": "algorithm.schedule.period=0: must be >= 1",
    "algorithm=cory_teamtr algorithm.schedule.kl_budget=0": "algorithm.schedule.kl_budget=0: must be > 0 or null",
    "algorithm=cory_cc algorithm.critic.cliprange_value=0": "algorithm.critic.cliprange_value=0: must be > 0",
    f"{G}.temperature=0": f"{G}.temperature=0: must be > 0",
    f"{G}.temperature=-1": f"{G}.temperature=-1: must be > 0",
    f"{G}.top_k=-1": f"{G}.top_k=-1: must be >= 0 (0: no top-k filter)",
    f"{G}.top_k=2.5": f"{G}.top_k=2.5: expected an integer or null",
    f"{G}.top_p=0": f"{G}.top_p=0: must be in (0, 1]",
    f"{G}.top_p=1.5": f"{G}.top_p=1.5: must be in (0, 1]",
    f"+{G}.repetition_penalty=0": f"{G}.repetition_penalty=0: must be > 0",
    f"+{G}.min_p=2": f"{G}.min_p=2: must be in [0, 1]",
    f"+{G}.num_beams=0": f"{G}.num_beams=0: must be >= 1",
    f"+{G}.max_new_tokens=0": f"{G}.max_new_tokens: set by the run, not by a task",
    f"+{G}.num_return_sequences=2": f"{G}.num_return_sequences: set by the run, not by a task",
    f"+{G}.top_kk=2": f"{G}.top_kk: not a setting of Hugging Face generate; did you mean {G}.top_k?",
    "task.query_chars=[0,0]": "task.query_chars=[0, 0]: each value must be >= 1",
    "task.eval_kl_coef=-1": "task.eval_kl_coef=-1: must be >= 0",
    "eval_batch_size=0": "eval_batch_size=0: must be >= 1",
    "hardware.forward_batch_size=0": "hardware.forward_batch_size=0: must be >= 1",
    "hardware.generation_batch_size=-1": "hardware.generation_batch_size=-1: must be >= 1",
    "hardware.length_groups=0": "hardware.length_groups=0: must be >= 1",
    "experiment=maft_smoke algorithm.generation.temperature=0": "algorithm.generation.temperature=0: must be > 0",
    "experiment=maft_smoke algorithm.sft.warmup=1": "algorithm.sft.warmup=1: must be in [0, 1)",
}


@pytest.mark.parametrize("overrides", list(DEGENERATE))
def test_a_degenerate_learner_or_sampling_value_is_one_line_before_any_model_loads(tmp_path, monkeypatch, overrides):
    """Values whose type is right but which `generate` or the learner cannot use (a zero temperature, a negative
    top_k, a clip range outside (0, 1], ...) are refused from the ranges declared beside their parameters, naming
    the key, before any model is built."""

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built for an invalid configuration")

    for builder in ("build_tiny_gpt2", "build_tiny_llama", "load_pretrained"):
        monkeypatch.setattr(cory.models, builder, no_model)
    experiment = [] if "experiment=" in overrides else ["experiment=smoke"]
    args = [*experiment, "progress=false", f"cache_dir={tmp_path / 'cache'}", *overrides.split()]
    with pytest.raises(ConfigError) as err:
        train(compose_cfg(args), tmp_path / "run")
    assert str(err.value).startswith(DEGENERATE[overrides]) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


LEARNER_PARTS = [PPOConfig, GAE, GRPO, RLOO, ClippedPPO, ClippedPPOKLInLoss, CentralizedCritic, RoleSwap, Interleaved]


@pytest.mark.parametrize("cls", [RunSettings, HardwareSettings, *LEARNER_PARTS, Sequential, SFTSettings, Generation])
def test_every_number_of_the_run_and_the_learners_has_a_declared_range(cls):
    """A new numeric setting cannot slip past the range check: each int or float field declares its range."""
    hints = typing.get_type_hints(cls)

    def number(hint) -> bool:  # takes an integer, but not any value (a class annotation takes anything)
        return type_problem(1, hint) is None and type_problem("a", hint) is not None

    numbers = [f.name for f in dataclasses.fields(cls) if number(hints[f.name])]
    assert numbers and set(numbers) <= set(declared_ranges(cls)), sorted(set(numbers) - set(declared_ranges(cls)))
    assert {"temperature", "top_k", "top_p", "repetition_penalty"} <= set(SAMPLING)  # the Task protocol's keys


# ------------------------------------------------------------------------------------------- builtin targets
BUILTIN_TARGETS = {  # overrides → the one-line message starts with
    "task._target_=builtins.dict": "task._target_=builtins.dict: a Python builtin",
    "task=imdb task.reward._target_=builtins.int": "task.reward._target_=builtins.int: a Python builtin",
    "model._target_=builtins.dict": "model._target_=builtins.dict: a Python builtin",
    "logger._target_=builtins.dict": "logger._target_=builtins.dict: a Python builtin",
    f"{A}._target_=builtins.float": f"{A}._target_=builtins.float: a Python builtin",
    "task._target_=cory.tasks.rewards.TfidfSentimentReward": "task._target_=cory.tasks.rewards.TfidfSentimentReward: "
    "not a task; it lacks train_queries, eval_queries, pioneer_prompt, observer_prompt, score (the Task protocol",
    "task=imdb task.reward._target_=cory.tasks.toy.ToyTask": "task.reward._target_=cory.tasks.toy.ToyTask: its "
    "instances cannot be called, and task.reward must be callable",
}


@pytest.mark.parametrize("overrides", list(BUILTIN_TARGETS))
def test_a_target_that_does_not_fit_its_place_is_one_line(tmp_path, monkeypatch, overrides):
    """A builtin type where a task, reward, model, logger or learner belongs (its keys cannot be checked against a
    signature it does not have), a class that is not a task, a reward whose instances cannot score: one line."""
    monkeypatch.setattr(cory.models, "build_tiny_gpt2", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(ConfigError) as err:
        train(smoke(tmp_path, *overrides.split()), tmp_path / "run")
    assert str(err.value).startswith(BUILTIN_TARGETS[overrides]) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------- the error boundary
def _interrupted_import():
    """What a library may make of Ctrl-C: the KeyboardInterrupt as the cause of another exception."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as err:
        raise ImportError("initialization of _C failed") from err


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (ConfigError("seed=-1: must be in [0, 2^32)"), 2, "error: seed=-1: must be in [0, 2^32)"),
        (AssetUnavailableError("no model 'gpt2'\n offline"), 2, "error: no model 'gpt2' offline"),
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/out/passk.json"),
            2,
            "error: cannot write /data/out/passk.json (No space left on device); free space or fix permissions",
        ),
        (KeyboardInterrupt(), 130, "error: interrupted (SIGINT); nothing was kept"),
        (_interrupted_import, 130, "error: interrupted (SIGINT); nothing was kept"),
    ],
    ids=["config", "asset", "disk-full", "ctrl-c", "ctrl-c-inside-a-library"],
)
def test_the_error_boundary_makes_expected_failures_one_line(capsys, raised, code, line):
    @entry_point()
    def main() -> None:
        if isinstance(raised, BaseException):
            raise raised
        raised()

    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == code and capsys.readouterr().err == line + "\n"


def test_the_error_boundary_keeps_the_traceback_of_a_bug():
    @entry_point()
    def main() -> None:
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        main()


# Ctrl-C at a moment of start-up: the script says which one in a marker file, then waits there for the signal.
_STARTING = """
import runpy, signal, sys, time
from pathlib import Path
# Ctrl-C as in a terminal (a process started in the background of a non-interactive shell inherits SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
marker, moment = Path(sys.argv.pop(1)), sys.argv.pop(1)
def wait(*args, **kwargs):
    marker.write_text(moment)
    while True:
        time.sleep(0.05)
if moment == "importing torch":
    class Importing:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                wait()
    sys.meta_path.insert(0, Importing())
else:  # composing the config, as the command line is checked
    import cory.cli
    cory.cli.compose = wait
runpy.run_module("cory.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("moment", ["importing torch", "composing the config"])
def test_ctrl_c_at_any_moment_of_start_up_is_one_line_and_exit_code_130(tmp_path, moment):
    """`python -m cory.train`: Ctrl-C while torch is being imported (the first seconds) or while the command line is
    checked: one line, exit code 130, no traceback, no folder (Ctrl-C while the model loads: test_robustness.py)."""
    run_dir, marker = tmp_path / "run", tmp_path / "moment"
    args = ["experiment=smoke", "progress=false", f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"]
    cmd = [sys.executable, "-c", _STARTING, str(marker), moment, *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines() == ["error: interrupted (SIGINT) before the run began; nothing was kept"]
    assert not run_dir.exists()


def test_the_command_of_extending_md_answers_in_one_line(capsys):
    """docs/extending.md's "A command" example, run as printed: its own expected failure is one line, code 2."""
    page = (REPO / "docs" / "extending.md").read_text().split("## A command", 1)[1]
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/extending.md", "exec"), namespace)
    with pytest.raises(SystemExit) as exit_:
        namespace["main"](["outputs/runs/one"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: 1 run folder given: a comparison needs two or more\n"
