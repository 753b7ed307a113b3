"""The event bus: recent decisions and engine events for `/v1/events` readers."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from topasd.model import Decision, ScoreTerms

log = logging.getLogger("topasd")

BUS_SIZE = 16_384


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
    terms: ScoreTerms | None  # the chosen candidate's (baselines choose none)
    params_version: int
    n_held: int = 0  # waiting requests left out of W_t (`Decision.held`)

    @staticmethod
    def of(d: Decision, params_version: int) -> DecisionSummary:
        chosen = d.chosen_candidate
        return DecisionSummary(d.seq, d.t, d.policy, tuple(d.admit), tuple(d.preempt),
                               tuple(d.load), tuple(d.evict), d.blocked, d.wall_ms,
                               len(d.candidates), None if chosen is None else chosen.terms,
                               params_version, len(d.held))

    def as_dict(self) -> dict[str, Any]:
        tm = self.terms
        return {
            "seq": self.seq, "t": self.t, "policy": self.policy, "admit": list(self.admit),
            "preempt": list(self.preempt), "load": list(self.load), "evict": list(self.evict),
            "noop": not (self.admit or self.preempt or self.load or self.evict),
            "blocked": self.blocked, "wall_ms": self.wall_ms,
            "n_candidates": self.n_candidates, "params_version": self.params_version,
            "n_held": self.n_held,
            "terms": None if tm is None else {
                "j_admit": tm.j_admit, "j_move": tm.j_move, "j_redo": tm.j_redo,
                "j_revoke": tm.j_revoke, "v_reuse": tm.v_reuse, "total": tm.total},
        }


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
