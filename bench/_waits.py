"""A run sink that keeps when each request was first ready and first admitted:
waits per stage and the longest wait of a run."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from topasd.model import EngineEvent, EventKind


class Waits:
    """A sink that keeps each request's first ready and admission times."""

    def __init__(self) -> None:
        self.ready: dict[int, tuple[float, str]] = {}
        self.admit: dict[int, float] = {}

    def decision(self, decision: Any) -> None:
        return None

    def event(self, ev: EngineEvent) -> None:
        if ev.kind is EventKind.REQUEST_READY and ev.request_id not in self.ready:
            self.ready[ev.request_id] = (ev.t, ev.stage or "?")  # type: ignore[index]
        elif ev.kind is EventKind.REQUEST_ADMIT and ev.request_id not in self.admit:
            self.admit[ev.request_id] = ev.t  # type: ignore[index]

    def per_stage(self) -> dict[str, float]:
        sums: dict[str, list[float]] = defaultdict(list)
        for rid, (t, stage) in self.ready.items():
            if rid in self.admit:
                sums[stage].append(self.admit[rid] - t)
        return {s: sum(v) / len(v) for s, v in sorted(sums.items())}

    def longest(self) -> tuple[float, str]:
        """The longest wait from ready to first admission, and its stage."""
        return max(((self.admit[rid] - t, stage) for rid, (t, stage) in self.ready.items()
                    if rid in self.admit), default=(0.0, "-"))
