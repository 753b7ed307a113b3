"""The application side of a trace: issue each stage's rounds as requests.

A stage becomes ready when all its predecessors finished (section III); its
rounds run one after another with the recorded tool wait between them. The
driver knows nothing about engines: it turns finished requests into the next
requests to submit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from topasd.model import Request, TopasError, Workflow
from workflows.trace import TaskRecord


@dataclass(slots=True)
class DriverStep:
    """What one finished request unlocked."""

    requests: list[Request] = field(default_factory=list)
    stages_done: list[str] = field(default_factory=list)
    task_done: bool = False


class _TaskRun:
    __slots__ = ("open_preds", "record", "stages_left")

    def __init__(self, record: TaskRecord, wf: Workflow) -> None:
        self.record = record
        self.open_preds = {v: len(wf.preds[v]) for v in wf.stages}
        self.stages_left = len(wf.stages)


class TaskDriver:
    """Submits requests for tasks in flight; one driver per run."""

    def __init__(self, workflows: Mapping[str, Workflow]) -> None:
        self.workflows = workflows
        self._runs: dict[int, _TaskRun] = {}
        self._requests: dict[int, Request] = {}
        self._next_id = 0

    @property
    def in_flight(self) -> int:
        return len(self._runs)

    def new_request_id(self) -> int:
        """A fresh request id (also for requests built outside the driver)."""
        rid = self._next_id
        self._next_id += 1
        return rid

    def start(self, record: TaskRecord, t: float) -> list[Request]:
        """A task arrives: its entry stages' first rounds are ready at `t`."""
        if record.id in self._runs:
            raise TopasError(f"task {record.id} was started twice")
        wf = self.workflows[record.workflow]
        self._runs[record.id] = _TaskRun(record, wf)
        return [self._request(record, v, 0, t) for v in wf.entry_stages]

    def on_finish(self, request_id: int, t: float) -> DriverStep:
        """A request finished at `t`: next round after its tool wait, or the
        stage is done and successors whose predecessors all finished start."""
        req = self._requests.pop(request_id)
        run = self._runs[req.task_id]
        rounds = run.record.stages[req.stage]
        step = DriverStep()
        if req.round + 1 < len(rounds):
            wait = rounds[req.round].tool_wait_s
            step.requests.append(self._request(run.record, req.stage, req.round + 1, t + wait))
            return step
        step.stages_done.append(req.stage)
        run.stages_left -= 1
        wf = self.workflows[req.workflow]
        for succ in wf.succs[req.stage]:
            run.open_preds[succ] -= 1
            if run.open_preds[succ] == 0:
                step.requests.append(self._request(run.record, succ, 0, t))
        if run.stages_left == 0:
            step.task_done = True
            del self._runs[req.task_id]
        return step

    def _request(self, record: TaskRecord, stage: str, k: int, ready_at: float) -> Request:
        wf = self.workflows[record.workflow]
        spec = record.stages[stage][k]
        agent = wf.stages[stage].agent
        req = Request(
            id=self.new_request_id(),
            task_id=record.id,
            workflow=record.workflow,
            stage=stage,
            agent=agent,
            round=k,
            input_tokens=spec.input_tokens,
            output_tokens=spec.output_tokens,
            ready_at=ready_at,
            task_arrival=record.arrival,
            prefix_tokens=wf.agents[agent].prefix_tokens,
        )
        self._requests[req.id] = req
        return req
