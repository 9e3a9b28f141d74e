"""Fine-tuning one Multiagent Finetuning agent (`cory/maft/sft.py`, `cory/maft/agents.py`) on a tiny Llama built in
memory: the loss covers exactly the assistant tokens under the template generation uses; SFT of one adapter moves
that adapter only (the other adapters and the base stay bit-identical); full copies likewise; weights round-trip.
Run: `pytest tests/test_maft_sft.py` (about 15 s, most of it importing TRL)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.maft_fakes import CHAT_TEMPLATE
from transformers import LlamaConfig, LlamaForCausalLM

from cory.maft.agents import FullCopies, GenerationSettings, LoraAgents
from cory.maft.sft import SFTSettings, chat_tokens, encode, render, sft_trainer
from cory.models import byte_tokenizer

CHATML = (  # a ChatML-style template (as SmolLM2's): the end-of-turn marker and newline close every turn
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CRITIC_CHAT = [
    {"role": "user", "content": "What is 2+3? Put it in \\boxed{}."},
    {"role": "assistant", "content": "2+3 = \\boxed{6}"},
    {"role": "user", "content": "Others said 5. Update your answer."},
    {"role": "assistant", "content": "I was wrong: \\boxed{5}"},
]
SETTINGS = SFTSettings(
    epochs=3,
    learning_rate=5e-2,
    max_length=512,
    batch_size=2,
    gradient_accumulation_steps=1,
    lr_scheduler="constant",
    warmup=0.0,
    weight_decay=0.0,
    gradient_checkpointing=False,
)


def tiny_llama():
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config), tokenizer


def pool_kwargs(names):
    return dict(names=names, seed=0, device=torch.device("cpu"), precision="fp32", generation_batch_size=8)


def lora_agents(names):
    model, tokenizer = tiny_llama()
    kw = dict(r=4, alpha=8, dropout=0.0, target_modules=None, chat_template=CHAT_TEMPLATE)
    return LoraAgents(model, tokenizer, **pool_kwargs(names), **kw)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assistant_nll(pool, name: str, chat) -> float:
    """Mean negative log-likelihood of the assistant tokens of `chat` under agent `name`."""
    ids, mask = chat_tokens(pool.tokenizer, chat)
    with pool.use(name) as model, torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    return float(nll[torch.tensor(mask[1:], dtype=torch.bool)].mean())


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML], ids=["tags", "chatml"])
def test_the_mask_covers_every_assistant_turn_and_nothing_else(template):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = template
    ids, mask = chat_tokens(tokenizer, CRITIC_CHAT)
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append(tokenizer.decode(ids[start:i]))
            start = None
    end = "<|endoftext|>" if template == CHAT_TEMPLATE else "<|im_end|>\n"
    assert spans == [CRITIC_CHAT[1]["content"] + end, CRITIC_CHAT[3]["content"] + end]  # the model learns to stop
    # the prompt the critic was generated from, in the same template, is exactly the tokens before its answer
    prompt = encode(tokenizer, render(tokenizer, CRITIC_CHAT[:3], add_generation_prompt=True))
    assert ids[: len(prompt)] == prompt and mask[len(prompt) - 1] == 0 and mask[len(prompt)] == 1


def test_a_template_that_renders_prompts_differently_is_refused():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<assistant>{% endif %}", "[gen]<assistant>{% endif %}")
    with pytest.raises(ValueError, match="prefix of the whole"):
        chat_tokens(tokenizer, CRITIC_CHAT)


def test_sft_trainer_labels_are_the_assistant_tokens(tmp_path):
    pool = lora_agents(["gen1"])
    with pool.use("gen1") as model:
        trainer = sft_trainer(
            model, pool.tokenizer, [CRITIC_CHAT], SETTINGS, seed=0, output_dir=str(tmp_path), use_cpu=True, bf16=False
        )
    ids, mask = chat_tokens(pool.tokenizer, CRITIC_CHAT)
    assert trainer.train_dataset[0]["labels"] == [t if m else -100 for t, m in zip(ids, mask)]


def test_sft_moves_only_the_named_adapter_and_agents_diverge(tmp_path):
    pool = lora_agents(["gen1", "gen2", "critic1"])
    init = {name: pool.state_dict(name) for name in pool.names}
    assert all(torch.equal(init["gen1"][k], init["gen2"][k]) for k in init["gen1"])  # identical seeded start
    base = {k: v for k, v in snapshot(pool.model).items() if "lora_" not in k}
    other_chat = [{"role": "user", "content": "What is 7*6?"}, {"role": "assistant", "content": "\\boxed{42}"}]
    nll_before = assistant_nll(pool, "gen1", CRITIC_CHAT)

    pool.finetune("gen1", [CRITIC_CHAT] * 4, replace(SETTINGS, epochs=10), seed=0)
    after_one = {name: pool.state_dict(name) for name in pool.names}
    pool.finetune("gen2", [other_chat] * 4, SETTINGS, seed=0)
    after = {name: pool.state_dict(name) for name in pool.names}

    assert any(not torch.equal(after_one["gen1"][k], init["gen1"][k]) for k in init["gen1"])
    assert all(torch.equal(after_one["gen2"][k], init["gen2"][k]) for k in init["gen2"])  # untouched by gen1's SFT
    assert all(torch.equal(after["gen1"][k], after_one["gen1"][k]) for k in init["gen1"])  # untouched by gen2's
    assert all(torch.equal(after["critic1"][k], init["critic1"][k]) for k in init["critic1"])
    assert any(not torch.equal(after["gen1"][k], after["gen2"][k]) for k in init["gen1"])  # the agents diverged
    now = snapshot(pool.model)
    assert all(torch.equal(now[k], v) for k, v in base.items())  # the shared base is bit-identical
    assert assistant_nll(pool, "gen1", CRITIC_CHAT) < nll_before - 0.1  # it learned its own data ...
    assert assistant_nll(pool, "critic1", CRITIC_CHAT) == pytest.approx(nll_before)  # ... which the others did not
    assert assistant_nll(pool, None, CRITIC_CHAT) == pytest.approx(nll_before)  # base = adapters off


def test_adapter_weights_round_trip_and_reset(tmp_path):
    pool = lora_agents(["gen1", "gen2"])
    init = pool.state_dict("gen1")
    pool.finetune("gen1", [CRITIC_CHAT] * 2, SETTINGS, seed=0)
    trained = {k: v.clone() for k, v in pool.state_dict("gen1").items()}
    pool.save("gen1", tmp_path / "gen1.safetensors")
    pool.reset("gen1")
    assert all(torch.equal(pool.state_dict("gen1")[k], init[k]) for k in init)
    pool.load("gen1", tmp_path / "gen1.safetensors")
    assert all(torch.equal(pool.state_dict("gen1")[k], trained[k]) for k in trained)
    assert not list(tmp_path.glob("*.tmp"))


def test_full_copies_train_one_copy_and_keep_the_base(tmp_path):
    model, tokenizer = tiny_llama()
    pool = FullCopies(model, tokenizer, **pool_kwargs(["gen1", "gen2"]), chat_template=CHAT_TEMPLATE)
    base, gen2 = snapshot(pool.base), snapshot(pool.copies["gen2"])
    own = pool.parameters("gen1")  # what the trainer checks for finiteness: every weight of gen1's copy
    assert {id(p) for p in own} == {id(p) for p in pool.copies["gen1"].parameters()} and own
    assert not {id(p) for p in own} & {id(p) for p in pool.parameters("gen2")}
    pool.finetune("gen1", [CRITIC_CHAT] * 2, SETTINGS, seed=0)
    assert any(not torch.equal(v, base[k]) for k, v in pool.state_dict("gen1").items())
    assert all(torch.equal(v, gen2[k]) for k, v in pool.state_dict("gen2").items())
    assert all(torch.equal(v, base[k]) for k, v in snapshot(pool.base).items())
    trained = snapshot(pool.copies["gen1"])
    pool.save("gen1", tmp_path / "gen1.safetensors")
    pool.reset("gen1")
    assert all(torch.equal(v, base[k]) for k, v in pool.state_dict("gen1").items())
    pool.load("gen1", tmp_path / "gen1.safetensors")
    assert all(torch.equal(v, trained[k]) for k, v in pool.state_dict("gen1").items())


def test_batched_generation_equals_one_prompt_at_a_time():
    """Prompts of different lengths share left-padded batches: with top_k=1 (argmax) each answer must be what the
    prompt alone gives, in the caller's order."""
    pool = lora_agents(["gen1"])
    greedy = GenerationSettings(max_new_tokens=6, summary_max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=1)
    chats = [CRITIC_CHAT[:3], CRITIC_CHAT[:1], [{"role": "user", "content": "Hi"}]]
    together = pool.generate("gen1", chats, 6, greedy)
    assert together == [pool.generate("gen1", [chat], 6, greedy)[0] for chat in chats]
    assert len(set(together)) > 1 and not any("<|endoftext|>" in text for text in together)
