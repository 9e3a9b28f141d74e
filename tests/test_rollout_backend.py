"""Rollout backends (`cory/ppo/backends.py`, `cory/ppo/vllm_backend.py`): the update's numbers never depend on which
engine sampled the tokens, and the vLLM translation of our settings and weight names, checked without vLLM.

The real engine is compared with Hugging Face `generate` by the `gpu` tests at the end (vLLM is a CUDA-only extra).
"""

from __future__ import annotations

import pytest
import torch
from helpers.compose import compose_cfg
from helpers.from_config import learner

from cory.errors import ConfigError
from cory.models import build_tiny_gpt2, build_tiny_llama, make_reference
from cory.policy import Backbone, LoraSettings, PolicyWithValueHead
from cory.ppo.backends import HFBackend, make_backends
from cory.ppo.learner import Agent, Batch, agent_on
from cory.ppo.rollout import encode_prompts, generate
from cory.ppo.vllm_backend import VLLMEngine, engine_config, hf_weights, lora_rank, response_ids, sampling_settings
from cory.settings import RolloutSettings, RunSettings

EOS = 7


# ------------------------------------------------------------------------------------------- settings → vLLM
def test_imdb_sampling_maps_to_vllm_settings() -> None:
    """The IMDB task's sampling (TRL's: pure sampling, repetition penalty 1.1): top-k 0 (off) becomes vLLM's -1."""
    kwargs = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.1}
    assert sampling_settings(kwargs, 15, EOS) == {
        "n": 1,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.1,
        "max_tokens": 15,
        "min_tokens": 0,
        "ignore_eos": True,
        "stop_token_ids": [7],
        "detokenize": False,
    }


def test_greedy_and_truncated_sampling_map_to_vllm_settings() -> None:
    greedy = sampling_settings({"do_sample": False, "top_k": 50, "top_p": 0.9, "temperature": 0.7}, 4, EOS)
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"]) == (0.0, -1, 1.0)  # greedy ignores the rest
    assert sampling_settings({}, 4, EOS)["temperature"] == 0.0  # Hugging Face's default is greedy too
    kwargs = {"do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 0.7, "min_p": 0.05}
    sampled = sampling_settings(kwargs, 4, 2)
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"], sampled["min_p"]) == (0.7, 50, 0.9, 0.05)
    assert sampled["stop_token_ids"] == [2] and sampled["max_tokens"] == 4


def test_settings_vllm_cannot_reproduce_are_refused() -> None:
    assert sampling_settings({"num_beams": 1, "typical_p": 1.0, "suppress_tokens": None}, 4, EOS)["n"] == 1
    for extra in ({"num_beams": 4}, {"no_repeat_ngram_size": 3}, {"typical_p": 0.9}, {"logits_processor": []}):
        with pytest.raises(ValueError, match="rollout=hf"):
            sampling_settings({"do_sample": True} | extra, 4, EOS)


def test_vllm_completions_read_as_hugging_face_responses() -> None:
    """Cut after the first EOS (kept); a stop on EOS that the engine did not return gets it back; a response that
    ran out of tokens stays as it is."""
    assert response_ids([5, 6, EOS, 9], "stop", EOS).tolist() == [5, 6, EOS]
    assert response_ids([5, 6], "stop", EOS).tolist() == [5, 6, EOS]
    assert response_ids([5, 6], "length", EOS).tolist() == [5, 6]
    assert response_ids([EOS], "stop", EOS).tolist() == [EOS]


def test_lora_ranks_fit_the_engine() -> None:
    assert [lora_rank(r) for r in (1, 8, 9, 64)] == [8, 8, 16, 64]
    with pytest.raises(ConfigError):
        lora_rank(1024)


# ------------------------------------------------------------------------------------------- weight names
def test_full_policy_weights_have_checkpoint_names_without_the_value_head() -> None:
    model, _ = build_tiny_gpt2()
    policy = PolicyWithValueHead(model)
    weights = dict(hf_weights(policy))
    assert set(weights) == {n for n, _ in model.named_parameters()}  # the tied LM head appears once, as wte
    assert "lm_head.weight" not in weights and not any("v_head" in n or "summary" in n for n in weights)
    assert weights["transformer.wte.weight"].data_ptr() == model.transformer.wte.weight.data_ptr()


def test_lora_policy_pushes_the_base_under_plain_names_and_no_adapter() -> None:
    """PEFT renames adapted layers (`base_model.model.` prefix, `.base_layer`) and adds adapter weights; the engine
    gets the plain model's names and values, for either agent of a shared base."""
    plain, _ = build_tiny_llama()
    expected = {n: p.detach().clone() for n, p in plain.named_parameters()}
    model, tokenizer = build_tiny_llama()
    lora = LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=None, share_base=True)
    backbone = Backbone(model, tokenizer, lora, add_special_tokens=True)
    policies = [backbone.policy(name, init_seed=0) for name in ("llm1", "llm2")]
    assert any(".base_layer." in n for n, _ in policies[0].pretrained_model.named_parameters())
    for policy in policies:
        weights = dict(hf_weights(policy))
        assert set(weights) == set(expected)
        assert all(torch.equal(weights[n], expected[n]) for n in expected)
    config = engine_config(model.config)
    assert config["hidden_size"] == 32 and "quantization_config" not in config


# ------------------------------------------------------------------------------------------- the seam
class FixedTokens:
    """A backend that ignores the policy and returns fixed response ids: what any engine looks like to the agent."""

    def __init__(self, responses: list[list[int]]) -> None:
        self.responses, self.synced = responses, 0

    def sync_weights(self, policy) -> None:
        self.synced += 1

    def generate(self, prompt_ids, max_new_tokens, generation_kwargs, batch_size):
        return [torch.tensor(r) for r in self.responses]


def _agent(backend=None) -> Agent:
    model, tokenizer = build_tiny_gpt2()
    config = learner(mini_batch_size=2, ppo_epochs=1, init_kl_coef=0.1)
    return agent_on("llm1", model, make_reference(model), tokenizer, config, seed=0, backend=backend)


def test_the_update_uses_hugging_face_log_probs_of_the_backends_tokens() -> None:
    """Whatever sampled them, the rollout's π_old log-probs are a plain Hugging Face forward of exactly those tokens,
    one sequence at a time without padding, so the update's numbers do not depend on the backend."""
    model, tokenizer = build_tiny_gpt2()
    eos = tokenizer.eos_token_id
    responses = [[72, 105, eos], [65, 66, 67], [10, 11, 12, 13]]  # as a backend returns them: cut after EOS
    agent = _agent(FixedTokens(responses))
    prompts = ["The film", "A", "Once upon a time"]
    rollout = agent.actor.act(prompts, max_new_tokens=4, generation_kwargs={"do_sample": True}, batch_size=2)
    model = agent.trainee.policy.pretrained_model
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        n = len(response)
        assert rollout.response_ids[i, :n].tolist() == response and int(rollout.response_mask[i].sum()) == n
        ids = torch.tensor([*agent.actor.tokenizer(prompt)["input_ids"], *response])
        with torch.no_grad():
            logits = model(ids[None]).logits[0].float()
        expected = torch.log_softmax(logits[-n - 1 : -1], -1).gather(-1, ids[-n:, None]).squeeze(-1)
        torch.testing.assert_close(rollout.logprobs[i, :n], expected, rtol=0, atol=1e-5)
    assert rollout.hit_max_tokens.tolist() == [False, False, True]  # EOS; 3 < 4 tokens; 4 tokens, no EOS


def test_backend_is_synced_before_the_first_generation_and_after_each_update() -> None:
    backend = FixedTokens([[65, 66], [67, 68]])
    agent = _agent(backend)
    act = lambda: agent.actor.act(["ab", "cd"], 2, {"do_sample": True}, batch_size=2)  # noqa: E731
    rollout = act()
    act()
    assert backend.synced == 1  # no update in between: nothing to push
    agent.learner.update(Batch(rollout, torch.tensor([1.0, -1.0])))
    act()
    assert backend.synced == 2


def test_hugging_face_backend_is_todays_generate() -> None:
    """The default backend draws the same tokens as `generate` did (same weights, same seed)."""
    agent = _agent()
    assert isinstance(agent.actor.backend, HFBackend)
    prompts, kwargs = ["The film", "A"], {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
    torch.manual_seed(3)
    _, want = generate(agent.trainee.policy, agent.actor.tokenizer, prompts, 6, kwargs, agent.trainee.device, 2)
    torch.manual_seed(3)
    got = agent.actor.backend.generate(encode_prompts(agent.actor.tokenizer, prompts), 6, kwargs, 2)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]


# ------------------------------------------------------------------------------------------- configuration
def test_rollout_group_composes_and_reaches_the_run_settings() -> None:
    assert RunSettings.from_config(compose_cfg(["experiment=smoke"])).rollout == RolloutSettings()
    cfg = compose_cfg(["experiment=smoke", "rollout=vllm", "rollout.gpu_memory_utilization=0.5"])
    settings = RunSettings.from_config(cfg).rollout
    assert (settings.backend, settings.gpu_memory_utilization, settings.enforce_eager) == ("vllm", 0.5, True)
    with pytest.raises(ConfigError, match="rollout.backend='sglang'"):
        RunSettings.from_config(compose_cfg(["experiment=smoke", "rollout.backend=sglang"]))
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutSettings(backend="vllm", gpu_memory_utilization=1.5)


def test_vllm_backend_refuses_what_it_cannot_do() -> None:
    model, tokenizer = build_tiny_gpt2()
    backbone = Backbone(model, tokenizer, None, add_special_tokens=False)
    vllm = RolloutSettings(backend="vllm")
    assert make_backends(RolloutSettings(), ["llm1"], learner(), backbone, "cpu", 0) == {"llm1": None}
    with pytest.raises(ConfigError, match="generate_in_train_mode"):
        make_backends(vllm, ["llm1"], learner(generate_in_train_mode=True), backbone, "cpu", 0)
    backends = make_backends(vllm, ["llm1", "llm2"], learner(), backbone, "cpu", 0)
    assert backends["llm1"].engine is backends["llm2"].engine  # one engine for the run's agents
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        backends["llm1"].engine.start()
    backends["llm1"].engine.close()


# ------------------------------------------------------------------------------------------- the real engine
def _greedy_texts(backend_name: str, model, tokenizer, prompts: list[str]) -> list[str]:
    device = torch.device("cuda")
    backbone = Backbone(model, tokenizer, None, add_special_tokens=False, device=device)
    policy = backbone.policy("llm1", init_seed=0)
    backend = HFBackend(policy, tokenizer, device)
    if backend_name == "vllm":
        engine = VLLMEngine(backbone, RolloutSettings(backend="vllm", dtype="float32"), device, seed=0)
        from cory.ppo.vllm_backend import VLLMBackend

        backend = VLLMBackend(engine, "llm1")
    backend.sync_weights(policy)
    ids = backend.generate(encode_prompts(tokenizer, prompts), 24, {"do_sample": False}, batch_size=len(prompts))
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["tiny_llama", "smollm2"])
def test_vllm_greedy_text_equals_hugging_face(which: str, tmp_path) -> None:
    """Same prompts, greedy, fp32 in both engines: identical text (vLLM gets the learner's weights pushed in)."""
    pytest.importorskip("vllm")
    if which == "smollm2":
        from cory.models import load_smollm2_135m

        model, tokenizer = load_smollm2_135m(str(tmp_path / "cache"))
    else:
        model, tokenizer = build_tiny_llama(hidden_size=256, intermediate_size=512, num_attention_heads=4)
    prompts = ["This movie was", "The plot of the film", "I rented this DVD because", "Honestly,"]
    hf = _greedy_texts("hf", model, tokenizer, prompts)
    assert _greedy_texts("vllm", model, tokenizer, prompts) == hf
