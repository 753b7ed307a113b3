"""The application side of a trace: issue each stage's rounds as requests.

A stage becomes ready when all its predecessors finished (section III), or
an entry stage when its task arrives; its first rounds are ready the recorded
wait before the stage later, and its rounds run one after another with the
recorded tool wait between them: a request is ready the wait after the event
that unlocked it (`_after`). A stage of several branches runs them in
parallel, and is done when the last one is. The driver knows nothing about
engines: it turns finished requests into the next requests to submit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from topasd.model import Request, Segment, TopasError, Workflow, segment_keys
from workflows.trace import RoundSpec, TaskRecord


@dataclass(slots=True)
class DriverStep:
    """What one finished request unlocked."""

    requests: list[Request] = field(default_factory=list)
    stages_done: list[str] = field(default_factory=list)
    task_done: bool = False


class _TaskRun:
    __slots__ = ("branches", "branches_left", "open_preds", "record", "stages_left")

    def __init__(self, record: TaskRecord, wf: Workflow) -> None:
        self.record = record
        self.open_preds = {v: len(wf.preds[v]) for v in wf.stages}
        self.stages_left = len(wf.stages)
        self.branches = {v: record.branches(v) for v in wf.stages}
        self.branches_left = {v: len(b) for v, b in self.branches.items()}


class TaskDriver:
    """Submits requests for tasks in flight; one driver per run."""

    def __init__(self, workflows: Mapping[str, Workflow]) -> None:
        self.workflows = workflows
        self._runs: dict[int, _TaskRun] = {}
        self._requests: dict[int, tuple[Request, int]] = {}  # id -> (request, branch)
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
        run = self._runs[record.id] = _TaskRun(record, wf)
        return [req for v in wf.entry_stages for req in self._stage_ready(run, v, t)]

    def on_finish(self, request_id: int, t: float) -> DriverStep:
        """A request finished at `t`: its branch's next round after its tool wait,
        or, once every branch finished, the stage is done and successors whose
        predecessors all finished start."""
        req, branch = self._requests.pop(request_id)
        run = self._runs[req.task_id]
        rounds = run.branches[req.stage][branch]
        step = DriverStep()
        if req.round + 1 < len(rounds):
            step.requests.append(self._request(run, req.stage, branch, req.round + 1,
                                               _after(t, rounds[req.round].tool_wait_s)))
            return step
        run.branches_left[req.stage] -= 1
        if run.branches_left[req.stage]:
            return step
        step.stages_done.append(req.stage)
        run.stages_left -= 1
        wf = self.workflows[req.workflow]
        for succ in wf.succs[req.stage]:
            run.open_preds[succ] -= 1
            if run.open_preds[succ] == 0:
                step.requests += self._stage_ready(run, succ, t)
        if run.stages_left == 0:
            step.task_done = True
            del self._runs[req.task_id]
        return step

    def _stage_ready(self, run: _TaskRun, stage: str, t: float) -> list[Request]:
        """`stage` is ready at `t`: the first round of each of its branches, after
        the wait before the stage."""
        at = _after(t, run.record.waits.get(stage, 0.0))
        return [self._request(run, stage, b, 0, at) for b in range(len(run.branches[stage]))]

    def _request(self, run: _TaskRun, stage: str, branch: int, k: int,
                 ready_at: float) -> Request:
        record = run.record
        wf = self.workflows[record.workflow]
        spec = run.branches[stage][branch][k]
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
            shared=_segments(record, agent, spec.shared),
            keeps=_kept_as(record, agent, spec, run.branches[stage][branch][k + 1:k + 2]),
        )
        self._requests[req.id] = (req, branch)
        return req


def _segments(record: TaskRecord, agent: str, names: tuple[str, ...]) -> tuple[Segment, ...]:
    """The shared segments a round's input starts with, as copies (`segment_keys`)."""
    keys = segment_keys(agent, record.id, names)
    return tuple(Segment(k, record.context[n]) for k, n in zip(keys, names, strict=True))


def _kept_as(record: TaskRecord, agent: str, spec: RoundSpec,
             after: tuple[RoundSpec, ...]) -> Segment | None:
    """The copy a round's finished sequence becomes: the last segment its next
    round names, when that round starts with this round's segments and then
    exactly this round's own input and output (the conversation so far)."""
    if not after or not after[0].shared or after[0].shared[:-1] != spec.shared:
        return None
    name = after[0].shared[-1]
    own = spec.input_tokens - sum(record.context[n] for n in spec.shared)
    if record.context[name] != own + spec.output_tokens:
        return None
    return Segment(segment_keys(agent, record.id, after[0].shared)[-1], record.context[name])


def _after(t: float, wait: float) -> float:
    """When a request unlocked at `t` is ready: after its wait (a tool call, or
    the pause before a stage)."""
    return t + wait
