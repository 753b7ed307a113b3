"""The Policy protocol: a pure, deterministic function of the EngineView."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from topasd.model import Decision, EngineEvent, EngineView
from topasd.scheduler.params import TopasParams


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. `decide` must not mutate the view; `observe` feeds
    completed work (request and stage service) into the policy's estimates."""

    name: str

    def decide(self, view: EngineView) -> Decision: ...

    def observe(self, event: EngineEvent) -> None: ...


@runtime_checkable
class TunablePolicy(Policy, Protocol):
    """A policy with TOPAS's parameters, which may change between decisions."""

    @property
    def params(self) -> TopasParams: ...

    def set_params(self, **changes: Any) -> TopasParams:
        """Validate and apply `changes` (effective at the next decision)."""


@dataclass(frozen=True, slots=True)
class PolicyKind:
    """What the registry knows of a policy before making one: whether it takes
    TOPAS's parameters (`tunable`: --param, PATCH /v1/params, the console
    form), runs TOPAS's search (`searches`: its decision times depend on the
    compiled search), and is part of `--policy all` (`in_all`: the ablation
    variants and topas-paper are named one by one)."""

    name: str
    tunable: bool
    searches: bool
    in_all: bool
