"""The daemon: one engine-loop thread owning backend, policy, task book,
drivers and the store sink; everything else talks to it through thread-safe
methods that return futures.

The loop (`Service._main`) repeats: advance the backend with the shared
`EventLoop` (decide at each SCHEDULE event, record every event), run the
pending commands (submissions, parameter changes, state queries) from a
queue, then wait for the clock or the next command. Commands run between
decisions, so a parameter change is effective at the next decision and a
state snapshot is consistent.

Clock: on the paced sim the engine's virtual time follows the wall clock,
t = (wall - wall0) x speed; with speed "max" it runs unpaced, as fast as the
work allows (and waits while idle).

Three sources of tasks: the built-in driver (`--workload NAME --rate R`),
`POST /v1/tasks` (a sampled task of a registered workflow), and
OpenAI-compatible calls that an application drives itself (`CallSpec`): each
call is one request; its task and stage come from its metadata, or, for a
plain client, a one-stage task of an agent keyed by its system prompt.

Token counts of OpenAI calls: `count_tokens(text) = ceil(len(text) / 4)`
(characters / 4, the usual rule of thumb; deterministic, no tokenizer).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import logging
import math
import threading
import time
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from backends.base import Backend, EngineLimits
from backends.sim.engine import SimBackend
from store import Store, StoreSink
from topasd.config import Settings
from topasd.model import (
    Agent,
    EngineEvent,
    EventKind,
    Location,
    Request,
    Stage,
    TaskView,
    TopasError,
    Workflow,
)
from topasd.profiles import HardwareProfile, get_profile
from topasd.runner import EventLoop, RunResult, run_info, stage_counts
from topasd.scheduler import ALL_POLICY_NAMES, TunablePolicy, build_policy, policy_params
from topasd.scheduler.param_specs import canonical_param
from topasd.scheduler.residual import ServiceModel, TaskPaths, quantile_rows
from workflows.builtin import Workload, builtin_workflows, load_workload
from workflows.driver import DriverStep, TaskDriver
from workflows.spec import load_workflow
from workflows.trace import TaskRecord, check_rate, sample_task, trace_tasks

log = logging.getLogger("topasd")

TICK_S = 0.02  # paced: wall seconds between clock ticks while the engine is busy
IDLE_WAIT_S = 0.5  # wait for a command at most this long while idle
UNPACED_SLICE = 1.0  # unpaced: virtual seconds advanced between command checks
PACED_SLICE_WALL = 0.1  # paced: at most this much wall time's worth per pump
KEEP_FINISHED = 100_000  # finished tasks kept for GET /v1/tasks/{id} and the run summary
KEEP_CLOSED_KEYS = 100_000  # ended client task ids remembered for a late call's message
KEEP_DECISION_MS = 200_000  # decision wall times kept for the run summary
RECENT_DECISIONS = 50
DETAIL_DECISIONS = 1024  # decisions kept with their candidates for GET /v1/decisions/{seq}
STATS_WINDOW = 10_000  # p99 JCT and decision latency over this many recent values
BUS_SIZE = 16_384
SYNTHESIZED = "agent:"  # name prefix of the one-stage workflows of calls without one


# ------------------------------------------------------------------ errors


class ServiceError(TopasError):
    """A request the daemon refuses; `status` is its HTTP status."""

    status = 400
    kind = "invalid_request_error"


class Invalid(ServiceError):
    status = 422


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"


class Conflict(ServiceError):
    status = 409
    kind = "conflict_error"


class Unavailable(ServiceError):
    status = 503
    kind = "unavailable_error"


class Withdrawn(ServiceError):
    """A call taken back before it finished: its client went away (nobody reads the
    reply; 499 is the status logs use for a client that closed the request)."""

    status = 499
    kind = "withdrawn_error"


# ------------------------------------------------------------ OpenAI calls


def count_tokens(text: str) -> int:
    """Simulated token count of a text: ceil(characters / 4)."""
    return math.ceil(len(text) / 4)


def agent_key(system_prompt: str) -> str:
    """The agent a plain client's call belongs to: its system prompt's hash."""
    if not system_prompt:
        return "default"
    return "sys-" + hashlib.sha256(system_prompt.encode()).hexdigest()[:10]


_WORDS = ("the", "job", "ran", "one", "new", "run", "for", "you", "and", "all")


def filler_text(tokens: int) -> str:
    """A simulated reply of `tokens` tokens under `count_tokens` (4 chars each)."""
    if tokens <= 0:
        return ""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(tokens)) + " "


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One OpenAI-compatible call, counted: the API builds it from a request body."""

    system_tokens: int  # the system prompt's tokens (prefix of a synthesized agent)
    system_key: str  # `agent_key` of the system prompt
    input_tokens: int
    output_tokens: int
    task_key: str | None = None  # metadata.task_id
    workflow: str | None = None
    stage: str | None = None
    agent: str | None = None
    last_in_stage: bool = True
    last_in_task: bool = False


@dataclass(frozen=True, slots=True)
class CallResult:
    """A finished call: what the reply reports."""

    request_id: int
    task_id: int
    workflow: str
    stage: str
    agent: str
    round: int
    prompt_tokens: int  # prefix + input
    completion_tokens: int
    t_ready: float
    t_finish: float
    task_done: bool
    task_key: str | None

    def meta(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "client_task_id": self.task_key,
            "request_id": self.request_id, "workflow": self.workflow, "stage": self.stage,
            "agent": self.agent, "round": self.round, "t_ready": self.t_ready,
            "t_finish": self.t_finish, "latency_s": self.t_finish - self.t_ready,
            "task_done": self.task_done,
        }


# ----------------------------------------------------------------- clock


class Clock:
    """Virtual time of the paced engine: (wall - wall0) x speed (None: unpaced)."""

    def __init__(self, speed: float | None) -> None:
        self.speed = speed
        self.wall0 = time.monotonic()

    def now(self) -> float:
        assert self.speed is not None
        return (time.monotonic() - self.wall0) * self.speed


# ------------------------------------------------------------- event bus


@dataclass(frozen=True, slots=True)
class DecisionSummary:
    """A decision as the state and the event stream show it (no candidate list)."""

    seq: int
    t: float
    policy: str
    admit: tuple[int, ...]
    preempt: tuple[int, ...]
    load: tuple[str, ...]
    evict: tuple[str, ...]
    blocked: bool
    wall_ms: float
    n_candidates: int
    terms: tuple[float, float, float, float, float] | None
    params_version: int

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq, "t": self.t, "policy": self.policy, "admit": list(self.admit),
            "preempt": list(self.preempt), "load": list(self.load), "evict": list(self.evict),
            "noop": not (self.admit or self.preempt or self.load or self.evict),
            "blocked": self.blocked, "wall_ms": self.wall_ms,
            "n_candidates": self.n_candidates, "params_version": self.params_version,
            "terms": None,
        }
        if self.terms is not None:
            ja, jm, jr, jv, vr = self.terms
            out["terms"] = {"j_admit": ja, "j_move": jm, "j_redo": jr, "j_revoke": jv,
                            "v_reuse": vr, "total": ja - jm - jr - jv + vr}
        return out


class EventBus:
    """A ring of recent decisions and events. The loop appends (O(1), never
    blocks); each reader keeps a cursor and, when it fell behind the ring,
    skips ahead and is told how many items it missed."""

    def __init__(self, size: int = BUS_SIZE) -> None:
        self._ring: deque[tuple[int, str, Any]] = deque(maxlen=size)
        self._seq = 0
        self._notified = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    @property
    def seq(self) -> int:
        return self._seq

    def put(self, kind: str, item: Any) -> None:
        with self._lock:
            self._seq += 1
            self._ring.append((self._seq, kind, item))

    def notify(self, force: bool = False) -> None:
        """Wake readers when items arrived (the loop calls this once per iteration;
        `force`: also without new items, e.g. to tell them the daemon stops)."""
        if self._seq == self._notified and not force:
            return
        self._notified = self._seq
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # a reader's problem never stops the engine loop
                log.exception("event stream listener failed")

    def listen(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def unlisten(self, fn: Callable[[], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def since(self, cursor: int, limit: int = 1000) -> tuple[int, list[tuple[int, str, Any]]]:
        """(missed, items) after `cursor`: at most `limit` items, the oldest first."""
        with self._lock:
            if not self._ring or self._ring[-1][0] <= cursor:
                return 0, []
            first = self._ring[0][0]
            missed = max(0, first - cursor - 1)
            start = max(cursor + 1, first) - first
            items = [self._ring[i] for i in range(start, min(len(self._ring), start + limit))]
        return missed, items


# ---------------------------------------------------------------- metrics


@dataclass(frozen=True, slots=True)
class Transfer:
    """A prefix move under way: `load` (host -> GPU), `offload` (GPU -> host
    backup) or `compute` (recomputed by prefill; its end is not known ahead)."""

    kind: str
    since: float
    until: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "since": self.since, "until": self.until}


_TRANSFER_EVENTS = frozenset({
    EventKind.PREFIX_LOAD_START, EventKind.PREFIX_LOAD_END, EventKind.PREFIX_OFFLOAD_START,
    EventKind.PREFIX_OFFLOAD_END, EventKind.PREFIX_COMPUTE_START, EventKind.PREFIX_COMPUTE_END,
    EventKind.PREFIX_EVICT})
_TRANSFER_ENDS = {EventKind.PREFIX_LOAD_END: "load", EventKind.PREFIX_OFFLOAD_END: "offload",
                  EventKind.PREFIX_COMPUTE_END: "compute"}


JCT_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
               1200.0)
DECISION_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


class Histogram:
    """Bucket counts, sum and count (Prometheus semantics, cumulative on read)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, x: float) -> None:
        self.counts[bisect_left(self.buckets, x)] += 1
        self.sum += x

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, n in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out


class Metrics:
    """Counters and gauges kept from the event stream by the loop thread; the
    API reads them (plain ints and dict copies: no lock on the hot path)."""

    def __init__(self) -> None:
        self.counts: dict[EventKind, int] = dict.fromkeys(EventKind, 0)
        self.waiting: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.on_gpu: dict[str, int] = {}
        self.jct = Histogram(JCT_BUCKETS)
        self.decision_latency = Histogram(DECISION_BUCKETS)
        self.decisions = 0
        self.param_changes = 0
        self.abandoned = 0
        self.pump_wall_s = 0.0
        self.decide_wall_s = 0.0
        self.t = 0.0
        self.recent_jct: deque[float] = deque(maxlen=STATS_WINDOW)
        self.transfers: dict[str, Transfer] = {}  # prefix moves under way, by agent
        self._running_ids: set[int] = set()  # admitted, not finished, preempted or withdrawn

    def event(self, ev: EngineEvent) -> None:
        kind = ev.kind
        self.counts[kind] += 1
        agent = ev.agent or ""
        if kind in _TRANSFER_EVENTS:
            self._transfer(ev)
        if kind is EventKind.REQUEST_READY:
            self.waiting[agent] = self.waiting.get(agent, 0) + 1
        elif kind is EventKind.REQUEST_ADMIT:
            self.waiting[agent] -= 1
            self.running[agent] = self.running.get(agent, 0) + 1
            self._running_ids.add(ev.request_id)  # type: ignore[arg-type]
        elif kind in (EventKind.PREEMPT, EventKind.RETRACT):
            self.running[agent] -= 1
            self.waiting[agent] = self.waiting.get(agent, 0) + 1
            self._running_ids.discard(ev.request_id)  # type: ignore[arg-type]
        elif kind is EventKind.REQUEST_FINISH:
            self.running[agent] -= 1
            self._running_ids.discard(ev.request_id)  # type: ignore[arg-type]
        elif kind is EventKind.REQUEST_WITHDRAW:
            if ev.request_id in self._running_ids:  # taken out of the batch
                self._running_ids.discard(ev.request_id)  # type: ignore[arg-type]
                self.running[agent] -= 1
            else:
                self.waiting[agent] -= 1
        elif kind in (EventKind.PREFIX_LOAD_START, EventKind.PREFIX_COMPUTE_START):
            self.on_gpu[agent] = 1
        elif kind is EventKind.PREFIX_EVICT:
            self.on_gpu[agent] = 0
        elif kind is EventKind.TASK_FINISH:
            self.jct.observe(ev.value)
            self.recent_jct.append(ev.value)

    def _transfer(self, ev: EngineEvent) -> None:
        """Track prefix moves: a load or backup runs [t, t + value), a recompute until
        its end event; an eviction ends all but a backup (which still completes)."""
        agent, kind = ev.agent or "", ev.kind
        now = self.transfers.get(agent)
        if kind is EventKind.PREFIX_LOAD_START:
            self.transfers[agent] = Transfer("load", ev.t, ev.t + ev.value)
        elif kind is EventKind.PREFIX_OFFLOAD_START:
            self.transfers[agent] = Transfer("offload", ev.t, ev.t + ev.value)
        elif kind is EventKind.PREFIX_COMPUTE_START:
            self.transfers[agent] = Transfer("compute", ev.t, None)
        elif now is not None and (_TRANSFER_ENDS.get(kind) == now.kind or (
                kind is EventKind.PREFIX_EVICT and now.kind != "offload")):
            del self.transfers[agent]

    def decision(self, wall_ms: float) -> None:
        self.decisions += 1
        self.decision_latency.observe(wall_ms / 1e3)

    @property
    def tasks_in_flight(self) -> int:
        return (self.counts[EventKind.TASK_ARRIVE] - self.counts[EventKind.TASK_FINISH]
                - self.abandoned)


# ----------------------------------------------------------- the recorder


class _Recorder:
    """The loop's RunSink: the store, the event bus, metrics and recent decisions."""

    def __init__(self, store: StoreSink, bus: EventBus, metrics: Metrics,
                 version: Callable[[], int]) -> None:
        self.store = store
        self.bus = bus
        self.metrics = metrics
        self.recent: deque[DecisionSummary] = deque(maxlen=RECENT_DECISIONS)
        self._version = version
        # the last decisions with their candidates (GET /v1/decisions/{seq}); read by
        # the HTTP thread, so guarded by a lock
        self._details: OrderedDict[int, tuple[Any, int]] = OrderedDict()
        self._details_lock = threading.Lock()
        # E[remaining path] for /v1/state: the daemon's own F_{a,v} (Eq. 5), fed by the
        # same completions as the policy's, whatever the policy
        self.service_model = ServiceModel()

    def decision(self, d: Any) -> None:
        self.store.decision(d)
        with self._details_lock:
            self._details[d.seq] = (d, self._version())
            if len(self._details) > DETAIL_DECISIONS:
                self._details.popitem(last=False)
        chosen = d.chosen_candidate
        terms = None
        if chosen is not None:
            tm = chosen.terms
            terms = (tm.j_admit, tm.j_move, tm.j_redo, tm.j_revoke, tm.v_reuse)
        summary = DecisionSummary(d.seq, d.t, d.policy, tuple(d.admit), tuple(d.preempt),
                                  tuple(d.load), tuple(d.evict), d.blocked, d.wall_ms,
                                  len(d.candidates), terms, self._version())
        self.recent.append(summary)
        self.bus.put("decision", summary)
        self.metrics.decision(d.wall_ms)

    def event(self, ev: EngineEvent) -> None:
        self.store.event(ev)
        self.bus.put("event", ev)
        self.metrics.event(ev)
        if ev.kind is EventKind.REQUEST_FINISH:
            self.service_model.observe_request((ev.agent or "", ev.stage or ""), ev.value)
        elif ev.kind is EventKind.STAGE_FINISH:
            self.service_model.observe_stage((ev.agent or "", ev.stage or ""), ev.value)

    def detail(self, seq: int, limit: int) -> dict[str, Any] | None:
        """Decision `seq` with its best `limit` candidates (and the chosen one);
        None when it is not among the last DETAIL_DECISIONS."""
        with self._details_lock:
            hit = self._details.get(seq)
        if hit is None:
            return None
        d, version = hit
        order = sorted(range(len(d.candidates)), key=lambda i: (-d.candidates[i].terms.total, i))
        keep = order[:limit]
        if d.chosen is not None and d.chosen not in keep and limit > 0:
            keep = [*keep[:limit - 1], d.chosen]
        return {
            "seq": d.seq, "t": d.t, "policy": d.policy, "admit": list(d.admit),
            "preempt": list(d.preempt), "load": list(d.load), "evict": list(d.evict),
            "noop": d.is_noop, "blocked": d.blocked, "retry": d.retry,
            "reservation": str(d.reservation), "wall_ms": d.wall_ms,
            "n_candidates": len(d.candidates), "chosen": d.chosen, "params_version": version,
            "candidates": [_candidate_dict(i, d.candidates[i], i == d.chosen) for i in keep],
        }

    def oldest_detail(self) -> int | None:
        with self._details_lock:
            return next(iter(self._details), None)


def _candidate_dict(idx: int, c: Any, won: bool) -> dict[str, Any]:
    tm = c.terms
    return {"idx": idx, "won": won, "resident": sorted(c.resident), "admit": list(c.admit),
            "preempt": list(c.preempt), "j_admit": tm.j_admit, "j_move": tm.j_move,
            "j_redo": tm.j_redo, "j_revoke": tm.j_revoke, "v_reuse": tm.v_reuse,
            "total": tm.total}


# ------------------------------------------------------- task bookkeeping


@dataclass(slots=True)
class _TaskEntry:
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
        stages = self.stages if self.stages is not None else _stages(view) if view else {}
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


def _stages(view: TaskView) -> dict[str, Any]:
    return {name: {"status": str(s.status), "rounds_done": s.rounds_done,
                   "service_s": s.service_s, "started_at": s.started_at,
                   "finished_at": s.finished_at}
            for name, s in view.stages.items()}


@dataclass(slots=True)
class _OpenTask:
    """A task an application drives itself through OpenAI-compatible calls."""

    id: int
    workflow: Workflow
    key: tuple[str, str] | None
    rounds: dict[str, int] = field(default_factory=dict)  # rounds handed out per stage
    free_rounds: dict[str, list[int]] = field(default_factory=dict)  # of withdrawn calls
    done: set[str] = field(default_factory=set)
    in_flight: int = 0
    closing: bool = False
    last_wall: float = field(default_factory=time.monotonic)  # last call or reply

    def take_round(self, stage: str) -> int:
        """The round of a new call of `stage`: a withdrawn call's first, else the next."""
        free = self.free_rounds.get(stage)
        if free:
            return heapq.heappop(free)
        k = self.rounds.get(stage, 0)
        self.rounds[stage] = k + 1
        return k

    def give_back_round(self, stage: str, k: int) -> None:
        """Round `k` of `stage` was not used (its call withdrawn or refused)."""
        heapq.heappush(self.free_rounds.setdefault(stage, []), k)

    def ended(self) -> bool:
        """Nothing of the task in flight, and its stages done or its end announced."""
        return self.in_flight == 0 and (self.closing
                                        or len(self.done) == len(self.workflow.stages))


def _remember(kept: dict[Any, Any], key: Any, value: Any, keep: int) -> None:
    """`kept[key] = value`; past `keep` entries the older half is forgotten."""
    kept[key] = value
    if len(kept) > keep:
        for old in list(kept)[:keep // 2]:
            del kept[old]


@dataclass(slots=True)
class _Call:
    task: _OpenTask
    request: Request
    spec: CallSpec
    future: Future[CallResult]


class _Calls:
    """The `RequestOwner` of OpenAI-compatible calls: resolves each call's
    future at its REQUEST_FINISH and says when its stage and task are done."""

    def __init__(self, orphaned: Callable[[_OpenTask, str], None]) -> None:
        self.open: dict[tuple[str, str], _OpenTask] = {}
        self.by_request: dict[int, _Call] = {}
        self.closed: dict[tuple[str, str], str] = {}  # recently ended keys: how they ended
        self.orphaned = orphaned  # a task no call can reach any more: the service drops it

    def close(self, task: _OpenTask, how: str) -> None:
        """`task` ended (`how`: for the message of a late call with its key)."""
        if task.key is None:
            return
        self.open.pop(task.key, None)
        self.closed.pop(task.key, None)
        _remember(self.closed, task.key, how, KEEP_CLOSED_KEYS)

    def on_finish(self, request_id: int, t: float) -> DriverStep:
        call = self._leave(request_id)
        task, req, spec = call.task, call.request, call.spec
        step = DriverStep()
        if spec.last_in_stage and req.stage not in task.done:
            task.done.add(req.stage)
            step.stages_done.append(req.stage)
        if spec.last_in_task:
            task.closing = True
        step.task_done = self._end_if_done(task, t)
        result = CallResult(req.id, req.task_id, req.workflow, req.stage, req.agent, req.round,
                            req.prefix_tokens + req.input_tokens, req.output_tokens,
                            req.ready_at, t, step.task_done, spec.task_key)
        if not call.future.done():
            call.future.set_result(result)
        return step

    def on_withdraw(self, request_id: int, t: float, why: str) -> DriverStep:
        """The engine took a call back: a retry gets its round; the task ends now
        if this was all it waited for (its last call finished first)."""
        call = self._leave(request_id)
        task, req = call.task, call.request
        task.give_back_round(req.stage, req.round)
        log.info("request %d (task %d, stage %s, round %d) withdrawn: %s", req.id,
                 req.task_id, req.stage, req.round, why)
        if not call.future.done():
            call.future.set_exception(Withdrawn(f"request {request_id} was withdrawn at "
                                                f"t={t:.3f}s: {why}"))
        step = DriverStep(task_done=self._end_if_done(task, t))
        if not step.task_done and task.key is None and not task.in_flight:
            self.orphaned(task, f"its only call was withdrawn ({why})")  # no id: no retry
        return step

    def _leave(self, request_id: int) -> _Call:
        """A call's request is done with the engine (finished or withdrawn)."""
        call = self.by_request.pop(request_id)
        call.task.in_flight -= 1
        call.task.last_wall = time.monotonic()
        return call

    def _end_if_done(self, task: _OpenTask, t: float) -> bool:
        """True, closing `task`, when it has ended (see `_OpenTask.ended`)."""
        if not task.ended():
            return False
        self.close(task, f"finished at t={t:.3f}s")
        return True

    def find(self, future: Future[CallResult]) -> _Call | None:
        """The call in flight that `future` belongs to, if any."""
        return next((c for c in self.by_request.values() if c.future is future), None)

    def idle_since(self, deadline: float) -> list[_OpenTask]:
        """Open tasks with no call in flight and no activity after `deadline`."""
        return [t for t in self.open.values() if not t.in_flight and t.last_wall < deadline]

    def fail_all(self, exc: BaseException) -> None:
        for call in self.by_request.values():
            if not call.future.done():
                call.future.set_exception(exc)


# ----------------------------------------------------------- the feeder


class _Feeder:
    """The built-in driver: Poisson arrivals of a workload's tasks (virtual time).
    With a task limit it plays exactly the trace `topasd trace gen` writes for
    the same workload, rate, seed and count (`trace_tasks`), so `topasd replay`
    can rerun the daemon's work; unbounded, it draws each task, then the gap
    to the next, from the seed."""

    def __init__(self, workload: Workload, rate: float, limit: int | None, seed: int) -> None:
        self.workload = workload
        self.rate = rate
        self.limit = limit
        self.generated = 0
        self.rng = np.random.default_rng(seed)
        self._trace = (None if limit is None
                       else trace_tasks(workload.workflows, rate, limit, seed))
        self._next: TaskRecord | None = None if self._trace is None else next(self._trace)
        self.next_arrival: float | None = 0.0 if self._next is None else self._next.arrival

    def pop(self, task_id: int, workflows: Mapping[str, Workflow]) -> TaskRecord:
        """The task arriving at `next_arrival` (with the daemon's `task_id`);
        schedules the next one."""
        assert self.next_arrival is not None
        self.generated += 1
        if self._trace is not None:
            assert self._next is not None
            record, self._next = self._next, next(self._trace, None)
            self.next_arrival = None if self._next is None else self._next.arrival
            return replace(record, id=task_id)
        wf = self.workload.workflows[(self.generated - 1) % len(self.workload.workflows)]
        record = sample_task(workflows[wf.name], task_id, self.next_arrival, self.rng)
        self.next_arrival += float(self.rng.exponential(1.0 / self.rate))
        return record


# ------------------------------------------------------------- service


Command = tuple[Callable[..., Any], tuple[Any, ...], Future[Any], bool]


def make_backend(settings: Settings, profile: HardwareProfile) -> Backend:
    """The engine `settings.backend` names: the simulator, an in-process vLLM
    engine on `model_path` (docs/vllm.md), or SGLang (docs/sglang.md)."""
    if settings.backend == "sim":
        return SimBackend(profile)
    if settings.backend == "vllm":
        from backends.vllm import POOL_TOKENS
        from backends.vllm import make_backend as vllm_backend

        budget = settings.budget or POOL_TOKENS
        return vllm_backend(str(settings.model_path), budget_tokens=budget,
                            profile=profile.with_overrides(budget_tokens=budget))
    from backends.sglang import SGLangOptions
    from backends.sglang import make_backend as sglang_backend

    options = SGLangOptions(model_path=str(settings.model_path), tp_size=settings.tp_size,
                            dp_size=settings.dp_size,
                            mem_fraction_static=settings.mem_fraction,
                            enable_hierarchical_cache=settings.hicache,
                            hicache_size=settings.hicache_size)
    return sglang_backend(options, profile)


@dataclass(frozen=True, slots=True)
class RequestLimit:
    """The longest request (prefix + input + output) the engine takes: the KV
    budget, or a shorter context (vLLM's max_model_len); how to name it; its fix."""

    tokens: int
    what: str
    fix: str


def request_limit(budget: int, limits: EngineLimits) -> RequestLimit:
    """The KV budget, or the engine's context when shorter."""
    context = limits.context_tokens
    if context is not None and context < budget:
        return RequestLimit(context, f"the engine's context (max_model_len) is {context}",
                            "use a model with a longer context")
    return RequestLimit(budget, f"the KV budget is {budget}",
                        "raise --budget or use a larger profile")


def never_fits(wf: Workflow, limit: RequestLimit) -> str | None:
    """Why no request of some stage of `wf` can ever fit `limit` (its prefix
    plus the least input and output it can draw), or None."""
    for v in wf.topo_order:
        stage = wf.stages[v]
        prefix = wf.agents[stage.agent].prefix_tokens
        p = stage.profile
        least = prefix + max(1, round(p.input_tokens.least())) + max(
            1, round(p.output_tokens.least()))
        if least > limit.tokens:
            return (f"workflow {wf.name!r}, stage {v!r}: even its smallest request needs "
                    f"{least} KV tokens (the prefix of agent {stage.agent!r}, {prefix}, + input "
                    f"+ output) but {limit.what}; {limit.fix}, or shrink the workflow")
    return None


def engine_profile(profile: HardwareProfile, limits: EngineLimits,
                   budget: int | None) -> HardwareProfile:
    """`profile` with the KV pool the engine reports (`budget_tokens`), so that
    fit checks match the engine. SGLang sizes its pool from GPU memory, and a
    --budget below it stays; vLLM's pool is the --budget rounded up to whole
    blocks (`pool_from_budget`), all of it usable."""
    pool = limits.pool_tokens
    if pool is None or pool == profile.budget_tokens:
        return profile
    if budget is not None and not limits.pool_from_budget:
        pool = min(budget, pool)
    return profile.with_overrides(budget_tokens=pool)


class Service:
    """The daemon's engine loop and its thread-safe API (see the module doc)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        profile = get_profile(settings.profile)
        if settings.budget is not None:
            profile = profile.with_overrides(budget_tokens=settings.budget)
        self.profile = profile
        self.workload = load_workload(settings.workload) if settings.workload else None
        specs = tuple(load_workflow(p) for p in settings.workflows)  # read once
        self.registry = _registry(self.workload, specs)
        self.policy = build_policy(settings.policy, settings.params)
        self.backend = make_backend(settings, profile)
        limits = self.backend.limits()
        self.profile = engine_profile(profile, limits, settings.budget)
        self.limit = request_limit(self.profile.budget_tokens, limits)
        try:
            self._refuse_unrunnable(settings, specs)
            self.feeder = None if self.workload is None else _Feeder(
                self.workload, settings.rate or _middle(self.workload), settings.tasks,
                settings.seed)
        except TopasError:
            self.backend.close()
            raise
        self.store = Store(settings.db)
        self.store_sink = self.store.sink(settings.log_candidates)
        self.bus = EventBus()
        self.metrics = Metrics()
        self.params_version = 0
        self._published_params = self._params_dict()
        self.recorder = _Recorder(self.store_sink, self.bus, self.metrics,
                                  lambda: self.params_version)
        self.active: dict[str, Workflow] = {}  # workflows in use (the policy's view)
        self._agent_sizes: dict[str, int] = {}
        self._system_keys: dict[str, str] = {}  # agents that a call's system prompt defined
        self.driver = TaskDriver(self.active)
        self.loop = EventLoop(self.active, self.policy, self.backend, self.recorder,
                              driver=self.driver)
        self.loop.on_task_done = self._task_done
        self.calls = _Calls(orphaned=self._abandon)
        if self.workload is not None:
            for wf in self.workload.workflows:
                self._activate(wf.name)
        self.rng = np.random.default_rng(settings.seed + 1)
        self._quantiles = quantile_rows(64, 64, 0)  # E[remaining path] samples (state)
        self.clock = Clock(None if settings.speed == "max" else float(settings.speed))
        self.tasks: OrderedDict[int, _TaskEntry] = OrderedDict()
        self.rejected = 0
        self._next_task = 0
        self._refused: dict[int, None] = {}  # driver task ids refused (cannot fit)
        self._cmds: deque[Command] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._draining = False
        self._drain_deadline = math.inf
        self._closed = False
        self.stopped = threading.Event()
        self.crash: BaseException | None = None
        self.started_wall = time.time()
        self._stall_warned = False
        self._next_housekeeping = 0.0

    def _refuse_unrunnable(self, settings: Settings, specs: tuple[Workflow, ...]) -> None:
        """Stop the start on work the engine could never run: a workflow of the
        --workload or a --workflow spec whose smallest request exceeds the
        limit, or a rate that puts arrivals beyond the bound on times."""
        for wf in (*(self.workload.workflows if self.workload else ()), *specs):
            problem = never_fits(wf, self.limit)
            if problem is not None:
                raise TopasError(problem)
        if self.workload is not None:
            check_rate(settings.rate or _middle(self.workload), settings.tasks or 1)

    # ---------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the run in the store and start the engine loop thread (t = 0 now)."""
        self.clock.wall0 = time.monotonic()
        meta = {"daemon": True, "workload": self.workload.name if self.workload else None,
                "rate": self.feeder.rate if self.feeder else None,
                "tasks": self.settings.tasks, "seed": self.settings.seed,
                "speed": self.settings.speed, "stages": stage_counts(self.registry)}
        self.store_sink.run_started(run_info(self.policy, self.backend, meta))
        self._thread = threading.Thread(target=self._main, name="topasd-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and not self._draining
                and self.crash is None)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, grace: float | None = None) -> None:
        """Stop admitting new tasks; running work may finish for `grace` wall seconds."""
        grace = self.settings.grace if grace is None else grace
        self._drain_deadline = time.monotonic() + grace
        self._draining = True
        self._wake.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self.stopped.wait(timeout)

    def close(self) -> None:
        """After the loop stopped: finish the store run (flushes every row), close."""
        if self._closed:
            return
        if self._thread is not None and self._thread.is_alive():
            self.drain(0.0)
            self._thread.join()
        self._closed = True
        book, loop = self.loop.book, self.loop
        result = RunResult(policy=self.policy.name, jct=book.jct(), arrivals=dict(book.arrivals),
                           finishes=dict(book.finishes), requests_finished=loop.requests_finished,
                           decisions=loop.decisions, decision_ms=loop.decision_ms,
                           stats=self.backend.stats, wall_s=time.time() - self.started_wall)
        self.store_sink.run_finished(None if self.crash else result, self.crash)
        self.store.close()
        self.backend.close()

    @property
    def run_id(self) -> int | None:
        return self.store_sink.run_id

    # ------------------------------------------------- thread-safe methods

    def submit_task(self, workflow: str, overrides: Mapping[str, Mapping[str, int]]
                    ) -> Future[dict[str, Any]]:
        """A sampled task of a registered workflow (per-stage token overrides)."""
        return self._command(self._cmd_task, workflow, dict(overrides))

    def submit_call(self, spec: CallSpec) -> Future[CallResult]:
        """One OpenAI-compatible call; the future resolves when it finishes."""
        return self._command(self._cmd_call, spec, deferred=True)

    def withdraw_call(self, future: Future[CallResult], why: str) -> Future[bool]:
        """Take back the call of `future`, waiting or running (its client went
        away); True when the engine took it back (False: it had finished)."""
        return self._command(self._cmd_withdraw, future, why)

    def get_task(self, task_id: int) -> Future[dict[str, Any]]:
        return self._command(self._cmd_get_task, task_id)

    def state(self, limit: int = 50) -> Future[dict[str, Any]]:
        return self._command(self._cmd_state, limit)

    def patch_params(self, changes: Mapping[str, Any]) -> Future[dict[str, Any]]:
        return self._command(self._cmd_params, dict(changes))

    def params(self) -> dict[str, Any]:
        """The policy and its parameters as last published by the loop."""
        return self._published_params

    def decision(self, seq: int, candidates: int = 50) -> dict[str, Any]:
        """A recent decision with its best `candidates` candidate states (and the
        chosen one); NotFound when `seq` is unknown or no longer kept in memory."""
        detail = self.recorder.detail(seq, candidates)
        if detail is not None:
            return detail
        oldest, last = self.recorder.oldest_detail(), self.loop.decisions
        if 1 <= seq <= last:
            raise NotFound(f"decision {seq} is older than the last {DETAIL_DECISIONS} kept in "
                           f"memory (from {oldest}); read it from the store (decisions and "
                           "candidates tables)")
        raise NotFound(f"no decision {seq}: decisions are numbered 1..{last} so far")

    def _command(self, fn: Callable[..., Any], *args: Any, deferred: bool = False
                 ) -> Future[Any]:
        fut: Future[Any] = Future()
        if self.stopped.is_set():
            fut.set_exception(Unavailable("the daemon is shutting down; no new work"))
            return fut
        self._cmds.append((fn, args, fut, deferred))
        self._wake.set()
        if self.stopped.is_set():  # the loop ended meanwhile: fail what it left
            self._fail_pending(Unavailable("the daemon is shutting down; no new work"))
        return fut

    # ------------------------------------------------------ the loop thread

    def _main(self) -> None:
        paced = self.clock.speed is not None
        try:
            while True:
                self._wake.clear()
                behind = self._catch_up() if paced else False
                ran = self._run_commands()  # stamped with the engine's current time
                self._housekeeping()
                if paced and ran:
                    self._advance(self.backend.t)  # decide on new work now, not next tick
                if self._draining and (self.backend.idle()
                                       or time.monotonic() >= self._drain_deadline):
                    break
                if paced:
                    self.bus.notify()
                    if not behind:
                        self._wait_paced()
                else:
                    self._tick_unpaced()
                    self.bus.notify()
        except BaseException as exc:  # a bug: the daemon stops (exit 1), the store says why
            self.crash = exc
            log.exception("engine loop stopped")
        finally:
            self.stopped.set()
            gone = Unavailable("the daemon shut down before this request finished")
            self.calls.fail_all(gone)
            self._fail_pending(gone)
            self.bus.notify(force=True)
            if self.crash is None:
                unfinished = len(self.loop.book.tasks)
                log.info("engine loop stopped at t=%.1fs (%d task(s) in flight, %d abandoned)",
                         self.backend.t, unfinished, self.metrics.abandoned)

    def _catch_up(self) -> bool:
        """Paced: run the engine to the clock's now (a bounded slice); True if behind."""
        assert self.clock.speed is not None
        target = self.clock.now()
        self._advance(min(target, self.backend.t + PACED_SLICE_WALL * self.clock.speed))
        return self.backend.t < target - 1e-9

    def _wait_paced(self) -> None:
        assert self.clock.speed is not None
        timeout = IDLE_WAIT_S if self.backend.idle() else TICK_S
        nxt = self._next_arrival()
        if nxt is not None:
            timeout = min(timeout, max(0.0, (nxt - self.clock.now()) / self.clock.speed))
        self._wake.wait(timeout)

    def _tick_unpaced(self) -> None:
        nxt = self._next_arrival()
        if not self.backend.idle():
            self._advance(self.backend.t + UNPACED_SLICE)
        elif nxt is not None:
            self._advance(max(nxt, self.backend.t))
        else:
            self._advance(self.backend.t)  # decide on new submissions; no time passes
            if self.backend.idle():
                self._check_stall()
                self._wake.wait(IDLE_WAIT_S)

    def _advance(self, target: float) -> None:
        """Run the engine to `target`, letting built-in driver tasks arrive on time."""
        loop = self.loop
        while True:
            nxt = self._next_arrival()
            stop = target if nxt is None or nxt > target else nxt
            t0 = time.perf_counter()
            ms0 = len(loop.decision_ms)
            loop.pump(stop)
            self.metrics.pump_wall_s += time.perf_counter() - t0
            self.metrics.decide_wall_s += sum(loop.decision_ms[ms0:]) / 1e3
            self.metrics.t = self.backend.t
            if nxt is None or nxt > self.backend.t:
                return
            self._feed()

    def _next_arrival(self) -> float | None:
        if self.feeder is None or self._draining:
            return None
        return self.feeder.next_arrival

    def _feed(self) -> None:
        assert self.feeder is not None
        while self.feeder.next_arrival is not None and self.feeder.next_arrival <= self.backend.t:
            record = self.feeder.pop(self._new_task_id(), self.active)
            if not self._fits(record):
                self.rejected += 1
                _remember(self._refused, record.id, None, KEEP_FINISHED)
                log.warning("driver task %d of %s does not fit the KV budget; skipped",
                            record.id, record.workflow)
                continue
            self._arrive(record, "driver", record.arrival)

    def _housekeeping(self) -> None:
        """Once a second: drop abandoned application tasks, bound the memory of a
        long-running daemon (the run summary covers what is kept)."""
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + min(1.0, (self.settings.task_timeout or 4.0) / 4)
        if self.settings.task_timeout:
            self._expire_open_tasks(now)
        ms = self.loop.decision_ms
        if len(ms) > KEEP_DECISION_MS:
            del ms[:len(ms) - KEEP_DECISION_MS // 2]
        book = self.loop.book
        if len(book.finishes) > KEEP_FINISHED:
            for tid in list(book.finishes)[:len(book.finishes) - KEEP_FINISHED // 2]:
                del book.finishes[tid]
                book.arrivals.pop(tid, None)

    def _expire_open_tasks(self, now: float) -> None:
        """Drop application-driven tasks that saw no call for `task_timeout` seconds."""
        timeout = self.settings.task_timeout
        for task in self.calls.idle_since(now - timeout):
            self._abandon(task, f"no call for {timeout:.0f} s")

    def _abandon(self, task: _OpenTask, why: str) -> None:
        """Drop an application-driven task that will see no more calls."""
        self.calls.close(task, f"was abandoned at t={self.backend.t:.3f}s ({why})")
        view = self.loop.book.drop(task.id)
        self.loop.record(EngineEvent(self.backend.t, EventKind.TASK_ABANDON, task_id=task.id,
                                     note=why))
        entry = self.tasks.get(task.id)
        if entry is not None:
            entry.abandoned = True
            entry.stages = _stages(view) if view is not None else entry.stages
        self.metrics.abandoned += 1
        log.info("task %d (%s, client id %r) abandoned: %s", task.id, task.workflow.name,
                 task.key[1] if task.key else None, why)

    def _check_stall(self) -> None:
        waiting = sum(self.metrics.waiting.values())
        if waiting and not self._stall_warned:
            self._stall_warned = True
            log.warning("the engine is idle with %d waiting request(s): policy %s stopped "
                        "admitting", waiting, self.policy.name)

    def _run_commands(self) -> int:
        """Run queued commands in order; returns how many ran."""
        cmds = self._cmds
        n = 0
        while cmds:
            n += 1
            fn, args, fut, deferred = cmds.popleft()
            if not deferred and not fut.set_running_or_notify_cancel():
                continue
            try:
                if deferred:
                    fn(fut, *args)
                else:
                    fut.set_result(fn(*args))
            except TopasError as exc:
                if not fut.done():
                    fut.set_exception(exc)
            except Exception as exc:
                log.exception("command %s failed", getattr(fn, "__name__", fn))
                if not fut.done():
                    fut.set_exception(exc)
        return n

    def _fail_pending(self, exc: BaseException) -> None:
        while self._cmds:
            try:
                _, _, fut, _ = self._cmds.popleft()
            except IndexError:
                return
            if not fut.done():
                with contextlib.suppress(Exception):  # cancelled or resolved concurrently
                    fut.set_exception(exc)

    # ------------------------------------------------------------ commands

    def _cmd_task(self, workflow: str, overrides: dict[str, dict[str, int]]) -> dict[str, Any]:
        if self._draining:
            raise Unavailable("the daemon is shutting down: not admitting new tasks")
        wf = self._registered(workflow)
        unknown = sorted(set(overrides) - set(wf.stages))
        if unknown:
            raise Invalid(f"stages: workflow {workflow!r} has no stage(s) {unknown}; its "
                          f"stages are {list(wf.topo_order)}")
        active = self._activate(workflow)
        task_id = self._next_task  # taken only once the task fits
        record = sample_task(active, task_id, self.backend.t, self.rng)
        if overrides:
            stages = {v: tuple(replace(r, input_tokens=o.get("input_tokens", r.input_tokens),
                                       output_tokens=o.get("output_tokens", r.output_tokens))
                               for r in rounds) if (o := overrides.get(v)) else rounds
                      for v, rounds in record.stages.items()}
            record = replace(record, stages=stages)
        problem = self._fit_problem(record)
        if problem:
            raise Invalid(problem)
        self._new_task_id()
        entry = self._arrive(record, "api", self.backend.t)
        return entry.as_dict(self.loop.book.tasks.get(task_id))

    def _cmd_call(self, fut: Future[CallResult], spec: CallSpec) -> None:
        if not fut.set_running_or_notify_cancel():
            return  # the client went away before the call reached the engine
        wf, stage, task = self._call_target(spec)
        agent = wf.stages[stage].agent
        prefix = wf.agents[agent].prefix_tokens
        own = spec.input_tokens + (self._uncached_system(agent, spec)
                                   if wf.name.startswith(SYNTHESIZED) else 0)
        need = prefix + own + spec.output_tokens
        if need > self.limit.tokens:
            fix = ("lower max_tokens or shorten the prompt" if prefix + 2 <= self.limit.tokens
                   else f"the prefix of agent {agent!r} alone does not leave room: give the "
                        "daemon a larger --budget" + (f", or a spec of {wf.name!r} with a "
                        "shorter prefix" if spec.workflow in self.registry else ""))
            raise Invalid(f"the call needs {need} KV tokens (prefix {prefix} + input "
                          f"{own} + max_tokens {spec.output_tokens}) but "
                          f"{self.limit.what}; {fix}")
        opened = task is None
        if task is None:
            key = None if spec.task_key is None else (wf.name, spec.task_key)
            task = self._open_task(wf, key, spec.task_key)
        k = task.take_round(stage)
        task.in_flight += 1
        task.last_wall = time.monotonic()
        req = Request(id=self.driver.new_request_id(), task_id=task.id, workflow=wf.name,
                      stage=stage, agent=agent, round=k, input_tokens=own,
                      output_tokens=spec.output_tokens, ready_at=self.backend.t,
                      task_arrival=self.loop.book.arrivals[task.id], prefix_tokens=prefix)
        self.calls.by_request[req.id] = _Call(task, req, spec, fut)
        try:
            self.loop.submit(req, self.calls)
        except TopasError:  # the engine refused it: undo, so nothing waits for it
            del self.calls.by_request[req.id]
            task.give_back_round(stage, k)
            task.in_flight -= 1
            if opened:
                self._abandon(task, "the engine refused its first call")
            raise

    def _cmd_withdraw(self, future: Future[CallResult], why: str) -> bool:
        call = self.calls.find(future)
        if call is None or not self.backend.withdraw(call.request.id, why):
            return False
        # its event now (the engine's clock stays): a retry queued right behind gets
        # the round it gives back
        self._advance(self.backend.t)
        return True

    def _call_target(self, spec: CallSpec) -> tuple[Workflow, str, _OpenTask | None]:
        """The workflow, stage and open task (None: a new one) a call belongs to."""
        if spec.task_key is None and not spec.last_in_stage:
            raise Invalid("topasd.last_in_stage=false needs topasd.task_id: without an id no "
                          "later call can continue (or end) this stage; send a task_id")
        if spec.workflow is None or spec.workflow.startswith(SYNTHESIZED):
            wf = self._synthesized(spec.agent or spec.system_key, spec)
            return wf, wf.topo_order[0], self._continued(wf.name, wf.topo_order[0], spec)
        if spec.workflow not in self.registry:
            raise Invalid(f"topasd.workflow: unknown workflow {spec.workflow!r}; registered: "
                          f"{', '.join(sorted(self.registry))} (add spec files with "
                          "--workflow), or leave workflow out for a one-stage call")
        wf = self.registry[spec.workflow]
        stage = spec.stage
        if stage is None:
            if len(wf.stages) > 1:
                raise Invalid(f"topasd.stage is required: workflow {wf.name!r} has stages "
                              f"{list(wf.topo_order)}")
            stage = wf.topo_order[0]
        if stage not in wf.stages:
            raise Invalid(f"topasd.stage: workflow {wf.name!r} has no stage {stage!r}; its "
                          f"stages are {list(wf.topo_order)}")
        runs_it = {wf.stages[stage].agent, self.active.get(wf.name, wf).stages[stage].agent}
        if spec.agent is not None and spec.agent not in runs_it:
            raise Invalid(f"topasd.agent: stage {stage!r} of {wf.name!r} is run by agent "
                          f"{wf.stages[stage].agent!r}, not {spec.agent!r}; drop agent or fix it")
        if spec.task_key is None and len(wf.stages) > 1:
            raise Invalid(f"topasd.task_id is required with workflow {wf.name!r} (it has "
                          f"{len(wf.stages)} stages): one id ties a task's calls together")
        task = self._continued(wf.name, stage, spec)
        waiting_on = [p for p in wf.stages[stage].after if task is None or p not in task.done]
        ended = None if task is not None or spec.task_key is None else self.calls.closed.get(
            (wf.name, spec.task_key))
        if waiting_on and ended is not None:
            raise Conflict(f"task {spec.task_key!r} of {wf.name!r} already ended (it {ended}); "
                           f"a call for stage {stage!r} would open a new task, which starts "
                           f"at {list(wf.entry_stages)}: use a new task_id")
        if waiting_on:
            raise Conflict(f"stage {stage!r} of {wf.name!r} runs after {waiting_on}, which "
                           f"task {spec.task_key!r} has not finished: end them first (their "
                           "last call with last_in_stage=true), or end the task with "
                           "last_in_task=true if they are not taken")
        return self._activate(wf.name), stage, task

    def _continued(self, workflow: str, stage: str, spec: CallSpec) -> _OpenTask | None:
        """The open task `spec.task_key` names in `workflow` (None: a new task),
        refusing a stage it already finished or a task that is closing."""
        task = None if spec.task_key is None else self.calls.open.get((workflow, spec.task_key))
        if task is None:
            if self._draining:
                raise Unavailable("the daemon is shutting down: not admitting new tasks")
            return None
        if stage in task.done:
            raise Conflict(f"task {spec.task_key!r} already finished stage {stage!r} (a call "
                           "with last_in_stage=true ended it); send earlier rounds with "
                           "last_in_stage=false, or use a new task_id")
        if task.closing:
            raise Conflict(f"task {spec.task_key!r} is closing (a call with last_in_task=true "
                           "ended it); use a new task_id")
        return task

    def _open_task(self, wf: Workflow, key: tuple[str, str] | None,
                   client_key: str | None) -> _OpenTask:
        task_id = self._new_task_id()
        t = self.backend.t
        self.loop.book.arrive(task_id, wf.name, t)
        self.loop.record(EngineEvent(t, EventKind.TASK_ARRIVE, task_id=task_id, note=wf.name))
        self._remember(_TaskEntry(task_id, wf.name, "openai", t, client_key))
        task = _OpenTask(task_id, wf, key)
        if key is not None:
            self.calls.open[key] = task
        return task

    def _cmd_get_task(self, task_id: int) -> dict[str, Any]:
        entry = self.tasks.get(task_id)
        if entry is None:
            if task_id in self._refused:
                raise NotFound(f"task {task_id} of the driver's trace was never admitted: it "
                               "cannot fit the KV budget (see driver_rejected in /v1/state)")
            if 0 <= task_id < self._next_task:
                raise NotFound(f"task {task_id} finished long ago and is no longer kept in "
                               "memory; read it from the store (tasks table)")
            raise NotFound(f"no task {task_id}: ids come from POST /v1/tasks or the replies' "
                           f"topasd.task_id (known ids are below {self._next_task})")
        return entry.as_dict(self.loop.book.tasks.get(task_id))

    def _cmd_params(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate and apply a parameter change (between two decisions); log it."""
        changes = {canonical_param(k): v for k, v in changes.items()}
        new_name = changes.pop("policy", None)
        t = self.backend.t
        old_name = self.policy.name
        old_params = policy_params(self.policy)
        switched = new_name is not None and new_name != old_name
        if switched:
            if new_name not in ALL_POLICY_NAMES:
                raise Invalid(f"policy: unknown policy {new_name!r}; choose one of "
                              f"{', '.join(ALL_POLICY_NAMES)}")
            self.policy = self.loop.policy = build_policy(new_name, changes)
        elif changes:
            if not isinstance(self.policy, TunablePolicy):
                raise Invalid(f"policy {old_name!r} has no parameters; switch policy first "
                              "(\"policy\": \"topas\")")
            self.policy.set_params(**changes)
        new_params = policy_params(self.policy)
        if switched:  # a fresh policy: `changed` names what differs from the old one's
            changed = {k: v for k, v in new_params.items()  # (or the body gave); the log
                       if k in changes or old_params.get(k) != v}  # gets the switch and
            logged = new_params  # every parameter in force (a replay resets them at a switch)
            self.store_sink.param_change(t, "policy", old_name, new_name,
                                         from_decision=self.loop.decisions + 1)
        else:
            changed = logged = {k: v for k, v in new_params.items() if old_params.get(k) != v}
        for name, value in sorted(logged.items()):
            self.store_sink.param_change(t, name, old_params.get(name), value,
                                         from_decision=self.loop.decisions + 1)
        if changed or switched:
            self.params_version += 1
            self.metrics.param_changes += len(changed) + switched
            log.info("params changed at t=%.3fs: %s%s", t,
                     f"policy={new_name} " if switched else "",
                     ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items())))
        self._published_params = self._params_dict()
        return {**self._published_params,
                "changed": sorted([*changed, *(["policy"] if switched else [])]), "t": t,
                "effective_from_decision": self.loop.decisions + 1}

    def _cmd_state(self, limit: int) -> dict[str, Any]:
        view = self.backend.state(self.loop.book.tasks, self.active)
        running: dict[str, list[dict[str, Any]]] = {}
        waiting: dict[str, list[dict[str, Any]]] = {}
        run_stage: dict[int, dict[str, Request]] = {}
        wait_stage: dict[int, set[str]] = {}
        for req in view.running:
            running.setdefault(req.agent, []).append(_req_dict(req))
            run_stage.setdefault(req.task_id, {})[req.stage] = req
        for req in view.waiting:
            waiting.setdefault(req.agent, []).append(_req_dict(req))
            wait_stage.setdefault(req.task_id, set()).add(req.stage)
        used_prefix = sum(p.tokens for p in view.prefixes.values() if p.location is Location.GPU)
        used_req = sum(r.kv_tokens() for r in view.running)
        paths = TaskPaths(self.recorder.service_model, view.costs, view.workflows,
                          self._quantiles, view.t)
        listed = list(self.loop.book.tasks.values())[:limit]
        paths.lhat_batch([(task, run_stage.get(task.id, {}), [()]) for task in listed
                          if task.workflow in view.workflows])  # one pass per DAG
        tasks = []
        for task in listed:
            entry = self.tasks.get(task.id)
            item: dict[str, Any] = entry.as_dict(task) if entry is not None else {"id": task.id}
            on = run_stage.get(task.id, {})
            item["stages_running"] = sorted(on)
            item["stages_waiting"] = sorted(wait_stage.get(task.id, set()) - set(on))
            item["remaining_s"] = (paths.lhat(task, on) if task.workflow in view.workflows
                                   else None)
            tasks.append(item)
        m = self.metrics
        transfers = m.transfers.copy()
        counts = {
            "tasks_arrived": m.counts[EventKind.TASK_ARRIVE],
            "tasks_finished": m.counts[EventKind.TASK_FINISH],
            "requests_withdrawn": m.counts[EventKind.REQUEST_WITHDRAW],
            "tasks_in_flight": len(self.loop.book.tasks),
            "requests_finished": self.loop.requests_finished,
            "requests_running": len(view.running),
            "requests_waiting": len(view.waiting),
            "decisions": self.loop.decisions,
            "events": sum(m.counts.values()),
            "driver_rejected": self.rejected,
            "tasks_abandoned": m.abandoned,
        }
        return {
            "t": view.t,
            "uptime_s": time.time() - self.started_wall,
            "speed": self.settings.speed,
            "draining": self._draining,
            "run_id": self.run_id,
            "policy": self.policy.name,
            "params_version": self.params_version,
            "budget": {"tokens": view.budget_tokens, "used": used_prefix + used_req,
                       "prefixes": used_prefix, "requests": used_req},
            "prefixes": [{"agent": p.agent, "tokens": p.tokens, "location": str(p.location),
                          "ready": p.ready, "host_copy": p.host_copy,
                          "transfer": (tr.as_dict() if (tr := transfers.get(p.agent))
                                       else None)}
                         for p in sorted(view.prefixes.values(), key=lambda p: p.agent)],
            "running": {a: rs[:limit] for a, rs in sorted(running.items())},
            "waiting": {a: rs[:limit] for a, rs in sorted(waiting.items())},
            "tasks": tasks,
            "counts": counts,
            "driver": None if self.feeder is None else {
                "workload": self.feeder.workload.name, "rate": self.feeder.rate,
                "generated": self.feeder.generated, "limit": self.feeder.limit,
                "next_arrival": self.feeder.next_arrival},
            "stats": self._stats(view.t),
            "started_ts": self.started_wall,
            "event_id": self.bus.seq,
            "loop": {"pump_wall_s": m.pump_wall_s, "decide_wall_s": m.decide_wall_s},
            "recent_decisions": [d.as_dict() for d in list(self.recorder.recent)[-limit:]],
        }

    def _stats(self, t: float) -> dict[str, Any]:
        """Headline numbers: throughput and mean JCT over the whole run, p99 JCT and
        decision latency over the last STATS_WINDOW values (None before the first)."""
        m = self.metrics
        n = sum(m.jct.counts)
        jcts = np.fromiter(m.recent_jct, float, len(m.recent_jct))
        ms = np.asarray(self.loop.decision_ms[-STATS_WINDOW:], dtype=float)
        return {
            "tasks_finished": int(n),
            "throughput_task_s": n / t if t > 0 else 0.0,
            "jct_mean_s": m.jct.sum / n if n else None,
            "jct_p99_s": float(np.percentile(jcts, 99)) if jcts.size else None,
            "decision_ms_mean": float(ms.mean()) if ms.size else None,
            "decision_ms_p99": float(np.percentile(ms, 99)) if ms.size else None,
        }

    # ----------------------------------------------------------- helpers

    def _new_task_id(self) -> int:
        tid = self._next_task
        self._next_task += 1
        return tid

    def _registered(self, name: str) -> Workflow:
        wf = self.registry.get(name)
        if wf is None:
            raise Invalid(f"workflow: unknown workflow {name!r}; registered: "
                          f"{', '.join(sorted(self.registry))} (add spec files with --workflow)")
        return wf

    def _activate(self, name: str) -> Workflow:
        """The registered workflow `name` as the engine runs it. Agents are global
        by name; an agent whose name is taken by a different-sized prefix is
        renamed `<workflow>/<agent>`."""
        if name in self.active:
            return self.active[name]
        wf = self.registry[name]
        rename = {a.name: f"{wf.name}/{a.name}" for a in wf.agents.values()
                  if self._agent_sizes.get(a.name, a.prefix_tokens) != a.prefix_tokens}
        if rename:
            agents = {rename.get(a, a): Agent(rename.get(a, a), ag.prefix_tokens)
                      for a, ag in wf.agents.items()}
            stages = {v: replace(s, agent=rename.get(s.agent, s.agent))
                      for v, s in wf.stages.items()}
            wf = Workflow(wf.name, agents, stages, wf.description)
        for agent in wf.agents.values():
            self._agent_sizes[agent.name] = agent.prefix_tokens
        self.active[name] = wf
        return wf

    def _synthesized(self, agent: str, spec: CallSpec) -> Workflow:
        """The one-stage workflow `agent:<agent>` of calls without a registered
        workflow; a new agent's prefix is this call's system prompt."""
        name = f"{SYNTHESIZED}{agent}"
        wf = self.active.get(name)
        if wf is None:
            if agent not in self._agent_sizes:
                self._system_keys[agent] = spec.system_key
            size = self._agent_sizes.get(agent, spec.system_tokens)
            wf = Workflow(name, {agent: Agent(agent, size)}, {"call": Stage("call", agent)},
                          f"calls of agent {agent} (synthesized)")
            self._agent_sizes[agent] = size
            self.active[name] = wf
        return wf

    def _uncached_system(self, agent: str, spec: CallSpec) -> int:
        """Tokens of a system prompt that is not its agent's prefix: an agent that
        a call's system prompt defined keeps that prefix, and a later call with
        another system prompt sends its own as input (no prefix-cache hit)."""
        key = self._system_keys.get(agent)
        return spec.system_tokens if key is not None and key != spec.system_key else 0

    def _fit_problem(self, record: TaskRecord) -> str | None:
        problem = record.oversized_round(self.active[record.workflow], self.limit.tokens)
        return None if problem is None else (
            f"{problem} but {self.limit.what}; lower the stage's token overrides")

    def _fits(self, record: TaskRecord) -> bool:
        return self._fit_problem(record) is None

    def _arrive(self, record: TaskRecord, source: str, t: float) -> _TaskEntry:
        entry = _TaskEntry(record.id, record.workflow, source, t)
        self._remember(entry)
        self.loop.arrive(record, t)
        return entry

    def _remember(self, entry: _TaskEntry) -> None:
        self.tasks[entry.id] = entry
        if len(self.tasks) > KEEP_FINISHED:
            for tid, old in self.tasks.items():
                if old.finished is not None or old.abandoned:
                    del self.tasks[tid]
                    break

    def _task_done(self, task: TaskView, t: float) -> None:
        entry = self.tasks.get(task.id)
        if entry is not None:
            entry.finished = t
            entry.stages = _stages(task)
            self.tasks.move_to_end(task.id)

    def _params_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "params": policy_params(self.policy),
                "version": self.params_version}


def _req_dict(req: Request) -> dict[str, Any]:
    return {"id": req.id, "task_id": req.task_id, "workflow": req.workflow,
            "stage": req.stage, "round": req.round, "input_tokens": req.input_tokens,
            "output_tokens": req.output_tokens, "generated": req.generated,
            "ready_at": req.ready_at, "preemptions": req.preemptions}


def _middle(workload: Workload) -> float:
    points = workload.operating_points
    if not points:
        raise TopasError(f"workload {workload.name!r} lists no operating points; pass --rate")
    return points[len(points) // 2]


def _registry(workload: Workload | None, specs: tuple[Workflow, ...]) -> dict[str, Workflow]:
    """Every workflow a task or call may name: the built-ins, the --workload and
    the --workflow spec files (`config.load_settings` refused name clashes)."""
    out = {name: wf for name, (_, wf) in builtin_workflows().items()}
    for wf in (*(workload.workflows if workload else ()), *specs):
        out[wf.name] = wf
    return out
