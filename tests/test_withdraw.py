"""A call whose client goes away before it runs is taken back: the backends'
`withdraw`, the daemon over real HTTP (a socket closed mid-wait), the store
and its replay, and the SGLang backend against a stand-in Engine that aborts
as SGLang's tokenizer manager does."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from backends.sim.engine import SimBackend
from store import Store
from store.queries import RunReplay
from tests.daemonkit import Daemon
from topasd.model import Decision, EventKind, Request
from topasd.profiles import get_profile


def _request(rid: int, agent: str = "A", output: int = 50) -> Request:
    return Request(id=rid, task_id=rid, workflow="w", stage="s", agent=agent, round=0,
                   input_tokens=20, output_tokens=output, ready_at=0.0, task_arrival=0.0,
                   prefix_tokens=100)


def test_the_simulator_withdraws_only_waiting_requests() -> None:
    """A waiting request leaves the queue with a REQUEST_WITHDRAW naming why and
    is never admitted; a running, finished or unknown one is refused (False)
    and the run goes on; withdrawing one that held the queue lets the next in."""
    sim = SimBackend(get_profile("small"))
    for rid in (1, 2, 3):
        sim.submit(_request(rid))
    events: list[Any] = []

    def pump(until: float | None, admit: tuple[int, ...] = ()) -> None:
        for ev in sim.run_until(until):
            if ev.kind is EventKind.SCHEDULE:
                waiting = [r.id for r in sim.view({}, {}).waiting]
                chosen = tuple(r for r in admit if r in waiting)
                sim.apply(Decision(sim.t, "script", admit=chosen,
                                   load=("A",) if not sim.view({}, {}).prefixes["A"].on_gpu
                                   else ()))
            else:
                events.append(ev)

    pump(0.0, admit=(1,))
    assert sim.withdraw(2, "client gone")
    assert not sim.withdraw(2, "twice") and not sim.withdraw(1, "running")
    assert not sim.withdraw(99, "unknown")
    assert [r.id for r in sim.view({}, {}).waiting] == [3]
    pump(None, admit=(3,))
    gone = [ev for ev in events if ev.kind is EventKind.REQUEST_WITHDRAW]
    assert [(ev.request_id, ev.note, ev.agent) for ev in gone] == [(2, "client gone", "A")]
    finished = sorted(ev.request_id for ev in events if ev.kind is EventKind.REQUEST_FINISH)
    assert finished == [1, 3]
    assert not any(ev.request_id == 2 for ev in events if ev.kind is EventKind.REQUEST_ADMIT)
    assert not sim.withdraw(3, "finished")


def _post_raw(url: str, body: dict[str, Any]) -> socket.socket:
    """POST `body` on a socket of our own and leave it open (the reply is never read)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def _call(task: str, max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": task, "workflow": "chain3", "stage": "a"}}


def test_a_client_that_disconnects_takes_its_waiting_call_back(tmp_path: Path) -> None:
    """Stage a of chain3 has a 4,000-token prefix; with a 5,000-token budget a
    600-token call runs and a second one waits. Its client closes the socket:
    the daemon withdraws it (counts, event, store), the first call still gets
    its reply, and the second task's call sent again runs, in the same round."""
    with Daemon(tmp_path, "--budget", "5000", speed="20") as d:
        first: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: first.update(
            r=d.http.post("/v1/chat/completions", json=_call("x", 600))))
        runner.start()
        d.wait_for(lambda s: s["counts"]["requests_running"] == 1)
        sock = _post_raw(d.url, _call("y", 600))
        st = d.wait_for(lambda s: s["counts"]["requests_waiting"] == 1)
        assert st["counts"]["requests_withdrawn"] == 0
        sock.close()
        st = d.wait_for(lambda s: s["counts"]["requests_withdrawn"] == 1)
        assert st["counts"]["requests_waiting"] == 0 and st["counts"]["requests_running"] == 1
        runner.join(60)
        assert first["r"].status_code == 200, first["r"].text
        again = d.http.post("/v1/chat/completions", json=_call("y", 600))
        assert again.status_code == 200, again.text
        meta = again.json()["topasd"]
        assert meta["round"] == 0 and meta["stage"] == "a"
        metrics = d.http.get("/metrics").text
        assert "topasd_requests_withdrawn_total 1.0" in metrics
        assert d.stop() == 0
    store = Store(tmp_path / "topasd.db", create=False)
    try:
        rows = store.db.execute(
            "SELECT t, request_id, task_id, note FROM engine_events "
            "WHERE kind = 'request_withdraw'").fetchall()
        assert len(rows) == 1 and rows[0][3] == "its client disconnected"
        t_gone, rid, task_id = rows[0][:3]
        admitted = store.db.execute(
            "SELECT count(*) FROM engine_events WHERE kind = 'request_admit' AND request_id = ?",
            [rid]).fetchone()[0]
        assert admitted == 0
        replay = RunReplay(store.db)
        before = replay.state_at(t_gone - 1e-9)
        after = replay.state_at(t_gone)
        assert rid in {r.request_id for r in before.waiting}
        assert rid not in {r.request_id for r in after.waiting + after.running}
        # the retry was a new request of the same task, and it finished
        retry = store.db.execute(
            "SELECT request_id FROM engine_events WHERE kind = 'request_finish' AND "
            "task_id = ? AND request_id != ?", [task_id, rid]).fetchall()
        assert len(retry) == 1
    finally:
        store.close()


class AbortingEngine:
    """Stands in for sglang.Engine: `async_generate` waits until finished or
    aborted; an abort of a waiting request makes it raise, as SGLang's
    tokenizer manager does for a non-streamed call (ValueError)."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.tokenizer_manager = self
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def async_generate(self, **kwargs: Any) -> dict[str, Any]:
        fut = asyncio.get_running_loop().create_future()
        self._pending[kwargs["rid"]] = fut
        return await fut

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)
        fut = self._pending.pop(rid)
        fut.set_exception(ValueError(f"Abort request {rid}"))

    def finish(self, loop: asyncio.AbstractEventLoop, rid: str, tokens: int) -> None:
        fut = self._pending.pop(rid)
        reply = {"text": "", "meta_info": {"completion_tokens": tokens}}
        loop.call_soon_threadsafe(fut.set_result, reply)

    def shutdown(self) -> None:
        return None


def test_the_sglang_backend_aborts_a_waiting_request_in_sglang() -> None:
    from backends.sglang import SGLangOptions
    from backends.sglang.backend import SGLangBackend

    engine = AbortingEngine()
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"),
                            endpoint=f"ipc:///tmp/topasd-withdraw-{os.getpid()}.sock",
                            engine_factory=lambda o: engine)
    try:
        backend.submit(_request(1, output=4))
        backend.submit(_request(2, output=4))
        events = list(backend.run_until(backend.t + 0.1))
        assert backend.withdraw(2, "client gone")
        assert not backend.withdraw(2, "twice") and not backend.withdraw(7, "unknown")
        deadline = time.monotonic() + 10
        while not any(e.kind is EventKind.REQUEST_WITHDRAW for e in events):
            assert time.monotonic() < deadline, "no REQUEST_WITHDRAW"
            events += backend.run_until(backend.t + 0.05)
        assert engine.aborted == ["topasd-2"]
        engine.finish(backend._loop, "topasd-1", 4)
        while not any(e.kind is EventKind.REQUEST_FINISH for e in events):
            assert time.monotonic() < deadline, "no REQUEST_FINISH"
            events += backend.run_until(backend.t + 0.05)
        assert backend.idle()
    finally:
        backend.close()
    kinds = [(e.kind, e.request_id) for e in events if e.request_id is not None]
    assert (EventKind.REQUEST_WITHDRAW, 2) in kinds and (EventKind.REQUEST_FINISH, 1) in kinds
    assert (EventKind.REQUEST_FINISH, 2) not in kinds
    gone = next(e for e in events if e.kind is EventKind.REQUEST_WITHDRAW)
    assert gone.note == "client gone" and gone.stage == "s"


def test_a_call_that_reached_no_engine_needs_no_withdrawal(tmp_path: Path) -> None:
    """Sanity of the HTTP path: a client that stays gets its reply (the
    disconnect watch does not end a call early)."""
    with Daemon(tmp_path) as d:
        r = httpx.post(f"{d.url}/v1/chat/completions", json=_call("z", 8), timeout=60)
        assert r.status_code == 200 and r.json()["topasd"]["task_done"] is False
        assert d.state()["counts"]["requests_withdrawn"] == 0
