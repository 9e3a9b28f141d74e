"""LoRA agents on one frozen base (`cory/policy.py`), on the tiny in-memory Llama of `experiment=gsm8k_smoke`.

Covers: CORY's agents are two named adapters over one PEFT model, start identical and share no trainable
parameter; learning moves only the learner's adapter and value head, the base stays bit-identical; π0 (adapters
disabled) gives exactly the adapter-free model's log-probs; trainable parameters are chosen by name (a
`requires_grad` filter picks the other agent's adapter); a role swap leaves every adapter and Adam state with its
agent; one shared base gives the same numbers as separate copies; checkpoints hold the adapter and value head
only and load back exactly; a SIGKILLed LoRA run resumes exactly; full fine-tuning runs on the same code; BOS and
generation settings come from the model config, never from a checkpoint; 4-bit is refused on a CPU in one line
and runs PPO and CORY on a GPU (`gpu`). Run: `pytest tests/test_lora.py` (about a minute on 2 CPUs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.from_config import algorithm_from
from helpers.runners import assert_same_rows, cli, env, read_rows, run_cli, wait_for_train_row
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import load_file

from cory.build import load_model
from cory.config import validate
from cory.errors import ConfigError
from cory.models import build_tiny_gpt2, build_tiny_llama, load_pretrained
from cory.policy import HANDLE_KEYS, AdapterFreeReference, LoraSettings
from cory.ppo.learner import Batch
from cory.ppo.rollout import generate
from cory.train import train

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]
QUERIES = ["What is the result of 3+4?", "What is the result of 8-2?", "What is the result of 5+5?"] * 2


def smoke(*overrides: str):
    return compose_cfg(["experiment=gsm8k_smoke", "progress=false", *overrides])


def make_algorithm(cfg):
    """The algorithm `train` builds from `cfg`, with its backbone (no trainer, no logger); every iteration trains
    on `QUERIES` with 4 new tokens."""
    algorithm = algorithm_from(cfg, batch=(QUERIES, 4))
    return algorithm, algorithm.team.context.backbone()


def adapter(agent) -> dict[str, torch.Tensor]:
    """The agent's own adapter weights, by name."""
    return {
        n: p.detach().clone()
        for n, p in agent.trainee.policy.pretrained_model.named_parameters()
        if f".{agent.name}." in n and "lora_" in n
    }


def base_weights(peft_model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in before if not torch.equal(before[k], after[k])]


def step(algorithm, iterations: int, start: int = 0) -> None:
    for k in range(start, start + iterations):
        algorithm.step(k)


# --------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize("build, conv1d", [(build_tiny_gpt2, True), (build_tiny_llama, False)])
def test_the_lora_config_fits_the_models_layers_so_peft_changes_and_warns_of_nothing(build, conv1d):
    """GPT-2's projections are transformers' `Conv1D` ([in, out] weights): PEFT needs `fan_in_fan_out` there and, left
    at its default, sets it itself with a warning per layer. The config we build says it; the adapters are PEFT's."""
    from peft import LoraConfig, get_peft_model

    settings = LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=None, share_base=True)
    ours, _ = build()
    config = settings.peft_config(ours)
    assert config.fan_in_fan_out is conv1d
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # PEFT's own warnings; FutureWarning is transformers' renames
        torch.manual_seed(0)
        ours = get_peft_model(ours, config, adapter_name="llm1")
    assert config.fan_in_fan_out is conv1d  # PEFT changed nothing

    theirs, _ = build()
    default = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        theirs = get_peft_model(theirs, default, adapter_name="llm1")
    assert any("fan_in_fan_out" in str(w.message) for w in caught) is conv1d
    assert default.fan_in_fan_out is conv1d  # what PEFT settled on is what we set
    a, b = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert a.keys() == b.keys() and any("lora_A" in n for n in a)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_cory_agents_are_two_adapters_on_one_frozen_base():
    algorithm, backbone = make_algorithm(smoke("algorithm=cory"))
    a, b = algorithm.agents["llm1"], algorithm.agents["llm2"]
    peft = backbone.peft_model
    assert (
        a.trainee.policy.pretrained_model is peft and b.trainee.policy.pretrained_model is peft
    )  # one base in memory
    assert set(peft.peft_config) == {"llm1", "llm2"}
    # identical start: same LoRA initialisation and value head, drawn from the run seed
    assert list(adapter(a).values()) and all(
        torch.equal(x, y) for x, y in zip(adapter(a).values(), adapter(b).values())
    )
    assert torch.equal(a.trainee.policy.v_head.summary.weight, b.trainee.policy.v_head.summary.weight)
    # what each optimiser steps: its own adapter and value head, nothing shared, no base weight
    own_a, own_b = {id(p) for p in a.trainee.trainable_parameters()}, {id(p) for p in b.trainee.trainable_parameters()}
    assert not own_a & own_b
    lora_a = {id(p) for n, p in peft.named_parameters() if ".llm1." in n}
    assert own_a == lora_a | {id(p) for p in a.trainee.policy.v_head.parameters()}
    assert {id(p) for g in a.trainee.engine.optimizer.param_groups for p in g["params"]} == own_a
    assert all(not p.requires_grad for n, p in peft.named_parameters() if "lora_" not in n)
    assert isinstance(a.actor.reference, AdapterFreeReference) and b.actor.reference is a.actor.reference
    assert list(a.actor.reference.parameters()) == []  # π0 owns no weights: it is the base with adapters disabled


def test_learning_moves_each_agents_adapter_and_never_the_base():
    algorithm, backbone = make_algorithm(smoke("algorithm=cory"))
    a, b = algorithm.agents["llm1"], algorithm.agents["llm2"]
    base_before, a_before, b_before = base_weights(backbone.peft_model), adapter(a), adapter(b)
    head_before = a.trainee.policy.v_head.summary.weight.detach().clone()
    step(algorithm, 2)
    assert changed(base_before, base_weights(backbone.peft_model)) == []  # bit-identical base
    assert changed(a_before, adapter(a)) and changed(b_before, adapter(b))
    assert not torch.equal(a.trainee.policy.v_head.summary.weight, head_before)
    assert any(not torch.equal(x, y) for x, y in zip(adapter(a).values(), adapter(b).values()))


def test_reference_log_probs_equal_the_adapter_free_model():
    cfg = smoke("algorithm=cory")
    algorithm, _ = make_algorithm(cfg)
    step(algorithm, 2)  # non-zero adapters
    loader = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k not in HANDLE_KEYS}
    plain, tokenizer = instantiate(loader)
    agent = algorithm.agents["llm1"]
    prompts = [torch.tensor(tokenizer(q)["input_ids"]) for q in QUERIES[:3]]
    responses = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 5, 2)]
    rollout = agent.actor.score_tokens(prompts, responses)  # left-padded prompts, right-padded responses
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids = torch.cat([p, r])[None]
            logits = plain(input_ids=ids).logits[0, len(p) - 1 : len(p) + len(r) - 1]
            want = torch.log_softmax(logits.float(), -1).gather(-1, r[:, None]).squeeze(-1)
            torch.testing.assert_close(rollout.ref_logprobs[i, : len(r)], want, rtol=0, atol=1e-5)
    # the adapters matter, so the comparison above has teeth
    assert (rollout.logprobs - rollout.ref_logprobs).abs().max() > 1e-4


def test_trainable_parameters_are_selected_by_name_not_requires_grad():
    algorithm, _ = make_algorithm(smoke("algorithm=cory"))
    a, b = algorithm.agents["llm1"], algorithm.agents["llm2"]
    b.trainee.policy.activate()  # PEFT now marks llm2's adapter trainable and llm1's frozen
    by_flag = {id(p) for p in a.trainee.policy.parameters() if p.requires_grad}
    assert by_flag & {id(p) for p in b.trainee.trainable_parameters()}  # the wrong filter would train llm2's adapter
    assert {id(p) for p in a.trainee.trainable_parameters()} == {
        id(p) for g in a.trainee.engine.optimizer.param_groups for p in g["params"]
    }
    rollout = a.actor.act(QUERIES, 4, {"do_sample": True, "top_k": 0}, 16)
    b_before, a_before = adapter(b), adapter(a)
    b.trainee.policy.activate()
    a.learner.update(Batch(rollout, torch.tensor([1.0, 0.0] * 3)))  # learning llm1 right after llm2 was active
    assert changed(a_before, adapter(a)) and changed(b_before, adapter(b)) == []


def test_role_swap_keeps_adapters_and_optimiser_state_with_their_agent():
    algorithm, _ = make_algorithm(smoke("algorithm=cory", "algorithm.schedule.period=1"))
    a = algorithm.agents["llm1"]
    step(algorithm, 1)  # llm1 pioneer; roles swap after this iteration
    assert algorithm.roles(0)["pioneer"] == "llm1" and algorithm.roles(1)["pioneer"] == "llm2"
    state = a.trainee.engine.optimizer.state_dict()["state"]
    steps = {float(s["step"]) for s in state.values()}
    assert len(state) == len(a.trainee.trainable_parameters()) and len(steps) == 1  # every owned parameter stepped
    names = {n for n, p in a.trainee.policy.named_parameters() if a.trainee.policy.owns(n)}
    assert names and all(".llm1." in n or n.startswith("v_head.") for n in names)
    step(algorithm, 1, start=1)  # llm1 now observer: its own Adam continues
    assert {float(s["step"]) for s in a.trainee.engine.optimizer.state_dict()["state"].values()} == {
        2 * next(iter(steps))
    }
    assert algorithm.roles(2)["pioneer"] == "llm1"


def test_the_official_swap_resets_each_agents_own_state():
    """`faithful_official_swap` with LoRA: fresh Adam over the same adapter, β back to its initial value."""
    cfg = smoke("algorithm=cory", "algorithm.schedule.period=1", "algorithm.schedule.faithful_official_swap=true")
    algorithm, _ = make_algorithm(cfg)
    a = algorithm.agents["llm1"]
    before = adapter(a)
    algorithm.step(0)
    # it learned, then the swap reset its training state and restarted the length draws
    assert algorithm.team.schedule.reseed_at == 1 and changed(before, adapter(a))
    assert (
        a.trainee.engine.optimizer.state_dict()["state"] == {}
        and a.learner.kl_ctl.value == cfg.algorithm.agent.init_kl_coef
    )
    assert {id(p) for g in a.trainee.engine.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in a.trainee.trainable_parameters()
    }


def test_one_shared_base_gives_the_numbers_of_separate_copies():
    """Adapter switching is exact: sharing the base changes memory, never a number."""
    metrics = {}
    for share in ("true", "false"):
        algorithm, _ = make_algorithm(smoke("algorithm=cory", f"model.lora.share_base={share}"))
        torch.manual_seed(0)
        outs = [algorithm.step(k).metrics for k in range(2)]
        metrics[share] = (outs, {i: adapter(agent) for i, agent in algorithm.agents.items()})
    shared, separate = metrics["true"], metrics["false"]
    assert shared[1]["llm1"] and all(
        torch.equal(shared[1][i][k], separate[1][i][k]) for i in shared[1] for k in shared[1][i]
    )
    for got, want in zip(shared[0], separate[0]):
        for key, value in want.items():
            if not key.startswith("time/"):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


# ------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_holds_adapter_and_value_head_only_and_loads_back(tmp_path):
    cfg = smoke("algorithm=ppo")
    algorithm, backbone = make_algorithm(cfg)
    agent = algorithm.agents["llm1"]
    step(algorithm, 1)
    agent.save(tmp_path / "llm1")
    files = sorted(p.name for p in (tmp_path / "llm1").iterdir())
    assert files == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "agent.json",
        "optimizer.pt",
        "value_head.safetensors",
    ]
    weights = load_file(str(tmp_path / "llm1" / "adapter_model.safetensors"))
    assert weights and all("lora_" in k for k in weights)  # no base weight, no adapter name: PEFT's format
    assert json.loads((tmp_path / "llm1" / "adapter_config.json").read_text())["r"] == cfg.model.lora.r
    fresh, _ = make_algorithm(cfg)
    other = fresh.agents["llm1"]
    assert changed(adapter(agent), adapter(other))
    other.load(tmp_path / "llm1")
    assert changed(adapter(agent), adapter(other)) == []
    assert torch.equal(agent.trainee.policy.v_head.summary.weight, other.trainee.policy.v_head.summary.weight)
    assert (
        other.trainee.engine.optimizer.state_dict()["state"].keys()
        == agent.trainee.engine.optimizer.state_dict()["state"].keys()
    )


@pytest.mark.long
@pytest.mark.slow
def test_a_killed_lora_run_resumes_exactly(tmp_path):
    args = ["experiment=gsm8k_smoke", "algorithm=cory", "iterations=6", "save_every=2", "algorithm.schedule.period=2"]
    train(compose_cfg([*args, "progress=false"]), tmp_path / "reference")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        cli(*args, "progress=false", f"hydra.run.dir={run_dir}"),
        cwd=REPO,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_train_row(run_dir, proc, 4)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    run_cli(f"resume={run_dir}")
    assert_same_rows(read_rows(run_dir), read_rows(tmp_path / "reference"))


# ----------------------------------------------------------------------------- full fine-tuning, tokens, 4 bit
def test_full_fine_tuning_runs_on_the_same_code(tmp_path):
    algorithm, backbone = make_algorithm(smoke("algorithm=cory", "model.lora.enabled=false"))
    a = algorithm.agents["llm1"]
    assert backbone.peft_model is None and a.trainee.policy.adapter is None
    assert all(p.requires_grad for p in a.trainee.trainable_parameters())
    before = {n: p.detach().clone() for n, p in a.trainee.policy.pretrained_model.named_parameters()}
    ref_before = {n: p.detach().clone() for n, p in a.actor.reference.named_parameters()}
    step(algorithm, 1)
    assert changed(before, dict(a.trainee.policy.pretrained_model.named_parameters()))
    assert changed(ref_before, dict(a.actor.reference.named_parameters())) == []
    a.save(tmp_path / "llm1")
    assert (tmp_path / "llm1" / "policy.safetensors").exists()


@pytest.mark.parametrize(("experiment", "bos"), [("gsm8k_smoke", True), ("smoke", False)])
def test_prompts_get_a_bos_when_the_model_config_says_so(experiment, bos):
    algorithm, backbone = make_algorithm(compose_cfg([f"experiment={experiment}", "algorithm=ppo"]))
    rollout = algorithm.agents["llm1"].actor.act(["ab", "abcd"], 2, {"do_sample": True, "top_k": 0}, 16)
    firsts = {int(row[mask.bool()][0]) for row, mask in zip(rollout.prompt_ids, rollout.prompt_mask)}
    lengths = rollout.prompt_mask.sum(-1).tolist()
    tok = backbone.tokenizer
    assert (firsts == {tok.bos_token_id}) is bos and lengths == [2 + bos, 4 + bos]
    assert (tok.bos_token_id != tok.eos_token_id) is bos


def test_a_checkpoints_generation_config_never_changes_sampling(tmp_path):
    model, tokenizer = build_tiny_llama(seed=3)
    model.generation_config.update(do_sample=True, temperature=0.05, top_k=1, top_p=0.5, repetition_penalty=5.0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, tok = load_pretrained(str(tmp_path))
    assert loaded.generation_config.temperature is None and loaded.generation_config.top_k is None
    # even a config set after loading cannot reach `generate`: every setting is passed explicitly
    loaded.generation_config.update(temperature=0.05, top_k=1, repetition_penalty=5.0, min_new_tokens=6)
    clean, _ = build_tiny_llama(seed=3)
    outs = []
    for m in (loaded, clean):
        torch.manual_seed(0)
        outs.append(generate(m, tok, ["ab", "xyz"], 6, {"do_sample": True, "top_k": 0}, CPU, 8, True)[1])
    assert all(torch.equal(x, y) for x, y in zip(*outs))


def test_4bit_is_refused_on_a_cpu_in_one_line(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(ConfigError, match=r"^model\.load_in_4bit=true needs CUDA") as err:
        validate(compose_cfg(["experiment=gsm8k_llama2", "hardware=cpu"]))
    assert "\n" not in str(err.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"^model\.load_in_4bit=true trains through LoRA"):
        validate(compose_cfg(["experiment=gsm8k_smoke", "model.load_in_4bit=true", "model.lora.share_base=false"]))
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)  # no bitsandbytes: refused before loading
    with pytest.raises(ConfigError, match=r"^model\.load_in_4bit=true needs bitsandbytes: pip install"):
        load_pretrained("/nonexistent", load_in_4bit=True)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["ppo", "cory"])
def test_4bit_lora_on_a_gpu(tmp_path, algorithm):
    """The 4-bit path: NF4 base, bf16 compute, LoRA adapters; the quantized weights never change."""
    cfg = smoke(f"algorithm={algorithm}", "hardware=gpu", "model.load_in_4bit=true", "iterations=2")
    model, _ = load_model(cfg.model)
    floats = {n: p.dtype for n, p in model.named_parameters() if p.is_floating_point()}
    assert floats and set(floats.values()) == {torch.float32}, floats  # head, embeddings, norms: fp32, as TRL's
    summary = train(cfg, tmp_path / "run")
    assert summary["completed"]
    for agent in summary["agents"].values():
        assert all(v == v for v in agent.values())  # finite (no NaN)
    files = {p.name for p in (tmp_path / "run" / "checkpoints").rglob("*.safetensors")}
    assert "adapter_model.safetensors" in files and "policy.safetensors" not in files
