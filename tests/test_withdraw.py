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

import pytest

from backends.sim.engine import SimBackend
from store import Store
from store.queries import RunReplay
from tests.daemonkit import Daemon, service_counts_until
from topasd.model import Decision, EngineEvent, EventKind, Request
from topasd.profiles import get_profile


def _request(rid: int, agent: str = "A", output: int = 50) -> Request:
    return Request(id=rid, task_id=rid, workflow="w", stage="s", agent=agent, round=0,
                   input_tokens=20, output_tokens=output, ready_at=0.0, task_arrival=0.0,
                   prefix_tokens=100)


def test_the_simulator_withdraws_any_unfinished_request() -> None:
    """A waiting, a preempted and a running request each leave the engine with
    a REQUEST_WITHDRAW naming why (the running one frees its KV and reports
    what it had generated); a finished or unknown one is refused (False), and
    the others run on."""
    sim = SimBackend(get_profile("small"))
    for rid in (1, 2, 3):
        sim.submit(_request(rid))
    events: list[Any] = []

    def pump(until: float | None, admit: tuple[int, ...] = ()) -> None:
        for ev in sim.run_until(until):
            if ev.kind is EventKind.SCHEDULE:
                view = sim.view({}, {})
                chosen = tuple(r for r in admit if r in {w.id for w in view.waiting})
                sim.apply(Decision(sim.t, "script", admit=chosen,
                                   load=("A",) if not view.prefixes["A"].on_gpu else ()))
            else:
                events.append(ev)

    pump(0.0, admit=(1,))
    sim.submit(_request(4))
    pump(sim.t, admit=(4,))
    sim.apply(Decision(sim.t, "script", preempt=(4,)))  # back to waiting
    assert sim.withdraw(4, "preempted, then gone") and sim.withdraw(2, "client gone")
    assert not sim.withdraw(2, "twice") and not sim.withdraw(99, "unknown")
    pump(sim.t + 0.2)  # 1 decodes a while
    used = sim._used_tokens()
    generated = sim._running[1].generated
    assert generated > 0 and sim.withdraw(1, "gone mid-answer")
    assert sim._used_tokens() == used - (20 + generated) and not sim._running
    assert [r.id for r in sim.view({}, {}).waiting] == [3]
    pump(None, admit=(3,))
    gone = {ev.request_id: (ev.note, ev.tokens) for ev in events
            if ev.kind is EventKind.REQUEST_WITHDRAW}
    assert gone == {4: ("preempted, then gone", 0), 2: ("client gone", 0),
                    1: ("gone mid-answer", generated)}
    finished = sorted(ev.request_id for ev in events if ev.kind is EventKind.REQUEST_FINISH)
    assert finished == [3] and sim.stats.withdrawn == 3
    assert not any(ev.request_id == 2 for ev in events if ev.kind is EventKind.REQUEST_ADMIT)
    assert not sim.withdraw(3, "finished")


BUDGET = "5010"  # chain3's 4,000-token prefix A, a 600-token call and a 20-token one


def _post_raw(url: str, body: dict[str, Any]) -> socket.socket:
    """POST `body` on a socket of our own and leave it open (the reply is never read)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def _call(task: str, max_tokens: int, **meta: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": task, "workflow": "chain3", "stage": "a", **meta}}


def test_a_withdrawal_ends_a_task_that_waited_only_for_it_and_frees_its_round(
        tmp_path: Path) -> None:
    """Task k's round 0 waits while its round 1 (`last_in_task`) fits and
    finishes: withdrawing round 0 ends the task then. Task m's round 0 waits
    while round 1 runs: after the withdrawal a retry takes round 0, the next
    call round 2."""
    with Daemon(tmp_path, "--budget", BUDGET, speed="20") as d:
        def post(body: dict[str, Any]) -> dict[str, Any]:
            r = d.http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["topasd"]

        def wait_then_leave(body: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
            """`body` waits (the 600-token filler runs), `then` finishes, `body`'s
            client leaves; returns `then`'s reply."""
            filler = threading.Thread(target=lambda: post(_call(f"f{time.time()}", 600,
                                                                  last_in_task=True)))
            filler.start()
            d.wait_for(lambda s: s["counts"]["requests_running"] >= 1)
            before = d.state()["counts"]["requests_withdrawn"]
            sock = _post_raw(d.url, body)
            d.wait_for(lambda s: s["counts"]["requests_waiting"] == 1)
            reply = post(then)
            sock.close()
            d.wait_for(lambda s: s["counts"]["requests_withdrawn"] == before + 1)
            filler.join(60)
            return reply

        last = wait_then_leave(_call("k", 1000, last_in_stage=False),
                               _call("k", 20, last_in_task=True))
        assert last["round"] == 1 and not last["task_done"]  # round 0 still waited
        task = d.http.get(f"/v1/tasks/{last['task_id']}").json()
        assert task["status"] == "done", task
        filler_done = d.wait_for(lambda s: s["counts"]["tasks_finished"] == 2)
        assert filler_done["counts"]["tasks_in_flight"] == 0

        mid = wait_then_leave(_call("m", 1000, last_in_stage=False),
                              _call("m", 20, last_in_stage=False))
        assert mid["round"] == 1
        assert post(_call("m", 20, last_in_stage=False))["round"] == 0  # the freed round
        assert post(_call("m", 20))["round"] == 2
        assert d.stop() == 0
    store = Store(tmp_path / "topasd.db", create=False)
    try:
        rows = store.db.execute("SELECT request_id, withdrawn, admitted, finished, input_tokens, "
                                "output_tokens FROM requests WHERE withdrawn IS NOT NULL"
                                ).fetchall()
        assert len(rows) == 2 and all(r[2] is None and r[3] is None for r in rows)
        assert all(r[4] > 0 for r in rows), "a never-admitted request keeps its input size"
        assert all(r[5] == 0 for r in rows), "it generated nothing (not NULL: unknown)"
        ended = store.db.execute("SELECT count(*) FROM engine_events WHERE kind = "
                                 "'task_finish' AND task_id = ?", [last["task_id"]]).fetchone()
        assert ended[0] == 1
        # two fillers and task k finished; m (stage a of three) was left open
        summary = json.loads(store.db.execute("SELECT summary FROM runs").fetchone()[0])
        assert (summary["tasks"], summary["tasks_unfinished"]) == (3, 1)
    finally:
        store.close()


def test_a_client_that_disconnects_takes_its_waiting_call_back(tmp_path: Path) -> None:
    """Stage a of chain3 has a 4,000-token prefix; with a 5,010-token budget a
    600-token call runs and a 1,000-token one waits (it fits alone, never beside
    the first, whatever the engine's decode reservation). Its client closes the socket:
    the daemon withdraws it (counts, event, store), the first call still gets
    its reply, and the second task's call sent again runs, in the same round."""
    with Daemon(tmp_path, "--budget", BUDGET, speed="20") as d:
        first: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: first.update(
            r=d.http.post("/v1/chat/completions", json=_call("x", 600))))
        runner.start()
        d.wait_for(lambda s: s["counts"]["requests_running"] == 1)
        sock = _post_raw(d.url, _call("y", 1000))
        st = d.wait_for(lambda s: s["counts"]["requests_waiting"] == 1)
        assert st["counts"]["requests_withdrawn"] == 0
        sock.close()
        st = d.wait_for(lambda s: s["counts"]["requests_withdrawn"] == 1)
        assert st["counts"]["requests_waiting"] == 0 and st["counts"]["requests_running"] == 1
        runner.join(60)
        assert first["r"].status_code == 200, first["r"].text
        again = d.http.post("/v1/chat/completions", json=_call("y", 1000))
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
        # its task only ever reached stage a, yet the replay knows chain3 has three
        assert [(tk.stages_done, tk.stages_total) for tk in after.tasks
                if tk.task_id == task_id] == [(0, 3)]
        # the retry is a new request of the same task, and it finished
        retry = store.db.execute(
            "SELECT request_id FROM engine_events WHERE kind = 'request_finish' AND "
            "task_id = ? AND request_id != ?", [task_id, rid]).fetchall()
        assert len(retry) == 1
    finally:
        store.close()


def test_a_running_call_whose_client_leaves_frees_its_kv(tmp_path: Path) -> None:
    """On the simulator a running call is taken back too: its KV is freed at
    once, the store ends its admission episode with the withdrawal (the Gantt
    bar's end), and the task can send the call again."""
    with Daemon(tmp_path, "--budget", BUDGET, speed="20") as d:
        sock = _post_raw(d.url, _call("r", 600))
        d.wait_for(lambda s: s["counts"]["requests_running"] == 1
                   and s["budget"]["requests"] > 0)
        sock.close()
        st = d.wait_for(lambda s: s["counts"]["requests_withdrawn"] == 1)
        assert st["counts"]["requests_running"] == 0 and st["budget"]["requests"] == 0
        again = d.http.post("/v1/chat/completions", json=_call("r", 20))
        assert again.status_code == 200 and again.json()["topasd"]["round"] == 0, again.text
        assert d.stop() == 0
    store = Store(tmp_path / "topasd.db", create=False)
    try:
        from store.queries import request_segments

        row = store.db.execute("SELECT request_id, admitted, withdrawn, finished FROM requests "
                               "ORDER BY request_id").fetchall()
        assert row[0][1] is not None and row[0][2] >= row[0][1] and row[0][3] is None
        assert row[1][3] is not None  # the retry finished
        run_id = store.db.execute("SELECT id FROM runs").fetchone()[0]
        ends = {s.request_id: s.end_kind for s in request_segments(store.db, run_id)}
        assert ends == {row[0][0]: "withdraw", row[1][0]: "finish"}
    finally:
        store.close()


class AbortingEngine:
    """Stands in for sglang.Engine: `async_generate` waits until finished or
    aborted; an abort of a waiting request makes it raise, as SGLang's
    tokenizer manager does for a non-streamed call (ValueError). The abort
    reaches SGLang's scheduler, which aborts every request whose rid starts
    with the given one (`Scheduler.abort_request`: `req.rid.startswith`); those
    return normally, with finish_reason "abort"."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.tokenizer_manager = self
        self.rid_to_state: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.register_after_s = 0.0

    async def async_generate(self, **kwargs: Any) -> dict[str, Any]:
        await asyncio.sleep(self.register_after_s)  # tokenizing: not registered yet
        fut = asyncio.get_running_loop().create_future()
        self.rid_to_state[kwargs["rid"]] = fut
        return await fut

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)
        fut = self.rid_to_state.pop(rid, None)
        if fut is None:  # SGLang ignores an abort of a request it does not hold
            return
        fut.set_exception(ValueError(f"Abort request {rid}"))
        self.scheduler_abort(rid)

    def scheduler_abort(self, rid: str) -> None:
        """What SGLang's scheduler does with an abort: every held rid that
        starts with `rid` returns, its finish_reason "abort"."""
        for other in [o for o in self.rid_to_state if o.startswith(rid)]:
            reason = {"type": "abort", "message": f"Abort request {rid}"}
            fut = self.rid_to_state.pop(other)
            fut.get_loop().call_soon_threadsafe(fut.set_result, {
                "text": "", "meta_info": {"completion_tokens": 0, "finish_reason": reason}})

    def finish(self, loop: asyncio.AbstractEventLoop, rid: str, tokens: int) -> None:
        fut = self.rid_to_state.pop(rid)
        reply = {"text": "", "meta_info": {"completion_tokens": tokens}}
        loop.call_soon_threadsafe(fut.set_result, reply)

    def shutdown(self) -> None:
        return None


def test_the_sglang_backend_aborts_a_waiting_request_in_sglang() -> None:
    from backends.sglang import SGLangOptions
    from backends.sglang.backend import SGLangBackend

    engine = AbortingEngine()
    engine.register_after_s = 0.3  # the withdrawal comes before SGLang holds the request
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"),
                            endpoint=f"ipc:///tmp/topasd-withdraw-{os.getpid()}.sock",
                            engine_factory=lambda o: engine,
                            require_plugin=False)  # a stand-in: no scheduler
    try:
        backend.submit(_request(1, output=4))
        backend.submit(_request(2, output=4))
        backend.submit(_request(3, output=4))
        events = list(backend.run_until(backend.t + 0.01))
        assert backend.withdraw(2, "client gone")
        assert not backend.withdraw(2, "twice") and not backend.withdraw(7, "unknown")
        backend._scheduler_events([EngineEvent(backend.t, EventKind.REQUEST_ADMIT, 3, 3, "A",
                                               "s")])
        assert backend.withdraw(3, "gone while running")  # SGLang aborts it in its batch
        deadline = time.monotonic() + 10
        while not any(e.kind is EventKind.REQUEST_WITHDRAW for e in events):
            assert time.monotonic() < deadline, "no REQUEST_WITHDRAW"
            events += backend.run_until(backend.t + 0.05)
        while sum(e.kind is EventKind.REQUEST_WITHDRAW for e in events) < 2:
            assert time.monotonic() < deadline, "no REQUEST_WITHDRAW of 3"
            events += backend.run_until(backend.t + 0.05)
        assert sorted(engine.aborted) == ["topasd-2.", "topasd-3."]
        engine.finish(backend._loop, "topasd-1.", 4)
        while not any(e.kind is EventKind.REQUEST_FINISH for e in events):
            assert time.monotonic() < deadline, "no REQUEST_FINISH"
            events += backend.run_until(backend.t + 0.05)
        assert backend.idle()
    finally:
        backend.close()
    kinds = [(e.kind, e.request_id) for e in events if e.request_id is not None]
    assert (EventKind.REQUEST_WITHDRAW, 2) in kinds and (EventKind.REQUEST_FINISH, 1) in kinds
    assert (EventKind.REQUEST_WITHDRAW, 3) in kinds
    assert not {(EventKind.REQUEST_FINISH, 2), (EventKind.REQUEST_FINISH, 3)} & set(kinds)
    gone = {e.request_id: e for e in events if e.kind is EventKind.REQUEST_WITHDRAW}
    assert (gone[2].note, gone[2].stage) == ("client gone", "s")  # in either order: 2's
    assert gone[3].note == "gone while running"  # abort waits until SGLang holds it


def test_a_call_that_reached_no_engine_needs_no_withdrawal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves while its call still waits for the engine loop (not
    started here) cancels the call: no withdrawal is sent, the reply is a
    Withdrawn, and the loop, once it runs, skips the call: no task, no request."""
    from topasd.api import openai
    from topasd.config import load_settings
    from topasd.daemon.errors import Withdrawn
    from topasd.daemon.service import Service

    settings = load_settings({"budget": int(BUDGET), "speed": 20.0,
                              "db": str(tmp_path / "s.db")}, environ={}).settings

    class Gone:
        """An ASGI request whose client has closed the connection."""

        async def receive(self) -> dict[str, str]:
            return {"type": "http.disconnect"}

    svc = Service(settings)
    try:
        fut = svc.submit_call(_spec("z", 8))
        asked: list[str] = []
        monkeypatch.setattr(svc, "withdraw_call", lambda f, why: asked.append(why))
        with pytest.raises(Withdrawn, match="disconnected before the reply"):
            asyncio.run(openai.call(svc, fut, Gone()))  # type: ignore[arg-type]
        assert fut.cancelled() and asked == []
        svc.start()
        counts = svc.state(1).result(30)["counts"]  # runs after the cancelled call
        assert (counts["tasks_arrived"], counts["requests_running"],
                counts["requests_waiting"], counts["requests_withdrawn"]) == (0, 0, 0, 0)
        assert svc.submit_call(_spec("z", 8)).result(60).round == 0  # "z" was never opened
    finally:
        svc.close()  # stops the loop first (no grace)


def test_the_console_status_line_counts_withdrawn_calls() -> None:
    """The live status line reads `counts.requests_withdrawn` from /v1/state
    and shows it once a call was withdrawn (not before)."""
    from textual.app import App, ComposeResult

    from console.snapshot import snapshot_from_state
    from console.widgets.status import StatusLine

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield StatusLine(id="status")

    def state(withdrawn: int) -> dict[str, Any]:
        return {"t": 5.0, "policy": "topas", "budget": {"tokens": 100}, "tasks": [],
                "counts": {"requests_waiting": 1, "requests_withdrawn": withdrawn}}

    async def run() -> list[str]:
        shown = []
        async with One().run_test(size=(160, 5)) as pilot:
            line = pilot.app.query_one(StatusLine)
            line.connected = True
            for n in (0, 2):
                line.set_snapshot(snapshot_from_state(state(n)))
                await pilot.pause()
                shown.append(str(line.render()))
        return shown

    before, after = asyncio.run(run())
    assert "1 waiting" in before and "withdrawn" not in before
    assert after.endswith("1 waiting · 0 decisions · 2 withdrawn"), after


def _spec(task: str | None, output: int, **meta: Any) -> Any:
    from topasd.daemon.calls import CallSpec

    where = {} if task is None else {"task_key": task, "workflow": "chain3", "stage": "a"}
    return CallSpec(system_tokens=0, system_key="", input_tokens=1, output_tokens=output,
                    **where, **meta)


def _service(tmp_path: Path, **flags: Any) -> Any:
    from topasd.config import load_settings
    from topasd.daemon.service import Service

    settings = load_settings({"budget": int(BUDGET), "speed": 20.0,
                              "db": str(tmp_path / "s.db"), **flags}, environ={}).settings
    svc = Service(settings)
    svc.start()
    return svc


_until = service_counts_until


def test_a_retry_queued_right_behind_the_withdrawal_takes_its_round(tmp_path: Path) -> None:
    """The withdrawal and the retry reach the engine loop together: the
    withdrawal's event is handled before the retry, which takes round 0."""
    svc = _service(tmp_path)
    try:
        filler = svc.submit_call(_spec("f", 600, last_in_task=True))
        _until(svc, lambda c: c["requests_running"] == 1)
        waiting = svc.submit_call(_spec("k", 1000, last_in_stage=False))
        _until(svc, lambda c: c["requests_waiting"] == 1)
        taken = svc.withdraw_call(waiting, "its client disconnected")
        retry = svc.submit_call(_spec("k", 20, last_in_stage=False))
        assert taken.result(10) is True
        assert retry.result(60).round == 0
        assert filler.result(60).task_done
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()


def test_a_plain_calls_task_is_abandoned_when_its_call_is_withdrawn(tmp_path: Path) -> None:
    """A call without a task_id is a task of one call that no retry can reach:
    withdrawing the call abandons the task at once (the task timeout only sees
    tasks with an id, so nothing else would end it)."""
    svc = _service(tmp_path)
    try:
        filler = svc.submit_call(_spec("f", 600, last_in_task=True))
        _until(svc, lambda c: c["requests_running"] == 1)
        plain = svc.submit_call(_spec(None, 1000, agent="solo"))
        _until(svc, lambda c: c["requests_waiting"] == 1)
        assert svc.withdraw_call(plain, "its client disconnected").result(10)
        counts = _until(svc, lambda c: c["tasks_abandoned"] == 1)
        assert counts["tasks_in_flight"] == 1  # the filler's alone
        assert filler.result(60).task_done
        assert _until(svc, lambda c: c["tasks_in_flight"] == 0)
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()
    store = Store(tmp_path / "s.db", create=False)
    try:
        why = store.db.execute("SELECT note FROM engine_events WHERE kind = 'task_abandon'"
                               ).fetchone()[0]
        assert why == "its only call was withdrawn (its client disconnected)"
    finally:
        store.close()


@pytest.mark.parametrize("policy", ["fcfs", "topas"])
def test_withdrawing_the_running_call_lets_the_blocked_one_in(tmp_path: Path,
                                                               policy: str) -> None:
    """A 900-token call runs; a second one cannot fit beside it (a baseline
    marks the batch full and waits for room). The first call's client leaves:
    its room comes back and the second call runs (under FCFS the daemon used
    to wait for good: nothing was left to finish and clear the full batch)."""
    svc = _service(tmp_path, policy=policy)
    try:
        first = svc.submit_call(_spec("a", 900))
        _until(svc, lambda c: c["requests_running"] == 1)
        second = svc.submit_call(_spec("b", 900))
        _until(svc, lambda c: c["requests_waiting"] == 1)
        assert svc.withdraw_call(first, "its client disconnected").result(10)
        assert second.result(60).completion_tokens == 900
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()


def test_withdrawing_a_request_aborts_no_other_in_sglang() -> None:
    """SGLang's scheduler aborts every rid that starts with the aborted rid:
    withdrawing request 1 must leave requests 10 and 11 running. A request
    SGLang aborts without a withdrawal finishes with an error note, never as
    a normal finish."""
    from backends.sglang import SGLangOptions
    from backends.sglang.backend import SGLangBackend

    engine = AbortingEngine()
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"),
                            endpoint=f"ipc:///tmp/topasd-withdraw-pfx-{os.getpid()}.sock",
                            engine_factory=lambda o: engine,
                            require_plugin=False)  # a stand-in: no scheduler
    events: list[EngineEvent] = []
    try:
        for rid in (1, 10, 11):
            backend.submit(_request(rid, output=4))
        deadline = time.monotonic() + 10
        while len(engine.rid_to_state) < 3:
            assert time.monotonic() < deadline, "SGLang never held the requests"
            events += backend.run_until(backend.t + 0.02)
        assert backend.withdraw(1, "client gone")
        while not any(e.kind is EventKind.REQUEST_WITHDRAW for e in events):
            assert time.monotonic() < deadline, "no REQUEST_WITHDRAW"
            events += backend.run_until(backend.t + 0.05)
        assert sorted(engine.rid_to_state) == ["topasd-10.", "topasd-11."]
        engine.scheduler_abort("topasd-10.")  # SGLang aborts it on its own (not withdrawn)
        engine.finish(backend._loop, "topasd-11.", 4)
        while not backend.idle():
            assert time.monotonic() < deadline, "requests 10 and 11 never ended"
            events += backend.run_until(backend.t + 0.05)
    finally:
        backend.close()
    ends = {e.request_id: e for e in events
            if e.kind in (EventKind.REQUEST_WITHDRAW, EventKind.REQUEST_FINISH)}
    assert ends[1].kind is EventKind.REQUEST_WITHDRAW
    assert ends[11].kind is EventKind.REQUEST_FINISH and ends[11].note == ""
    assert ends[10].kind is EventKind.REQUEST_FINISH
    assert ends[10].note == "error: SGLang aborted it: Abort request topasd-10."
