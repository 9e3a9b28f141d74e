"""The learner's fast paths keep its numbers (README, cost section): each check fails on the slow or wrong variant.

- `runtime.all_finite`, the finite-gradient and finite-weight check, flags one inf or NaN anywhere and nothing
  else (huge finite values included, where a 2-norm or a sum would overflow);
- the agent steps torch's fused Adam on a CPU, whose weights stay within float32 rounding of the default
  implementation's over several updates;
- a checkpoint written by an unfused optimiser (runs from before the fused kernel) resumes on the fused kernel and
  continues bit for bit like the run that never stopped;
- the LM head of the policy and of the frozen reference receives a contiguous input (a strided one sends a frozen
  model's head to a slower batched matmul), on the response columns only, and the value head reads the same final
  hidden state as the LM head, for GPT-2, Llama and a LoRA policy;
- `runtime.keep_freed_memory` (`hardware.keep_freed_memory`): large tensors allocated again, step after step,
  reuse freed heap instead of faulting in fresh pages, the trainer gives that heap back after every iteration and
  evaluation (`runtime.release_freed_memory`), and a run logs the same numbers with it and without it;
- `model.config_overrides` puts GPT-2's GELU in one fused kernel on the same weights, within float32 rounding of
  the composed one, and refuses in one line an attribute the config lacks or a value the model cannot be built with.

No timing is asserted: speed is measured by `scripts/benchmark.py`.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.from_config import learner
from helpers.runners import cli, env, exact_rows, one_error_line, run_cli, start_run
from transformers.activations import ACT2FN

from cory import runtime
from cory.errors import ConfigError
from cory.models import build_tiny_gpt2, build_tiny_llama, load_pretrained, make_reference
from cory.policy import Backbone, LoraSettings
from cory.ppo.learner import Agent, Batch, agent_on

CFG = learner(learning_rate=1e-3, mini_batch_size=2, ppo_epochs=2)
SCORES = torch.tensor([1.0, -0.5, 2.0, 0.0])


def make_agent(seed: int = 0) -> Agent:
    model, tokenizer = build_tiny_gpt2(seed=0)
    return agent_on("llm1", model, make_reference(model), tokenizer, CFG, seed=seed)


def tokens(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in (3, 5, 2, 4)]
    responses = [torch.randint(0, 256, (n,), generator=g) for n in (4, 1, 6, 3)]
    return prompts, responses


def weights(agent: Agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.trainee.trainable_parameters()]


# ---------------------------------------------------------------------------------------------- all_finite
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_all_finite_flags_one_bad_element_wherever_it_is(bad):
    for n in (1, 7, 33, 1000):  # around the vector widths of the reduction kernels
        for i in range(n):
            x = torch.randn(n)
            x[i] = bad
            assert not runtime.all_finite([torch.ones(3), x]), (n, i)
    big = torch.randn(3_000_000)
    for i in (0, 1_234_567, 2_999_999):
        y = big.clone()
        y[i] = bad
        assert not runtime.all_finite([y])
        assert not runtime.all_finite([y.view(3, -1).t()])  # a non-contiguous view
        assert not runtime.all_finite([y.to(torch.bfloat16)])


def test_all_finite_passes_every_finite_tensor():
    huge = torch.full((1000,), 3.0e38)  # finite, but its 2-norm and its sum overflow to inf
    assert torch.isinf(torch.linalg.vector_norm(huge)) and torch.isinf(huge.sum())
    assert runtime.all_finite([huge, -huge, torch.zeros(5), torch.randn(4, 4).to(torch.bfloat16)])
    assert runtime.all_finite([]) and runtime.all_finite([torch.zeros(0), torch.ones(2)])


# ----------------------------------------------------------------------------------------------- fused Adam
def test_fused_adam_stays_within_rounding_of_the_default_adam():
    fused, default = make_agent(), make_agent()
    default.trainee.engine.optimizer = torch.optim.Adam(
        default.trainee.trainable_parameters(), lr=CFG.learning_rate, foreach=False
    )
    assert (
        fused.trainee.engine.optimizer.param_groups[0]["fused"]
        and not default.trainee.engine.optimizer.param_groups[0]["fused"]
    )
    start = weights(fused)
    for seed in range(3):  # 3 learn calls × 4 optimiser steps, each on the agents' own (near-equal) rollouts
        fused.learner.update(Batch(fused.actor.score_tokens(*tokens(seed)), SCORES))
        default.learner.update(Batch(default.actor.score_tokens(*tokens(seed)), SCORES))
    moved = max((a - b).abs().max().item() for a, b in zip(weights(fused), start))
    assert moved > 1e-3  # 12 steps at lr 1e-3 really moved the weights
    for (name, _), a, b in zip(fused.trainee.policy.named_parameters(), weights(fused), weights(default)):
        # the attention key bias has an analytically zero gradient (softmax ignores a constant per query row), so
        # Adam turns its float noise into steps of up to ~lr: both kernels agree there to 1e-4 (lr/10), elsewhere
        # to float32 rounding (1e-7 absolute, 1e-6 relative: a ten-thousandth of one step)
        atol, rtol = (1e-4, 0.0) if name.endswith("c_attn.bias") else (1e-7, 1e-6)
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("saved_kernel", ["fused", "unfused (an older checkpoint)"])
def test_a_checkpoint_resumes_on_the_fused_kernel_exactly(tmp_path, saved_kernel):
    a = make_agent()
    a.learner.update(Batch(a.actor.score_tokens(*tokens(0)), SCORES))
    a.save(tmp_path)
    if saved_kernel != "fused":  # what an unfused optimiser writes: the same tensors, `fused: None`
        state = torch.load(tmp_path / "optimizer.pt", weights_only=True)
        for group in state["param_groups"]:
            group["fused"] = None
        torch.save(state, tmp_path / "optimizer.pt")
    b = make_agent(seed=5)
    b.load(tmp_path)
    assert b.trainee.engine.optimizer.param_groups[0]["fused"]
    rollout = a.actor.score_tokens(*tokens(1))
    assert a.learner.update(Batch(rollout, SCORES)).stats == b.learner.update(Batch(rollout, SCORES)).stats
    assert all(torch.equal(x, y) for x, y in zip(weights(a), weights(b)))


def test_a_reset_optimizer_is_fused_too():
    agent = make_agent()
    agent.reset(reseed=False)  # the official swap's fresh Adam
    assert agent.trainee.engine.optimizer.param_groups[0]["fused"]
    agent.trainee.optimization = dataclasses.replace(agent.trainee.optimization, learning_rate=2e-3)
    agent.reset(reseed=False)
    assert agent.trainee.engine.optimizer.param_groups[0]["lr"] == 2e-3


# ------------------------------------------------------------------------------------------------ LM head
def _record_head_inputs(agent: Agent, seen: list[torch.Tensor]) -> list:
    """Hooks on the LM heads of the policy and of π0 (one module when LoRA shares the base)."""
    heads = {agent.trainee.policy.pretrained_model.get_output_embeddings()}
    if hasattr(agent.actor.reference, "get_output_embeddings"):  # a frozen copy; the LoRA reference is the shared base
        heads.add(agent.actor.reference.get_output_embeddings())
    return [head.register_forward_pre_hook(lambda _module, args: seen.append(args[0])) for head in heads]


def _lora_agent() -> Agent:
    model, tokenizer = build_tiny_llama()
    lora = LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"), share_base=True)
    backbone = Backbone(model, tokenizer, lora, add_special_tokens=True)
    policy = backbone.policy("llm1", init_seed=0)
    with torch.no_grad():  # a non-zero adapter, so that π and π0 differ
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return agent_on("llm1", policy, backbone.reference(), tokenizer, CFG, seed=0)


def _gpt2_agent() -> Agent:
    return make_agent()


def _llama_agent() -> Agent:
    model, tokenizer = build_tiny_llama()
    return agent_on("llm1", model, make_reference(model), tokenizer, CFG, seed=0)


@pytest.mark.parametrize("build", [_gpt2_agent, _llama_agent, _lora_agent], ids=["gpt2", "llama", "lora"])
def test_lm_heads_get_contiguous_response_columns_and_the_value_head_the_same_states(build):
    agent = build()
    base = agent.trainee.policy.pretrained_model
    rollout = agent.actor.score_tokens(*tokens(0))
    # the values are the value head on exactly the hidden states the LM head reads (after the final norm)
    p_ids, r_ids = rollout.prompt_ids, rollout.response_ids
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
    head_input: list[torch.Tensor] = []
    handles = _record_head_inputs(agent, head_input)
    with torch.no_grad():
        agent.trainee.policy.activate()
        hidden = base(
            input_ids=torch.cat([p_ids, r_ids], 1),
            attention_mask=mask,
            position_ids=(mask.cumsum(1) - 1).clamp(min=0),
            output_hidden_states=True,
            use_cache=False,
        ).hidden_states[-1]
    for handle in handles:
        handle.remove()
    assert torch.equal(hidden, head_input[0])
    with torch.no_grad():
        expected = agent.trainee.policy.v_head(hidden[:, p_ids.shape[1] - 1 : -1])
    assert rollout.values.abs().min() > 0
    torch.testing.assert_close(rollout.values, expected, atol=1e-6, rtol=0)
    # every LM head call, rollout (policy, π0) and learning (2 epochs × 2 minibatches), gets a contiguous input
    # holding the response columns and the one after them, never the prompt
    seen: list[torch.Tensor] = []
    handles = _record_head_inputs(agent, seen)
    try:
        agent.learner.update(Batch(agent.actor.score_tokens(*tokens(1)), SCORES))
    finally:
        for handle in handles:
            handle.remove()
    assert len(seen) == 2 + 4
    width = max(len(r) for r in tokens(1)[1])
    assert all(x.is_contiguous() and x.shape[1] == width + 1 for x in seen)


# ---------------------------------------------------------------------------------------- keep_freed_memory
FAULTS = """
import resource, sys, torch
from cory import runtime
applied = runtime.keep_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(16):  # a step's pattern: large tensors of two sizes, freed in another order than made
    before = faults()
    x = torch.ones(16 * 2**20); y = torch.ones(8 * 2**20); del x; z = torch.ones(16 * 2**20); del y, z
    counts.append(faults() - before)
print(applied, sum(counts[-4:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_large_tensors_allocated_again_reuse_the_heap_instead_of_fresh_pages():
    """Each cycle makes 64, 32 and 64 MB tensors (above glibc's mmap threshold) and frees them. By default every
    cycle maps them afresh and faults in all their 40,960 pages again; after `keep_freed_memory` the heap they were
    freed into serves them once it has grown to hold a cycle (a few cycles: the first blocks freed are not always
    reusable at once), and the last four of sixteen cycles fault in (almost) nothing. Each case in a process of its
    own, because the setting is process-wide."""

    def last_cycles(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
        applied, faults = out.stdout.split()
        return applied, int(faults)

    default, kept = last_cycles("default"), last_cycles("keep")
    assert default[0] == "None" and default[1] > 4 * 40_000, default
    assert kept[0] == "True" and kept[1] < 1_000, kept


RELEASE = """
import os, torch
from cory import runtime
def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
released = runtime.release_freed_memory()  # before keep_freed_memory: nothing to release, nothing done
runtime.keep_freed_memory()
x = torch.ones(64 * 2**20); del x  # 256 MB, freed into the heap, which keeps it
kept = resident_mb()
print(released, runtime.release_freed_memory(), round(kept - resident_mb()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_the_heap_kept_for_a_step_goes_back_to_the_kernel_when_released():
    """What `keep_freed_memory` keeps would stay resident for ever; `release_freed_memory`, which the trainer calls
    after every iteration and evaluation, gives it back: a freed 256 MB tensor stays resident until then and leaves
    with it. Before `keep_freed_memory` it does nothing (glibc returns large blocks by itself then)."""
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True)
    before, released, freed_mb = out.stdout.split()
    assert before == "False" and released == "True"
    assert int(freed_mb) > 200, out.stdout


def test_the_trainer_releases_the_kept_heap_after_every_iteration_and_evaluation(tmp_path: Path, monkeypatch):
    """The release is the trainer's (the step's reuse is inside an iteration): the smoke run's 2 iterations and its
    2 evaluations (before training and at the end) release once each."""
    calls = []
    monkeypatch.setattr(runtime, "release_freed_memory", lambda: calls.append(1) or True)
    start_run(tmp_path, tmp_path / "run", "iterations=2", "save_every=0")
    assert len(calls) == 4


@pytest.mark.slow
def test_a_run_logs_the_same_numbers_with_and_without_kept_memory(tmp_path: Path):
    """Where the bytes live changes, not the arithmetic: the smoke run of CORY, in two fresh processes, logs identical
    rows (wall times and memory aside)."""

    def rows(flag: str) -> list[dict]:
        run = tmp_path / flag
        run_cli("experiment=smoke", "algorithm=cory", "iterations=2", "progress=false",
                f"hardware.keep_freed_memory={flag}", f"hydra.run.dir={run}",
                f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
        return exact_rows(run)

    kept, default = rows("true"), rows("false")
    assert len(kept) >= 3 and kept == default


# ------------------------------------------------------------------------------------------------ length_groups
@pytest.mark.long  # two CORY runs in subprocesses; the forward's equivalence itself is tests/test_agent.py's
def test_a_run_in_length_groups_logs_the_numbers_of_one_rectangle_up_to_rounding(tmp_path: Path):
    """`hardware.length_groups=3` changes the products' shapes, not what is computed: the smoke run of CORY logs the
    same held-out evaluation before training and the same first iteration (both sample the same tokens: sampling
    does not go through the grouped forward) within float32 rounding, stated here as 1e-4 relative or 1e-5
    absolute per number. Later rows are not compared: a rounding difference in the weights may change a later
    sampled token, after which the runs are two draws."""

    def rows(groups: int) -> list[dict]:
        run = tmp_path / str(groups)
        run_cli("experiment=smoke", "algorithm=cory", "iterations=1", "progress=false",
                f"hardware.length_groups={groups}", f"hydra.run.dir={run}",
                f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
        return exact_rows(run)[:2]  # the evaluation at iteration 0, then iteration 1's training row

    grouped, default = rows(3), rows(1)
    assert [r["iteration"] for r in default] == [0, 1] and grouped[0].keys() == default[0].keys()
    differ = 0
    for got, want in zip(grouped, default):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
            differ += got[key] != value
    assert differ > 0  # the shapes did change: not the same rectangles under another name


# ----------------------------------------------------------------------------------------------- config overrides
@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    """A tiny GPT-2 saved as a local folder (what `model=gpt2 model.name_or_path=DIR` loads), with GPT-2's GELU."""
    model, tokenizer = build_tiny_gpt2(seed=0)
    assert model.config.activation_function == "gelu_new"
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_config_override_runs_gpt2s_gelu_as_one_fused_kernel_on_the_same_weights(gpt2_folder: Path):
    """The same weights load into blocks whose activation is torch's fused tanh GELU; the log-probabilities stay
    within float32 rounding of the composed `gelu_new`'s (1e-5 absolute); the folder is not changed."""
    config_file = gpt2_folder / "config.json"
    before = config_file.read_bytes()
    plain, _ = load_pretrained(str(gpt2_folder))
    fused, _ = load_pretrained(str(gpt2_folder), config_overrides={"activation_function": "gelu_pytorch_tanh"})
    assert {type(block.mlp.act) for block in plain.transformer.h} == {type(ACT2FN["gelu_new"])}
    assert {type(block.mlp.act) for block in fused.transformer.h} == {type(ACT2FN["gelu_pytorch_tanh"])}
    assert type(ACT2FN["gelu_new"]) is not type(ACT2FN["gelu_pytorch_tanh"])
    weights = plain.state_dict()
    assert all(torch.equal(weights[name], tensor) for name, tensor in fused.state_dict().items())
    ids = torch.randint(0, 256, (4, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = (torch.log_softmax(m(input_ids=ids).logits, -1) for m in (plain, fused))
    assert torch.allclose(got, want, rtol=0, atol=1e-5)
    assert config_file.read_bytes() == before


def test_a_config_override_the_model_cannot_take_is_refused_before_the_weights_load(gpt2_folder: Path):
    with pytest.raises(ConfigError, match=r"has no activaton_function; did you mean activation_function\?"):
        load_pretrained(str(gpt2_folder), config_overrides={"activaton_function": "gelu_pytorch_tanh"})
    with pytest.raises(ConfigError, match=r"cannot be built with them \(KeyError: 'gelu_fast2'\)"):
        load_pretrained(str(gpt2_folder), config_overrides={"activation_function": "gelu_fast2"})
    # from the command line: one line, exit code 2
    typo = "+model.config_overrides.activaton_function=gelu_pytorch_tanh"
    run = f"hydra.run.dir={gpt2_folder.parent / 'run'}"
    args = cli("experiment=smoke", "model=gpt2", f"model.name_or_path={gpt2_folder}", "progress=false", typo, run)
    out = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=300)
    assert "did you mean activation_function?" in one_error_line(out)
