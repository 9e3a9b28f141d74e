"""One PPO update of each agent on fixed rollouts, in W processes (under `torchrun`) or in one that stands for them.

`python tests/helpers/data_parallel.py OUT ALGORITHM --emulate W` (one process, the whole batch of W×B rows) or
`torchrun --nproc_per_node W tests/helpers/data_parallel.py OUT ALGORITHM` (process r takes rows r·B…(r+1)·B).
Each writes OUT/rank<r>.pt: every agent's trainable parameters, Adam's step count and β after `learn`.
The agents are built as a run builds them (`experiment=smoke`; CORY: two LoRA adapters on one base, the reference
that base with adapters disabled) and the engine is joined as a run joins it (`cory.distributed.setup`).
`--shard zero2|zero3|fsdp`: full fine-tuning (CORY: two whole copies), and under `torchrun` that sharding engine
(`hardware=deepspeed_zero2|deepspeed_zero3|fsdp`, fp32 on the CPU; ZeRO-3 and FSDP also shard the weights and the
reference); the emulating process keeps torch's Adam, so the two are compared.
`--save DIR`: each process also takes part in saving the agents after the update (`cory.ppo.learner.Agent.save`,
rank 0 writes DIR/<agent>); `--load DIR`: every agent first loads DIR/<agent> (saved by either engine).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from cory import build, distributed, engines  # noqa: E402
from cory.ppo.estimators import Estimate, EstimatorInputs  # noqa: E402
from cory.ppo.learner import Agent, Batch  # noqa: E402
from helpers.compose import compose_cfg  # noqa: E402
from helpers.from_config import agent_from  # noqa: E402

B = 4  # rows per process
PROMPT, RESPONSE = 5, 6  # equal lengths: every row has the same number of response tokens (see the test)


def fixed_rollout_tokens(rows: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (PROMPT,), generator=g) for _ in range(rows)]
    responses = [torch.randint(0, 256, (RESPONSE,), generator=g) for _ in range(rows)]
    return prompts, responses, torch.randn(rows, generator=g)


def per_slice_advantages(agent: Agent, slices: int):
    """The agent's estimator (GAE, whitened) on each process's slice, as each of `slices` processes whitens its own
    (TRL's semantics)."""
    estimator = agent.learner.advantage

    def advantages(inputs: EstimatorInputs) -> Estimate:
        fields = (inputs.rewards, inputs.values, inputs.mask, inputs.roles)
        parts = [estimator(EstimatorInputs(*x)) for x in zip(*(f.chunk(slices) for f in fields))]
        return Estimate(torch.cat([p.advantages for p in parts]), torch.cat([p.returns for p in parts]))

    advantages.uses_values = estimator.uses_values
    return advantages


def main(out: Path, algorithm: str, emulate: int, shard: str, save: Path | None, load: Path | None) -> None:
    world = int(emulate) or 1
    rows = B * world if emulate else B  # one process holds the whole batch; W processes a slice each
    option = shard if shard == "fsdp" else f"deepspeed_{shard}"
    shard_hardware = [f"hardware={option}", "hardware.device=cpu", "hardware.precision=fp32"]
    if shard == "zero3":  # every weight sharded, however small (DeepSpeed keeps those under 1e5 elements whole)
        shard_hardware.append(f"hardware.deepspeed_config={Path(__file__).with_name('zero3_shard_everything.json')}")
    cfg = compose_cfg(
        [
            "experiment=smoke",
            f"algorithm={algorithm}",
            f"model.lora.enabled={algorithm == 'cory' and not shard}",
            *(shard_hardware if shard and not emulate else []),
            f"algorithm.agent.mini_batch_size={rows}",  # one minibatch per epoch: the whole (local) batch
            "algorithm.agent.ppo_epochs=2",
            "algorithm.agent.max_grad_norm=1.0",  # clipping must see the averaged gradient
        ]
    )
    device = distributed.setup(cfg.hardware, torch.device("cpu"))
    backbone = build.build_backbone(cfg.model, device)
    reference = backbone.reference()
    names = ["llm1", "llm2"] if algorithm == "cory" else ["llm1"]
    agents = [agent_from(cfg, backbone, reference, name, seed=i) for i, name in enumerate(names)]
    result = {}
    for agent in agents if load is not None else []:
        agent.load(load / agent.name)
    for i, agent in enumerate(agents):
        prompts, responses, scores = fixed_rollout_tokens(B * (int(emulate) or distributed.world_size()), seed=10 + i)
        lo = 0 if emulate else distributed.rank() * B
        sl = slice(lo, lo + rows)
        if emulate:
            agent.learner.advantage = per_slice_advantages(agent, world)
        rollout = agent.actor.score_tokens(prompts[sl], responses[sl])
        stats = agent.learner.update(Batch(rollout, scores[sl])).stats
        steps = [s["step"] for s in agent.trainee.engine.optimizer.state.values()]
        with agent.trainee.engine.whole():  # ZeRO-3, FSDP: gathered from the shards
            params = {str(k): engines.held(p).clone() for k, p in enumerate(agent.trainee.trainable_parameters())}
        result[agent.name] = {
            "params": params,
            "kl_coef": agent.learner.kl_ctl.value,
            "adam_steps": float(steps[0]),
            "policy_loss": stats["policy_loss"],
            # the trainable weights this process holds (under ZeRO-3 and FSDP its shard of them)
            "weight_bytes": sum(
                engines.local(p).numel() * p.element_size() for p in agent.trainee.trainable_parameters()
            ),
            # Adam's moments held by this process (under ZeRO and FSDP its shard of them)
            "adam_bytes": sum(
                engines.local(t).numel() * t.element_size()
                for state in agent.trainee.engine.optimizer.state.values()
                for t in state.values()
                if torch.is_tensor(t) and t.dim() > 0
            ),
        }
        if save is not None:
            agent.save(save / agent.name)  # collective under ZeRO/FSDP: every process gathers the Adam state
    out.mkdir(parents=True, exist_ok=True)
    torch.save(result | {"world_size": distributed.world_size()}, out / f"rank{distributed.rank()}.pt")
    distributed.close()


if __name__ == "__main__":
    emulate = int(sys.argv[sys.argv.index("--emulate") + 1]) if "--emulate" in sys.argv else 0
    save, load = (Path(sys.argv[sys.argv.index(f) + 1]) if f in sys.argv else None for f in ("--save", "--load"))
    shard = sys.argv[sys.argv.index("--shard") + 1] if "--shard" in sys.argv else ""
    main(Path(sys.argv[1]), sys.argv[2], emulate, shard, save, load)
    # The results are on disk and the process group is gone. Under ZeRO-3 a gloo worker thread can still hold work
    # that interpreter finalisation tears down, which aborts the process now and then ("terminate called without an
    # active exception"; torch's c10d has no fix yet): leave without finalisation, as the results are what is checked.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
