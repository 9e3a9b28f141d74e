"""A centralised critic for CORY's two agents (CoLLM-CC, Liu et al., arXiv 2601.21972; docs/method.md §10).

One value function reads the joint sequence [x_P; a1; a2] (the pioneer's prompt, the pioneer's response, the
observer's response) and gives both actors their values; each actor keeps its own policy, clipping, KL penalty and
KL controller, and has no value loss of its own.

Token alignment (causal, as PPO's V_t: the value of the state before token t, `cory.ppo.rollout`):
- the pioneer's token t reads the joint sequence up to a1_{<t}: column P − 1 + t;
- the observer's token t reads x_P, all of a1, and a2_{<t}: column P + T1 − 1 + t.
So the observer's values see both responses, and the pioneer's see what preceded each of its tokens (a2 does not
exist yet when the pioneer acts). `x_P` and a1 carry everything the observer prompt x_O = T_obs(q, a1) holds.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from cory import distributed, engines
from cory.checkpoints import tensors_of
from cory.policy import PolicyWithValueHead
from cory.ppo import core as ppo_core
from cory.ppo.learner import Agent, PPOConfig
from cory.ppo.rollout import Rollout


# ------------------------------------------------------------------------------------------- joint sequences
@dataclass
class JointBatch:
    """B joint sequences, left-padded, with the columns whose value each agent's response token takes.

    ids, mask: [B, L]; pioneer_columns: [B, T1]; observer_columns: [B, T2] (columns of padded response tokens are
    clamped into range; their values are masked by the agents' response masks).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    pioneer_columns: torch.Tensor
    observer_columns: torch.Tensor

    def select(self, idx: torch.Tensor) -> JointBatch:
        return JointBatch(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})


def joint_batch(pioneer: Rollout, observer: Rollout, pad_token_id: int) -> JointBatch:
    """[x_P; a1; a2] per sample from the two rollouts (pioneer prompt and response, observer response)."""
    rows, col1, col2 = [], [], []
    for i in range(len(pioneer)):
        prompt = pioneer.prompt_ids[i][pioneer.prompt_mask[i].bool()]
        a1 = pioneer.response_ids[i][pioneer.response_mask[i].bool()]
        a2 = observer.response_ids[i][observer.response_mask[i].bool()]
        rows.append(torch.cat([prompt, a1, a2]))
        P, T1 = len(prompt), len(a1)
        col1.append(P - 1 + torch.arange(pioneer.response_ids.shape[1]))
        col2.append(P + T1 - 1 + torch.arange(observer.response_ids.shape[1]))
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r) :], mask[i, L - len(r) :] = r, 1
    shift = torch.tensor([L - len(r) for r in rows]).unsqueeze(1)  # left padding moves every column right
    clamp = lambda c: (torch.stack(c) + shift).clamp(0, L - 1)  # noqa: E731
    return JointBatch(ids, mask, clamp(col1), clamp(col2))


# ------------------------------------------------------------------------------------------------ the actors
class CriticActor(Agent):
    """PPO's agent whose values come from outside (`rollout.values`, set by the algorithm from the centralised critic
    before `learn`): GAE with those values, no value term, its own value head neither trained nor stepped. It keeps
    the returns of its last update for the critic (`returns`, None when the update was skipped)."""

    trains_value = False

    def learn(self, rollout: Rollout, scores: torch.Tensor) -> dict[str, float]:
        self.returns = None
        return super().learn(rollout, scores)

    def advantages(
        self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        advantages, returns = super().advantages(rewards, values, mask)
        self.returns = returns
        return advantages, returns

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        own = {id(p) for p in self.policy.trainable_parameters()}
        return [p for n, p in self.policy.named_parameters() if id(p) in own and not n.startswith("v_head.")]


class CriticActors:
    """The learner node as the agent team sees it, building `CriticActor`s; every other attribute is the node's."""

    def __init__(self, learner: PPOConfig) -> None:
        self.learner = learner

    def __getattr__(self, name: str):
        return getattr(self.learner, name)

    def build(self, name: str, model, ref_model, tokenizer, **placement) -> CriticActor:
        return CriticActor(name, model, ref_model, tokenizer, self.learner, **placement)


# ------------------------------------------------------------------------------------------------ the critic
class CentralCritic:
    """V_φ on joint sequences: its own model handle (a full copy, or a LoRA adapter `critic` on the agents' base),
    value head, Adam and minibatch stream; trained with PPO's clipped value loss on both agents' returns.

    Args:
        policy: the critic's handle (`Backbone.policy("critic", ...)`); only its value head's output is used.
        config: the learner block: learning rate, epochs, minibatches, value clip range and gradient clipping are
            the actors' (one set of hyperparameters, as PPO's shared policy/value optimiser has).
        seed: seed of the critic's minibatch permutations.
    """

    def __init__(
        self,
        policy: PolicyWithValueHead,
        config: PPOConfig,
        seed: int,
        device: str | torch.device,
        autocast_dtype: torch.dtype | None,
        forward_batch_size: int,
    ) -> None:
        self.policy, self.config, self.seed = policy, config, seed
        self.device, self.autocast_dtype, self.forward_batch_size = (
            torch.device(device),
            autocast_dtype,
            forward_batch_size,
        )
        # the agents' engine (`cory/engines.py`): Adam on every process, or sharded by ZeRO
        self.engine = engines.new_engine(
            self.policy,
            self.trainable_parameters(),
            config.learning_rate,
            config.max_grad_norm,
            config.mini_batch_size,
            config.gradient_accumulation_steps,
        )
        self.rng = np.random.RandomState(seed)
        self.policy.eval()

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _forward(self, joint: JointBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Values of the pioneer's and the observer's response tokens, [B, T1] and [B, T2] (float32)."""
        ids, mask = joint.ids.to(self.device), joint.mask.to(self.device)
        position_ids = (torch.cumsum(mask, dim=1) - 1).clamp(min=0)
        first = int(min(joint.pioneer_columns.min(), joint.observer_columns.min()))
        keep = ids.shape[1] - first  # the LM head runs on the response columns only; its logits are unused
        with self._autocast():
            _, values = self.engine.forward_module(self.policy)(ids, mask, position_ids, logits_to_keep=keep)
        values = values.float()
        v1 = torch.gather(values, 1, (joint.pioneer_columns - first).to(self.device))
        v2 = torch.gather(values, 1, (joint.observer_columns - first).to(self.device))
        return v1, v2

    @torch.no_grad()
    def values(self, joint: JointBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """V_old of both agents' response tokens, in micro-batches, on the CPU."""
        parts1, parts2 = [], []
        for s in range(0, len(joint.ids), self.forward_batch_size):
            v1, v2 = self._forward(joint.select(torch.arange(s, min(s + self.forward_batch_size, len(joint.ids)))))
            parts1.append(v1.cpu())
            parts2.append(v2.cpu())
        return torch.cat(parts1), torch.cat(parts2)

    def learn(
        self,
        joint: JointBatch,
        old: tuple[torch.Tensor, torch.Tensor],
        returns: tuple[torch.Tensor, torch.Tensor],
        masks: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[dict[str, float], dict[str, float]]:
        """PPO epochs of the clipped value loss ½·mean max((V − G)², (clip(V, V_old ± ε) − G)²) over every response
        token of both agents (docs/method.md §10); `old`, `returns`, `masks` are (pioneer [B, T1], observer
        [B, T2]). Returns each agent's statistics on its own tokens: value_loss, value_clipfrac, explained_variance;
        an agent whose mask is all zero (frozen by a schedule: no returns to learn) adds no tokens and gets `{}`."""
        cfg, B = self.config, len(joint.ids)
        present = tuple(bool(mk.any()) for mk in masks)
        backward_batch = cfg.mini_batch_size * cfg.gradient_accumulation_steps
        stats: list[list[dict[str, float]]] = []
        for _ in range(cfg.ppo_epochs):
            order = self.rng.permutation(B)
            for b in range(0, B, backward_batch):
                for m in range(b, b + backward_batch, cfg.mini_batch_size):
                    idx = torch.as_tensor(order[m : m + cfg.mini_batch_size])
                    stats.append(self._train_minibatch(joint.select(idx), idx, old, returns, masks, present))
                self._optimizer_step()
        out = []
        for agent, (v, g, mk) in enumerate(zip(old, returns, masks)):
            if not present[agent]:
                out.append({})
                continue
            row = {k: float(np.mean([s[agent][k] for s in stats])) for k in stats[0][agent]}
            row["explained_variance"] = ppo_core.explained_variance(v * mk, g, mk).item()
            out.append(row)
        return out[0], out[1]

    def _train_minibatch(self, joint, idx, old, returns, masks, present) -> list[dict[str, float]]:
        vpreds = self._forward(joint)
        parts = [
            (vp, o[idx].to(self.device), g[idx].to(self.device), mk[idx].float().to(self.device))
            for vp, o, g, mk in zip(vpreds, old, returns, masks)
        ]
        # one loss over every response token of both agents: the two sequences are concatenated along time
        vp, o, g, mk = (torch.cat(x, dim=1) for x in zip(*parts))
        loss, _ = ppo_core.value_loss(vp, o, g, mk, self.config.cliprange_value)
        self.engine.backward(loss)  # ÷ gradient_accumulation_steps inside
        with torch.no_grad():
            per_agent = []
            for (vp, o, g, mk), on in zip(parts, present):
                if not on:
                    per_agent.append({})
                    continue
                agent_loss, clipfrac = ppo_core.value_loss(vp, o, g, mk, self.config.cliprange_value)
                per_agent.append({"value_loss": agent_loss.item(), "value_clipfrac": clipfrac.item()})
        return per_agent

    def _optimizer_step(self) -> bool:
        return self.engine.step()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.engine.optimizer

    # ------------------------------------------------------------------------------------------ checkpointing
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The critic's model (or adapter) and value head."""
        return self.policy.trainable_parameters()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        with self.engine.whole():  # ZeRO-3: gathered and copied out (`Agent.state_tensors`)
            tensors = {f"weight {n}": engines.held(t) for n, t in self.policy.state_dict(keep_vars=True).items()}
        return tensors | tensors_of(self.engine.state_dict()["state"], "optimizer state")

    def save(self, directory: Path) -> None:
        """Weights (safetensors: the adapter and value head, or the whole model), Adam (tensors), RNG (JSON)."""
        directory.mkdir(parents=True, exist_ok=True)
        optimizer_state = self.engine.state_dict()  # under ZeRO, gathered by every process (collective)
        with self.engine.whole():  # ZeRO-3: gathered on every process, rank 0 writes them
            if distributed.is_main():
                self.policy.save_weights(directory)
        if not distributed.is_main():
            return
        torch.save(optimizer_state, directory / "optimizer.pt")
        name, keys, pos, has_gauss, gauss = self.rng.get_state()
        state = {"rng": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
        (directory / "critic.json").write_text(json.dumps(state))

    def load(self, directory: Path) -> None:
        with self.engine.whole(modify=True):
            self.policy.load_weights(directory)
        self.engine.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        name, keys, pos, has_gauss, gauss = json.loads((directory / "critic.json").read_text())["rng"]
        self.rng.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
