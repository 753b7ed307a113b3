"""Counters and gauges the daemon keeps from the event stream (`/metrics`,
`/v1/state`), kept by the engine loop's thread."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any

from topasd.lifecycle import (
    REQUEST_PHASE,
    RUNNING,
    SYNTHESIZED,
    TASK_ENDS,
    PrefixPhase,
    prefix_after,
    request_phase,
    workflow_label,
)
from topasd.model import EngineEvent, EventKind, Location

STATS_WINDOW = 10_000  # p99 JCT and decision latency over this many recent values
GROUP_WINDOW = 1_000  # per workflow (and stage): JCT and stage time over this many


@dataclass(frozen=True, slots=True)
class Transfer:
    """A prefix move under way: `load` (host -> GPU), `offload` (GPU -> host
    backup) or `compute` (recomputed by prefill; its end is not known ahead)."""

    kind: str
    since: float
    until: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "since": self.since, "until": self.until}


JCT_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
               1200.0)
DECISION_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
# request latencies (vLLM's buckets for queue time, TTFT and end-to-end, in seconds)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                   160.0, 320.0, 640.0)
OTHER = "other"  # the agent label of the agents past the cap


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


class Labelled:
    """Histograms by a tuple of label values, created on first use."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.by: dict[tuple[str, ...], Histogram] = {}

    def observe(self, labels: tuple[str, ...], x: float) -> None:
        h = self.by.get(labels)
        if h is None:
            h = self.by[labels] = Histogram(self.buckets)
        h.observe(x)


def _recent(kept: dict[Any, deque[float]], key: Any, x: float) -> None:
    """Append `x` to the recent values of `key` (the last GROUP_WINDOW)."""
    values = kept.get(key)
    if values is None:
        values = kept[key] = deque(maxlen=GROUP_WINDOW)
    values.append(x)


@dataclass(slots=True)
class _Req:
    """A request in the engine as the metrics follow it."""

    workflow: str  # the label value
    stage: str
    agent: str
    ready: float
    input_tokens: int
    since: float  # in its phase (waiting: since it (re-)entered the queue)
    admitted: bool = False
    first_token: bool = False


class Metrics:
    """Counters and gauges kept from the event stream by the loop thread; the
    API reads them (plain ints and dict copies: no lock on the hot path).

    Per request (by its workflow and stage, `workflow_label`): queue time
    (ready -> first admission), time to first token (ready -> its prefill's
    end, where the backend reports PREFILL_END), end-to-end latency (ready ->
    finish), prompt and generated tokens, prefix-cache queries and hits (an
    admission whose agent's prefix was ready on the GPU hits its tokens)."""

    def __init__(self) -> None:
        self.counts: dict[EventKind, int] = dict.fromkeys(EventKind, 0)
        self.waiting: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.on_gpu: dict[str, int] = {}
        self.jct = Histogram(JCT_BUCKETS)
        self.jct_by = Labelled(JCT_BUCKETS)  # (workflow,)
        self.queue_time = Labelled(LATENCY_BUCKETS)  # (workflow, stage)
        self.ttft = Labelled(LATENCY_BUCKETS)
        self.e2e = Labelled(LATENCY_BUCKETS)
        self.tokens: dict[tuple[str, str], int] = {}  # (workflow, prompt|generation)
        self.prefix_cache: dict[tuple[str, str], int] = {}  # (workflow, queries|hits)
        self.decision_latency = Histogram(DECISION_BUCKETS)
        self.decisions = 0
        self.held = 0  # requests the last decision held out of W_t (`Decision.held`)
        self.param_changes = 0
        self.abandoned = 0
        self.pump_wall_s = 0.0
        self.decide_wall_s = 0.0
        self.t = 0.0
        self.kv_used = 0  # KV tokens held (resident prefixes + running requests), per second
        self.recent_jct: deque[float] = deque(maxlen=STATS_WINDOW)
        self.transfers: dict[str, Transfer] = {}  # prefix moves under way, by agent
        self.agents: dict[str, bool] = {}  # every agent seen, in order: synthesized?
        self.requests: dict[int, _Req] = {}  # the requests in the engine
        self.tasks: dict[int, tuple[str, float]] = {}  # in flight: (workflow label, arrival)
        self.workflow_labels: dict[str, None] = {}  # every workflow label seen, in order
        self._phase: dict[int, str] = {}  # the requests in the engine: waiting or running
        self._prefixes: dict[str, PrefixPhase] = {}
        self._workflows: dict[int, str] = {}  # task -> its workflow (raw name)
        # recent JCTs by workflow label, stage durations (first ready -> finish) by
        # (workflow label, stage): what "late" is judged against (`/v1/state` stats)
        self.recent_jct_by: dict[str, deque[float]] = {}
        self.recent_stage: dict[tuple[str, str], deque[float]] = {}
        self._stage_start: dict[int, dict[str, float]] = {}  # task -> stage -> first ready

    def event(self, ev: EngineEvent) -> None:
        """Count `ev` and fold it into the queues and prefixes (`topasd.lifecycle`)."""
        kind = ev.kind
        self.counts[kind] += 1
        if ev.request_id is not None:
            if kind in REQUEST_PHASE:
                self._request(ev.request_id, ev.agent or "", kind)
            self._latency(ev)
        elif ev.agent is not None and kind.startswith("prefix_"):
            self._prefix(ev)
        elif kind is EventKind.TASK_ARRIVE and ev.task_id is not None:
            self._workflows[ev.task_id] = ev.note
            label = workflow_label(ev.note)
            self.tasks[ev.task_id] = (label, ev.t)
            self.workflow_labels.setdefault(label)
        elif kind is EventKind.STAGE_FINISH and ev.task_id is not None:
            start = self._stage_start.get(ev.task_id, {}).pop(ev.stage or "", None)
            if start is not None:
                label = workflow_label(self._workflows.get(ev.task_id, ""))
                _recent(self.recent_stage, (label, ev.stage or ""), ev.t - start)
        elif kind in TASK_ENDS and ev.task_id is not None:
            workflow = self._workflows.pop(ev.task_id, "")
            self.tasks.pop(ev.task_id, None)
            self._stage_start.pop(ev.task_id, None)
            if kind is EventKind.TASK_FINISH:
                self.jct.observe(ev.value)
                self.jct_by.observe((workflow_label(workflow),), ev.value)
                self.recent_jct.append(ev.value)
                _recent(self.recent_jct_by, workflow_label(workflow), ev.value)

    def _latency(self, ev: EngineEvent) -> None:
        """A request's own event: its latencies, tokens and prefix-cache lookups."""
        kind, rid = ev.kind, ev.request_id
        assert rid is not None
        if kind is EventKind.REQUEST_READY:
            workflow = self._workflows.get(ev.task_id, "")  # type: ignore[arg-type]
            self.agents.setdefault(ev.agent or "", workflow.startswith(SYNTHESIZED))
            self.requests[rid] = _Req(workflow_label(workflow), ev.stage or "", ev.agent or "",
                                      ev.t, ev.tokens, ev.t)
            if ev.task_id is not None:
                self._stage_start.setdefault(ev.task_id, {}).setdefault(ev.stage or "", ev.t)
            return
        req = self.requests.get(rid)
        if req is None:
            return
        labels = (req.workflow, req.stage)
        if kind is EventKind.REQUEST_ADMIT and not req.admitted:
            req.admitted = True
            self.queue_time.observe(labels, ev.t - req.ready)
            prefix = self._prefixes.get(req.agent)
            tokens = 0 if prefix is None else prefix.tokens
            hit = prefix is not None and prefix.location is Location.GPU and prefix.ready
            self._add(self.prefix_cache, (req.workflow, "queries"), tokens)
            self._add(self.prefix_cache, (req.workflow, "hits"), tokens if hit else 0)
        elif kind is EventKind.PREFILL_END and not req.first_token:
            req.first_token = True
            self.ttft.observe(labels, ev.t - req.ready)
        elif kind in (EventKind.PREEMPT, EventKind.RETRACT):
            req.since = ev.t
        elif kind is EventKind.REQUEST_FINISH:
            del self.requests[rid]
            self.e2e.observe(labels, ev.t - req.ready)
            prefix = self._prefixes.get(req.agent)
            prompt = req.input_tokens + (0 if prefix is None else prefix.tokens)
            self._add(self.tokens, (req.workflow, "prompt"), prompt)
            self._add(self.tokens, (req.workflow, "generation"), ev.tokens)
        elif kind is EventKind.REQUEST_WITHDRAW:
            del self.requests[rid]

    @staticmethod
    def _add(counter: dict[tuple[str, str], int], key: tuple[str, str], n: int) -> None:
        counter[key] = counter.get(key, 0) + n

    def _request(self, request_id: int, agent: str, kind: EventKind) -> None:
        """Waiting and running requests by agent."""
        old = self._phase.get(request_id)
        new = request_phase(old, kind)
        if old is not None:
            self._queue(old)[agent] -= 1
        if new is None:
            self._phase.pop(request_id, None)
            return
        self._phase[request_id] = new
        queue = self._queue(new)
        queue[agent] = queue.get(agent, 0) + 1

    def _queue(self, phase: str) -> dict[str, int]:
        return self.running if phase == RUNNING else self.waiting

    def _prefix(self, ev: EngineEvent) -> None:
        """Prefixes on the GPU, and the moves under way (a load or backup runs
        [t, t + value), a recompute until its end; see `lifecycle.prefix_after`)."""
        agent = ev.agent or ""
        self.agents.setdefault(agent, False)
        p = prefix_after(self._prefixes.get(agent), ev.t, ev.kind, ev.tokens, ev.value, ev.note)
        self._prefixes[agent] = p
        self.on_gpu[agent] = int(p.location is Location.GPU)
        if p.transfer is None:
            self.transfers.pop(agent, None)
        elif p.since is not None:
            self.transfers[agent] = Transfer(p.transfer, p.since, p.until)

    def phase(self, request_id: int) -> str | None:
        """waiting, running, or None (not in the engine)."""
        return self._phase.get(request_id)

    def location(self, agent: str) -> Location:
        p = self._prefixes.get(agent)
        return Location.NONE if p is None else p.location

    def decision(self, wall_ms: float, held: int) -> None:
        self.decisions += 1
        self.decision_latency.observe(wall_ms / 1e3)
        self.held = held

    @property
    def tasks_in_flight(self) -> int:
        return self.counts[EventKind.TASK_ARRIVE] - sum(self.counts[k] for k in TASK_ENDS)

    # ------------------------------------------------------------ for /metrics

    def agent_labels(self, cap: int) -> dict[str, str]:
        """Each agent shown in the agent-labelled families and its label: the
        first `cap` of them by their own name, the rest as OTHER. A synthesized
        agent (a plain client's system prompt) that is idle (nothing waiting or
        running, its prefix off the GPU, no move under way) is retired: it has
        no series and takes no place."""
        out: dict[str, str] = {}
        own = 0
        for agent, synthesized in list(self.agents.items()):
            if synthesized and not (self.waiting.get(agent) or self.running.get(agent)
                                    or self.on_gpu.get(agent) or agent in self.transfers):
                continue
            own += 1
            out[agent] = agent if own <= cap else OTHER
        return out

    def waiting_since(self) -> dict[str, float]:
        """The oldest waiting request's queue entry time, by workflow label."""
        out: dict[str, float] = {}
        for rid, req in list(self.requests.items()):
            if self._phase.get(rid) not in (RUNNING, None):
                out[req.workflow] = min(req.since, out.get(req.workflow, req.since))
        return out
