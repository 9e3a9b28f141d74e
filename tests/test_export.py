"""`cory-export` (`python -m cory.export`): one trained agent of a run as a `save_pretrained` folder.

Each export is loaded the way a user of another library loads it (transformers' `AutoModelForCausalLM`, PEFT's
`PeftModel`) and its logits are compared with the checkpoint's own policy on a few inputs: a full fine-tune (CORY's
llm2), a LoRA run merged into its base and kept as an adapter, an older checkpoint by `--iteration`. The value head
stays behind. No checkpoint, an unknown agent or iteration and a non-empty `--out` are one `error:` line, exit 2.

Run: `pytest tests/test_export.py` (about a minute on 2 CPUs: two smoke runs, a subprocess export).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.runners import REPO, env
from safetensors.torch import load_file

import cory.export
from cory.build import build_backbone
from cory.checkpoints import ALGORITHM_DIR
from cory.evaluate import load_config
from cory.train import train

TEXTS = ["the movie was", "a b c d e f", "12 + 7 ="]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """A finished 4-iteration CORY smoke run (full fine-tuning, checkpoints iter_000002 and iter_000004)."""
    run_dir = tmp_path_factory.mktemp("export-full") / "run"
    train(compose_cfg(["experiment=smoke", "algorithm=cory", "progress=false"]), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A finished 2-iteration PPO smoke run with LoRA adapters."""
    run_dir = tmp_path_factory.mktemp("export-lora") / "run"
    train(compose_cfg(["experiment=smoke", "model.lora.enabled=true", "iterations=2", "progress=false"]), run_dir)
    return run_dir


def checkpoint_logits(run_dir: Path, checkpoint: str, agent: str) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(input ids, the checkpoint's policy logits, tokenizer): the agent as the trainer and `cory.evaluate` hold it."""
    cfg = load_config(run_dir, [])
    backbone = build_backbone(cfg.model, "cpu")
    policy = backbone.policy("reference", init_seed=0)
    policy.load_weights(run_dir / "checkpoints" / checkpoint / ALGORITHM_DIR / agent)
    ids, mask = encode(backbone.tokenizer)
    with torch.no_grad():
        logits, _ = policy(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    return ids, logits, backbone.tokenizer


def encode(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    keep = batch["attention_mask"].all(0)  # positions every text fills: no padding in the comparison
    return batch["input_ids"][:, keep], batch["attention_mask"][:, keep]


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()


def export_main(*argv: str, capsys) -> tuple[int, str]:
    try:
        cory.export.main(list(argv))
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def test_a_full_fine_tune_exports_as_a_transformers_model_with_the_checkpoints_logits(full_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "llm2"
    done = subprocess.run(  # the command as a user types it
        [sys.executable, "-m", "cory.export", str(full_run), "--agent", "llm2", "--out", str(out)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ids, want, tokenizer = checkpoint_logits(full_run, "iter_000004", "llm2")
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits_of(model, ids), want, rtol=1e-5, atol=1e-5)
    untrained = build_backbone(load_config(full_run, []).model, "cpu").base  # not vacuous: the trained weights count
    assert not torch.allclose(logits_of(untrained, ids), want)
    assert AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]
    assert not [k for k in load_file(str(out / "model.safetensors")) if "v_head" in k]  # the critic stays behind
    info = json.loads((out / "cory_export.json").read_text())
    assert [info[k] for k in ("agent", "checkpoint", "iteration", "weights")] == ["llm2", "iter_000004", 4, "full"]


def test_an_older_checkpoint_by_iteration(full_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    assert export_main(str(full_run), "--iteration", "2", "--out", str(tmp_path / "it2"), capsys=capsys)[0] == 0
    ids, want, _ = checkpoint_logits(full_run, "iter_000002", "llm1")
    got = logits_of(AutoModelForCausalLM.from_pretrained(tmp_path / "it2"), ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, checkpoint_logits(full_run, "iter_000004", "llm1")[1])
    assert json.loads((tmp_path / "it2" / "cory_export.json").read_text())["iteration"] == 2


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_a_lora_run_exports_merged_or_as_a_peft_adapter(lora_run, tmp_path, capsys, mode):
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / mode
    assert export_main(str(lora_run), "--lora", mode, "--out", str(out), capsys=capsys)[0] == 0
    ids, want, _ = checkpoint_logits(lora_run, "iter_000002", "llm1")
    if mode == "merged":  # a plain model: no adapter files, no LoRA weights
        assert not (out / "adapter_config.json").exists()
        assert not [k for k in load_file(str(out / "model.safetensors")) if "lora" in k or "v_head" in k]
        got = logits_of(AutoModelForCausalLM.from_pretrained(out), ids)
    else:  # PEFT's adapter folder; this tiny model was built in memory, so its base is written beside it
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str((out / "base").resolve())
        assert not [k for k in load_file(str(out / "adapter_model.safetensors")) if "v_head" in k]
        base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
        got = logits_of(PeftModel.from_pretrained(base, out), ids)
        torch.testing.assert_close(logits_of(AutoPeftModelForCausalLM.from_pretrained(out), ids), got)
        assert not torch.allclose(logits_of(AutoModelForCausalLM.from_pretrained(out / "base"), ids), want, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert json.loads((out / "cory_export.json").read_text())["weights"] == f"lora {mode}"


def test_a_run_with_a_config_override_exports_the_model_it_trained(tmp_path, capsys):
    """`+model.config_overrides.activation_function=gelu_pytorch_tanh` (GPT-2's GELU in one kernel): the export's
    config keeps the attribute, so the folder loads into the function the agent was trained as."""
    from transformers import AutoModelForCausalLM
    from transformers.activations import ACT2FN

    from cory.models import build_tiny_gpt2

    folder = tmp_path / "gpt2"
    for part in build_tiny_gpt2(seed=0):  # a local GPT-2 folder, as `model=gpt2 model.name_or_path=DIR` loads
        part.save_pretrained(folder)
    fused = "+model.config_overrides.activation_function=gelu_pytorch_tanh"
    run_dir = tmp_path / "run"
    overrides = ["experiment=smoke", "model=gpt2", f"model.name_or_path={folder}", fused, "iterations=2"]
    train(compose_cfg([*overrides, "progress=false"]), run_dir)
    assert export_main(str(run_dir), "--out", str(tmp_path / "out"), capsys=capsys)[0] == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["activation_function"] == "gelu_pytorch_tanh"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert {type(block.mlp.act) for block in model.transformer.h} == {type(ACT2FN["gelu_pytorch_tanh"])}
    ids, want, _ = checkpoint_logits(run_dir, "iter_000002", "llm1")
    torch.testing.assert_close(logits_of(model, ids), want, rtol=1e-5, atol=1e-5)
    assert json.loads((folder / "config.json").read_text())["activation_function"] == "gelu_new"


def test_expected_failures_are_one_line_with_exit_code_2(full_run, tmp_path, capsys):
    no_checkpoint = tmp_path / "fresh"  # a run folder without any checkpoint
    no_checkpoint.mkdir()
    shutil.copy(full_run / "run_config.yaml", no_checkpoint / "run_config.yaml")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    cases = {
        (str(no_checkpoint), "--out", str(tmp_path / "a")): "has no checkpoint yet",
        (str(full_run), "--agent", "llm3", "--out", str(tmp_path / "b")): "--agent llm3: ",
        (str(full_run), "--iteration", "3", "--out", str(tmp_path / "c")): "iter_000002, iter_000004",
        (str(full_run), "--out", str(busy)): "is not an empty folder",
        (str(tmp_path), "--out", str(tmp_path / "d")): "neither a cory run folder",
        (str(full_run), "--lora", "adapter", "--out", str(tmp_path / "e")): "has no adapter to export",
        (str(full_run), "--out", str(tmp_path / "f"), "model.n_embd=64"): "export with the run's own model settings",
    }
    for argv, message in cases.items():
        code, err = export_main(*argv, capsys=capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "fresh"]  # nothing written, no temporary left
    assert (busy / "something").read_text() == "x"


def test_the_console_command_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["cory-export"] == "cory.export:main"
