"""App-wide messages: workers post them, the app and its screens handle them."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from console.snapshot import DecisionDetail, DecisionRow, Snapshot


class StateArrived(Message):
    """A fresh snapshot of the engine (a /v1/state poll, or the replay cursor)."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class DecisionsArrived(Message):
    """New decisions from the event stream, batched; `missed`: skipped by lag."""

    def __init__(self, rows: list[DecisionRow], missed: int = 0) -> None:
        super().__init__()
        self.rows = rows
        self.missed = missed


class ConnectionChanged(Message):
    """The daemon answers again (`connected`), or stopped answering (`error`)."""

    def __init__(self, connected: bool, error: str | None = None, attempt: int = 0,
                 url: str = "") -> None:
        super().__init__()
        self.connected = connected
        self.error = error
        self.attempt = attempt
        self.url = url


class FeedReset(Message):
    """Start the decision feed over: `rows` (the daemon's recent decisions), then the
    event stream from event id `since`. `restarted`: a new daemon process."""

    def __init__(self, rows: list[DecisionRow], since: int | None, restarted: bool) -> None:
        super().__init__()
        self.rows = rows
        self.since = since
        self.restarted = restarted


class DetailRequested(Message):
    """The decisions feed selected decision `seq`."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.seq = seq


class DetailLoaded(Message):
    """A decision's candidates arrived (or `error` says why not)."""

    def __init__(self, seq: int, detail: DecisionDetail | None, error: str | None = None
                 ) -> None:
        super().__init__()
        self.seq = seq
        self.detail = detail
        self.error = error


class ParamsApplied(Message):
    """The daemon's answer to a parameter change: its body, or its error."""

    def __init__(self, result: dict[str, Any] | None, error: str | None = None) -> None:
        super().__init__()
        self.result = result
        self.error = error
