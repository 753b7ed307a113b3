"""The link between SGLang's scheduler (leader rank of each replica) and the
daemon: ZeroMQ over an IPC socket, pickled messages.

leader -> daemon: ("decide", replica, seq, snapshot, events) and waits for
("decision", seq, decision); ("events", replica, events) needs no answer.
A decision that arrives after its request timed out is dropped (seq check),
and the leader's next message names that request's seq (`dropped`) so the
daemon can log that the decision was never carried out.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from typing import Any

from topasd.model import Decision, EngineEvent

ENDPOINT_ENV = "TOPASD_SGLANG_ENDPOINT"  # set by the daemon; enables the plugin
TIMEOUT_ENV = "TOPASD_SGLANG_DECIDE_TIMEOUT_S"
T0_ENV = "TOPASD_SGLANG_T0"  # the daemon's time.monotonic() at t=0 (events share its clock)
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DecideRequest:
    replica: int
    seq: int
    snapshot: Any  # adapter.EngineSnapshot
    events: list[EngineEvent]
    dropped: tuple[int, ...] = ()  # seqs of earlier requests this leader stopped waiting for


@dataclass(frozen=True, slots=True)
class EventBatch:
    replica: int
    events: list[EngineEvent]
    dropped: tuple[int, ...] = ()


class LeaderChannel:
    """The scheduler side (DEALER): ask for decisions, send events."""

    def __init__(self, endpoint: str, replica: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import zmq

        self._zmq = zmq
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.replica = replica
        self.timeout_ms = int(timeout_s * 1000)
        self.timeouts = 0
        self.dropped: list[int] = []  # timed out, not yet reported to the daemon

    def _take_dropped(self) -> tuple[int, ...]:
        dropped, self.dropped = tuple(self.dropped), []
        return dropped

    def decide(self, seq: int, snapshot: Any, events: list[EngineEvent]) -> Decision | None:
        """The daemon's decision for `snapshot`, or None after the timeout."""
        self.sock.send(pickle.dumps(DecideRequest(self.replica, seq, snapshot, events,
                                                  self._take_dropped())))
        poller = self._zmq.Poller()
        poller.register(self.sock, self._zmq.POLLIN)
        remaining = self.timeout_ms
        while remaining > 0:
            if not poller.poll(remaining):
                break
            got_seq, decision = pickle.loads(self.sock.recv())
            if got_seq == seq:
                return decision
            remaining = max(1, remaining // 2)  # a stale answer: keep waiting a little
        self.timeouts += 1
        self.dropped.append(seq)
        return None

    def send_events(self, events: list[EngineEvent]) -> None:
        if events or self.dropped:
            self.sock.send(pickle.dumps(EventBatch(self.replica, events, self._take_dropped())))

    def close(self) -> None:
        self.sock.close(0)


class DaemonChannel:
    """The daemon side (ROUTER): receive requests and events, answer decisions."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self._zmq = zmq
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.endpoint = endpoint

    def poll(self, timeout_s: float) -> list[tuple[bytes, DecideRequest | EventBatch]]:
        """Messages that arrived within `timeout_s` (at least one wait, then all ready)."""
        out = []
        if self.sock.poll(max(0, int(timeout_s * 1000))):
            while True:
                try:
                    ident, payload = self.sock.recv_multipart(self._zmq.NOBLOCK)
                except self._zmq.Again:
                    break
                out.append((ident, pickle.loads(payload)))
        return out

    def answer(self, ident: bytes, seq: int, decision: Decision | None) -> None:
        """Send `decision` (without its candidate log) to the asking leader."""
        if decision is not None:
            decision = replace(decision, candidates=(), chosen=None)
        self.sock.send_multipart([ident, pickle.dumps((seq, decision))])

    def close(self) -> None:
        self.sock.close(0)
