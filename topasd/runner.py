"""Run a trace through a policy on a backend: the loop that wires one
scheduling event (architecture steps 1-5) together."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from backends.base import Backend, BackendStats
from topasd.model import (
    Decision,
    EngineEvent,
    EventKind,
    Request,
    TaskView,
    TopasError,
    Workflow,
    is_int64,
)
from topasd.scheduler import POLICIES, native, policy_params
from topasd.scheduler.base import Policy
from topasd.tasks import TaskBook
from workflows.driver import DriverStep, TaskDriver
from workflows.trace import TaskRecord, Trace


class StalledRun(TopasError):
    """The engine went idle with work left: the policy stopped admitting."""


class RunSink(Protocol):
    """Where a run's decisions and events go (the store implements it).

    A sink that also implements `RunHooks` is told when the run starts and ends.
    """

    def decision(self, decision: Decision) -> None: ...

    def event(self, event: EngineEvent) -> None: ...


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a run is, told to a `RunHooks` sink before the first event."""

    policy: str
    backend: str
    profile: str | None
    # {"profile": {...}, "policy": {...}, "backend": {...}} (+ "search" under TOPAS)
    params: Mapping[str, Any]
    workload: str | None
    seed: int | None
    trace_meta: Mapping[str, Any]


@runtime_checkable
class RunHooks(Protocol):
    """Optional sink hooks around `Run.execute` (sinks without them still work)."""

    def run_started(self, info: RunInfo) -> None: ...

    def run_finished(self, result: RunResult | None, error: BaseException | None) -> None:
        """After the run: its result, or the error that ended it (then re-raised)."""


@dataclass
class RunResult:
    policy: str
    jct: dict[int, float]
    arrivals: dict[int, float]
    finishes: dict[int, float]
    requests_finished: int
    decisions: int
    decision_ms: list[float] = field(repr=False, default_factory=list)
    stats: BackendStats | None = None
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The replay table's row (times in seconds)."""
        jct = np.array(list(self.jct.values()), dtype=float)
        first = min(self.arrivals.values())
        end = max(self.finishes.values())
        makespan = end - first
        ms = np.array(self.decision_ms or [0.0])
        return {
            "policy": self.policy,
            "tasks": len(jct),
            "tasks_unfinished": len(self.arrivals) - len(self.finishes),
            "mean_jct_s": float(jct.mean()),
            "p50_jct_s": float(np.percentile(jct, 50)),
            "p99_jct_s": float(np.percentile(jct, 99)),
            "makespan_s": makespan,
            "throughput_req_s": self.requests_finished / makespan if makespan > 0 else 0.0,
            "first_task_s": min(self.finishes.values()) - first,
            **_engine_columns(self.stats),
            "decisions": self.decisions,
            "decision_mean_ms": float(ms.mean()),
            "decision_p99_ms": float(np.percentile(ms, 99)),
            "wall_s": self.wall_s,
        }


def _engine_columns(s: BackendStats | None) -> dict[str, float]:
    """The replay table's engine counters (zeros without statistics)."""
    if s is None:
        return {"mean_batch": 0.0, "peak_batch": 0, "prefix_loads": 0, "prefix_load_gb": 0.0,
                "prefix_computes": 0, "preemptions": 0, "retractions": 0,
                "recomputed_tokens": 0}
    return {"mean_batch": s.mean_batch, "peak_batch": s.peak_batch,
            "prefix_loads": s.prefix_loads, "prefix_load_gb": s.prefix_load_bytes / 1e9,
            "prefix_computes": s.prefix_computes, "preemptions": s.preemptions,
            "retractions": s.retractions, "recomputed_tokens": s.recomputed_tokens}


Progress = Callable[[int, int, float], None]


class RequestOwner(Protocol):
    """Who turns a finished request into the next step of its task (a
    `TaskDriver` for trace tasks; the daemon's external-call book for requests
    an application drives itself)."""

    def on_finish(self, request_id: int, t: float) -> DriverStep: ...

    def on_withdraw(self, request_id: int, t: float, why: str) -> DriverStep:
        """The backend took the request back before it finished (REQUEST_WITHDRAW)."""


class EventLoop:
    """The event handling a replay `Run` and the daemon share (architecture
    steps 1-5): pump the backend, decide at each SCHEDULE event, record every
    event, and turn finished requests into stage/task completions and the next
    requests. Single-threaded: the owner calls it from one thread.

    `workflows` may grow between calls (the daemon adds workflows as they are
    first used); `on_task_done(task, t)` runs after each TASK_FINISH with the
    task's last view (its stage histories).
    """

    def __init__(self, workflows: Mapping[str, Workflow], policy: Policy, backend: Backend,
                 sink: RunSink | None = None, driver: TaskDriver | None = None) -> None:
        self.workflows = workflows
        self.policy = policy
        self.backend = backend
        self.sink = sink
        self.book = TaskBook(workflows)
        self.driver = driver if driver is not None else TaskDriver(workflows)
        self.owners: dict[int, RequestOwner] = {}  # requests not owned by `driver`
        self.requests_finished = 0
        self.decisions = 0  # numbers decisions (seq); `decision_ms` may be trimmed
        self.decision_ms: list[float] = []
        self.on_task_done: Callable[[TaskView, float], None] | None = None
        self._preempted_by: dict[int, int] = {}  # request -> the decision preempting it
        self._tool_calls: dict[int, float] = {}  # next round's request -> its tool call start

    def arrive(self, record: TaskRecord, t: float | None = None) -> None:
        """A trace task arrives (at `t`, default its recorded arrival): book it,
        record TASK_ARRIVE, submit its entry requests."""
        at = record.arrival if t is None else t
        self.book.arrive(record.id, record.workflow, at)
        self.record(EngineEvent(at, EventKind.TASK_ARRIVE, task_id=record.id,
                                note=record.workflow))
        for req in self.driver.start(record, at):
            self.backend.submit(req)

    def submit(self, request: Request, owner: RequestOwner) -> None:
        """Submit a request whose completion `owner` handles (not the driver)."""
        self.owners[request.id] = owner
        try:
            self.backend.submit(request)
        except BaseException:
            del self.owners[request.id]  # refused: the engine never saw it
            raise

    def pump(self, t_stop: float | None, *, more_at_stop: bool = False) -> None:
        """Run the backend to `t_stop` (None: until idle), deciding and recording;
        with `more_at_stop` (tasks arrive at `t_stop`) a decision due at that
        instant is taken on the next pump, after they arrived."""
        for ev in self.backend.run_until(t_stop, more_at_stop=more_at_stop):
            if ev.kind is EventKind.SCHEDULE:
                self.decide()
                continue
            if ev.kind is EventKind.REQUEST_READY and ev.request_id in self._tool_calls:
                start = self._tool_calls.pop(ev.request_id)
                self.record(replace(ev, kind=EventKind.TOOL_CALL_END, tokens=0,
                                    value=ev.t - start))
            self.record(ev)
            if ev.kind is EventKind.REQUEST_FINISH:
                self.finished(ev)
            elif ev.kind is EventKind.REQUEST_WITHDRAW:
                owner = self.owners.pop(ev.request_id, None)  # type: ignore[arg-type]
                if owner is not None:  # (the trace driver's requests are never withdrawn)
                    step = owner.on_withdraw(ev.request_id, ev.t, ev.note)  # type: ignore[arg-type]
                    self._step(ev, step)

    def decide(self) -> None:
        view = self.backend.view(self.book.tasks, self.workflows)
        t0 = time.perf_counter()
        decision = self.policy.decide(view)
        wall_ms = (time.perf_counter() - t0) * 1e3
        self.decision_ms.append(wall_ms)
        self.decisions += 1
        decision = replace(decision, wall_ms=wall_ms, seq=self.decisions)
        self.backend.apply(decision)
        for rid in decision.preempt:
            self._preempted_by[rid] = decision.seq
        if self.sink is not None:
            self.sink.decision(decision)

    def finished(self, ev: EngineEvent) -> None:
        self.requests_finished += 1
        owner = self.owners.pop(ev.request_id, None)  # type: ignore[arg-type]
        if owner is None:
            step = self.driver.on_finish(ev.request_id, ev.t)  # type: ignore[arg-type]
        else:
            step = owner.on_finish(ev.request_id, ev.t)  # type: ignore[arg-type]
        self._step(ev, step)

    def _step(self, ev: EngineEvent, step: DriverStep) -> None:
        """What a request's end (`ev`) did to its task: stages and the task done,
        the next requests submitted."""
        for stage in step.stages_done:
            self.book.stage_done(ev.task_id, stage, ev.t)  # type: ignore[arg-type]
            wf = self.workflows[self.book.tasks[ev.task_id].workflow]  # type: ignore[index]
            service = self.book.tasks[ev.task_id].stages[stage].service_s  # type: ignore[index]
            self.record(EngineEvent(ev.t, EventKind.STAGE_FINISH, task_id=ev.task_id,
                                    agent=wf.stages[stage].agent, stage=stage, value=service))
        if step.task_done:
            task = self.book.tasks[ev.task_id]  # type: ignore[index]
            self.book.task_done(ev.task_id, ev.t)  # type: ignore[arg-type]
            jct = ev.t - self.book.arrivals[ev.task_id]  # type: ignore[index]
            self.record(EngineEvent(ev.t, EventKind.TASK_FINISH, task_id=ev.task_id, value=jct))
            if self.on_task_done is not None:
                self.on_task_done(task, ev.t)
        for req in step.requests:
            if req.round and req.ready_at > ev.t:  # the round before it called a tool
                self._tool_calls[req.id] = ev.t
                self.record(EngineEvent(ev.t, EventKind.TOOL_CALL_START, ev.request_id,
                                        ev.task_id, req.agent, req.stage,
                                        value=req.ready_at - ev.t, note=f"round {req.round - 1}"))
            self.backend.submit(req)

    def record(self, ev: EngineEvent) -> None:
        """Book `ev`, tell the policy, log it (a PREEMPT with the decision it
        carries out)."""
        if ev.kind is EventKind.PREEMPT and ev.request_id is not None:
            seq = self._preempted_by.pop(ev.request_id, None)
            if seq is not None:
                ev = replace(ev, decision=seq)
        self.book.on_event(ev)
        self.policy.observe(ev)
        if self.sink is not None:
            self.sink.event(ev)


class Run:
    """One run: a driver plays the trace's tasks, the policy decides at each
    SCHEDULE event, the backend executes, a sink records."""

    def __init__(self, trace: Trace, policy: Policy, backend: Backend,
                 sink: RunSink | None = None, progress: Progress | None = None) -> None:
        self.trace = trace
        self.policy = policy
        self.backend = backend
        self.sink = sink
        self.progress = progress
        self.loop = EventLoop(trace.workflows, policy, backend, sink)
        if progress is not None:
            self.loop.on_task_done = self._tick

    @property
    def book(self) -> TaskBook:
        return self.loop.book

    @property
    def driver(self) -> TaskDriver:
        return self.loop.driver

    @property
    def requests_finished(self) -> int:
        return self.loop.requests_finished

    @property
    def decision_ms(self) -> list[float]:
        return self.loop.decision_ms

    def execute(self) -> RunResult:
        hooks = self.sink if isinstance(self.sink, RunHooks) else None
        if hooks is not None:
            hooks.run_started(self.info())
        gc.freeze()  # the trace and workflows live all run: keep them out of GC passes
        try:
            result = self._execute()
        except BaseException as exc:
            if hooks is not None:
                hooks.run_finished(None, exc)
            raise
        finally:
            gc.unfreeze()
        if hooks is not None:
            hooks.run_finished(result, None)
        return result

    def info(self) -> RunInfo:
        """The run's metadata: policy, backend, profile and parameters, workload."""
        return run_info(self.policy, self.backend,
                        {**self.trace.meta, "stages": stage_counts(self.trace.workflows)})

    def _execute(self) -> RunResult:
        wall0 = time.perf_counter()
        loop = self.loop
        tasks = self.trace.tasks
        i = 0
        while i < len(tasks):
            loop.pump(tasks[i].arrival, more_at_stop=True)
            while i < len(tasks) and tasks[i].arrival <= self.backend.t:
                loop.arrive(tasks[i])
                i += 1
            if self.progress is not None:  # engine time moves on while no task finishes
                self.progress(len(loop.book.finishes), len(tasks), self.backend.t)
        loop.pump(None)
        if loop.book.tasks:
            left = len(loop.book.tasks)
            raise StalledRun(
                f"{self.policy.name}: the engine went idle at t={self.backend.t:.1f}s with "
                f"{left} task(s) unfinished; the policy stopped admitting waiting requests"
            )
        return RunResult(
            policy=self.policy.name,
            jct=loop.book.jct(),
            arrivals=dict(loop.book.arrivals),
            finishes=dict(loop.book.finishes),
            requests_finished=loop.requests_finished,
            decisions=len(loop.decision_ms),
            decision_ms=loop.decision_ms,
            stats=self.backend.stats,
            wall_s=time.perf_counter() - wall0,
        )

    def _tick(self, task: TaskView, t: float) -> None:
        assert self.progress is not None
        self.progress(len(self.loop.book.finishes), len(self.trace.tasks), t)


def stage_counts(workflows: Mapping[str, Workflow]) -> dict[str, int]:
    """Stages per workflow, for the run's metadata: a replay of the log shows a
    task's progress out of them (its events only name the stages it reached)."""
    return {name: len(wf.stages) for name, wf in workflows.items()}


def run_info(policy: Policy, backend: Backend, meta: Mapping[str, Any]) -> RunInfo:
    """A run's metadata from its policy, backend and trace/daemon meta."""
    params: dict[str, Any] = {
        "profile": asdict(backend.profile),
        "policy": policy_params(policy),
        "backend": backend.describe(),
    }
    kind = POLICIES.get(policy.name)
    if kind is not None and kind.searches:  # which search its logged decision times are of
        params["search"] = native.status().reason
    meta = dict(meta)
    seed = meta.get("seed")
    return RunInfo(
        policy=policy.name,
        backend=backend.name,
        profile=backend.profile.name,
        params=params,
        workload=None if meta.get("workload") is None else str(meta["workload"]),
        seed=seed if isinstance(seed, int) and is_int64(seed) else None,
        trace_meta=meta,
    )
