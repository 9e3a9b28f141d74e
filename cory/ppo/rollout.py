"""Batched generation and the rollout-time forward passes (docs/method.md §2.2, §2.9).

Layout: prompts are left-padded `[B, P]`, responses right-padded `[B, T]`; every forward gets
`position_ids = cumsum(mask) − 1`, so padding never changes a log-prob. The logits at column P−1+t predict
response token t, and the value at that column is V_t, the value of the state before token t.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from cory.ppo import core as ppo_core
from cory.ppo import decode


@dataclass
class LiveForward:
    """The policy's rollout forward kept with its graph, for the update's first minibatch (docs/method.md §2.2): the
    rows in `order` (the first epoch's permutation), response-aligned logits [B, T, V] and values [B, T]."""

    order: np.ndarray
    logits: torch.Tensor
    values: torch.Tensor


@dataclass
class Rollout:
    """One batch of (prompt, response) with everything PPO needs, computed once without gradients (or, with `live`,
    with the policy's forward kept for the update that takes this batch whole)."""

    prompts: list[str]
    responses: list[str]  # decoded response text, special tokens stripped
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T] right-padded, truncated after the first EOS (kept)
    response_mask: torch.Tensor  # [B, T]
    logprobs: torch.Tensor  # [B, T] log π_old(a_t | s_t)
    ref_logprobs: torch.Tensor  # [B, T] log π0(a_t | s_t)
    values: torch.Tensor  # [B, T] V_old(s_t)
    kls: torch.Tensor  # [B, T] per-token KL of the configured estimator (docs/method.md §2.4)
    entropy: torch.Tensor  # [B, T] full-vocabulary entropy of π_old
    hit_max_tokens: torch.Tensor  # [B] bool: the response ran to max_new_tokens without EOS
    # the policy's forward with its graph, for the learner's first minibatch; only on a whole batch, never selected
    # or concatenated (the learner takes it off the rollout, so nothing that keeps the rollout keeps the graph)
    live: LiveForward | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, idx: torch.Tensor | list[int]) -> Rollout:
        """The sub-batch at `idx` (tensors and lists alike), without `live`."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        out = {}
        for f in fields(self):
            if f.name == "live":
                continue
            v = getattr(self, f.name)
            out[f.name] = v[idx] if isinstance(v, torch.Tensor) else [v[i] for i in idx.tolist()]
        return Rollout(**out)


def concat_rollouts(a: Rollout, b: Rollout, pad_token_id: int) -> Rollout:
    """`a`'s samples then `b`'s as one batch: prompts re-padded on the left and responses on the right to the wider
    of the two (padding is masked and positions come from the masks, so no log-prob or value changes)."""
    out = {}
    for f in fields(Rollout):
        if f.name == "live":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, list) or x.dim() == 1:  # texts, per-sample flags
            out[f.name] = x + y if isinstance(x, list) else torch.cat([x, y])
            continue
        left = f.name.startswith("prompt_")  # [B, P] left-padded; every other [B, T] right-padded
        value = pad_token_id if f.name.endswith("_ids") else 0
        width = max(x.shape[1], y.shape[1])
        padded = [F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value) for t in (x, y)]
        out[f.name] = torch.cat(padded)
    return Rollout(**out)


def pad(seqs: list[torch.Tensor], value: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors into [B, L] ids and mask, padding on the left or the right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, sl], mask[i, sl] = s, 1
    return ids, mask


def truncate_after_eos(response_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Mask [B, T] keeping each response up to and including its first EOS (docs/method.md §2.9)."""
    is_eos = response_ids == eos_token_id
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # EOS tokens strictly before t
    return (eos_before == 0).long()


# Every sampling setting `generate` reads, at the library's neutral value; a task's `generation_kwargs` override
# them. Spelling them all out means nothing comes from a checkpoint's `generation_config.json`.
NEUTRAL_GENERATION = {
    "do_sample": False,
    "num_beams": 1,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
}


def generation_config(max_new_tokens: int, generation_kwargs: dict, tokenizer: PreTrainedTokenizerBase):
    """The explicit `GenerationConfig` of every `generate` call: neutral settings, then the task's, then length
    and special tokens (no `min_length`: a response may be just EOS, docs/method.md §2.9). Keys of
    `generation_kwargs` that are not `GenerationConfig` fields (a `logits_processor`) are left to `generate`."""
    from transformers import GenerationConfig

    fields = GenerationConfig().to_dict()
    settings = NEUTRAL_GENERATION | {k: v for k, v in generation_kwargs.items() if k in fields}
    return GenerationConfig(
        **settings,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], add_special_tokens: bool = False
) -> list[torch.Tensor]:
    """Per-prompt 1-D ids, as every backend receives them (`add_special_tokens`: the model's choice, Llama's BOS)."""
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]
    return [torch.tensor(ids, dtype=torch.long) for ids in encoded]


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    generation_kwargs: dict,
    device: torch.device,
    batch_size: int,
    add_special_tokens: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Sample responses for `prompts`: `encode_prompts`, then `generate_ids`.

    Returns per-sample 1-D prompt ids and response ids (truncated after the first EOS, EOS kept).
    """
    prompt_ids = encode_prompts(tokenizer, prompts, add_special_tokens)
    responses = generate_ids(model, tokenizer, prompt_ids, max_new_tokens, generation_kwargs, device, batch_size)
    return prompt_ids, responses


@torch.no_grad()
def generate_ids(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[torch.Tensor],
    max_new_tokens: int,
    generation_kwargs: dict,
    device: torch.device,
    batch_size: int,
    decoder: str = "lean",
) -> list[torch.Tensor]:
    """Sampled responses for 1-D `prompt_ids` in batches of `batch_size` with left padding.

    `model` is anything with Hugging Face's `generate` (a `cory.policy.PolicyWithValueHead` activates its adapter
    first). `decoder="lean"` samples with `cory.ppo.decode` wherever it reproduces `generate` token for token (the
    sampling settings every task here uses), else with `generate`; `"generate"` always with `generate`. Returns
    per-sample 1-D response ids, truncated after the first EOS (EOS kept).
    """
    config = generation_config(max_new_tokens, generation_kwargs, tokenizer)
    extra = {k: v for k, v in generation_kwargs.items() if k not in config.to_dict()}
    lean = decoder == "lean" and decode.supports(config, extra)
    responses: list[torch.Tensor] = []
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        ids, mask = pad(chunk, tokenizer.pad_token_id, left=True)
        ids, mask = ids.to(device), mask.to(device)
        if lean:
            out = decode.decode(_causal_lm(model), ids, mask, config)
        else:
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extra)
        out = out.cpu()[:, ids.shape[1] :]
        keep = truncate_after_eos(out, tokenizer.eos_token_id)
        responses += [row[: int(k.sum())] for row, k in zip(out, keep)]
    return responses


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """What `generate` runs the forwards of: a policy handle's language model with the handle's adapter active."""
    sampler = getattr(model, "sampler", None)
    return sampler() if sampler is not None else model


def forward_logits(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    with_values: bool,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Response-aligned logits [B, T, V] (float32) and, for a policy with value head, values [B, T].

    `groups` > 1 runs the rows in up to that many forwards of similar length (`length_groups`), each padded only to
    its own longest prompt and response, and puts the outputs back in row order and width, zero at the positions
    the group did not compute (response padding, which every reader masks). The model and the numbers are the
    same; the products' shapes are not, so their float rounding differs (docs/cost.md, "Padding")."""
    P, T = prompt_ids.shape[1], response_ids.shape[1]
    if groups > 1:  # (`length_groups` keeps a single row as one group)
        p_len, r_len = prompt_mask.sum(1).tolist(), response_mask.sum(1).tolist()
        split = length_groups(p_len, r_len, groups)
        if len(split) > 1:  # else no split saves positions: the rectangle as it is, below
            logits = values = None
            for idx in split:
                p, r = group_widths(idx, p_len, r_len)  # left-padded prompts, right-padded responses
                sel = torch.as_tensor(idx, device=prompt_ids.device)
                args = (
                    prompt_ids[sel, P - p :],
                    prompt_mask[sel, P - p :],
                    response_ids[sel, :r],
                    response_mask[sel, :r],
                )
                out, vals = forward_logits(model, *args, with_values)
                if logits is None:  # one full-width output, each group written into its rows (no padded copies)
                    logits = out.new_zeros(len(prompt_ids), T, out.shape[-1])
                    values = vals.new_zeros(len(prompt_ids), T) if vals is not None else None
                logits[sel, :r] = out
                if values is not None:
                    values[sel, :r] = vals
            return logits, values
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)
    # The LM head runs on the last T+1 columns only: column P−1+t predicts response token t, and the last column,
    # which predicts nothing we use, is dropped afterwards (in the matmul it keeps the summation order of the LM
    # head's weight gradient). They are passed as positions, which the model gathers into a contiguous tensor: a
    # strided slice (`logits_to_keep=T + 1`) sends a frozen model's LM head to a batched matmul about 3× slower
    # than the plain one, with the same numbers.
    keep = torch.arange(P - 1, P + T, device=input_ids.device)
    if with_values:
        logits, values = model(input_ids, attention_mask, position_ids, logits_to_keep=keep)
        return logits[:, :-1], values[:, :-1]
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=keep,
    )
    return out.logits[:, :-1].float(), None


def length_groups(prompt_lengths: list[int], response_lengths: list[int], groups: int) -> list[list[int]]:
    """Rows split into at most `groups` groups whose padded rectangles hold the fewest positions.

    A group of rows costs (its rows) × (its longest prompt + its longest response) positions in a forward. Rows are
    ordered by total length, longest first (ties by row index), and cut into contiguous runs of that order by dynamic
    programming over the cut points, which is exact for that order; of equally cheap splits, the one with fewer
    groups. Returns the groups' row indices, longest first; one group (every row, in row order) when `groups` is 1.
    """
    n = len(prompt_lengths)
    if groups <= 1 or n <= 1:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: (-(prompt_lengths[i] + response_lengths[i]), i))

    cost = {}  # (a, b) -> positions of rows order[a:b] as one rectangle, with running maxima: O(n²)
    for a in range(n):
        longest_prompt = longest_response = 0
        for b in range(a + 1, n + 1):
            longest_prompt = max(longest_prompt, prompt_lengths[order[b - 1]])
            longest_response = max(longest_response, response_lengths[order[b - 1]])
            cost[(a, b)] = (b - a) * (longest_prompt + longest_response)
    k_max = min(groups, n)
    best = {(1, b): (cost[(0, b)], [b]) for b in range(1, n + 1)}  # (groups, rows covered) -> (positions, cuts)
    for k in range(2, k_max + 1):
        for b in range(k, n + 1):
            splits = ((best[(k - 1, a)][0] + cost[(a, b)], [*best[(k - 1, a)][1], b]) for a in range(k - 1, b))
            best[(k, b)] = min(splits)
    total, cuts = best[(1, n)]
    for k in range(2, k_max + 1):  # a group more only where it saves positions (each forward has its own overhead)
        if best[(k, n)][0] < total:
            total, cuts = best[(k, n)]
    if len(cuts) == 1:
        return [list(range(n))]
    bounds = [0, *cuts]
    return [order[a:b] for a, b in zip(bounds, bounds[1:])]


def group_widths(rows: list[int], prompt_lengths: list[int], response_lengths: list[int]) -> tuple[int, int]:
    """The prompt and response widths of the rectangle a forward over `rows` multiplies: their longest prompt (at least
    the one column whose logits predict the first response token) and their longest response."""
    return max(1, *(prompt_lengths[i] for i in rows)), max(response_lengths[i] for i in rows)


@torch.no_grad()
def score_forward(
    policy: torch.nn.Module,
    ref_model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    kl_estimator: str,
    batch_size: int,
    policy_out: tuple[torch.Tensor, torch.Tensor] | None = None,
    groups: int = 1,
) -> dict[str, torch.Tensor]:
    """Rollout-time log-probs, reference log-probs, values, per-token KL and entropy, all [B, T].

    Runs in micro-batches of `batch_size`; full distributions live only inside one micro-batch. `policy_out`: the
    policy's logits [B, T, V] and values [B, T] already computed (detached, in row order), read instead of its forward.
    `groups`: each micro-batch's forwards in up to that many length groups (`forward_logits`).
    """
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("logprobs", "ref_logprobs", "values", "kls", "entropy")}
    for s in range(0, len(prompt_ids), batch_size):
        sl = slice(s, s + batch_size)
        args = (prompt_ids[sl], prompt_mask[sl], response_ids[sl], response_mask[sl])
        if policy_out is None:
            logits, values = forward_logits(policy, *args, with_values=True, groups=groups)
        else:
            logits, values = policy_out[0][sl], policy_out[1][sl]
        ref_logits, _ = forward_logits(ref_model, *args, with_values=False, groups=groups)
        tokens = response_ids[sl]
        # each log-softmax once: the log-probs, the full KL and the entropy all read it
        log_probs, ref_log_probs = F.log_softmax(logits, dim=-1), F.log_softmax(ref_logits, dim=-1)
        logprobs, ref_logprobs = ppo_core.gather(log_probs, tokens), ppo_core.gather(ref_log_probs, tokens)
        if kl_estimator == "full":
            kls = ppo_core.full_kl_of(log_probs, ref_log_probs)
        else:
            kls = ppo_core.kl_penalty(logprobs, ref_logprobs, kl_estimator)
        entropy = ppo_core.entropy_from_log_probs(log_probs)
        for k, v in zip(parts, (logprobs, ref_logprobs, values, kls, entropy)):
            parts[k].append(v.float())
    return {k: torch.cat(v) for k, v in parts.items()}
