"""Policy layouts: which weights play the roles (docs/method.md §11).

A layout is a small frozen dataclass picked by `_target_` in `cory/conf/algorithm/layout/<name>.yaml`
(`algorithm/layout=shared`). It names the agents of a run and the model handle each is built on:

| layout | agents | weights |
|---|---|---|
| `Separate` (CORY) | one per role: llm1, llm2, … | each its own full copy or LoRA adapter, value head, optimiser |
| `LoraPerRole` | one per role | one frozen base, one LoRA adapter per role named after it (llm1 trains `pioneer`) |
| `Shared` (self-play) | llm1 alone | one policy plays every role, one update per iteration on all roles' samples |

With `LoraPerRole` an adapter never leaves its role: no schedule that exchanges roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from cory.errors import ConfigError


class Layout(Protocol):
    name: ClassVar[str]
    keeps_roles: ClassVar[bool]  # an agent never leaves its role (no schedule may exchange roles)
    needs_lora: ClassVar[bool]  # it checks the loaded backbone (`check_backbone`) before the agents are built

    def agents(self, roles: tuple[str, ...]) -> list[str]: ...

    def handle(self, agent: str, roles: tuple[str, ...]) -> str: ...

    def players(self, assigned: list[str], roles: tuple[str, ...]) -> list[str]: ...


@dataclass(frozen=True)
class Separate:
    name: ClassVar[str] = "separate"
    keeps_roles: ClassVar[bool] = False  # agents may exchange roles
    needs_lora: ClassVar[bool] = False

    def agents(self, roles: tuple[str, ...]) -> list[str]:
        return [f"llm{i + 1}" for i in range(len(roles))]

    def handle(self, agent: str, roles: tuple[str, ...]) -> str:
        return agent

    def players(self, assigned: list[str], roles: tuple[str, ...]) -> list[str]:
        """The agent of each role, as the schedule assigned them."""
        return assigned


@dataclass(frozen=True)
class LoraPerRole:
    name: ClassVar[str] = "lora_per_role"
    keeps_roles: ClassVar[bool] = True  # an adapter is named after its role and never leaves it
    needs_lora: ClassVar[bool] = True

    def agents(self, roles: tuple[str, ...]) -> list[str]:
        return [f"llm{i + 1}" for i in range(len(roles))]

    def handle(self, agent: str, roles: tuple[str, ...]) -> str:
        return roles[int(agent.removeprefix("llm")) - 1]

    def players(self, assigned: list[str], roles: tuple[str, ...]) -> list[str]:
        return assigned

    def check_backbone(self, backbone) -> None:
        """One adapter per role on one base: LoRA with a shared base (refused in one line otherwise)."""
        if backbone.lora is None:
            raise ConfigError(
                "algorithm/layout=lora_per_role trains one LoRA adapter per role, but model.lora.enabled=false "
                "(full fine-tuning): set model.lora.enabled=true or algorithm/layout=separate"
            )
        if not backbone.lora.share_base:
            raise ConfigError(
                "algorithm/layout=lora_per_role puts every role's adapter on one base, but model.lora.share_base=false"
            )


@dataclass(frozen=True)
class Shared:
    name: ClassVar[str] = "shared"
    keeps_roles: ClassVar[bool] = False
    needs_lora: ClassVar[bool] = False

    def agents(self, roles: tuple[str, ...]) -> list[str]:
        return ["llm1"]

    def handle(self, agent: str, roles: tuple[str, ...]) -> str:
        return agent

    def players(self, assigned: list[str], roles: tuple[str, ...]) -> list[str]:
        """The one policy plays every role."""
        return assigned[:1] * len(roles)
