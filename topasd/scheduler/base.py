"""The Policy protocol: a pure, deterministic function of the EngineView."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from topasd.model import Decision, EngineEvent, EngineView


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. `decide` must not mutate the view; `observe` feeds
    completed work (request and stage service) into the policy's estimates."""

    name: str

    def decide(self, view: EngineView) -> Decision: ...

    def observe(self, event: EngineEvent) -> None: ...
