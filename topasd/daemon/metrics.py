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
    TASK_ENDS,
    PrefixPhase,
    prefix_after,
    request_phase,
)
from topasd.model import EngineEvent, EventKind, Location

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
        self._phase: dict[int, str] = {}  # the requests in the engine: waiting or running
        self._prefixes: dict[str, PrefixPhase] = {}

    def event(self, ev: EngineEvent) -> None:
        """Count `ev` and fold it into the queues and prefixes (`topasd.lifecycle`)."""
        kind = ev.kind
        self.counts[kind] += 1
        if ev.request_id is not None and kind in REQUEST_PHASE:
            self._request(ev.request_id, ev.agent or "", kind)
        elif ev.request_id is None and ev.agent is not None and kind.startswith("prefix_"):
            self._prefix(ev)
        elif kind is EventKind.TASK_FINISH:
            self.jct.observe(ev.value)
            self.recent_jct.append(ev.value)

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
        p = prefix_after(self._prefixes.get(agent), ev.t, ev.kind, ev.tokens, ev.value, ev.note)
        self._prefixes[agent] = p
        self.on_gpu[agent] = int(p.location is Location.GPU)
        if p.transfer is None:
            self.transfers.pop(agent, None)
        elif p.since is not None:
            self.transfers[agent] = Transfer(p.transfer, p.since, p.until)

    def decision(self, wall_ms: float) -> None:
        self.decisions += 1
        self.decision_latency.observe(wall_ms / 1e3)

    @property
    def tasks_in_flight(self) -> int:
        return self.counts[EventKind.TASK_ARRIVE] - sum(self.counts[k] for k in TASK_ENDS)
