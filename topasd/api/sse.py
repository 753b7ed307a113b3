"""`/v1/events`: decisions and engine events as server-sent events. Each reader
keeps its own cursor in the event bus; one that falls behind skips ahead and
is told how many it missed (`lag`); the scheduler never waits for a reader.
The readers share one `EventFeed`: each event is JSON-encoded once for all of
them, they are woken for news at most every WAKE_INTERVAL_S, and a reader
takes at most BATCH events per turn of the event loop, so that a hundred
readers with a backlog leave the loop to the requests between their batches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from topasd.daemon.bus import BUS_SIZE, EventBus
from topasd.daemon.errors import Invalid
from topasd.model import EventKind

BATCH = 256  # events one reader takes per turn of the event loop
WAKE_INTERVAL_S = 0.025  # readers are woken for news at most this often


def kinds(text: str | None) -> frozenset[str] | None:
    if text is None or not text.strip():
        return None
    known = {"decision", *(k.value for k in EventKind)} - {EventKind.SCHEDULE.value}
    wanted = {k.strip() for k in text.split(",") if k.strip()}
    if not wanted:  # ",,": like none given
        return None
    unknown = sorted(wanted - known)
    if unknown:
        raise Invalid(f"kinds: unknown kind(s) {unknown}; use decision and/or "
                           f"{', '.join(sorted(known - {'decision'}))}")
    return frozenset(wanted)


class EventFeed:
    """What every `/v1/events` reader of one app shares: one listener on the bus
    (a notification wakes all readers at once), and each event's SSE text,
    encoded once, by its first reader, for all of them."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.encoded = 0  # events encoded so far (each once)
        self._texts: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._waking = False
        self._last_wake = -WAKE_INTERVAL_S

    def changed(self) -> asyncio.Event:
        """An event set once the bus has news after this call (take it before
        looking at the bus, so that no news between is lost)."""
        if self._changed is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()
            self.bus.listen(self._notify)
        return self._changed

    def _notify(self) -> None:
        """The engine loop's notification (its thread): one wake-up per batch of news."""
        if self._waking or self._loop is None:
            return
        self._waking = True
        with contextlib.suppress(RuntimeError):  # the server's loop already closed
            self._loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        """Wake the readers, at most once per WAKE_INTERVAL_S: each wake-up costs a
        turn of every reader, and the news of the meantime goes in one turn."""
        assert self._loop is not None
        delay = self._last_wake + WAKE_INTERVAL_S - self._loop.time()
        self._loop.call_later(max(0.0, delay), self._wake)

    def _wake(self) -> None:
        assert self._loop is not None
        self._last_wake = self._loop.time()
        self._waking = False
        old, self._changed = self._changed, asyncio.Event()
        if old is not None:
            old.set()

    def text(self, seq: int, kind: str, item: Any) -> str:
        """The SSE text of bus item `seq` (encoded on first use)."""
        text = self._texts.get(seq)
        if text is None:
            name, data = ("decision", item.as_dict()) if kind == "decision" else (
                "engine", item.as_row())
            text = f"id: {seq}\nevent: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
            if len(self._texts) >= 2 * BUS_SIZE:  # keep what the ring still holds
                oldest = self.bus.seq - BUS_SIZE
                self._texts = {k: v for k, v in self._texts.items() if k > oldest}
            self._texts[seq] = text
            self.encoded += 1
        return text


def _wanted(kind: str, item: Any, kinds: frozenset[str] | None) -> bool:
    if kinds is None:
        return True
    return ("decision" if kind == "decision" else item.kind.value) in kinds


async def event_stream(feed: EventFeed, stopped: threading.Event, request: Request,
                       kinds: frozenset[str] | None, since: int | None,
                       max_events: int | None) -> AsyncIterator[str]:
    """One reader's stream: at most BATCH events per turn of the event loop,
    which it then yields to the other readers and requests."""
    bus = feed.bus
    cursor = bus.seq if since is None else since
    sent = 0
    yield f"retry: 1000\n: topasd events from {cursor}\n\n"
    while True:
        changed = feed.changed()
        missed, items = bus.since(cursor, BATCH)
        parts: list[str] = []
        if missed:
            parts.append(f"event: lag\ndata: {json.dumps({'missed': missed})}\n\n")
        for seq, kind, item in items:
            cursor = seq
            if not _wanted(kind, item, kinds):
                continue
            parts.append(feed.text(seq, kind, item))
            sent += 1
            if max_events is not None and sent >= max_events:
                break
        if parts:
            yield "".join(parts)
        if max_events is not None and sent >= max_events:
            return
        if items:
            await asyncio.sleep(0)  # the others' turn: a backlog never holds the loop
            continue
        if stopped.is_set():
            yield "event: end\ndata: {}\n\n"
            return
        if await request.is_disconnected():
            return
        try:
            await asyncio.wait_for(changed.wait(), 15.0)
        except TimeoutError:
            yield ": keep-alive\n\n"
