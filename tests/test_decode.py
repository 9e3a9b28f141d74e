"""The lean decode loop (`cory/ppo/decode.py`) against Hugging Face `generate`, its reference: the same tokens and the
same global RNG state afterwards, for fixed seeds, on GPT-2 and Llama, sampling and greedy, with rows that end early;
settings it does not reproduce are refused so that the caller falls back to `generate`."""

from __future__ import annotations

import pytest
import torch

from cory.models import build_tiny_gpt2, build_tiny_llama
from cory.ppo import decode
from cory.ppo.rollout import generate_ids, generation_config, pad

IMDB = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.1}
SETTINGS = {
    "imdb": IMDB,
    "temperature_top_k": {"do_sample": True, "temperature": 0.7, "top_k": 20, "repetition_penalty": 1.3},
    "top_p": {"do_sample": True, "top_p": 0.9},
    "greedy": {"do_sample": False, "repetition_penalty": 1.2},
}


def _prompts(tokenizer, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [("a" * (1 + 3 * i)) + " good film" for i in range(n)]  # lengths differ: left padding in every row but one
    ids = [torch.tensor(tokenizer(t)["input_ids"]) for t in texts]
    return pad(ids, tokenizer.pad_token_id, left=True)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_lean_decode_gives_generates_tokens_and_rng_state(arch, setting):
    model, tokenizer = build_tiny_gpt2() if arch == "gpt2" else build_tiny_llama()
    model.eval()
    config = generation_config(12, SETTINGS[setting], tokenizer)
    assert decode.supports(config, {})
    ids, mask = _prompts(tokenizer)
    runs = {}
    for name in ("generate", "lean"):
        torch.manual_seed(3)
        with torch.no_grad():
            if name == "generate":
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            else:
                out = decode.decode(model, ids, mask, config)
        runs[name] = (out, torch.random.get_rng_state())
    assert runs["lean"][0].shape == runs["generate"][0].shape
    assert torch.equal(runs["lean"][0], runs["generate"][0])
    assert torch.equal(runs["lean"][1], runs["generate"][1])  # the next draw of the run is the same too


def test_rows_that_end_early_are_padded_and_the_loop_stops_when_all_ended():
    model, tokenizer = build_tiny_gpt2()
    eos = tokenizer.eos_token_id
    with torch.no_grad():  # EOS made likely (the final norm's output pushed along its embedding): rows end early
        direction = model.lm_head.weight[eos]
        model.transformer.ln_f.bias += 4.0 * direction / direction.norm() ** 2
    config = generation_config(40, IMDB, tokenizer)
    ids, mask = _prompts(tokenizer)
    torch.manual_seed(0)
    reference = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    torch.manual_seed(0)
    lean = decode.decode(model, ids, mask, config)
    assert torch.equal(lean, reference)
    ended = (lean[:, ids.shape[1] :] == eos).any(dim=1)
    assert ended.all() and lean.shape[1] < ids.shape[1] + 40  # stopped once every row had ended


def test_generate_ids_uses_the_lean_loop_only_where_it_reproduces_generate():
    model, tokenizer = build_tiny_gpt2()
    prompts = [torch.tensor(tokenizer(t)["input_ids"]) for t in ("x", "a longer prompt")]
    outs = {}
    for decoder in decode.DECODERS:
        torch.manual_seed(1)
        outs[decoder] = generate_ids(model, tokenizer, prompts, 8, IMDB, torch.device("cpu"), 2, decoder=decoder)
    assert all(torch.equal(a, b) for a, b in zip(outs["lean"], outs["generate"]))
    unsupported = generation_config(8, {"do_sample": True, "min_p": 0.1}, tokenizer)
    assert not decode.supports(unsupported, {})
    assert not decode.supports(generation_config(8, IMDB, tokenizer), {"logits_processor": []})
    assert not decode.supports(generation_config(8, IMDB | {"num_beams": 2}, tokenizer), {})
