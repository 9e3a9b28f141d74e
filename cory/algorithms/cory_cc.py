"""CORY with a centralised critic (CoLLM-CC, Liu et al., arXiv 2601.21972; docs/method.md §10).

CORY's loop (`cory/algorithms/cory.py`, docs/method.md §1.2) with one change at step 5: both actors take their
values from one critic that reads the joint sequence [x_P; a1; a2] (`cory.ppo.central_critic`), and the critic is
trained on both agents' returns. Each actor keeps its own policy, clipping, KL penalty and β; neither has a value loss.
  1-4. as CORY: pioneer acts, observer acts on T_obs(q, a1), task rewards, collective rewards R_P and R_O (Eq. 4)
  5a.  the critic's values V_φ of each agent's response tokens, read from the joint sequence (causal)
  5b.  two PPO updates, GAE on each agent's own KL-shaped rewards with the critic's values
  5c.  the critic's update: clipped value loss against both agents' returns
  6.   role exchange as CORY (the critic has no role: it reads the joint sequence in role order)
`critic: per_agent` is CORY itself (each agent's own value head).
"""

from __future__ import annotations

from pathlib import Path

import torch

from cory import runtime
from cory.algorithms.base import RunContext, named_parameters
from cory.algorithms.cory import CORY
from cory.checkpoints import check_files, damaged, refuse_nonfinite
from cory.errors import CheckpointError, ConfigError
from cory.ppo.central_critic import CentralCritic, CriticActors, joint_batch
from cory.ppo.learner import PPOConfig

CRITICS = ("per_agent", "centralized")
CRITIC_DIR = "critic"


class CORYCC(CORY):
    """CORY whose two actors share a centralised critic (`critic: centralized`), or CORY (`critic: per_agent`).

    Built by Hydra from `cory/conf/algorithm/cory_cc.yaml`: CORY's keys plus `critic`.
    """

    def __init__(
        self,
        agent,
        critic: str,
        knowledge_transfer: bool,
        role_exchange: bool,
        swap_period: int,
        w_self: float,
        w_other: float,
        faithful_official_swap: bool,
        log_samples: int,
        *,
        context: RunContext,
    ) -> None:
        if critic not in CRITICS:
            raise ConfigError(f"algorithm.critic={critic!r}: allowed {CRITICS}")
        centralized = critic == "centralized"
        if centralized and type(agent) is not PPOConfig:  # GAE needs values: a critic-free learner has no use for them
            raise ConfigError(
                "algorithm.critic=centralized needs PPO's learner (algorithm.agent._target_: "
                f"cory.ppo.learner.PPOConfig), got {type(agent).__module__}.{type(agent).__qualname__}"
            )
        super().__init__(
            CriticActors(agent) if centralized else agent,
            knowledge_transfer,
            role_exchange,
            swap_period,
            w_self,
            w_other,
            faithful_official_swap,
            log_samples,
            context=context,
        )
        self.critic_mode, self.critic = critic, None
        if centralized:
            s, hw = context.settings, context.hardware
            backbone = context.backbone()  # the one the team's agents were built on (cached)
            self.pad_token_id = backbone.tokenizer.pad_token_id
            self.critic = CentralCritic(
                backbone.policy(CRITIC_DIR, init_seed=s.seed),
                agent,
                seed=s.seed + len(self.team.agents),  # its own minibatch stream after the agents' seed, seed + 1
                device=context.device,
                autocast_dtype=runtime.autocast_dtype(hw.precision),
                forward_batch_size=hw.forward_batch_size,
            )

    def describe(self) -> dict:
        return super().describe() | {"algorithm": "cory_cc", "critic": self.critic_mode}

    def _update(self, iteration: int, pioneer: tuple, observer: tuple) -> tuple[dict, dict]:
        """Step 5 with the centralised critic; CORY's steps 1-4 and 6 are CORY's own (`CORY.step`). Under a schedule
        that freezes an agent (`cory/algorithms/cory_variants.py`) the frozen actor takes no update and the critic
        learns from the returns of the agent that did."""
        if self.critic is None:
            return super()._update(iteration, pioneer, observer)
        (pio_agent, pio, R_pio), (obs_agent, obs, R_obs) = pioneer, observer
        # 5a. the centralised critic's values of each agent's tokens, from the joint sequence [x_P; a1; a2]
        joint = joint_batch(pio, obs, self.pad_token_id)
        v1, v2 = self.critic.values(joint)
        pio.values, obs.values = v1 * pio.response_mask, v2 * obs.response_mask
        # 5b. two PPO updates with those values (GAE on each agent's own KL-shaped rewards), as the schedule allows
        stats = [self._learn(iteration, pio_agent, pio, R_pio), self._learn(iteration, obs_agent, obs, R_obs)]
        # 5c. the critic learns the returns of the agents that learned (both, unless the schedule froze one), over
        # their tokens only; skipped with an actor's update on a non-finite input (its returns are None then)
        sides = ((pio_agent, pio), (obs_agent, obs))
        learned = [self.learns(a.name, iteration) for a, _ in sides]
        if any(learned) and all(a.returns is not None for (a, _), on in zip(sides, learned) if on):
            returns = tuple(a.returns if on else torch.zeros_like(r.values) for (a, r), on in zip(sides, learned))
            masks = tuple(r.response_mask * on for (_, r), on in zip(sides, learned))
            critic_stats = self.critic.learn(joint, (pio.values, obs.values), returns, masks)
            stats = [s | c if on else s for s, c, on in zip(stats, critic_stats, learned)]
        return stats[0], stats[1]

    def parameters(self):
        yield from self.team.parameters()
        if self.critic is not None:
            yield from named_parameters({CRITIC_DIR: self.critic.trainable_parameters()})

    def save(self, directory: Path) -> None:
        super().save(directory)
        if self.critic is not None:
            self.critic.save(directory / CRITIC_DIR)

    def load(self, directory: Path) -> None:
        if self.critic is not None:  # checked before anything is loaded
            checkpoint, folder = directory.parent, directory / CRITIC_DIR
            if not folder.is_dir():
                raise CheckpointError(f"checkpoint {checkpoint} has no centralised critic ({CRITIC_DIR}/)")
            check_files(folder, checkpoint)
        super().load(directory)
        if self.critic is not None:
            with damaged(folder, checkpoint):
                self.critic.load(folder)
            refuse_nonfinite(self.critic.state_tensors(), folder, checkpoint)
