"""Where the console's data comes from: a live daemon over HTTP (httpx), or a
recorded run in a store file (through `store.queries`). Nothing else.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from console.snapshot import (
    DecisionDetail,
    DecisionRow,
    Numbers,
    Snapshot,
    TaskDetail,
    decision_from_store,
    detail_from_api,
    detail_from_store,
    numbers_from_headline,
    snapshot_from_replay,
    task_from_api,
)
from store import Store
from store import queries as q
from topasd.model import DECISION_REQUESTS, TopasError

STATE_LIMIT = 2000  # tasks (and requests per agent) asked of /v1/state


class ConsoleError(TopasError):
    """The console cannot start; the message says why and what to do."""


class ConnectionLost(Exception):
    """The daemon did not answer (refused, timed out, went away)."""


class ApiError(Exception):
    """The daemon answered with an error; `message` is its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------ live


@dataclass(frozen=True, slots=True)
class Target:
    """A daemon to watch: its URL, and the runtime file it was found through."""

    url: str
    runtime_file: str | None = None
    token: str | None = None


def check_url(url: str) -> str:
    """`url` without a trailing slash; ConsoleError unless it is http(s)://host[:port]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConsoleError(f"--url: expected http://HOST:PORT (e.g. http://127.0.0.1:8470), "
                           f"got {url!r}")
    return url.rstrip("/")


def find_daemon(url: str | None, runtime_file: str | None, token: str | None = None,
                config: str | None = None) -> Target:
    """The daemon to watch: `url`, else the one the runtime file names."""
    if url is not None:
        return Target(check_url(url), None, token)
    from topasd.daemon.runtime import RuntimeFile

    runtime = RuntimeFile.configured(runtime_file, config)
    info = runtime.read()
    if info is None:
        raise ConsoleError(f"no daemon running (no live runtime file at {runtime}); start one "
                           "with `topasd start`, or pass --url or --db FILE")
    return Target(check_url(str(info["url"])), str(runtime), token)


def rediscover(target: Target) -> Target:
    """The target again: a daemon restarted elsewhere is found through its runtime file."""
    if target.runtime_file is None:
        return target
    from topasd.daemon.runtime import RuntimeFile

    info = RuntimeFile(target.runtime_file).read()
    if info is None or "url" not in info:
        return target
    return Target(str(info["url"]).rstrip("/"), target.runtime_file, target.token)


class LiveClient:
    """The daemon's HTTP API, asynchronously (one httpx client)."""

    def __init__(self, target: Target, timeout: float = 5.0) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._http = httpx.AsyncClient(timeout=timeout, headers=headers)

    @property
    def url(self) -> str:
        return self.target.url

    def retarget(self) -> None:
        self.target = rediscover(self.target)

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = await self._http.request(method, self.url + path, **kw)
        except httpx.HTTPError as exc:
            raise ConnectionLost(_reason(exc)) from None
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text.strip()[:200] or r.reason_phrase
            raise ApiError(r.status_code, message)
        try:
            return r.json()
        except ValueError:
            raise ConnectionLost(f"{path} answered with non-JSON") from None

    async def state(self, limit: int = STATE_LIMIT, brief: bool = False) -> dict[str, Any]:
        """`/v1/state` (`brief`: what the panels draw, without the recent decisions)."""
        params: dict[str, Any] = {"limit": limit}
        if brief:
            params["brief"] = "true"
        return await self._call("GET", "/v1/state", params=params)

    async def params(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/params")

    async def patch_params(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("PATCH", "/v1/params", json=dict(changes))

    async def decision(self, seq: int, candidates: int = 50) -> DecisionDetail:
        data = await self._call("GET", f"/v1/decisions/{seq}",
                                params={"candidates": candidates})
        return detail_from_api(data)

    async def task(self, task_id: int) -> TaskDetail:
        return task_from_api(await self._call("GET", f"/v1/tasks/{task_id}"))

    async def events(self, since: int | None, kinds: str = "decision"
                     ) -> AsyncIterator[list[tuple[int | None, str, dict[str, Any]]]]:
        """Server-sent events as batches of (id, event, data): one batch per chunk
        the daemon sent, so a busy stream arrives in few, large batches."""
        params: dict[str, Any] = {"kinds": kinds}
        if since is not None:
            params["since"] = since
        timeout = httpx.Timeout(5.0, read=30.0)  # keep-alives come every 15 s
        try:
            async with self._http.stream("GET", self.url + "/v1/events", params=params,
                                         timeout=timeout) as r:
                if r.status_code != 200:
                    raise ConnectionLost(f"/v1/events answered {r.status_code}")
                buf = ""
                async for chunk in r.aiter_text():
                    buf += chunk
                    *blocks, buf = buf.split("\n\n")
                    batch = [ev for ev in map(_sse_event, blocks) if ev is not None]
                    if batch:
                        yield batch
        except httpx.HTTPError as exc:
            raise ConnectionLost(_reason(exc)) from None


def _sse_event(block: str) -> tuple[int | None, str, dict[str, Any]] | None:
    """One server-sent event block as (id, event, data); None for comments."""
    ident: int | None = None
    name, data = "message", ""
    for line in block.splitlines():
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            ident = int(value)
        elif field == "event":
            name = value
        elif field == "data":
            data += value
    if not data:
        return None
    return ident, name, json.loads(data)


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return text


# ----------------------------------------------------------------- replay


class ReplaySource:
    """A recorded run of a store file, read at any time through `store.queries`."""

    def __init__(self, path: str | Path, run_id: int | None = None) -> None:
        p = Path(path)
        if not p.is_file():
            raise ConsoleError(f"--db {p}: no such file (record one with `topasd start` or "
                               f"`topasd replay --db {p.name}`)")
        self.store = Store(p, create=False)
        self.path = p
        try:
            self.replay = q.RunReplay(self.store.db, run_id)
        except BaseException:
            self.store.close()
            raise
        self.run = self.replay.run
        self.t0, self.t1 = self.replay.span

    @property
    def label(self) -> str:
        return f"{self.path.name} · {self.run.label}"

    def close(self) -> None:
        self.store.close()

    def snapshot(self, t: float) -> Snapshot:
        policy, _ = q.params_at(self.store.db, self.run, t)
        return snapshot_from_replay(self.replay.state_at(t), policy, self.replay.groups_at(t))

    def series(self, t: float, points: int = 30) -> list[Numbers]:
        return [numbers_from_headline(h) for h in self.replay.headline_series(t, points)]

    def decisions(self, t: float, limit: int = 300, noop: bool = False,
                  keep: int | None = None) -> list[DecisionRow]:
        """The feed at `t` (no-ops only if `noop`), with decision `keep` (the
        cursor's, a no-op perhaps) always among them."""
        rows = [decision_from_store(r) for r in q.decisions_before(
            self.store.db, self.run.id, t, limit=limit, noop=noop)]
        if keep is not None and all(d.seq != keep for d in rows):
            rows.append(decision_from_store(q.decision_row(self.store.db, self.run.id, keep)))
            rows.sort(key=lambda d: d.seq)
        return rows

    def detail(self, seq: int) -> DecisionDetail:
        row = q.decision_row(self.store.db, self.run.id, seq)
        cands = q.candidates(self.store.db, self.run.id, seq)
        policy, _ = q.params_at(self.store.db, self.run, float(row["t"]), seq)
        ids = [rid for f in DECISION_REQUESTS.values() for rid in row.get(f) or ()]
        return detail_from_store(row, cands, policy, q.request_names(self.store.db,
                                                                     self.run.id, ids))

    def params(self, t: float) -> tuple[str, dict[str, Any]]:
        return q.params_at(self.store.db, self.run, t)

    def task(self, task_id: int, t: float) -> TaskDetail | None:
        """Task `task_id` as of `t` (None: it had not arrived)."""
        data = q.task_at(self.store.db, self.run.id, task_id, t)
        return None if data is None else task_from_api(data)

    def param_changes(self, t: float) -> list[dict[str, Any]]:
        """The changes up to `t` that changed a value (a policy switch also logs every
        parameter of the new policy, most of them as they were)."""
        return [c for c in q.param_changes(self.store.db, self.run.id)
                if c["t"] <= t and c["old"] != c["new"]]

    def step(self, seq: int | None, direction: int) -> tuple[int | None, float]:
        """The decision `direction` (+1/-1) steps from decision `seq` (None: before
        the first), and its time; clamped at both ends."""
        seqs, times = self.replay.decision_seqs, self.replay.decision_times
        if not seqs:
            return None, self.t0
        i = -1 if seq is None else bisect_left(seqs, seq)
        j = min(max(i + direction, 0), len(seqs) - 1)
        return seqs[j], times[j]

    def at(self, t: float) -> tuple[int | None, float]:
        """The cursor at time `t` (clamped to the run; NaN: its start): the last
        decision made by then."""
        t = self.t0 if math.isnan(t) else min(max(t, self.t0), self.t1)
        return self.replay.decision_at(t), t
