"""The tasks a daemon reports (`GET /v1/tasks`, `GET /v1/tasks/{id}`): every
task it admitted, from any source, kept after it finished (up to
KEEP_FINISHED), the ids of driver tasks that never fit, the client ids
applications gave their tasks, and for the last KEEP_TRAILS tasks each
request's trail: its times and the decisions that admitted or preempted it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from topasd.daemon.calls import remember
from topasd.daemon.errors import Invalid, NotFound
from topasd.lifecycle import Trail
from topasd.model import DECISION_REQUESTS, Decision, EngineEvent, EventKind, TaskView

KEEP_FINISHED = 100_000  # finished tasks kept for GET /v1/tasks/{id} and the run summary
KEEP_TRAILS = 10_000  # tasks whose requests' trails are kept (older: read the store)
STATUSES = ("running", "done", "abandoned")


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

    @property
    def status(self) -> str:
        return "done" if self.finished is not None else "abandoned" if self.abandoned \
            else "running"

    def as_dict(self, view: TaskView | None) -> dict[str, Any]:
        stages = self.stages if self.stages is not None else stages_dict(view) if view else {}
        return {
            "id": self.id, "workflow": self.workflow, "source": self.source,
            "client_task_id": self.client_key, "status": self.status, "arrival": self.arrival,
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
        self.by_client: dict[str, list[int]] = {}  # client task id -> our ids, oldest first
        self.trails: OrderedDict[int, dict[int, Trail]] = OrderedDict()  # task -> requests
        self._task_of: dict[int, int] = {}  # request in the engine -> its task

    def new_id(self) -> int:
        tid = self.next_id
        self.next_id += 1
        return tid

    def add(self, entry: TaskEntry) -> TaskEntry:
        """Keep `entry`; past KEEP_FINISHED the oldest ended task is forgotten."""
        self.entries[entry.id] = entry
        if entry.client_key is not None:
            self.by_client.setdefault(entry.client_key, []).append(entry.id)
        self.trails[entry.id] = {}
        if len(self.trails) > KEEP_TRAILS:
            self.trails.popitem(last=False)
        if len(self.entries) > KEEP_FINISHED:
            for tid, old in self.entries.items():
                if old.finished is not None or old.abandoned:
                    self._forget(tid, old)
                    break
        return entry

    def _forget(self, task_id: int, entry: TaskEntry) -> None:
        del self.entries[task_id]
        if entry.client_key is not None:
            ids = self.by_client.get(entry.client_key, [])
            if task_id in ids:
                ids.remove(task_id)
            if not ids:
                self.by_client.pop(entry.client_key, None)

    # ------------------------------------------------------------ trails

    def on_event(self, ev: EngineEvent) -> None:
        """A request's event: its trail (the engine loop's thread)."""
        rid = ev.request_id
        if rid is None or ev.task_id is None:
            return
        if ev.kind in (EventKind.REQUEST_FINISH, EventKind.REQUEST_WITHDRAW):
            self._task_of.pop(rid, None)
        trails = self.trails.get(ev.task_id)
        if trails is None:
            return
        if ev.kind is EventKind.REQUEST_READY:
            trails[rid] = Trail(rid, ev.stage or "", ev.agent or "", ev.t)
            self._task_of[rid] = ev.task_id
            return
        trail = trails.get(rid)
        if trail is not None:
            trail.after(ev.kind, ev.t)

    def on_decision(self, d: Decision) -> None:
        """The decisions that admitted, preempted or held each request."""
        for action, f in DECISION_REQUESTS.items():
            for rid in getattr(d, f):
                task = self._task_of.get(rid)
                trail = None if task is None else self.trails.get(task, {}).get(rid)
                if trail is not None:
                    trail.on_decision(d.seq, action)

    # ------------------------------------------------------------ lookups

    def find(self, key: str, workflow: str | None = None) -> TaskEntry:
        """The task `key` names: our id (digits), else the client's task id (the
        latest such task, of `workflow` if given); NotFound saying why not."""
        if key.isdigit():
            entry = self.entries.get(int(key))
            if entry is not None and (workflow is None or entry.workflow == workflow):
                return entry
        ids = [i for i in self.by_client.get(key, ())
               if workflow is None or self.entries[i].workflow == workflow]
        if ids:
            return self.entries[ids[-1]]
        if key.isdigit() and workflow is None:
            return self.get(int(key))  # NotFound, saying what became of it
        where = f" of workflow {workflow!r}" if workflow else ""
        raise NotFound(f"no task {key!r}{where}: neither a task id of this daemon nor a "
                       "client's task_id (topasd.task_id of its calls) it holds; "
                       "GET /v1/tasks lists the tasks")

    def select(self, workflow: str | None, status: str | None,
               client_task_id: str | None) -> Iterator[TaskEntry]:
        """The tasks kept, newest first, that match every filter given."""
        if status is not None and status not in STATUSES:
            raise Invalid(f"status: {status!r} is not one of {', '.join(STATUSES)}")
        if client_task_id is not None:
            pool: Any = (self.entries[i] for i in reversed(self.by_client.get(
                client_task_id, [])))
        else:
            pool = reversed(list(self.entries.values()))
        for entry in pool:
            if workflow is not None and entry.workflow != workflow:
                continue
            if status is not None and entry.status != status:
                continue
            yield entry

    def requests(self, task_id: int) -> list[dict[str, Any]] | None:
        """Task `task_id`'s requests' trails (None: no longer kept)."""
        trails = self.trails.get(task_id)
        return None if trails is None else [t.as_dict() for t in trails.values()]

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
