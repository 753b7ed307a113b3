"""The tasks a daemon reports (`GET /v1/tasks/{id}`): every task it admitted,
from any source, kept after it finished (up to KEEP_FINISHED), and the ids of
driver tasks that never fit."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from topasd.daemon.calls import remember
from topasd.daemon.errors import NotFound
from topasd.model import TaskView

KEEP_FINISHED = 100_000  # finished tasks kept for GET /v1/tasks/{id} and the run summary


def stages_dict(view: TaskView) -> dict[str, Any]:
    """A task's stage histories as the API shows them."""
    return {name: {"status": str(s.status), "rounds_done": s.rounds_done,
                   "service_s": s.service_s, "started_at": s.started_at,
                   "finished_at": s.finished_at}
            for name, s in view.stages.items()}


@dataclass(slots=True)
class TaskEntry:
    """A task as `GET /v1/tasks/{id}` reports it."""

    id: int
    workflow: str
    source: str  # driver | api | openai
    arrival: float
    client_key: str | None = None
    finished: float | None = None
    stages: dict[str, Any] | None = None  # final stage histories, once done or dropped
    abandoned: bool = False  # an application's task that saw no call for task_timeout

    def as_dict(self, view: TaskView | None) -> dict[str, Any]:
        done = self.finished is not None
        stages = self.stages if self.stages is not None else stages_dict(view) if view else {}
        status = "done" if done else "abandoned" if self.abandoned else "running"
        return {
            "id": self.id, "workflow": self.workflow, "source": self.source,
            "client_task_id": self.client_key, "status": status, "arrival": self.arrival,
            "finished": self.finished,
            "jct": None if self.finished is None else self.finished - self.arrival,
            "stages_done": sum(1 for s in (stages or {}).values() if s["status"] == "done"),
            "stages_total": len(stages or {}),
            "stages": stages,
        }


class TaskLedger:
    """Task ids, handed out in order, and the entries of the tasks they name."""

    def __init__(self) -> None:
        self.entries: OrderedDict[int, TaskEntry] = OrderedDict()
        self.refused: dict[int, str] = {}  # driver task ids never admitted: why
        self.next_id = 0

    def new_id(self) -> int:
        tid = self.next_id
        self.next_id += 1
        return tid

    def add(self, entry: TaskEntry) -> TaskEntry:
        """Keep `entry`; past KEEP_FINISHED the oldest ended task is forgotten."""
        self.entries[entry.id] = entry
        if len(self.entries) > KEEP_FINISHED:
            for tid, old in self.entries.items():
                if old.finished is not None or old.abandoned:
                    del self.entries[tid]
                    break
        return entry

    def refuse(self, task_id: int, why: str) -> None:
        """A driver task never admitted, and why (it cannot fit the KV budget, the
        daemon was at capacity)."""
        remember(self.refused, task_id, why, KEEP_FINISHED)

    def finished(self, view: TaskView, t: float) -> None:
        entry = self.entries.get(view.id)
        if entry is not None:
            entry.finished = t
            entry.stages = stages_dict(view)
            self.entries.move_to_end(view.id)

    def abandoned(self, task_id: int, view: TaskView | None) -> None:
        entry = self.entries.get(task_id)
        if entry is not None:
            entry.abandoned = True
            entry.stages = stages_dict(view) if view is not None else entry.stages

    def get(self, task_id: int) -> TaskEntry:
        """The entry of `task_id`; NotFound saying why there is none."""
        entry = self.entries.get(task_id)
        if entry is not None:
            return entry
        if task_id in self.refused:
            raise NotFound(f"task {task_id} of the driver's trace was never admitted: "
                           f"{self.refused[task_id]}")
        if 0 <= task_id < self.next_id:
            raise NotFound(f"task {task_id} finished long ago and is no longer kept in "
                           "memory; read it from the store (tasks table)")
        raise NotFound(f"no task {task_id}: ids come from POST /v1/tasks or the replies' "
                       f"topasd.task_id (known ids are below {self.next_id})")
