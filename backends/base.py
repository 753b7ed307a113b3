"""The Backend protocol: an engine that runs requests and reports events."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from topasd.model import Decision, EngineEvent, EngineView, Request, TaskView, TopasError, Workflow


class InfeasibleDecision(TopasError):
    """A backend refused a Decision; the message says which rule it breaks."""


class Backend(Protocol):
    """An engine behind topasd. Times are seconds on the backend's clock."""

    name: str

    @property
    def t(self) -> float: ...

    def submit(self, request: Request) -> None:
        """Queue a request; it becomes waiting at `request.ready_at`."""

    def run_until(self, t_stop: float | None) -> Iterator[EngineEvent]:
        """Advance to `t_stop` (None: until idle), yielding events. A SCHEDULE
        event asks the caller to `apply` a decision before iterating on."""

    def view(self, tasks: Mapping[int, TaskView],
             workflows: Mapping[str, Workflow]) -> EngineView:
        """The state a policy decides on, with the caller's task book."""

    def apply(self, decision: Decision) -> None:
        """Carry out a decision or raise InfeasibleDecision without changing state."""

    def idle(self) -> bool:
        """Nothing running, loading or scheduled in the future."""
