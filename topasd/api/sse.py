"""`/v1/events`: decisions and engine events as server-sent events. Each reader
keeps its own cursor in the event bus; one that falls behind skips ahead and
is told how many it missed (`lag`); the scheduler never waits for a reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import Request

from topasd.daemon.errors import Invalid
from topasd.daemon.service import Service
from topasd.model import EventKind


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


async def event_stream(service: Service, request: Request, kinds: frozenset[str] | None,
                        since: int | None, max_events: int | None) -> AsyncIterator[str]:
    bus = service.bus
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the server's loop already closed
            loop.call_soon_threadsafe(wake.set)

    bus.listen(notify)
    cursor = bus.seq if since is None else since
    sent = 0
    try:
        yield f"retry: 1000\n: topasd events from {cursor}\n\n"
        while True:
            missed, items = bus.since(cursor)
            parts: list[str] = []
            if missed:
                parts.append(f"event: lag\ndata: {json.dumps({'missed': missed})}\n\n")
            for seq, kind, item in items:
                cursor = seq
                if kind == "decision":
                    name, data = "decision", item.as_dict()
                else:
                    name, data = "engine", item.as_row()
                    if kinds is not None and data["kind"] not in kinds:
                        continue
                if kinds is not None and name == "decision" and "decision" not in kinds:
                    continue
                parts.append(f"id: {seq}\nevent: {name}\n"
                             f"data: {json.dumps(data, separators=(',', ':'))}\n\n")
                sent += 1
                if max_events is not None and sent >= max_events:
                    break
            if parts:
                yield "".join(parts)
            if max_events is not None and sent >= max_events:
                return
            if items:
                continue
            if service.stopped.is_set():
                yield "event: end\ndata: {}\n\n"
                return
            if await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(wake.wait(), 15.0)
            except TimeoutError:
                yield ": keep-alive\n\n"
            wake.clear()
    finally:
        bus.unlisten(notify)

