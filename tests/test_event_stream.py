"""`/v1/events` under many readers: each event is encoded once for all of
them, a reader with a backlog takes at most BATCH events per turn of the
event loop, and a real daemon with a hundred readers serves a burst of calls
without a failure while `/health` keeps answering."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path
from typing import Any

from starlette.requests import Request

from tests.daemonkit import Daemon
from topasd.api.sse import BATCH, EventFeed, event_stream
from topasd.daemon.bus import EventBus
from topasd.model import EngineEvent, EventKind

READERS = 100
CALLS = 500


def filled_bus(n: int) -> EventBus:
    bus = EventBus()
    for i in range(n):
        bus.put("event", EngineEvent(float(i), EventKind.REQUEST_FINISH, request_id=i,
                                     task_id=i, agent="A", stage="s", tokens=7, value=0.5))
    return bus


def open_request() -> Request:
    """A request whose client stays connected."""
    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "GET", "path": "/v1/events", "headers": []},
                   receive)


def test_readers_share_one_encoding_and_a_backlog_yields_between_batches() -> None:
    n = 20 * BATCH + 17
    bus, feed = filled_bus(n), None
    turns: list[int] = []  # events all readers had sent at each turn of the loop

    async def main() -> list[list[str]]:
        nonlocal feed
        feed = EventFeed(bus)
        sent = [0]
        done = asyncio.Event()

        async def read() -> list[str]:
            chunks = []
            async for chunk in event_stream(feed, threading.Event(), open_request(), None,
                                            0, n):
                chunks.append(chunk)
                sent[0] += chunk.count("\nevent: ")
            return chunks

        async def ticker() -> None:  # stands for /health: one step per turn of the loop
            while not done.is_set():
                turns.append(sent[0])
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        streams = await asyncio.gather(*(read() for _ in range(8)))
        done.set()
        await tick
        return streams

    streams = asyncio.run(main())
    assert feed is not None and feed.encoded == n  # once, not once per reader
    texts = ["".join(chunks[1:]) for chunks in streams]  # after the greeting
    assert len(set(texts)) == 1 and texts[0].count("\nevent: engine\n") == n
    ids = [int(line[4:]) for line in texts[0].splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, n + 1))
    for chunks in streams:
        assert max(c.count("\nevent: ") for c in chunks) <= BATCH
    # between two turns of the ticker each of the 8 readers sent one batch at most,
    # and the ticker turned all along (before: one reader sent its whole backlog)
    steps = [b - a for a, b in itertools.pairwise(turns)]
    assert max(steps) <= 8 * BATCH and len(turns) >= n // BATCH


def last_id(chunks: list[str]) -> int:
    """The id of the last event a reader received so far (0: none)."""
    text = "".join(chunks)
    at = text.rfind("\nid: ")
    return 0 if at < 0 else int(text[at + 5:text.index("\n", at + 1)])


async def _burst(url: str, calls: int) -> dict[str, Any]:
    """READERS event-stream readers, `calls` concurrent chat completions and a
    /health probe, all at once; what each saw."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def reader(out: list[str]) -> None:
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /v1/events?since=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        try:
            await r.readuntil(b"\r\n\r\n")
            while chunk := await r.read(1 << 16):
                out.append(chunk.decode())
        finally:
            w.close()

    async def call(i: int) -> int:
        r, w = await asyncio.open_connection(host, int(port))
        body = json.dumps({"model": "m", "max_tokens": 8, "messages": [
            {"role": "system", "content": f"You are agent {i % 4}. " * 40},
            {"role": "user", "content": f"call {i}"}]}).encode()
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                b"application/json\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)
        status = int((await r.readline()).split()[1])
        await r.read()
        w.close()
        return status

    async def health(stop: asyncio.Event, answers: list[int]) -> None:
        r, w = await asyncio.open_connection(host, int(port))
        while not stop.is_set():
            w.write(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await r.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await r.readexactly(length)
            answers.append(int(head.split()[1]))
        w.close()

    streams: list[list[str]] = [[] for _ in range(READERS)]
    tasks = [asyncio.create_task(reader(out)) for out in streams]
    stop, answers = asyncio.Event(), []
    probe = asyncio.create_task(health(stop, answers))
    statuses = await asyncio.gather(*(call(i) for i in range(calls)))
    during = len(answers)
    stop.set()
    await probe
    return {"statuses": statuses, "health_during": during, "health": answers,
            "streams": streams, "tasks": tasks}


def test_a_hundred_readers_and_a_burst_of_calls_leave_health_answering(
        tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        async def run() -> dict[str, Any]:
            seen = await _burst(d.url, CALLS)
            newest = (await asyncio.to_thread(d.state, 1))["event_id"]
            while any(last_id(s) < newest for s in seen["streams"]):
                await asyncio.sleep(0.05)  # the readers catch up with the last events
            for task in seen["tasks"]:
                task.cancel()
            await asyncio.gather(*seen["tasks"], return_exceptions=True)
            seen["newest"] = newest
            return seen

        seen = asyncio.run(run())
        assert seen["statuses"] == [200] * CALLS  # no call failed
        assert set(seen["health"]) == {200} and seen["health_during"] >= 1
        # every reader got every event, in order, none skipped (no lag)
        for stream in seen["streams"]:
            text = "".join(stream)
            ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
            assert ids[:seen["newest"]] == list(range(1, seen["newest"] + 1))
            assert "event: lag" not in text
        assert d.state()["counts"]["requests_finished"] == CALLS
        assert d.stop() == 0
