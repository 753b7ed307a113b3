"""The daemon end to end: `topasd start` as a real server subprocess on
127.0.0.1 (a free port), driven over HTTP and with the official `openai`
client; the decision log it writes is checked after SIGTERM flushed it.

Every daemon runs the sim unpaced (`--speed max`) unless a test is about the
paced clock, so nothing depends on wall-clock timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.gantt import dump_dom, find_chromium
from store import Store
from store import queries as q
from tests.daemonkit import Daemon, clean_env, sse_events
from topasd.daemon.calls import agent_key, count_tokens
from topasd.scheduler.params import TopasParams
from workflows.builtin import load_workload
from workflows.trace import generate_trace

SYSTEM = "You are agent {0}. Follow the plan and answer tersely. " * 6


def openai_client(d: Daemon, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key=api_key, max_retries=0, timeout=60)


def test_openai_client_drives_a_three_stage_workflow(tmp_path: Path) -> None:
    replies: dict[str, list[tuple[str, Any]]] = {}
    with Daemon(tmp_path) as d:
        client = openai_client(d)

        def run_task(task: str) -> None:
            text = f"Build feature {task} and report back."
            out = []
            for stage, agent in (("a", "A"), ("b", "B"), ("c", "C")):
                r = client.chat.completions.create(
                    model="topasd-sim", max_tokens=40,
                    messages=[{"role": "system", "content": SYSTEM.format(agent)},
                              {"role": "user", "content": text}],
                    extra_body={"topasd": {"task_id": task, "workflow": "chain3",
                                           "stage": stage}})
                out.append((text, r))
                text = r.choices[0].message.content  # the next agent reads this answer
            replies[task] = out

        threads = [threading.Thread(target=run_task, args=(f"job-{i}",)) for i in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        plain = client.chat.completions.create(
            model="gpt-anything", max_tokens=30, max_completion_tokens=12,  # the newer wins
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "What is TOPAS?"}])
        streams = {usage: list(client.chat.completions.create(
            model="gpt-anything", max_tokens=9, stream=True,
            stream_options={"include_usage": True} if usage else None,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Stream it."}])) for usage in (True, False)}
        final = d.state()
        assert d.stop() == 0

    assert sorted(replies) == ["job-0", "job-1", "job-2"]
    task_ids = {}
    for task, rs in replies.items():
        metas = [r.model_extra["topasd"] for _, r in rs]
        assert [m["stage"] for m in metas] == ["a", "b", "c"]
        assert [m["agent"] for m in metas] == ["A", "B", "C"]
        assert [m["task_done"] for m in metas] == [False, False, True]
        assert len({m["task_id"] for m in metas}) == 1  # one daemon task per application task
        assert {m["client_task_id"] for m in metas} == {task}
        task_ids[task] = metas[0]["task_id"]
        for text, r in rs:
            assert r.usage.completion_tokens == 40
            assert r.usage.total_tokens == r.usage.prompt_tokens + 40
            assert count_tokens(r.choices[0].message.content) == 40
            # chain3's agents have 4000-token prefixes; the request's input is the user text
            assert r.usage.prompt_tokens == 4000 + count_tokens(text)
        # each stage starts after the previous one finished (the application drives it)
        assert all(metas[i]["t_finish"] <= metas[i + 1]["t_ready"] for i in range(2))
    assert len(set(task_ids.values())) == 3
    pmeta = plain.model_extra["topasd"]
    assert pmeta["agent"] == agent_key("Be brief.")
    assert pmeta["workflow"] == f"agent:{agent_key('Be brief.')}" and pmeta["task_done"]
    assert plain.usage.prompt_tokens == count_tokens("Be brief.") + count_tokens("What is TOPAS?")
    assert plain.usage.completion_tokens == 12  # max_completion_tokens, not max_tokens
    *_, last = streams[True]  # with include_usage: a last chunk without choices, with usage
    assert last.choices == [] and last.usage is not None
    assert (last.usage.completion_tokens, last.usage.total_tokens) == (
        9, last.usage.prompt_tokens + 9)
    assert all(c.usage is None for c in streams[False])
    assert plain.usage.completion_tokens == 12

    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        assert (run.status, run.backend, run.policy) == ("done", "sim", "topas")
        reqs = {r["request_id"]: r for r in store.db.query(
            "SELECT * FROM requests WHERE run_id = ?", [run.id])}
        assert len(reqs) == 9 + 1 + 2 == final["counts"]["requests_finished"]  # + 2 streamed
        for task, rs in replies.items():
            for _, r in rs:
                meta = r.model_extra["topasd"]
                row = reqs[meta["request_id"]]
                assert (row["task_id"], row["stage"], row["agent"]) == (
                    task_ids[task], meta["stage"], meta["agent"])
                assert row["output_tokens"] == 40
                assert row["finished"] == pytest.approx(meta["t_finish"])
        tasks = {t.task_id: t for t in q.tasks(store.db, run.id)}
        for task_id in task_ids.values():
            assert tasks[task_id].workflow == "chain3" and tasks[task_id].completion is not None
        assert tasks[pmeta["task_id"]].workflow == pmeta["workflow"]
        decisions = q.decisions(store.db, run.id)
        assert len(decisions) == run.decisions == final["counts"]["decisions"]
        admitted = {rid for dec in decisions for rid in (dec["admit"] or [])}
        assert set(reqs) <= admitted  # every request ran because a decision admitted it


STAGE_PREDS = {"chain3": {"a": (), "b": ("a",), "c": ("b",)},
               "dag4": {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}}


def _random_application(url: str, n: int, rng: random.Random) -> tuple[str, str]:
    """One application's task through OpenAI calls: a registered workflow's
    stages in dependency order (parallel branches at once), 1-3 ReAct rounds
    each, sometimes streamed, sometimes ended early; or a synthesized agent's
    rounds. Returns (kind, client task id)."""
    def call(meta: dict[str, Any]) -> None:
        body = {"model": "m", "max_tokens": rng.randint(1, 30), "topasd": meta,
                "messages": [{"role": "user", "content": "y" * rng.randint(1, 300)}],
                "stream": rng.random() < 0.25}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, (r.text, meta)
        assert not body["stream"] or r.text.rstrip().endswith("data: [DONE]")

    tid = f"app-{n}"
    if rng.random() < 0.25:
        rounds = rng.randint(1, 4)
        for k in range(rounds):
            call({"task_id": tid, "agent": f"tool{n % 3}", "last_in_stage": k == rounds - 1})
        return "synthesized", tid
    wf = rng.choice(sorted(STAGE_PREDS))
    early = rng.random() < 0.15
    plans = {v: rng.randint(1, 3) for v in STAGE_PREDS[wf]}

    def stage(v: str) -> None:
        for k in range(plans[v]):
            call({"task_id": tid, "workflow": wf, "stage": v, "last_in_stage": k == plans[v] - 1,
                  "last_in_task": early and k == plans[v] - 1})

    done: set[str] = set()
    while len(done) < len(plans):
        ready = [v for v, ps in STAGE_PREDS[wf].items() if v not in done and set(ps) <= done]
        with ThreadPoolExecutor(len(ready)) as pool:
            list(pool.map(stage, ready))
        done.update(ready)
        if early:
            return "early", tid
    return wf, tid


def test_random_applications_drive_every_task_to_done(tmp_path: Path) -> None:
    """Sixty concurrent applications of every kind (a fixed seed): every call is
    answered, every task ends, none is abandoned, and the store holds them all."""
    rng = random.Random(7)
    seeds = [rng.random() for _ in range(60)]
    with Daemon(tmp_path, "--task-timeout", "0") as d:
        with ThreadPoolExecutor(16) as pool:
            apps = list(pool.map(lambda i: _random_application(d.url, i, random.Random(seeds[i])),
                                 range(60)))
        st = d.wait_for(lambda s: s["counts"]["tasks_in_flight"] == 0)
        assert d.stop() == 0
    assert st["counts"]["tasks_arrived"] == st["counts"]["tasks_finished"] == 60
    assert st["counts"]["tasks_abandoned"] == 0
    assert {kind for kind, _ in apps} >= {"synthesized", "chain3", "dag4", "early"}
    with Store(d.db, create=False) as store:
        assert len(q.tasks(store.db, q.get_run(store.db).id)) == 60
    assert "Traceback" not in d.log.read_text()


def test_200_concurrent_tasks_all_complete_and_the_store_agrees(tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        def submit(i: int) -> dict[str, Any]:
            wf = ("chain3", "dag4")[i % 2]
            short = {"input_tokens": 60, "output_tokens": 30}  # keeps the run brief
            stages = {v: short for v in "bcd"[: 2 + i % 2]}
            stages["a"] = {"output_tokens": 20 + i % 7}
            r = httpx.post(f"{d.url}/v1/tasks", timeout=60,
                           json={"workflow": wf, "stages": stages})
            assert r.status_code == 201, r.text
            assert r.headers["location"] == f"/v1/tasks/{r.json()['id']}"
            return r.json()

        with ThreadPoolExecutor(32) as pool:
            submitted = list(pool.map(submit, range(200)))
        ids = [s["id"] for s in submitted]
        assert len(set(ids)) == 200
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 200)
        assert st["counts"]["tasks_in_flight"] == 0 and st["counts"]["tasks_arrived"] == 200
        infos = [d.http.get(f"/v1/tasks/{i}").json() for i in ids]
        final = d.state()
        assert d.stop() == 0

    assert all(info["status"] == "done" and info["source"] == "api" for info in infos)
    assert all(info["stages_done"] == info["stages_total"] == len(info["stages"])
               for info in infos)
    by_id = {info["id"]: info for info in infos}
    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        rows = q.tasks(store.db, run.id)
        assert sorted(r.task_id for r in rows) == sorted(ids)  # none lost, none duplicated
        for row in rows:
            info = by_id[row.task_id]
            assert row.workflow == info["workflow"]
            assert row.completion == pytest.approx(info["finished"])
            assert row.jct == pytest.approx(info["jct"])
        counts = q.counts(store.db, run.id)
        c = final["counts"]
        assert counts["tasks"] == c["tasks_finished"] == 200
        assert counts["requests"] == c["requests_finished"]
        assert counts["decisions"] == run.decisions == c["decisions"]
        assert counts["engine_events"] == run.events == c["events"]
        unfinished = store.db.execute("SELECT count(*) FROM requests WHERE run_id = ? AND "
                                      "finished IS NULL", [run.id]).fetchone()[0]
        assert unfinished == 0
        # the per-stage override reached the engine
        outs = {r["task_id"]: r["output_tokens"] for r in store.db.query(
            "SELECT task_id, output_tokens FROM requests WHERE run_id = ? AND stage = 'a'",
            [run.id])}
        assert all(outs[s["id"]] == 20 + i % 7 for i, s in enumerate(submitted))


def test_the_driver_with_a_task_limit_plays_the_trace_that_trace_gen_writes(
        tmp_path: Path) -> None:
    """`topasd start -w W -r R -s S -n N` runs the very tasks `topasd trace gen`
    (and `topasd replay -w`) draws for the same workload, rate, seed and count,
    so the daemon's work can be rerun through any policy (it drew its own
    arrivals and rounds before)."""
    args = ("--workload", "dag4", "--rate", "0.5", "--seed", "3", "--tasks", "12")
    with Daemon(tmp_path, *args) as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 12)
        assert d.stop() == 0
    trace = generate_trace(load_workload("dag4").workflows, 0.5, 12, 3)
    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        arrivals = [r["arrival"] for r in store.db.query(
            "SELECT arrival FROM tasks WHERE run_id = ? ORDER BY task_id", [run.id])]
        rounds = sorted((r["task_id"], r["stage"], r["input_tokens"], r["output_tokens"])
                        for r in store.db.query("SELECT task_id, stage, input_tokens, "
                                                "output_tokens FROM requests WHERE run_id = ?",
                                                [run.id]))
    assert arrivals == [t.arrival for t in trace.tasks]
    assert rounds == sorted((t.id, v, r.input_tokens, r.output_tokens)
                            for t in trace.tasks for v, rs in t.stages.items() for r in rs)


def _run_log(db: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """A decision log's decisions, engine events and task JCTs, in order."""
    with Store(db, create=False) as store:
        run_id = q.get_run(store.db).id
        return tuple(  # type: ignore[return-value]
            [tuple(r.values()) for r in store.db.query(sql, [run_id])] for sql in (
                "SELECT seq, t, admit, preempt, load, evict FROM decisions "
                "WHERE run_id = ? ORDER BY seq",
                "SELECT t, kind, request_id, task_id, agent, tokens, value, note "
                "FROM engine_events WHERE run_id = ? ORDER BY id",
                "SELECT task_id, arrival, completion, jct FROM tasks "
                "WHERE run_id = ? ORDER BY task_id"))


def test_a_paced_daemon_makes_the_very_decisions_replay_makes_of_its_trace(
        tmp_path: Path) -> None:
    """In real time the engine runs in slices that end wherever the wall clock
    is; the daemon's decisions, engine events and JCTs are still exactly those
    of `topasd replay` on the same trace (before, slices cut decode runs, their
    times rounded differently, and the two drifted apart)."""
    args = ("--workload", "dag4", "--rate", "0.5", "--seed", "3", "--tasks", "12")
    with Daemon(tmp_path / "paced", *args, speed="40") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 12)
        assert d.stop() == 0
    replayed = tmp_path / "replay.db"
    subprocess.run([sys.executable, "-m", "topasd.cli", "replay", *args, "--db", str(replayed)],
                   check=True, capture_output=True, env=clean_env())
    daemon_log, replay_log = _run_log(d.db), _run_log(replayed)
    assert len(daemon_log[0]) > 40 and len(daemon_log[2]) == 12
    assert daemon_log == replay_log


def test_patch_beta_takes_effect_at_the_next_decision_and_is_logged(tmp_path: Path) -> None:
    spec = str(_spec(tmp_path))
    # the built-in driver feeds 12 tasks at engine-time arrivals (deterministic)
    with Daemon(tmp_path, "--workload", spec, "--rate", "50", "--tasks", "12") as d:
        got = d.http.get("/v1/params").json()
        assert got["params"]["beta"] == 20.0
        ranges = got["ranges"]  # integer parameters have integer bounds
        assert ranges["m"] == [0, 16] and all(isinstance(v, int) for v in ranges["m"])
        assert isinstance(ranges["beta"][1], float)
        specs = {s["name"]: s for s in got["specs"]}  # one per parameter, as the form shows
        assert set(specs) == set(got["params"]) and specs["h_age"]["symbol"] == "H_age"
        assert specs["m"]["range"] == ranges["m"] and specs["reuse"]["kind"] == "bool"
        assert "topas-paper" in got["tunable"] and "fcfs" not in got["tunable"]
        d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 12)
        r = d.http.patch("/v1/params", json={"beta": 0})
        assert r.status_code == 200, r.text
        change = r.json()
        assert change["params"]["beta"] == 0.0 and change["changed"] == ["beta"]
        first_after = change["effective_from_decision"]
        bad = d.http.patch("/v1/params", json={"beta": 1e6})
        assert bad.status_code == 422 and "beta" in bad.json()["error"]["message"]
        assert d.http.patch("/v1/params", json={"zeta": 1}).status_code == 422
        assert d.http.get("/v1/params").json()["params"]["beta"] == 0.0  # 422 changed nothing
        for _ in range(6):
            assert d.http.post("/v1/tasks", json={"workflow": "fanout"}).status_code == 201
        d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 18)
        assert d.stop() == 0

    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        changes = q.param_changes(store.db, run.id)
        assert [(c["name"], c["old"], c["new"], c["source"], c["from_decision"])
                for c in changes] == [("beta", 20.0, 0.0, "api", first_after)]
        assert changes[0]["t"] == pytest.approx(change["t"])
        last_before = q.decision_row(store.db, run.id, first_after - 1)
        assert q.params_at(store.db, run, last_before["t"], first_after - 1)[1]["beta"] == 20.0
        assert q.params_at(store.db, run, change["t"], first_after)[1]["beta"] == 0.0
        decisions = q.decisions(store.db, run.id)
        before = [x for x in decisions if x["seq"] < first_after and x["v_reuse"] is not None]
        after = [x for x in decisions if x["seq"] >= first_after and x["v_reuse"] is not None]
        assert before and after
        assert any(x["v_reuse"] > 0 for x in before)  # beta = 20 valued reuse
        assert all(x["v_reuse"] == 0 for x in after)  # beta = 0 from the next decision on
        cands = store.db.execute(
            "SELECT count(*), sum(v_reuse != 0) FROM candidates WHERE run_id = ? AND "
            "decision_seq >= ?", [run.id, first_after]).fetchone()
        assert cands[0] > 0 and cands[1] == 0


def test_an_acknowledged_change_survives_kill_9_with_every_decision_before_it(
        tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag10wide", "--rate", "3",
                "--log-candidates", "all") as d:
        d.wait_for(lambda s: s["counts"]["decisions"] >= 50)
        r = d.http.patch("/v1/params", json={"beta": 7})
        assert r.status_code == 200, r.text
        made = r.json()["effective_from_decision"] - 1  # decisions made before the change
        assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    with Store(d.db, create=False) as store:  # the writer committed what it held
        run = q.get_run(store.db)
        changes = [(c["name"], c["old"], c["new"]) for c in q.param_changes(store.db, run.id)]
        assert changes == [("beta", 20.0, 7.0)]
        seqs = [row[0] for row in store.db.execute(
            "SELECT seq FROM decisions WHERE run_id = ? ORDER BY seq", [run.id])]
        assert seqs[:made] == list(range(1, made + 1))


def _spec(tmp_path: Path) -> Path:
    """A fan-out workflow: the planner's successors share agent W, so TOPAS sees
    upcoming reuse of W's prefix (V_reuse > 0) while plans are running."""
    spec = {
        "name": "fanout",
        "agents": {"P": {"prefix_tokens": 2000}, "W": {"prefix_tokens": 3000}},
        "stages": [
            {"name": "plan", "agent": "P", "input_tokens": 200,
             "output_tokens": {"uniform_int": [20, 240]}},
            {"name": "w1", "agent": "W", "after": ["plan"], "output_tokens": 120},
            {"name": "w2", "agent": "W", "after": ["plan"], "output_tokens": 120},
        ],
    }
    path = tmp_path / "fanout.json"
    path.write_text(json.dumps(spec))
    return path


def test_react_rounds_early_task_end_and_abandoned_tasks(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--task-timeout", "0.5") as d:
        def call(task: str, stage: str, **meta: Any) -> dict[str, Any]:
            r = d.http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
                "topasd": {"task_id": task, "workflow": "chain3", "stage": stage, **meta}})
            assert r.status_code == 200, r.text
            return r.json()["topasd"]

        r0 = call("react", "a", last_in_stage=False)  # a ReAct round, the stage goes on
        r1 = call("react", "a")
        assert (r0["round"], r1["round"], r0["task_id"]) == (0, 1, r1["task_id"])
        r2 = call("react", "b", last_in_task=True)  # a branch without stage c
        assert r2["task_done"] and r2["task_id"] == r0["task_id"]
        info = d.http.get(f"/v1/tasks/{r0['task_id']}").json()
        assert info["status"] == "done" and info["stages_done"] == 2
        assert info["stages"]["a"]["rounds_done"] == 2 and info["stages"]["c"]["status"] == \
            "pending"
        late = d.http.post("/v1/chat/completions", json={  # c after the task ended
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": "react", "workflow": "chain3", "stage": "c"}})
        assert late.status_code == 409 and "'react' of 'chain3' already ended (it finished " \
            "at t=" in late.text and "starts at ['a']: use a new task_id" in late.text, late.text
        again = call("react", "a")  # the id is free again: a new task
        assert again["task_id"] != r0["task_id"]
        gone = call("left", "a")  # the application never sends b and c

        def plain(task: str | None, **meta: Any) -> httpx.Response:  # no registered workflow
            ids = {} if task is None else {"task_id": task}
            return d.http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
                "topasd": {"agent": "react", **ids, **meta}})

        p0 = plain("r1", last_in_stage=False).json()["topasd"]  # the id ties the rounds
        p1 = plain("r1").json()["topasd"]
        assert (p0["round"], p1["round"], p0["task_id"]) == (0, 1, p1["task_id"])
        assert p1["task_done"] and not p0["task_done"]
        stray = plain("r2", last_in_stage=False).json()["topasd"]  # never continued
        nokey = plain(None, last_in_stage=False)  # nothing could ever end it
        assert nokey.status_code == 422 and "needs topasd.task_id" in nokey.text
        d.wait_for(lambda s: s["counts"]["tasks_abandoned"] >= 3, timeout=30)
        for left in (gone, stray):
            assert d.http.get(f"/v1/tasks/{left['task_id']}").json()["status"] == "abandoned"
        late = d.http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": "left", "workflow": "chain3", "stage": "b"}})
        assert late.status_code == 409 and "already ended (it was abandoned at t=" in late.text
        # dag4's A and B clash with chain3's (other sizes): renamed, and the new names
        # the replies carry may be sent back
        a = d.http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": "D1", "workflow": "dag4", "stage": "a", "agent": "A"}})
        assert a.status_code == 200 and a.json()["topasd"]["agent"] == "dag4/A", a.text
        for agent in ("dag4/B", "B"):
            b = d.http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
                "topasd": {"task_id": "D1", "workflow": "dag4", "stage": "b", "agent": agent,
                           "last_in_stage": False}})
            assert b.status_code == 200 and b.json()["topasd"]["agent"] == "dag4/B", b.text
        d.http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
            "topasd": {"task_id": "D1", "workflow": "dag4", "stage": "b", "last_in_task": True}})
        assert d.state()["counts"]["tasks_in_flight"] == 0
        assert d.stop() == 0


def test_a_named_agents_prefix_is_its_first_system_prompt(tmp_path: Path) -> None:
    """A later call of the agent with another system prompt keeps the agent's
    prefix and sends its own system prompt as input: usage counts it, and a
    call that cannot fit with its own system prompt is 422 (the first call's size
    does not stand for it)."""
    with Daemon(tmp_path) as d:
        def call(system: str, agent: str = "agY", user: str = "go") -> httpx.Response:
            return d.http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 8,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": user}],
                "topasd": {"agent": agent}})

        short, other = "s" * 40, "o" * 400  # 10 and 100 tokens
        first = call(short)
        assert first.json()["usage"]["prompt_tokens"] == 10 + 1, first.text
        same = call(short, user="u" * 80)
        assert same.json()["usage"]["prompt_tokens"] == 10 + 20, same.text
        changed = call(other)
        assert changed.status_code == 200, changed.text
        assert changed.json()["usage"]["prompt_tokens"] == 10 + 100 + 1, changed.text
        huge = "h" * 100_000  # 25,000 tokens: more than the 18,000-token budget
        for agent in ("agY", "agZ"):  # a known agent and a new one alike
            refused = call(huge, agent=agent)
            assert refused.status_code == 422 and "KV tokens" in refused.text, refused.text
        rows = d.http.get("/v1/state").json()
        assert rows["counts"]["tasks_in_flight"] == 0
        assert d.stop() == 0


def test_bad_requests_get_4xx_with_a_message_and_the_daemon_keeps_serving(
        tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        h = d.http

        def err(r: httpx.Response, status: int, *words: str) -> None:
            assert r.status_code == status, (r.status_code, r.text)
            msg = r.json()["error"]["message"]
            for w in words:
                assert w in msg, msg

        err(h.post("/v1/tasks", content=b'{"workflow": "chain3"',
                   headers={"content-type": "application/json"}), 400, "not valid JSON")
        err(h.post("/v1/tasks", content=b"workflow=chain3"), 400, "JSON")
        err(h.post("/v1/tasks", content=b'{"workflow": "\xff"}',
                   headers={"content-type": "application/json"}), 400, "not valid JSON",
            "UTF-8")
        err(h.post("/v1/tasks", content=b"\xff\xfe",  # a UTF-16 BOM: json reads it so
                   headers={"content-type": "application/json"}), 400, "not UTF-8 text")
        err(h.post("/v1/tasks", content=b"[" * 5000 + b"]" * 5000,
                   headers={"content-type": "application/json"}), 400,
            "nests 5000 levels deep, more than 32")
        err(h.post("/v1/tasks", content=b"", headers={"content-type": "application/json"}),
            400, "the body is empty")
        err(h.post("/v1/tasks", json={"workflow": 3}), 422, "workflow")
        err(h.post("/v1/tasks", json={"workflow": "nope"}), 422, "nope", "chain3")
        err(h.post("/v1/tasks", json={"workflow": "chain3", "stages": {"zz": {}}}), 422, "zz")
        err(h.post("/v1/tasks", json={"workflow": "chain3",
                                      "stages": {"a": {"output_tokens": 90_000}}}),
            422, "KV budget")
        err(h.get("/v1/tasks/424242"), 404, "no task 424242")
        # a refused task takes no id: the next one gets it
        before = h.post("/v1/tasks", json={"workflow": "chain3"}).json()["id"]
        err(h.post("/v1/tasks", json={"workflow": "chain3",
                                      "stages": {"a": {"output_tokens": 90_000}}}), 422, "KV")
        assert h.post("/v1/tasks", json={"workflow": "chain3"}).json()["id"] == before + 1
        # an invalid key is named, printably (its bad character escaped)
        err(h.patch("/v1/params", content=b'{"\\ud800": 1}',
                    headers={"content-type": "application/json"}), 422, "\\ud800",
            "not valid Unicode")
        err(h.post("/v1/tasks", content=b'{"workflow": "chain3", "stages": {"x\\udfff": {}}}',
                   headers={"content-type": "application/json"}), 422, "stages.x\\udfff")
        err(h.get("/v1/tasks/abc"), 404, "no task 'abc'", "GET /v1/tasks lists")
        err(h.get("/no/such/path"), 404, "/docs")
        err(h.get("/v1/events", params={"since": 10**12}), 422, "beyond the newest event id")
        err(h.patch("/v1/params", json={"M": 4, "m": 8}), 422, "M and m name the same "
            "parameter; give one")
        err(h.patch("/v1/params", content=b'{"beta": NaN}',
                    headers={"content-type": "application/json"}), 422, "beta", "finite")
        err(h.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "x"}],
            "topasd": {"task_id": "x" * 257}}), 422, "topasd.task_id", "at most 256")
        err(h.post("/v1/chat/completions", json={"model": "m", "messages": []}), 422, "messages")
        err(h.post("/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": 50_000}), 422, "max_tokens")
        err(h.post("/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "topasd": {"workflow": "chain3", "stage": "b"}}), 422, "task_id")
        err(h.post("/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "topasd": {"workflow": "chain3", "stage": "q", "task_id": 1}}),
            422, "no stage 'q'")
        # a misspelled workflow is refused, not run as a one-stage call of its own
        err(h.post("/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "topasd": {"workflow": "chian3", "stage": "b", "task_id": "j2"}}),
            422, "unknown workflow 'chian3'", "chain3", "leave workflow out")
        # a reply's synthesized workflow sent back is the same as none
        echo = h.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "topasd": {"workflow": "agent:default"}})
        assert echo.status_code == 200
        assert echo.json()["topasd"]["workflow"] == "agent:default"
        call = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "topasd": {"workflow": "chain3", "stage": "a", "task_id": "t1"}}
        assert h.post("/v1/chat/completions", json=call).status_code == 200
        err(h.post("/v1/chat/completions", json=call), 409, "already finished stage 'a'")
        early = {**call, "topasd": {**call["topasd"], "stage": "c"}}  # b has not run
        err(h.post("/v1/chat/completions", json=early), 409, "runs after ['b']", "'t1'")
        fresh = {**call, "topasd": {**call["topasd"], "stage": "b", "task_id": "t2"}}
        err(h.post("/v1/chat/completions", json=fresh), 409, "runs after ['a']")
        err(h.post("/v1/completions", json={"model": "m", "prompt": ["a", "b"]}), 422, "one prompt")
        for body, where in (  # JSON can escape an unpaired surrogate; no text encoding can
                (b'{"model": "m", "messages": [{"role": "system", "content": "\\ud800"}]}',
                 "messages.0.content"),
                (b'{"model": "\\ud800", "prompt": "x"}', "model"),
                (b'{"model": "m", "prompt": "x", "topasd": {"task_id": "\\udc00"}}',
                 "topasd.task_id")):
            path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
            err(h.post(path, content=body, headers={"content-type": "application/json"}),
                422, where, "not valid Unicode")
        assert h.get("/v1/state").status_code == 200
        err(h.get("/v1/events", params={"kinds": "nonsense"}), 422, "nonsense")
        err(h.patch("/v1/params", json={"policy": "fcfs", "beta": 3}), 422, "no parameters")
        err(h.patch("/v1/params", json={"policy": "magic"}), 422, "policy")
        err(h.patch("/v1/params", json={"M": None}), 422, "M:", "range [0, 16]")
        err(h.patch("/v1/params", json={"rho": -1}), 422, "rho:", "range [0, 1000]")
        err(h.patch("/v1/params", json={"seed": -1}), 422, "seed:", "got -1",
            "range [0, 2147483647]")
        assert h.get("/health").json() == {"status": "ok", "engine": True}
        switched = h.patch("/v1/params", json={"policy": "lpm"}).json()
        assert (switched["policy"], switched["params"]) == ("lpm", {})
        r = h.post("/v1/completions", json={"model": "m", "prompt": "still here?", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        back = h.patch("/v1/params", json={"policy": "topas", "K": 2}).json()
        assert (back["policy"], back["params"]["k"]) == ("topas", 2)
        # from lpm (no parameters): every one of TOPAS's that has a value came into force
        assert back["changed"] == sorted([*(k for k, v in back["params"].items()
                                            if v is not None), "policy"])
        assert d.stop() == 0
    with Store(d.db, create=False) as store:
        run = q.get_run(store.db)
        changes = [(c["name"], c["old"], c["new"]) for c in q.param_changes(store.db, run.id)]
        # each switch is logged, then every parameter of the new policy (lpm: none)
        assert changes[:2] == [("policy", "topas", "lpm"), ("policy", "lpm", "topas")]
        assert [name for name, _, _ in changes[2:]] == sorted(asdict(TopasParams()))
        assert ("k", None, 2) in changes and ("beta", None, 20.0) in changes
        last = max(c["t"] for c in q.param_changes(store.db, run.id))
        assert q.params_at(store.db, run, last) == ("topas", asdict(TopasParams(k=2)))
        decided_by = {row["policy"] for row in store.db.query("SELECT policy FROM runs")}
        assert decided_by == {"topas"}  # the run keeps the policy it started with
        assert run.switched_to == ("lpm", "topas")  # and its label says what ran
        assert run.label.startswith(f"run {run.id} (topas → lpm → topas, ")
        many = replace(run, switched_to=("lpm", "fcfs", "spf", "topas"))
        assert many.policies_text == "topas → … → topas (4 switches)"


def test_mutating_endpoints_need_the_token_off_loopback(tmp_path: Path) -> None:
    s3cret = "s3cret-of-16-chars"
    with Daemon(tmp_path, "--host", "0.0.0.0", "--public-reads",
                env=clean_env(TOPAS_TOKEN=s3cret)) as d:
        plain = httpx.Client(base_url=d.url, timeout=30)
        r = plain.post("/v1/tasks", json={"workflow": "chain3"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in r.json()["error"]["message"]
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403
        assert plain.patch("/v1/params", json={"beta": 1}).status_code == 401
        assert plain.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code == 401
        assert plain.get("/v1/state").status_code == 200  # --public-reads: reads are open
        assert plain.get("/v1/params").status_code == 200
        with pytest.raises(openai.PermissionDeniedError):
            openai_client(d, "wrong-key").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
        ok = openai_client(d, s3cret).chat.completions.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert ok.usage.completion_tokens == 4
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": f"Bearer {s3cret}"})
        assert r.status_code == 201
        # the token is checked before the body is read: junk without it is 401, not 400
        assert plain.post("/v1/tasks", content=b"{not json").status_code == 401
        # bodies over 16 MiB get 413, announced (Content-Length) or streamed (chunked)
        big = b'{"workflow": "' + b"x" * (16 * 1024 * 1024) + b'"}'
        auth = {"Authorization": f"Bearer {s3cret}", "Content-Type": "application/json"}
        r = plain.post("/v1/tasks", content=big, headers=auth)
        assert r.status_code == 413 and "larger than 16,777,216 bytes" in r.text
        chunks = (big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20))
        assert plain.post("/v1/tasks", content=chunks, headers=auth).status_code == 413
        assert plain.get("/v1/state").status_code == 200  # still serving
        # only the Bearer scheme carries the token: any other is no token at all
        for value in (f"Basic {s3cret}", s3cret, f"Token {s3cret}", "Bearer"):
            r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                           headers={"Authorization": value})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", value
            # refused before the body is read, as with no header at all
            r = plain.post("/v1/tasks", content=b"{not json",
                           headers={"Authorization": value, "Content-Type": "application/json"})
            assert r.status_code == 401, value
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": f"bearer {s3cret}"})  # the scheme is any case
        assert r.status_code == 201
        # an announced oversized body is refused as soon as its headers are in,
        # before any of it is sent (the server does not wait for the body)
        with socket.create_connection(("127.0.0.1", d.info["port"])) as sock:
            sock.settimeout(20)
            sock.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + s3cret.encode() + b"\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: 20000000\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 413")
        plain.close()
        assert d.stop() == 0


def test_a_token_set_on_loopback_is_enforced_the_same_way(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--token", "T0k") as d:
        assert d.info["auth"] is True
        plain = httpx.Client(base_url=d.url, timeout=30)
        r = plain.post("/v1/tasks", json={"workflow": "chain3"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": "Bearer x"})
        assert r.status_code == 403
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": "Basic T0k"})
        assert r.status_code == 401
        assert plain.patch("/v1/params", json={"beta": 1}).status_code == 401
        assert plain.get("/v1/state").status_code == 200  # reads stay open
        r = plain.post("/v1/tasks", json={"workflow": "chain3"},
                       headers={"Authorization": "Bearer T0k"})
        assert r.status_code == 201
        plain.close()
        assert d.stop() == 0
    with Daemon(tmp_path / "open") as d:  # no token on loopback: nothing to send
        assert d.info["auth"] is False
        assert d.http.post("/v1/tasks", json={"workflow": "chain3"}).status_code == 201
        assert d.stop() == 0


def test_a_non_loopback_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "topasd.cli", "start", "--host", "0.0.0.0",
                          "--port", "0", "--db", str(tmp_path / "x.db")], cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("error: host '0.0.0.0' is not a loopback address")
    assert "Traceback" not in res.stderr and not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("how", ["budget", "workflow", "rate"])
def test_a_workflow_that_can_never_fit_stops_the_start(tmp_path: Path, how: str) -> None:
    """Every request of chain3 needs its 4,000-token prefix; a spec's 50,000-token
    prefix exceeds the 18,000-token pool: the daemon would only skip or refuse
    all their work, so it does not start (one line, exit 2, no log file). Nor
    does one whose first arrival lies beyond the bound on times."""
    fix = "raise --budget"
    if how == "budget":
        args = ["--workload", "chain3", "--budget", "1000"]
        says = "workflow 'chain3', stage 'a': even its smallest request needs 4500"
    elif how == "rate":
        args = ["--workload", "chain3", "--rate", "1e-300"]
        says, fix = "arrival rate 1e-300 task/s", "give a --rate of at least"
    else:
        spec = tmp_path / "big.json"
        spec.write_text(json.dumps({"name": "big", "agents": {"X": {"prefix_tokens": 50_000}},
                                    "stages": [{"name": "s", "agent": "X"}]}))
        args = ["--workflow", str(spec)]
        says = "workflow 'big', stage 's': even its smallest request needs 50512"
    res = subprocess.run([sys.executable, "-m", "topasd.cli", "start", "--port", "0",
                          "--db", str(tmp_path / "x.db"), *args], cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
    assert fix in lines[0] and not (tmp_path / "x.db").exists()


def test_sigterm_lets_running_work_finish_and_exits_0_with_the_store_intact(
        tmp_path: Path) -> None:
    # paced at 50x: a chain3 stage of 300 tokens takes ~15 engine s, ~0.3 s of wall
    with Daemon(tmp_path, "--workload", "chain3", "--rate", "2", "--grace", "60",
                speed="50") as d:
        d.wait_for(lambda s: s["counts"]["requests_running"] > 0)
        done: dict[str, Any] = {}

        def slow_call() -> None:
            done["r"] = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, json={
                "model": "m", "max_tokens": 2000,  # ~90 engine s: in sight of /v1/state
                "messages": [{"role": "user", "content": "x"}]})

        th = threading.Thread(target=slow_call)
        th.start()
        # SIGTERM once the plain call (agent "default") is in the engine
        d.wait_for(lambda s: "default" in s["waiting"] or "default" in s["running"])
        before = d.state()
        assert d.stop(signal.SIGTERM) == 0
        th.join(30)
    assert done["r"].status_code == 200  # the call in flight at SIGTERM was served
    assert "listening on" in d.log.read_text()
    with Store(d.db, create=False) as store:
        assert store.integrity() == "ok"
        run = q.get_run(store.db)
        assert run.status == "done" and run.finished_ts is not None and run.error is None
        counts = q.counts(store.db, run.id)
        assert counts["engine_events"] == run.events and counts["decisions"] == run.decisions
        rows = q.tasks(store.db, run.id)
        in_flight_then = {t["id"] for t in before["tasks"]}
        finished = {r.task_id for r in rows if r.completion is not None}
        assert in_flight_then <= finished  # work running at SIGTERM finished
        assert all(r.completion is not None for r in rows)  # no task left behind
        assert store.db.execute("SELECT count(*) FROM requests WHERE run_id = ? AND finished "
                                "IS NULL", [run.id]).fetchone()[0] == 0
    assert not d.runtime.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_drains_and_logs_everything(
        tmp_path: Path, sig: int) -> None:
    """Ctrl-C in a terminal (or `timeout`, or a service manager) signals the
    daemon's whole process group: the decision-log writer, in a session of its
    own, keeps writing while the daemon drains, and the run ends clean (under
    load too, when the signal can arrive while the writer is still starting)."""
    with Daemon(tmp_path, "--workload", "chain3", "--rate", "2", "--grace", "60",
                speed="50", own_group=True) as d:
        d.wait_for(lambda s: s["counts"]["requests_running"] > 0)
        assert d.stop(sig, group=True) == 0, d.log.read_text(errors="replace")
    with Store(d.db, create=False) as store:
        assert store.integrity() == "ok"
        run = q.get_run(store.db)
        assert run.status == "done" and run.error is None
        counts = q.counts(store.db, run.id)
        assert counts["decisions"] == run.decisions > 0
        assert counts["engine_events"] == run.events
        rows = q.tasks(store.db, run.id)
        assert rows and all(r.completion is not None for r in rows)
    assert not d.runtime.exists()


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_the_api_page_renders_with_no_network_but_the_daemon(tmp_path: Path) -> None:
    """/docs serves Swagger UI's assets itself (it loaded them from a CDN, so on
    an offline GPU host the page stayed blank): headless Chromium, with every
    host but 127.0.0.1 unresolvable, renders every endpoint."""
    with Daemon(tmp_path) as d:
        for page in ("/docs", "/redoc"):
            html = d.http.get(page).text
            assert re.findall(r'(?:src|href)="(https?://[^"]*)"', html) == [], page
        dom = dump_dom(f"{d.url}/docs", offline=True)
        paths = set(re.findall(r'data-path="([^"]+)"', dom))
        assert {"/v1/tasks", "/v1/params", "/v1/chat/completions", "/v1/state"} <= paths
        assert d.stop() == 0


def test_event_stream_and_metrics(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag4", "--rate", "0.5", "--tasks", "30") as d:
        events: list[tuple[str, dict[str, Any]]] = []
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": 0, "max_events": 60}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name in ("decision", "engine", "lag"):
                    events.append((name, json.loads(line[6:])))
        kinds = {n for n, _ in events}
        assert {"decision", "engine"} <= kinds and len(events) == 60
        assert any(e["kind"] == "task_arrive" for n, e in events if n == "engine")
        dec = [e for n, e in events if n == "decision"]
        assert [e["seq"] for e in dec] == sorted(e["seq"] for e in dec)
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": 0, "max_events": 5, "kinds": "request_finish"}) as r:
            data = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
        assert len(data) == 5 and {e["kind"] for e in data} == {"request_finish"}
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,  # no kind named: all
                          params={"since": 0, "max_events": 5, "kinds": ",,"}) as r:
            data = [x for x in r.iter_lines() if x.startswith("data: ")]
        assert len(data) == 5

        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 30)
        text = d.http.get("/metrics").text
        metrics = {s.name + str(sorted(s.labels.items())): s.value
                   for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert metrics["topasd_tasks_finished_total[]"] == st["counts"]["tasks_finished"] == 30
        assert metrics["topasd_task_jct_seconds_count[('workflow', 'dag4')]"] == 30
        assert metrics["topasd_decisions_total[]"] == st["counts"]["decisions"]
        assert metrics["topasd_requests_finished_total[]"] == st["counts"]["requests_finished"]
        assert metrics["topasd_tasks_in_flight[]"] == 0
        assert "topasd_decision_latency_seconds_bucket[('le', '+Inf')]" in metrics
        assert "topasd_prefix_swaps_total[('direction', 'in')]" in metrics
        assert "topasd_preemptions_total[('by', 'policy')]" in metrics
        assert any(k.startswith("topasd_prefix_resident[") for k in metrics)
        assert d.stop() == 0


def test_the_event_bus_skips_a_slow_reader_ahead_and_counts_what_it_missed() -> None:
    from topasd.daemon.bus import EventBus

    bus = EventBus(size=4)
    for i in range(1, 11):
        bus.put("engine", i)
    missed, items = bus.since(0)
    assert missed == 6 and [seq for seq, _, _ in items] == [7, 8, 9, 10]
    assert [item for _, _, item in items] == [7, 8, 9, 10]
    assert bus.since(6) == (0, [(7, "engine", 7), (8, "engine", 8), (9, "engine", 9),
                                (10, "engine", 10)])
    assert bus.since(8) == (0, [(9, "engine", 9), (10, "engine", 10)])
    assert bus.since(10) == (0, [])
    assert bus.since(3, limit=2) == (3, [(7, "engine", 7), (8, "engine", 8)])


def test_events_carry_ids_and_since_resumes_exactly_after_one(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "chain3", "--tasks", "4") as d:
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] >= 4)
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": 0, "max_events": 40}) as r:
            every = sse_events(r.iter_lines())
        ids = [eid for eid, _, _ in every]
        assert ids == list(range(1, 41))  # every event has its id, none skipped
        for cursor in (1, 17, 35):  # resume after `cursor`: the next ones, none resent
            with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                              params={"since": cursor, "max_events": 3}) as r:
                got = sse_events(r.iter_lines())
            assert got == every[cursor:cursor + 3]
        # resuming at the newest id is allowed: the stream waits for what comes next
        newest = d.state()["event_id"]
        assert newest >= st["event_id"]
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": newest, "max_events": 1}) as r:
            assert r.status_code == 200
        assert d.http.post("/v1/tasks", json={"workflow": "chain3"}).status_code == 201
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": newest, "max_events": 1}) as r:
            got = sse_events(r.iter_lines())
        assert [eid for eid, _, _ in got] == [newest + 1]
        r = d.http.get("/v1/events", params={"since": d.state()["event_id"] + 1})
        assert r.status_code == 422 and "beyond the newest event id" in r.text
        assert d.stop() == 0


def test_a_reader_that_resumes_behind_the_ring_gets_a_lag_event(tmp_path: Path) -> None:
    from topasd.daemon.bus import BUS_SIZE

    with Daemon(tmp_path, "--workload", "chain3", "--rate", "0.5") as d:
        d.wait_for(lambda s: s["event_id"] > BUS_SIZE + 100)
        with httpx.stream("GET", f"{d.url}/v1/events", timeout=60,
                          params={"since": 1, "max_events": 2}) as r:
            got = sse_events(r.iter_lines())
        (none, lag, missed), (first, _, _), _ = got
        assert lag == "lag" and none is None and first is not None
        assert missed == {"missed": first - 2}  # ids 2 .. first-1 are gone
        assert d.stop() == 0


def test_pollers_share_one_state_snapshot_until_it_ages_or_a_change_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future

    from topasd.api.deps import STATE_MAX_AGE_S
    from topasd.api.deps import StateCache as _States

    class Loop:  # the service's state(): one engine-loop snapshot per call
        snapshots = 0

        def state(self, limit: int) -> Future[dict[str, Any]]:
            self.snapshots += 1
            fut: Future[dict[str, Any]] = Future()
            fut.set_result({"limit": limit, "snapshot": self.snapshots})
            return fut

    wall = [100.0]
    monkeypatch.setattr("topasd.api.deps.time.monotonic", lambda: wall[0])
    loop = Loop()
    states = _States(loop)  # type: ignore[arg-type]

    async def main() -> list[dict[str, Any]]:
        many = await asyncio.gather(*(states.get(50) for _ in range(20)))
        other = await states.get(7)
        wall[0] += STATE_MAX_AGE_S / 2
        again = await states.get(50)
        wall[0] += STATE_MAX_AGE_S
        aged = await states.get(50)
        states.invalidate()  # a change through the API
        fresh = await states.get(50)
        return [json.loads(b) for b in (*many, other, again, aged, fresh)]

    got = asyncio.run(main())
    assert [g["snapshot"] for g in got] == [1] * 20 + [2, 1, 3, 4]
    assert got[20]["limit"] == 7 and loop.snapshots == 4


def test_the_paced_clock_is_wall_time_times_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    from topasd.daemon.clock import PacedClock

    wall = [1000.0]
    monkeypatch.setattr("topasd.daemon.clock.time.monotonic", lambda: wall[0])
    clock = PacedClock(500.0)
    assert clock.now() == 0.0
    wall[0] += 0.2
    assert clock.now() == pytest.approx(100.0)  # 0.2 s of wall time at 500x


def test_paced_clock_follows_the_wall_clock_times_speed(tmp_path: Path) -> None:
    with Daemon(tmp_path, speed="500") as d:
        t1 = d.state()["t"]
        r = d.http.post("/v1/completions", json={"model": "m", "prompt": "go", "max_tokens": 20})
        assert r.status_code == 200
        meta = r.json()["topasd"]
        t2 = d.state()["t"]
        assert t1 < meta["t_ready"] < meta["t_finish"] <= t2  # engine time moves while idle
        assert d.state()["speed"] == 500.0
        assert d.stop(signal.SIGINT) == 0  # SIGINT to the daemon alone: a clean stop
    with Store(d.db, create=False) as store:
        assert q.get_run(store.db).status == "done"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_loopback_daemon_is_reachable_at_its_advertised_url(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--host", "::1") as d:
        assert d.url.startswith("http://[::1]:")
        st = subprocess.run([sys.executable, "-m", "topasd.cli", "status", "--runtime-file",
                             str(d.runtime)], env=clean_env(), capture_output=True, text=True,
                            timeout=60)
        assert st.returncode == 0 and f"running: {d.url}" in st.stdout, st.stderr
        assert d.stop() == 0


def test_detach_status_and_stop(tmp_path: Path) -> None:
    runtime = tmp_path / "rt.json"
    base = [sys.executable, "-m", "topasd.cli"]
    env = clean_env()
    res = subprocess.run([*base, "start", "--detach", "--port", "0", "--speed", "max",
                          "--runtime-file", str(runtime), "--db", str(tmp_path / "d.db"),
                          "--log-file", str(tmp_path / "d.log")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    info = json.loads(runtime.read_text())
    try:
        assert f"started in the background: {info['url']}" in res.stdout
        st = subprocess.run([*base, "status", "--runtime-file", str(runtime)], env=env,
                            capture_output=True, text=True, timeout=60)
        assert st.returncode == 0 and f"running: {info['url']} (pid {info['pid']})" in st.stdout
        assert "speed max" in st.stdout and "TOPAS search: pure Python: TOPASD_NATIVE=0" in \
            st.stdout  # tests/conftest.py runs the suite on the pure search
        again = subprocess.run([*base, "start", "--port", "0", "--runtime-file", str(runtime),
                                "--db", str(tmp_path / "e.db")], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "a daemon already runs" in again.stderr
        assert f"stop it with `topasd stop --runtime-file {runtime}`" in again.stderr
        sp = subprocess.run([*base, "stop", "--runtime-file", str(runtime)], env=env,
                            capture_output=True, text=True, timeout=90)
        assert sp.returncode == 0 and "stopped" in sp.stdout
        assert not runtime.exists()
        from topasd.cli.daemon import exited
        assert exited(info["pid"])  # "stopped" means the process is gone, not just its file
        gone = subprocess.run([*base, "status", "--runtime-file", str(runtime)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert gone.returncode == 2 and gone.stderr.startswith("error: no daemon running")
        as_json = subprocess.run([*base, "status", "--json", "--runtime-file", str(runtime)],
                                 env=env, capture_output=True, text=True, timeout=60)
        reply = json.loads(as_json.stdout)  # a script gets JSON either way
        assert as_json.returncode == 2 and reply["running"] is False
        assert reply["daemon"] is None and reply["error"].startswith("no daemon running")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(info["pid"], signal.SIGKILL)


def test_a_foreground_daemon_also_logs_to_its_log_file(tmp_path: Path) -> None:
    log = tmp_path / "fg.log"
    with Daemon(tmp_path, "--log-file", str(log), "--log-level", "info") as d:
        assert d.stop() == 0
    text = log.read_text()  # once each: stderr is not this file
    assert text.count("listening on") == 1 and text.count("topasd stopped") == 1
    assert "topasd stopped" in d.log.read_text()  # and stderr still has it


def test_stop_says_why_it_waits_and_a_second_stop_ends_the_grace(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "topasd.cli"]
    with Daemon(tmp_path, "--workload", "chain3", "--rate", "2", "--grace", "120",
                speed="1") as d:
        d.wait_for(lambda s: s["counts"]["requests_running"] > 0)
        first = subprocess.run([*base, "stop", "--runtime-file", str(d.runtime), "--timeout",
                                "2"], env=clean_env(), capture_output=True, text=True, timeout=60)
        again = f"`topasd stop --runtime-file {d.runtime}` again stops it now"
        assert first.returncode == 2, first.stderr
        assert "is letting running work finish" in first.stderr and again in first.stderr
        assert "did not exit within 2 s" in first.stderr
        second = subprocess.run([*base, "stop", "--runtime-file", str(d.runtime)],
                                env=clean_env(), capture_output=True, text=True, timeout=60)
        assert second.returncode == 0 and "stopped" in second.stdout, second.stderr
        assert d.proc.wait(30) == 0


def test_a_call_the_engine_refuses_leaves_no_task_open(tmp_path: Path) -> None:
    """The engine may refuse a request the daemon's checks let through (vLLM
    rounds KV up to whole blocks): the call fails, and the task it opened is
    dropped with a logged reason instead of staying in flight forever."""
    from topasd.config import load_settings
    from topasd.daemon.calls import CallSpec
    from topasd.daemon.service import Service
    from topasd.model import TopasError

    settings = load_settings({"db": str(tmp_path / "x.db"), "speed": "max"}, environ={})
    svc = Service(settings.settings)

    def refuse(request: Any) -> None:
        raise TopasError(f"request {request.id} needs more KV in whole blocks")

    svc.backend.submit = refuse  # type: ignore[method-assign]
    svc.start()
    try:
        spec = CallSpec(system_tokens=10, system_key="k", input_tokens=5, output_tokens=5,
                        task_key="job", agent="solo")
        with pytest.raises(TopasError, match="whole blocks"):
            svc.submit_call(spec).result(timeout=30)
        state = svc.state().result(timeout=30)
        assert state["counts"]["tasks_in_flight"] == 0
        assert state["counts"]["tasks_abandoned"] == 1
    finally:
        svc.close()
    with Store(tmp_path / "x.db", create=False) as store:
        rows = list(store.db.query(
            "SELECT kind, task_id, note FROM engine_events WHERE kind LIKE 'task_%'"))
    assert [(r["kind"], r["note"]) for r in rows] == [
        ("task_arrive", "agent:solo"), ("task_abandon", "the engine refused its first call")]


def test_a_signal_while_the_engine_starts_stops_the_daemon_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM takes seconds to start: a SIGTERM meanwhile does not kill the daemon
    (exit 143, no log); it comes up, drains at once, and returns 0 with its run
    in the store."""
    from topasd.config import load_settings
    from topasd.daemon import process
    from topasd.daemon.service import Service

    class SlowStart(Service):
        def __init__(self, settings: Any) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the engine starts
            super().__init__(settings)

    monkeypatch.setattr(process, "Service", SlowStart)
    settings = load_settings({"port": 0, "db": str(tmp_path / "t.db"),
                              "runtime_file": str(tmp_path / "d.json")}, environ={}).settings
    def too_early(signum: int, frame: Any) -> None:  # what the signal met before
        raise AssertionError("SIGTERM came before serve() took it: the default action "
                             "would have killed the daemon")

    before = signal.signal(signal.SIGTERM, too_early)
    try:
        assert process.serve(settings) == 0
        assert signal.getsignal(signal.SIGTERM) is too_early  # handlers restored
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not (tmp_path / "d.json").exists()
    with Store(tmp_path / "t.db", create=False) as store:
        assert q.get_run(store.db).status == "done"


def test_the_runtime_file_and_the_state_name_the_same_start(tmp_path: Path) -> None:
    """`started_ts` identifies the daemon process (docs/api.md): the runtime
    file and GET /v1/state give the same value."""
    with Daemon(tmp_path) as d:
        state = httpx.get(f"{d.url}/v1/state", timeout=30).json()
        assert state["started_ts"] == d.info["started_ts"]
        assert d.stop() == 0
