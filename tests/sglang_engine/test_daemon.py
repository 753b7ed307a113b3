"""`topasd start --backend sglang` with SGLang's real engine on this CPU.

One daemon serves the module (the engine's start-up is 20-60 s), with two
SGLang replicas (`--dp-size 2`, each deciding with its own TOPAS state): the
built-in workload driver, POST /v1/tasks, OpenAI calls from the `openai`
client, /v1/state (200 at any moment, the simulator's fields), /v1/events,
/metrics, PATCH /v1/params, `topasd status`, the console (live, driven with
Pilot), and, last, SIGTERM draining.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.app import ConsoleApp
from console.sources import Target
from console.widgets.residency import Residency
from store import queries as q
from tests.daemonkit import Daemon, clean_env, sse_events
from tests.sglang_engine.conftest import cpu_engine_env, tiered_env

TASKS = 3  # driven by the built-in workload driver
START_S = 240.0  # the engine's start-up on a loaded 2-core box, with room
STREAMED_TOKENS = 256  # a streamed call's decode: over 0.5 s even on a quiet box (96: 0.47 s)


@pytest.fixture(scope="module")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    work = tmp_path_factory.mktemp("daemon")
    d = Daemon(work, "--backend", "sglang", "--model-path", str(tiny_model), "--dp-size", "2",
               "--workload", "chain3", "--rate", "4", "--tasks", str(TASKS), "--grace", "120",
               speed="1", env=clean_env(**cpu_engine_env(), **tiered_env()),
               start_timeout=START_S)
    with d:
        yield d


@pytest.fixture(scope="module")
def sim_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """/v1/state of the simulator's daemon, to compare fields with."""
    with Daemon(tmp_path_factory.mktemp("sim"), "--workload", "chain3", "--rate", "2",
                "--tasks", "2") as d:
        state = d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 2)
        assert d.stop() == 0
    return state


def test_state_answers_200_at_any_moment_with_the_simulators_fields(
        sim_state: dict[str, Any], daemon: Daemon) -> None:
    """Polled all through the driver's workload and through a task posted once
    the polls began (decisions due or not): never an error, the same
    top-level and nested fields as the simulator's, and SGLang's running
    batch seen while the posted task ran (it runs only after the first poll,
    so the polls cover it whatever the driver's workload did meanwhile)."""
    seen_running, posted = False, None
    deadline = time.monotonic() + 240
    while True:
        r = daemon.http.get("/v1/state", params={"limit": 50})
        assert r.status_code == 200, r.text
        st = r.json()
        assert set(st) == set(sim_state)
        assert set(st["counts"]) == set(sim_state["counts"])
        assert set(st["stats"]) == set(sim_state["stats"])
        seen_running = seen_running or st["counts"]["requests_running"] > 0
        if posted is None:
            made = daemon.http.post("/v1/tasks", json={"workflow": "chain3"})
            assert made.status_code == 201, made.text
            posted = made.json()["id"]
        elif (st["counts"]["tasks_finished"] > TASKS
              and daemon.http.get(f"/v1/tasks/{posted}").json()["status"] == "done"):
            break
        assert time.monotonic() < deadline, "the workload and the posted task did not finish"
    assert seen_running  # the state showed SGLang's running batch, not an empty pool
    assert st["policy"] == "topas" and st["counts"]["driver_rejected"] == 0


def test_the_daemon_decides_for_both_replicas(daemon: Daemon) -> None:
    """The driver's tasks went to replicas 0 and 1 (task % 2); every
    admitting decision admits one replica's requests (each replica's
    scheduler asked on its own), and both replicas were decided."""
    daemon.wait_for(lambda s: s["counts"]["tasks_finished"] >= TASKS, timeout=120)
    with daemon.store() as store:
        run = q.get_run(store.db)
        task_of = dict(store.db.execute("SELECT request_id, task_id FROM requests "
                                        "WHERE run_id = ?", [run.id]).fetchall())
        admits = [json.loads(a) for (a,) in store.db.execute(
            "SELECT admit FROM decisions WHERE run_id = ? AND n_admit > 0", [run.id])]
    replicas = [{task_of[r] % 2 for r in admit} for admit in admits]
    assert all(len(r) == 1 for r in replicas), replicas
    assert set().union(*replicas) == {0, 1}


def test_a_task_posted_to_the_api_runs_to_done(daemon: Daemon) -> None:
    r = daemon.http.post("/v1/tasks", json={"workflow": "chain3"})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    daemon.wait_for(lambda s: daemon.http.get(f"/v1/tasks/{tid}").json()["status"] == "done",
                    timeout=120)


def test_openai_calls_get_exact_output_lengths_from_the_engine(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0,
                           timeout=120)
    reply = client.chat.completions.create(
        model="tiny", max_tokens=7,
        messages=[{"role": "system", "content": "You are a terse helper."},
                  {"role": "user", "content": "hello"}])
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    again = client.chat.completions.create(  # the same agent: its prefix is cached
        model="tiny", max_tokens=3,
        messages=[{"role": "system", "content": "You are a terse helper."},
                  {"role": "user", "content": "again"}])
    assert again.usage is not None and again.usage.completion_tokens == 3


def test_tokens_stream_as_sglang_makes_them(daemon: Daemon) -> None:
    """`stream: true` on SGLang: the role chunk, the tokens in several chunks
    as SGLang's steps make them (the first before the last by at least the
    time SGLang took from admitting the call to finishing it, from the log),
    usage last."""
    from tests.test_streaming import (
        GRANULARITY_S,
        call_body,
        check_streamed,
        read_stream,
        token_times,
    )

    got: list[tuple[float, str, Any]] = []
    read_stream(daemon.url, call_body(STREAMED_TOKENS), got)
    meta = check_streamed(got, STREAMED_TOKENS)
    # SGLang's log has no prefill_end: its admission, which the prefill follows at
    # once, is the earliest the first token can come (engine seconds: wall)
    deadline = time.monotonic() + 60  # the log writer follows the engine
    while True:
        try:
            first, finish = token_times(daemon.db, meta["request_id"], first="request_admit")
            break
        except KeyError:
            assert time.monotonic() < deadline, "the call's finish never reached the log"
            time.sleep(0.2)
    texts = [t for t, k, _ in got if k == "text"]
    assert finish - first > 0.5  # decoding took long enough to tell
    assert texts[-1] - texts[0] >= (finish - first) - GRANULARITY_S


def test_the_event_stream_carries_decisions_and_sglangs_events(daemon: Daemon) -> None:
    with httpx.stream("GET", f"{daemon.url}/v1/events", timeout=60,
                      params={"since": 0, "max_events": 40}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [(n, e) for _, n, e in sse_events(r.iter_lines())]
    kinds = {e["kind"] for n, e in events if n == "engine"}
    assert {"task_arrive", "request_ready", "request_admit"} <= kinds  # request_admit: SGLang's
    assert any(n == "decision" for n, _ in events)


def test_metrics_count_what_the_state_counts(daemon: Daemon) -> None:
    st = daemon.state(limit=1)
    text = daemon.http.get("/metrics").text
    metrics = {s.name + str(sorted(s.labels.items())): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert metrics["topasd_tasks_finished_total[]"] >= st["counts"]["tasks_finished"] >= TASKS
    assert metrics["topasd_decisions_total[]"] >= st["counts"]["decisions"] > 0
    assert "topasd_decision_latency_seconds_bucket[('le', '+Inf')]" in metrics


def test_patch_params_reaches_the_policy(daemon: Daemon) -> None:
    r = daemon.http.patch("/v1/params", json={"beta": 7})
    assert r.status_code == 200, r.text
    assert daemon.http.get("/v1/params").json()["params"]["beta"] == 7.0
    r = daemon.http.post("/v1/tasks", json={"workflow": "chain3"})  # decided with beta 7
    assert r.status_code == 201


def test_topasd_status_reads_the_sglang_daemon(daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, "-m", "topasd.cli", "status", "--runtime-file",
                           str(daemon.runtime)], capture_output=True, text=True, timeout=60,
                          env=clean_env(), cwd=daemon.workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sglang backend" in done.stdout


async def _until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = 120.0) -> None:
    """Let the console run until `cond()` holds (bounded; fails naming `what`)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def test_the_console_follows_the_sglang_daemon_live(daemon: Daemon) -> None:
    """The console (HTTP API only) connects, shows SGLang's KV pool and the
    decision feed, and a task posted while it watches arrives as new
    decisions through the event stream and as the task's agents' residency."""
    app = ConsoleApp(Target(daemon.url), poll_s=0.2, render_s=0.1)
    budget = daemon.state(limit=1)["budget"]["tokens"]

    async def scenario(pilot: Any) -> None:
        await _until(pilot, lambda: app.connected and app.snapshot, "the connection")
        res = app.dashboard.query_one(Residency)
        await _until(pilot, lambda: res.snapshot is not None, "the residency panel")
        assert res.snapshot is not None and res.snapshot.budget == budget
        seen = app.counters["decisions"]
        r = await asyncio.to_thread(daemon.http.post, "/v1/tasks", json={"workflow": "chain3"})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        await _until(pilot, lambda: app.counters["decisions"] > seen, "a new decision")
        await _until(pilot, lambda: app.snapshot is not None and tid in {
            t.id for t in app.snapshot.tasks}, f"task {tid} on the dashboard")
        await _until(pilot, lambda: res.snapshot is not None and "A" in {
            a.agent for a in res.snapshot.agents}, "agent A's prefix in the residency panel")

    async def main() -> None:
        async with app.run_test(size=(150, 45)) as pilot:
            await scenario(pilot)

    asyncio.run(main())


def test_sigterm_drains_the_calls_in_flight_and_exits_0(daemon: Daemon) -> None:
    """Last in the module: a call in SGLang at SIGTERM is served, then the
    daemon shuts the engine down and exits 0 with every request logged."""
    done: dict[str, httpx.Response] = {}

    def call() -> None:
        done["r"] = httpx.post(f"{daemon.url}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "max_tokens": 400, "messages": [{"role": "user", "content": "x"}]})

    th = threading.Thread(target=call)
    th.start()
    daemon.wait_for(lambda s: "default" in s["waiting"] or "default" in s["running"])
    assert daemon.stop(signal.SIGTERM, timeout=180) == 0
    th.join(60)
    assert done["r"].status_code == 200
    assert done["r"].json()["usage"]["completion_tokens"] == 400
    with daemon.store() as store:
        assert store.integrity() == "ok"
        run = q.get_run(store.db)
        assert run.status == "done" and run.backend == "sglang"
        assert store.db.execute("SELECT count(*) FROM requests WHERE run_id = ? AND finished "
                                "IS NULL", [run.id]).fetchone()[0] == 0
