"""Critics: where an update's V_old comes from, and what learns the values (docs/method.md §2.5, §10).

Three parts, picked by `_target_` in `cory/conf/algorithm/critic/<name>.yaml` (`algorithm/critic=centralized`):
- `PerAgentCritic`: each actor's own value head, on its own prompt, trained by the actor's own value loss (PPO's
  shared policy/value model, TRL; CORY). Its values travel in the actor's rollout.
- `NoCritic`: no values at all (the group baselines GRPO and RLOO); the actors' value heads are neither trained nor
  stepped.
- `CentralizedCritic`: one value model on the joint sequence of every role's answer (CoLLM-CC, Liu et al., arXiv
  2601.21972; a MAPPO-style centralised critic), giving every actor its values; it learns all the learning
  actors' returns, and the actors train no value head of their own.

The joint sequence of N roles is [x_0; a_1; a_2; …; a_N]: the first role's prompt, then every role's response in
role order. Token alignment is causal, as PPO's V_t (the value of the state before token t, `cory.ppo.rollout`):
role k's token t reads the joint sequence up to a_k,<t, column P + T_1 + … + T_{k−1} − 1 + t. So a later role's
values see every earlier answer, and an earlier role's values see what preceded each of its tokens. With knowledge
transfer, x_0 and the earlier answers carry everything a later role's prompt holds (T_obs(q, a_{k−1}), or
T_obs(q, a_1 ⊕ … ⊕ a_{k−1}) where a role sees every earlier answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import torch

from cory.policy import PolicyWithValueHead
from cory.ppo import core as ppo_core
from cory.ppo.rollout import Rollout
from cory.ppo.trainee import Trainee

CRITIC_DIR = "critic"
CRITIC_STATE = "critic.json"


class Critic(Protocol):
    """The configured part. `actors_train_values`: each actor trains its own value head (per-agent critic);
    `has_values`: an update gets V_old (an estimator that needs values needs this); `joint`: a model of its own."""

    name: ClassVar[str]
    actors_train_values: ClassVar[bool]
    has_values: ClassVar[bool]


@dataclass(frozen=True)
class PerAgentCritic:
    """Each actor's own value head (docs/method.md §2.1): PPO's and CORY's."""

    name: ClassVar[str] = "per_agent"
    actors_train_values: ClassVar[bool] = True
    has_values: ClassVar[bool] = True


@dataclass(frozen=True)
class NoCritic:
    """No value function: estimators that compare samples of one prompt (GRPO, RLOO; docs/method.md §9)."""

    name: ClassVar[str] = "none"
    actors_train_values: ClassVar[bool] = False
    has_values: ClassVar[bool] = False


@dataclass(frozen=True)
class CentralizedCritic:
    """One value model on the joint sequence of every role (docs/method.md §10): its own full copy of the model or
    LoRA adapter `critic` on the agents' base, value head, Adam and minibatch stream, trained with PPO's clipped value
    loss at `cliprange_value` on the learning actors' returns. Learning rate, epochs, minibatches and gradient
    clipping are the learner block's (one set of hyperparameters, as PPO's shared policy/value optimiser has)."""

    RANGES: ClassVar[dict[str, str]] = {"cliprange_value": "(0, inf)"}  # checked before any model loads

    cliprange_value: float

    name: ClassVar[str] = "centralized"
    actors_train_values: ClassVar[bool] = False
    has_values: ClassVar[bool] = True

    def build(
        self,
        policy: PolicyWithValueHead,
        learner,
        seed: int,
        pad_token_id: int,
        device: str | torch.device,
        autocast_dtype: torch.dtype | None,
        forward_batch_size: int,
    ) -> JointValueModel:
        trainee = Trainee(
            CRITIC_DIR,
            policy,
            seed,
            learner.optimization(),
            train_value_head=True,
            device=device,
            autocast_dtype=autocast_dtype,
            forward_batch_size=forward_batch_size,
        )
        return JointValueModel(trainee, pad_token_id, learner.ppo_epochs, self.cliprange_value)


# ------------------------------------------------------------------------------------------- joint sequences
@dataclass
class JointBatch:
    """B joint sequences, left-padded, with the columns whose value each role's response token takes.

    ids, mask: [B, L]; columns: one [B, T_k] per role (columns of padded response tokens are clamped into range;
    their values are masked by the roles' response masks).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    columns: list[torch.Tensor]

    def select(self, idx: torch.Tensor) -> JointBatch:
        return JointBatch(self.ids[idx], self.mask[idx], [c[idx] for c in self.columns])


def joint_batch(rollouts: list[Rollout], pad_token_id: int) -> JointBatch:
    """[x_0; a_1; …; a_N] per sample from the roles' rollouts (the first role's prompt, every role's response)."""
    first = rollouts[0]
    rows, columns = [], [[] for _ in rollouts]
    for i in range(len(first)):
        parts = [first.prompt_ids[i][first.prompt_mask[i].bool()]]
        start = len(parts[0])  # the column of the first response token
        for k, rollout in enumerate(rollouts):
            answer = rollout.response_ids[i][rollout.response_mask[i].bool()]
            columns[k].append(start - 1 + torch.arange(rollout.response_ids.shape[1]))
            parts.append(answer)
            start += len(answer)
        rows.append(torch.cat(parts))
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r) :], mask[i, L - len(r) :] = r, 1
    shift = torch.tensor([L - len(r) for r in rows]).unsqueeze(1)  # left padding moves every column right
    return JointBatch(ids, mask, [(torch.stack(c) + shift).clamp(0, L - 1) for c in columns])


# ------------------------------------------------------------------------------------------- the critic model
class JointValueModel:
    """V_φ on joint sequences (a `CentralizedCritic` built on the run's model): values for every role, and its
    update on the returns of the roles whose actors learned."""

    def __init__(self, trainee: Trainee, pad_token_id: int, ppo_epochs: int, cliprange_value: float) -> None:
        self.trainee, self.pad_token_id = trainee, pad_token_id
        self.ppo_epochs, self.cliprange_value = ppo_epochs, cliprange_value

    def _forward(self, joint: JointBatch) -> list[torch.Tensor]:
        """Values of each role's response tokens, [B, T_k] (float32)."""
        device = self.trainee.device
        ids, mask = joint.ids.to(device), joint.mask.to(device)
        position_ids = (torch.cumsum(mask, dim=1) - 1).clamp(min=0)
        first = int(min(c.min() for c in joint.columns))
        keep = ids.shape[1] - first  # the LM head runs on the response columns only; its logits are unused
        with self.trainee.autocast():
            _, values = self.trainee.forward_module()(ids, mask, position_ids, logits_to_keep=keep)
        values = values.float()
        return [torch.gather(values, 1, (c - first).to(device)) for c in joint.columns]

    @torch.no_grad()
    def values(self, joint: JointBatch, rollouts: list[Rollout]) -> list[torch.Tensor]:
        """V_old of every role's response tokens, in micro-batches, on the CPU, zero on padding."""
        n, step = len(joint.ids), self.trainee.forward_batch_size
        parts = [self._forward(joint.select(torch.arange(s, min(s + step, n)))) for s in range(0, n, step)]
        return [torch.cat([p[k].cpu() for p in parts]) * r.response_mask for k, r in enumerate(rollouts)]

    def update(
        self, joint: JointBatch, old: list[torch.Tensor], returns: list[torch.Tensor], masks: list[torch.Tensor]
    ) -> list[dict[str, float]]:
        """PPO epochs of the clipped value loss ½·mean max((V − G)², (clip(V, V_old ± ε) − G)²) over every response
        token of every role (docs/method.md §10); `old`, `returns`, `masks` hold one [B, T_k] per role. Returns each
        role's statistics on its own tokens: value_loss, value_clipfrac, explained_variance; a role whose mask is all
        zero (its actor did not learn: no returns) adds no tokens and gets `{}`."""
        trainee, B = self.trainee, len(joint.ids)
        cfg = trainee.optimization
        present = [bool(mk.any()) for mk in masks]
        backward_batch = cfg.micro_batch * cfg.accumulation
        stats: list[list[dict[str, float]]] = []
        for _ in range(self.ppo_epochs):
            order = trainee.permutation(B)
            for b in range(0, B, backward_batch):
                for m in range(b, b + backward_batch, cfg.micro_batch):
                    idx = torch.as_tensor(order[m : m + cfg.micro_batch])
                    stats.append(self._minibatch(joint.select(idx), idx, old, returns, masks, present))
                trainee.step()
        trainee.updated()
        out = []
        for k, (v, g, mk) in enumerate(zip(old, returns, masks)):
            if not present[k]:
                out.append({})
                continue
            row = {name: float(np.mean([s[k][name] for s in stats])) for name in stats[0][k]}
            row["explained_variance"] = ppo_core.explained_variance(v * mk, g, mk).item()
            out.append(row)
        return out

    def _minibatch(self, joint, idx, old, returns, masks, present) -> list[dict[str, float]]:
        device = self.trainee.device
        vpreds = self._forward(joint)
        parts = [
            (vp, o[idx].to(device), g[idx].to(device), mk[idx].float().to(device))
            for vp, o, g, mk in zip(vpreds, old, returns, masks)
        ]
        # one loss over every response token of every role: the roles' sequences are concatenated along time
        vp, o, g, mk = (torch.cat(x, dim=1) for x in zip(*parts))
        loss, _ = ppo_core.value_loss(vp, o, g, mk, self.cliprange_value)
        self.trainee.backward(loss)  # ÷ gradient_accumulation_steps inside
        with torch.no_grad():
            per_role = []
            for (vp, o, g, mk), on in zip(parts, present):
                if not on:
                    per_role.append({})
                    continue
                role_loss, clipfrac = ppo_core.value_loss(vp, o, g, mk, self.cliprange_value)
                per_role.append({"value_loss": role_loss.item(), "value_clipfrac": clipfrac.item()})
        return per_role

    # ------------------------------------------------------------------------------------------ checkpointing
    def parameters(self) -> list[torch.nn.Parameter]:
        return self.trainee.trainable_parameters()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.trainee.state_tensors()

    def save(self, directory: Path) -> None:
        self.trainee.save(directory, CRITIC_STATE, {})

    def load(self, directory: Path) -> None:
        self.trainee.load(directory, CRITIC_STATE)
