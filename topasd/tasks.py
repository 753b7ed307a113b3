"""The task book: arrival times and stage histories the EngineView carries.

Fed by engine events (request service) and the workflow driver (stage and
task completion) through `lifecycle.stage_after`; each change replaces one
frozen `TaskView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from topasd.lifecycle import stage_after
from topasd.model import EngineEvent, EventKind, StageProgress, TaskView, Workflow


class TaskBook:
    """In-flight tasks as frozen views; finished tasks keep their times."""

    def __init__(self, workflows: Mapping[str, Workflow]) -> None:
        self.workflows = workflows
        self.tasks: dict[int, TaskView] = {}  # in flight
        self.arrivals: dict[int, float] = {}
        self.finishes: dict[int, float] = {}

    def arrive(self, task_id: int, workflow: str, t: float) -> None:
        wf = self.workflows[workflow]
        stages = {v: StageProgress() for v in wf.topo_order}
        self.tasks[task_id] = TaskView(task_id, workflow, t, stages)
        self.arrivals[task_id] = t

    def on_event(self, ev: EngineEvent) -> None:
        """A request's event moves its stage's history (`lifecycle.stage_after`)."""
        if ev.kind in (EventKind.REQUEST_READY, EventKind.REQUEST_FINISH):
            self._update(ev.task_id, ev.stage, ev.kind, ev.t, ev.value)

    def stage_done(self, task_id: int, stage: str, t: float) -> None:
        self._update(task_id, stage, EventKind.STAGE_FINISH, t)

    def task_done(self, task_id: int, t: float) -> None:
        self.finishes[task_id] = t
        del self.tasks[task_id]

    def drop(self, task_id: int) -> TaskView | None:
        """Forget an unfinished task (it keeps its arrival; it gets no finish time)."""
        return self.tasks.pop(task_id, None)

    def jct(self) -> dict[int, float]:
        return {i: self.finishes[i] - self.arrivals[i] for i in self.finishes}

    def _update(self, task_id: int | None, stage: str | None, kind: EventKind, t: float,
                value: float = 0.0) -> None:
        task = self.tasks.get(task_id)  # type: ignore[arg-type]
        if task is None or stage is None:
            return
        stages = dict(task.stages)
        stages[stage] = stage_after(task.stages[stage], kind, t, value)
        self.tasks[task.id] = replace(task, stages=stages)
