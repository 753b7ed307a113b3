"""Counters and gauges the daemon keeps from the event stream (`/metrics`,
`/v1/state`), kept by the engine loop's thread."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any

from topasd.model import EngineEvent, EventKind

STATS_WINDOW = 10_000  # p99 JCT and decision latency over this many recent values


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
