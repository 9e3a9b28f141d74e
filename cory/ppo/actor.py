"""`Actor`: how one agent answers prompts, and the rollout-time forward passes over its answers (docs/method.md §2.2).

An actor samples responses with its rollout backend (Hugging Face `generate` on the live weights, or vLLM), then
computes, once and without gradients, everything the update needs: log-probs under the policy and under π0, values
of its own value head, the per-token KL and the entropy (`cory.ppo.rollout.score_forward`). Whichever backend
sampled, these numbers are the trainee's own forward, so the update never depends on the backend.

A rollout the update will take whole (`for_update`) can keep the policy's forward with its graph instead: when the
learner's `planner` gives the first epoch's row order for the batch, that forward runs once, with gradients, on the
rows in that order, and the update's first minibatch uses it rather than running the same forward again (docs/cost.md,
"No repeated forward"); the rollout's numbers are read from it, detached, so they are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from cory.ppo.backends import HFBackend, RolloutBackend
from cory.ppo.rollout import LiveForward, Rollout, encode_prompts, forward_logits, pad, score_forward
from cory.ppo.trainee import Trainee


class Actor:
    """Sampling and scoring for one trainee.

    Args:
        trainee: the model that answers.
        reference: π0, shared and frozen (a frozen copy, or the LoRA base with adapters disabled).
        tokenizer: the policy tokenizer.
        kl_penalty: the per-token KL of the rollout (`full` or a sampled estimator, docs/method.md §2.4).
        generate_in_train_mode: TRL's dropout-on sampling after the trainee's first update (§2.1).
        add_special_tokens: tokenise prompts with the tokenizer's special tokens (the model's choice: Llama's BOS).
        backend: what samples the responses; default Hugging Face `generate` on the trainee's policy.
        planner: the learner's first-epoch row order for a batch of n samples it would take whole from the rollout's
            forward (`PPOLearner.planned_order`), or None where it would not; no planner: never.
    """

    def __init__(
        self,
        trainee: Trainee,
        reference: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        kl_penalty: str,
        generate_in_train_mode: bool,
        add_special_tokens: bool = False,
        backend: RolloutBackend | None = None,
        planner: Callable[[int], np.ndarray | None] | None = None,
    ) -> None:
        self.trainee, self.reference, self.tokenizer = trainee, reference, tokenizer
        self.planner = planner
        self.kl_penalty, self.generate_in_train_mode = kl_penalty, generate_in_train_mode
        self.add_special_tokens = add_special_tokens
        self.backend = backend if backend is not None else HFBackend(trainee.policy, tokenizer, trainee.device)
        # the backend is synced before a generation whenever the policy's `weights_version` moved since the last sync;
        # it lives on the policy handle, so an actor sharing another's policy sees that one's updates too
        self._synced_version: int | None = None

    @property
    def device(self) -> torch.device:
        return self.trainee.device

    def act(
        self,
        prompts: list[str],
        max_new_tokens: int,
        generation_kwargs: dict,
        batch_size: int,
        lengths: list[int] | None = None,
        kl_estimator: str | None = None,
        evaluation: bool = False,
        for_update: bool = False,
    ) -> Rollout:
        """Sample one response per prompt, then compute the rollout-time quantities.

        `lengths` (evaluation) cuts response i to its own cap; sampling is autoregressive, so this has the
        distribution of sampling with `max_new_tokens=lengths[i]` while generating the batch in one call.
        `evaluation=True` always samples in eval mode (dropout off): `generate_in_train_mode` reproduces a quirk
        of TRL's training loop and must not confound a before/after comparison (docs/method.md §2.1, §1.6).
        `for_update=True`: this batch is the one the trainee's next update takes whole; the policy's forward is kept
        for it where the planner allows (the module docstring).
        """
        policy = self.trainee.policy
        train_mode = self.generate_in_train_mode and self.trainee.updates_since_load > 0 and not evaluation
        policy.train(train_mode)
        prompt_ids = encode_prompts(self.tokenizer, prompts, self.add_special_tokens)
        version = getattr(policy, "weights_version", 0)
        if self._synced_version != version:
            self.backend.sync_weights(policy)
            self._synced_version = version
        with self.trainee.autocast(), self.trainee.engine.generating():  # ZeRO-3: on gathered weights
            response_ids = self.backend.generate(prompt_ids, max_new_tokens, generation_kwargs, batch_size)
        policy.eval()
        if lengths is not None:
            response_ids = [r[:n] for r, n in zip(response_ids, lengths)]
        planned = for_update and self.planner is not None
        order = None if evaluation or not planned else self.planner(len(prompts))
        rollout = self.score_tokens(prompt_ids, response_ids, prompts, kl_estimator, order)
        eos = self.tokenizer.eos_token_id
        caps = lengths if lengths is not None else [max_new_tokens] * len(response_ids)
        rollout.hit_max_tokens = torch.tensor([len(r) >= c and r[-1] != eos for r, c in zip(response_ids, caps)])
        return rollout

    @torch.no_grad()
    def score_tokens(
        self,
        prompt_ids: list[torch.Tensor],
        response_ids: list[torch.Tensor],
        prompts: list[str] | None = None,
        kl_estimator: str | None = None,
        order: np.ndarray | None = None,
    ) -> Rollout:
        """The rollout for given token ids (TRL `step`'s first forward passes). Lists of 1-D tensors.

        `kl_estimator` overrides the configured penalty's estimator (evaluation always measures `full` KL). `order`:
        keep the policy's forward with its graph, run on the rows in this order (`Rollout.live`).
        """
        if any(len(r) == 0 for r in response_ids):
            raise ValueError("every response needs at least one token (max_new_tokens must be >= 1)")
        p_ids, p_mask = pad(prompt_ids, self.tokenizer.pad_token_id, left=True)
        r_ids, r_mask = pad(response_ids, self.tokenizer.pad_token_id, left=False)
        device = self.trainee.device
        live, policy_out = None, None
        if order is not None:
            rows = torch.as_tensor(order, dtype=torch.long)
            args = (p_ids[rows], p_mask[rows], r_ids[rows], r_mask[rows])
            with torch.enable_grad(), self.trainee.autocast():  # the first minibatch's forward, as the learner runs it
                logits, values = forward_logits(
                    self.trainee.forward_module(), *(a.to(device) for a in args), True, self.trainee.length_groups
                )
            live = LiveForward(order, logits, values)
            back = torch.argsort(rows.to(device))  # the rows in their own order again, for the rollout's numbers
            policy_out = (logits.detach()[back], values.detach()[back])
        with self.trainee.autocast():
            out = score_forward(
                self.trainee.forward_module(),
                self.reference,
                p_ids.to(device),
                p_mask.to(device),
                r_ids.to(device),
                r_mask.to(device),
                kl_estimator or self.kl_penalty,
                self.trainee.forward_batch_size,
                policy_out,
                self.trainee.length_groups,
            )
        out = {k: v.cpu() for k, v in out.items()}
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        if prompts is None:
            prompts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
        return Rollout(
            prompts=list(prompts),
            responses=texts,
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            response_ids=r_ids,
            response_mask=r_mask,
            logprobs=out["logprobs"],
            ref_logprobs=out["ref_logprobs"],
            values=out["values"],
            kls=out["kls"] * r_mask,
            entropy=out["entropy"],
            hit_max_tokens=torch.zeros(len(r_ids), dtype=torch.bool),
            live=live,
        )

    def context_length(self) -> int | None:
        """The model's context in positions (None when its config does not say)."""
        config = self.trainee.policy.pretrained_model.config.get_text_config()
        return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)

    def token_counts(self, prompts: list[str]) -> list[int]:
        """Prompt lengths in tokens, as `act` tokenises them."""
        ids = self.tokenizer(prompts, add_special_tokens=self.add_special_tokens)["input_ids"]
        return [len(x) for x in ids]
