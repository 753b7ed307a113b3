"""The engine loop's `RunSink`: every decision and event goes to the store, the
event bus and the metrics; recent decisions stay in memory for the API."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from store import StoreError, StoreSink
from topasd.daemon.bus import DecisionSummary, EventBus
from topasd.daemon.ledger import TaskLedger
from topasd.daemon.metrics import Metrics
from topasd.model import DECISION_REQUESTS, Candidate, Decision, EngineEvent, EventKind
from topasd.scheduler.residual import ServiceModel

RECENT_DECISIONS = 50
DETAIL_DECISIONS = 1024  # decisions kept with their candidates for GET /v1/decisions/{seq}


class Recorder:
    """Where the daemon's `EventLoop` records: the store, the bus, the metrics."""

    def __init__(self, store: StoreSink, bus: EventBus, metrics: Metrics,
                 version: Callable[[], int], ledger: TaskLedger | None = None) -> None:
        self.store = store
        self.ledger = ledger
        self.bus = bus
        self.metrics = metrics
        self.recent: deque[DecisionSummary] = deque(maxlen=RECENT_DECISIONS)
        self._version = version
        # the last decisions with their candidates (GET /v1/decisions/{seq}); read by
        # the HTTP thread, so guarded by a lock
        self._details: OrderedDict[int, tuple[Decision, int, dict[int, Any]]] = OrderedDict()
        self._requests: dict[int, dict[str, Any]] = {}  # in the engine: task, stage, agent
        self._details_lock = threading.Lock()
        # E[remaining path] for /v1/state: the daemon's own F_{a,v} (Eq. 5), fed by the
        # same completions as the policy's, whatever the policy
        self.service_model = ServiceModel()
        self.store_failed = False

    def _logged(self, write: Callable[[Any], None], item: Any) -> None:
        """Write `item` to the store unless the store failed (the sink then told
        the service why; running work goes on, unlogged)."""
        if self.store_failed:
            return
        try:
            write(item)
        except StoreError:
            self.store_failed = True

    def decision(self, d: Decision) -> None:
        self._logged(self.store.decision, d)
        named = {rid: self._requests[rid] for f in DECISION_REQUESTS.values()
                 for rid in getattr(d, f)
                 if rid in self._requests}
        with self._details_lock:
            self._details[d.seq] = (d, self._version(), named)
            if len(self._details) > DETAIL_DECISIONS:
                self._details.popitem(last=False)
        summary = DecisionSummary.of(d, self._version())
        self.recent.append(summary)
        self.bus.put("decision", summary)
        self.metrics.decision(d.wall_ms, len(d.held))
        if self.ledger is not None:
            self.ledger.on_decision(d)

    def event(self, ev: EngineEvent) -> None:
        self._logged(self.store.event, ev)
        if ev.request_id is not None:
            if ev.kind is EventKind.REQUEST_READY:
                self._requests[ev.request_id] = {"task_id": ev.task_id, "stage": ev.stage,
                                                 "agent": ev.agent}
            elif ev.kind in (EventKind.REQUEST_FINISH, EventKind.REQUEST_WITHDRAW):
                self._requests.pop(ev.request_id, None)
        self.bus.put("event", ev)
        self.metrics.event(ev)
        if self.ledger is not None:
            self.ledger.on_event(ev)
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
        d, version, named = hit
        order = sorted(range(len(d.candidates)), key=lambda i: (-d.candidates[i].terms.total, i))
        keep = order[:limit]
        if d.chosen is not None and d.chosen not in keep and limit > 0:
            keep = [*keep[:limit - 1], d.chosen]
        return {
            "seq": d.seq, "t": d.t, "policy": d.policy, "admit": list(d.admit),
            "preempt": list(d.preempt), "load": list(d.load), "evict": list(d.evict),
            "noop": d.is_noop, "blocked": d.blocked, "retry": d.retry,
            "reservation": str(d.reservation), "wall_ms": d.wall_ms,
            "n_candidates": len(d.candidates), "chosen": d.chosen, "held": list(d.held),
            "params_version": version,
            "requests": {str(rid): info for rid, info in named.items()},
            "candidates": [candidate_dict(i, d.candidates[i], i == d.chosen) for i in keep],
        }

    def oldest_detail(self) -> int | None:
        with self._details_lock:
            return next(iter(self._details), None)


def candidate_dict(idx: int, c: Candidate, won: bool) -> dict[str, Any]:
    tm = c.terms
    return {"idx": idx, "won": won, "resident": sorted(c.resident), "admit": list(c.admit),
            "preempt": list(c.preempt), "j_admit": tm.j_admit, "j_move": tm.j_move,
            "j_redo": tm.j_redo, "j_revoke": tm.j_revoke, "v_reuse": tm.v_reuse,
            "total": tm.total}
