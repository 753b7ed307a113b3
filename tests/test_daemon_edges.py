"""Edges a mutation audit found untested: draining (refusals while it lasts, the
grace deadline, a second stop), the store's replay queries at their time
boundaries, and the vLLM backend's context and KV-size helpers."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from backends.vllm import read_model_config, write_tiny_model
from backends.vllm.sizing import context_fix, context_tokens, cpu_profile, kv_bytes_per_token
from store import Store
from store import queries as q
from tests.daemonkit import Daemon, service_counts_until
from topasd.config import load_settings
from topasd.daemon.calls import CallSpec
from topasd.daemon.errors import Unavailable
from topasd.daemon.service import Service
from topasd.model import Decision, EngineEvent, EventKind
from topasd.runner import RunInfo

# ------------------------------------------------------------------ draining

# At speed 20 a decode step of the default profile takes ~45 engine ms: an
# 8,000-token reply needs ~18 wall seconds, far beyond every grace used here
# (the paced engine never runs ahead of the wall clock), while an 8-token one
# takes a few wall milliseconds.
LONG = 8000
NOT_ADMITTING = "the daemon is shutting down: not admitting new tasks"
CUT = "the daemon shut down before this request finished"


def _service(tmp_path: Path) -> Service:
    """A paced in-process service whose own grace (600 s) no test waits for."""
    settings = load_settings({"speed": 20.0, "grace": 600.0, "db": str(tmp_path / "s.db")},
                             environ={}).settings
    svc = Service(settings)
    svc.start()
    return svc


def _call(task: str | None, output: int, *, last_in_stage: bool = True) -> CallSpec:
    """A call of the synthesized one-stage agent "solo" (no prefix)."""
    return CallSpec(system_tokens=0, system_key="", input_tokens=1, output_tokens=output,
                    task_key=task, agent="solo", last_in_stage=last_in_stage)


_until = service_counts_until


def _shutdown(svc: Service) -> None:
    svc.drain(0.0)
    svc.wait_stopped(30)
    svc.close()


def test_draining_refuses_new_tasks_and_calls_and_a_second_drain_cuts_running_work(
        tmp_path: Path) -> None:
    """While draining, POST /v1/tasks and calls that would open a task are refused
    (Unavailable, saying why) and open no task; a drain with no grace left (a
    second stop) ends the loop at once, failing the call still running."""
    svc = _service(tmp_path)
    try:
        long = svc.submit_call(_call("job", LONG, last_in_stage=False))
        _until(svc, lambda c: c["requests_running"] == 1)
        svc.drain(3600.0)
        assert svc.draining and not svc.ready
        with pytest.raises(Unavailable, match=NOT_ADMITTING):
            svc.submit_task("chain3", {}).result(10)
        with pytest.raises(Unavailable, match=NOT_ADMITTING):
            svc.submit_call(_call("other", 8)).result(10)  # a new client task id
        with pytest.raises(Unavailable, match=NOT_ADMITTING):
            svc.submit_call(_call(None, 8)).result(10)  # a plain call: a new task too
        state = svc.state(5).result(10)
        assert state["draining"] is True
        assert state["counts"]["tasks_arrived"] == 1 and state["counts"]["requests_running"] == 1
        svc.drain(0.0)
        assert svc.wait_stopped(60)
        with pytest.raises(Unavailable, match=CUT):
            long.result(0)
    finally:
        _shutdown(svc)


def test_the_grace_lets_running_tasks_continue_and_its_deadline_cuts_the_rest(
        tmp_path: Path) -> None:
    """During the grace an open task's next call is still served; once the
    deadline passes, the loop stops although a call still runs: the call fails,
    and the store keeps its request and task unfinished."""
    svc = _service(tmp_path)
    try:
        long = svc.submit_call(_call("job", LONG, last_in_stage=False))
        _until(svc, lambda c: c["requests_running"] == 1)
        svc.drain(3.0)
        more = svc.submit_call(_call("job", 8, last_in_stage=False))  # continues "job"
        assert more.result(30).round == 1
        assert svc.wait_stopped(60)
        with pytest.raises(Unavailable, match=CUT):
            long.result(0)
        run_id = svc.run_id
    finally:
        _shutdown(svc)
    with Store(tmp_path / "s.db", create=False) as store:
        rows = store.db.execute("SELECT admitted, finished FROM requests WHERE run_id = ? "
                                "ORDER BY request_id", [run_id]).fetchall()
        # the long call ran (admitted) and never finished; the later one finished
        assert [(adm is not None, fin is not None) for adm, fin in rows] == [(True, False),
                                                                             (True, True)]
        assert [t.completion for t in q.tasks(store.db, run_id)] == [None]


def _error(r: httpx.Response) -> str:
    assert r.status_code == 503, r.text
    body = r.json()["error"]
    assert body["type"] == "unavailable_error"
    return str(body["message"])


def test_a_second_sigterm_ends_a_long_grace_and_draining_refusals_are_503(
        tmp_path: Path) -> None:
    """`topasd start --grace 600`: after SIGTERM the daemon drains (not ready;
    new tasks and calls get 503 saying why; the state says draining); a second
    SIGTERM stops it now (exit 0): the call still running gets a 503, and the
    store keeps its task unfinished."""
    with Daemon(tmp_path, "--grace", "600", speed="20") as d:
        reply: dict[str, httpx.Response] = {}

        def long_call() -> None:
            with contextlib.suppress(httpx.HTTPError):  # no reply: the check below fails
                reply["r"] = httpx.post(f"{d.url}/v1/chat/completions", timeout=120, json={
                    "model": "m", "max_tokens": LONG,
                    "messages": [{"role": "user", "content": "x"}]})

        th = threading.Thread(target=long_call)
        th.start()
        d.wait_for(lambda s: s["counts"]["requests_running"] == 1)
        d.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while d.http.get("/ready").status_code != 503:
            assert time.monotonic() < deadline, "the daemon did not start draining"
            time.sleep(0.05)
        assert NOT_ADMITTING in _error(d.http.post("/v1/tasks", json={"workflow": "chain3"}))
        assert NOT_ADMITTING in _error(d.http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "y"}]}))
        st = d.state()
        assert st["draining"] is True and st["counts"]["tasks_arrived"] == 1
        assert d.stop(signal.SIGTERM, timeout=60) == 0
        th.join(60)
    assert "r" in reply and CUT in _error(reply["r"])
    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        assert run.status == "done" and run.error is None
        assert [t.completion for t in q.tasks(store.db, run.id)] == [None]
        assert store.db.execute("SELECT count(*) FROM requests WHERE run_id = ? AND finished "
                                "IS NULL", [run.id]).fetchone()[0] == 1


# -------------------------------------------------------- replay boundaries


def _write_run(path: Path) -> int:
    """A hand-made run through the store's sink: its first decision (t = 8) comes
    before its first event (t = 10); task 0 finishes at t = 20 (JCT 10), task 1
    at t = 30 (JCT 15); decisions at 8, 20 and 30; beta changes at t = 20."""
    k = EventKind
    events = [
        EngineEvent(10.0, k.TASK_ARRIVE, task_id=0, note="w"),
        EngineEvent(10.0, k.REQUEST_READY, 0, 0, "A", "s"),
        EngineEvent(12.0, k.REQUEST_ADMIT, 0, 0, "A", "s", tokens=5),
        EngineEvent(15.0, k.TASK_ARRIVE, task_id=1, note="w"),
        EngineEvent(20.0, k.REQUEST_FINISH, 0, 0, "A", "s", tokens=3, value=8.0),
        EngineEvent(20.0, k.STAGE_FINISH, task_id=0, agent="A", stage="s", value=8.0),
        EngineEvent(20.0, k.TASK_FINISH, task_id=0, value=10.0),
        EngineEvent(30.0, k.TASK_FINISH, task_id=1, value=15.0),
    ]
    decisions = [Decision(8.0, "hand", wall_ms=1.0), Decision(20.0, "hand", wall_ms=3.0),
                 Decision(30.0, "hand", wall_ms=8.0)]
    with Store(path) as store:
        sink = store.sink()
        sink.run_started(RunInfo("topas", "sim", "unit", {"policy": {"beta": 1.0}}, "w", 0, {}))
        sink.decision(decisions[0])
        for ev in events[:4]:
            sink.event(ev)
        sink.param_change(20.0, "beta", 1.0, 5.0, from_decision=2)
        sink.decision(decisions[1])
        for ev in events[4:7]:
            sink.event(ev)
        sink.decision(decisions[2])
        sink.event(events[7])
        sink.run_finished(None, None)
        assert sink.run_id is not None
        return sink.run_id


def test_throughput_counts_from_the_runs_start(tmp_path: Path) -> None:
    """The headline's throughput is finished tasks over the time since the run's
    start (its first decision or event, here t = 8): not since t = 0, the
    first event or the first finish; at the start itself it is 0, not 0/0."""
    run_id = _write_run(tmp_path / "r.db")
    with Store(tmp_path / "r.db", create=False) as store:
        replay = q.RunReplay(store.db, run_id)
        assert replay.span == (8.0, 30.0)
        h = replay.headline_at(30.0)
        assert h.tasks_finished == 2
        assert h.throughput_task_s == pytest.approx(2 / 22)
        assert replay.headline_at(25.0).throughput_task_s == pytest.approx(1 / 17)
        assert replay.headline_at(8.0).throughput_task_s == 0.0
        assert replay.headline_at(8.0).tasks_finished == 0
        # trend points at even times after the start, the last at t
        assert [x.t for x in replay.headline_series(30.0, points=3)] == [19.0, 30.0]


def test_queries_at_a_time_include_what_happened_exactly_then(tmp_path: Path) -> None:
    """An event, finish, decision or parameter change stamped exactly t counts
    as done at t (and not a moment before)."""
    run_id = _write_run(tmp_path / "r.db")
    with Store(tmp_path / "r.db", create=False) as store:
        db = store.db
        replay = q.RunReplay(db, run_id)
        before, at = replay.state_at(19.999), replay.state_at(20.0)
        assert [r.request_id for r in before.running] == [0]
        assert (before.tasks_finished, before.requests_finished) == (0, 0)
        assert at.running == () and (at.tasks_finished, at.requests_finished) == (1, 1)
        assert [t.task_id for t in at.tasks] == [1]
        assert (before.decisions, before.last_decision) == (1, 1)
        assert (at.decisions, at.last_decision) == (2, 2)
        assert replay.state_at(10.0).tasks_arrived == 1
        assert replay.state_at(8.0).decisions == 1 and replay.state_at(7.999).decisions == 0
        assert replay.decision_at(20.0) == 2 and replay.decision_at(19.999) == 1
        assert replay.decision_at(8.0) == 1 and replay.decision_at(7.999) is None
        h = replay.headline_at(20.0)
        assert (h.tasks_finished, h.jct_mean_s) == (1, 10.0)
        assert h.decision_ms_mean == pytest.approx(2.0)  # decisions at 8 and 20
        assert h.decision_ms_p99 == pytest.approx(float(np.percentile([1.0, 3.0], 99)))
        assert replay.headline_at(30.0).jct_mean_s == pytest.approx(12.5)
        assert [d["seq"] for d in q.decisions_before(db, run_id, 20.0)] == [1, 2]
        assert [d["seq"] for d in q.decisions_before(db, run_id, 19.999)] == [1]
        assert [d["seq"] for d in q.decisions(db, run_id, t0=20.0, t1=20.0)] == [2]
        assert [d["seq"] for d in q.decisions(db, run_id, t0=8.0, t1=30.0)] == [1, 2, 3]
        run = q.get_run(db, run_id)
        assert q.params_at(db, run, 20.0)[1]["beta"] == 5.0
        assert q.params_at(db, run, 19.999)[1]["beta"] == 1.0


# ------------------------------------------------------------ vLLM helpers


def test_context_tokens_is_the_models_context_capped_by_the_block_rounded_pool() -> None:
    assert context_tokens({}, 1000) == 1024  # no context given: the pool, whole blocks
    assert context_tokens({"max_position_embeddings": 8192}, 1000) == 1024
    assert context_tokens({"max_position_embeddings": 1024}, 1000) == 1024
    assert context_tokens({"max_position_embeddings": 1010}, 1000) == 1010
    assert context_tokens({"max_position_embeddings": 512}, 1000) == 512
    assert context_tokens({"max_position_embeddings": "4096"}, 8000) == 4096
    assert context_tokens({}, 1000, block_size=64) == 1024
    assert context_tokens({}, 1000, block_size=16) == 1008
    assert context_tokens({}, 4096) == 4096  # already whole blocks


def test_context_fix_names_what_caps_the_context() -> None:
    pool = "the KV pool caps it: give a larger --budget, or shorten the request"
    model = ("the model's max_position_embeddings caps it: shorten the request, or use a "
             "model config with a longer context")
    assert context_fix(4096, 4096) == pool  # exactly the budget: the pool is the cap
    assert context_fix(4128, 4096) == pool
    assert context_fix(4095, 4096) == model
    assert context_fix(512, 4096) == model
    budget = 4096
    assert context_fix(context_tokens({"max_position_embeddings": 8192}, budget), budget) == pool
    assert context_fix(context_tokens({"max_position_embeddings": 2048}, budget), budget) == model
    # a budget that is not whole blocks: the pool (1024) caps nothing below it, so a
    # model context of 1010 is the model's cap, though it exceeds the budget (1000)
    assert context_tokens({"max_position_embeddings": 1010}, 1000) == 1010
    assert context_fix(1010, 1000) == model
    assert context_fix(context_tokens({"max_position_embeddings": 4000}, 1000), 1000) == pool


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer_in_float32(tmp_path: Path) -> None:
    # 2 (K, V) x layers x key/value heads x head size x 4 bytes
    gqa = {"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 256}
    assert kv_bytes_per_token(gqa) == 2 * 3 * 2 * 32 * 4
    assert kv_bytes_per_token({**gqa, "head_dim": 64}) == 2 * 3 * 2 * 64 * 4
    assert kv_bytes_per_token({**gqa, "head_dim": None}) == 2 * 3 * 2 * 32 * 4
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 512}
    assert kv_bytes_per_token(mha) == 2 * 2 * 4 * 128 * 4  # key/value heads = heads
    assert kv_bytes_per_token({}) == 2 * 2 * 4 * 32 * 4  # defaults: 2 layers, 4 heads of 32
    tiny = read_model_config(write_tiny_model(tmp_path / "m", layers=3, hidden=256))
    assert kv_bytes_per_token(tiny) == 2 * 3 * 4 * 32 * 4  # 8 heads of 32, 4 key/value
    assert cpu_profile(4096, 512, tiny).kv_bytes_per_token == kv_bytes_per_token(tiny)
