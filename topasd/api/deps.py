"""What the routers share: the service, how to wait for its engine loop, and
the `/v1/state` cache."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from topasd.api.sse import EventFeed
from topasd.daemon import state
from topasd.daemon.errors import Unavailable
from topasd.daemon.service import Service

QUERY_TIMEOUT_S = 10.0  # state, params and task queries wait this long for the loop
STATE_MAX_AGE_S = 0.2  # /v1/state serves one engine-loop snapshot this long (wall s)


async def wait(fut: Future[Any], timeout: float | None = QUERY_TIMEOUT_S) -> Any:
    """Await a Service future (a timeout is a 503: the loop did not answer)."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
    except TimeoutError:
        raise Unavailable("the engine loop did not answer in time; retry") from None


class StateCache:
    """/v1/state for any number of pollers: at most one engine-loop snapshot (and
    one JSON encoding) per `limit` and `brief` every STATE_MAX_AGE_S, so reads take little of
    the loop's time from the scheduler. A change through the API starts afresh."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.lock = asyncio.Lock()
        self.kept: dict[tuple[int, bool], tuple[float, bytes]] = {}

    def invalidate(self) -> None:
        self.kept.clear()

    async def get(self, limit: int, brief: bool = False) -> bytes:
        """The state's JSON (`brief`: `state.brief` of it)."""
        async with self.lock:  # concurrent pollers wait for one snapshot
            hit = self.kept.get((limit, brief))
            if hit is not None and time.monotonic() - hit[0] < STATE_MAX_AGE_S:
                return hit[1]
            full = await wait(self.service.state(limit))
            # plain JSON types already: skip FastAPI's encoder (7x the cost of json.dumps on
            # a state of hundreds of tasks); the encoding of Starlette's JSONResponse
            body = json.dumps(state.brief(full) if brief else full, ensure_ascii=False,
                              allow_nan=False, indent=None, separators=(",", ":")
                              ).encode("utf-8")
            if len(self.kept) >= 8:
                self.kept.clear()
            self.kept[(limit, brief)] = (time.monotonic(), body)
            return body


@dataclass(frozen=True)
class Reads:
    """How the guarded reads (`/v1/...` GETs, `/metrics`) are declared."""

    guarded: list[Any]  # their dependencies (the bearer check off loopback), or none
    errors: tuple[int, ...]  # the auth statuses they may answer (401, 403), or none


@dataclass(frozen=True)
class Context:
    """One app's routers' common ground."""

    service: Service
    states: StateCache
    guarded: list[Any]  # dependencies of the mutating endpoints (the bearer check)
    mutating: tuple[int, ...]  # the error statuses a mutating endpoint may answer
    reads: Reads
    events: EventFeed  # what the /v1/events readers share
