"""What the daemon's API gained for the console: `GET /v1/decisions/{seq}`
(a decision with its candidate states) and, in `/v1/state`, each task's
expected remaining path and running/waiting stages, prefix moves under way,
headline statistics and the event id to resume the stream from.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from store import Store
from store import queries as q
from tests.daemonkit import Daemon
from topasd.daemon.metrics import Metrics
from topasd.model import EngineEvent, EventKind
from topasd.profiles import get_profile


def test_decision_detail_matches_the_store(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag4", "--tasks", "8", "--log-candidates", "all",
                speed="max") as d:
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] == 8)
        last = st["counts"]["decisions"]
        seqs = [s for s in range(1, last + 1)]
        details = {s: d.http.get(f"/v1/decisions/{s}", params={"candidates": 1000}).json()
                   for s in seqs}
        one = d.http.get(f"/v1/decisions/{last}", params={"candidates": 1}).json()
        missing = d.http.get(f"/v1/decisions/{last + 1}")
        zero = d.http.get("/v1/decisions/0")
        assert d.stop() == 0
    assert missing.status_code == 404 and zero.status_code == 404
    assert f"1..{last}" in missing.json()["error"]["message"]
    store = Store(d.db, create=False)
    run_id = d.info["run_id"]
    for seq, det in details.items():
        row = q.decision_row(store.db, run_id, seq)
        assert det["t"] == pytest.approx(row["t"])
        assert det["admit"] == (row["admit"] or []) and det["evict"] == (row["evict"] or [])
        assert det["n_candidates"] == row["n_candidates"] == len(det["candidates"])
        stored = {c["idx"]: c for c in q.candidates(store.db, run_id, seq)}
        totals = [c["total"] for c in det["candidates"]]
        assert totals == sorted(totals, reverse=True)
        for c in det["candidates"]:
            s = stored[c["idx"]]
            for term in ("j_admit", "j_move", "j_redo", "j_revoke", "v_reuse", "total"):
                assert c[term] == pytest.approx(s[term])
            assert c["won"] == bool(s["won"]) == (c["idx"] == det["chosen"])
            assert c["total"] == pytest.approx(c["j_admit"] - c["j_move"] - c["j_redo"]
                                               - c["j_revoke"] + c["v_reuse"])
    assert [c["idx"] for c in one["candidates"]] == [one["chosen"]]  # the chosen one stays
    store.close()


def test_state_shows_remaining_path_stages_and_stats(tmp_path: Path) -> None:
    # a crawling clock, no observations yet: E[remaining] is the profiled path
    # a -> max(b, c) -> d of three equal stages, less what stage a already ran (the
    # engine's first step may have run past the clock: at most t)
    with Daemon(tmp_path, "--grace", "0", speed="0.001") as d:
        r = d.http.post("/v1/tasks", json={"workflow": "dag4"})
        assert r.status_code == 201
        task = r.json()["id"]
        # the state once the submission's decision is in it: the POST returns when the
        # engine loop has run the command, the decision follows the loop's commands, and
        # a state asked meanwhile can be answered first
        st = d.wait_for(lambda s: any(t["id"] == task and t["stages_running"]
                                      for t in s["tasks"]), limit=50)
        assert d.stop() == 0
    item = next(t for t in st["tasks"] if t["id"] == task)
    stage = get_profile("qwen2.5-32b-a100").cost_hints().t_request(200, 300)
    assert 3 * stage - st["t"] - 1e-6 <= item["remaining_s"] <= 3 * stage + 1e-6
    assert st["t"] < stage / 2
    # after the submission's decision: stage a runs, its agent A alone is on the GPU,
    # and a move under way is the one the recorded events give at t (the crawling
    # clock adds none before the stop)
    assert (item["stages_running"], item["stages_waiting"]) == (["a"], [])
    assert [(p["agent"], p["location"]) for p in st["prefixes"]] == [("A", "gpu")]
    with Store(d.db, create=False) as store:
        replay = q.RunReplay(store.db, d.info["run_id"])
        (was,) = replay.state_at(st["t"]).prefixes
    shown = st["prefixes"][0]["transfer"]
    assert (was.agent, was.transfer) == ("A", shown and shown["kind"])
    if shown is not None:
        assert shown["since"] <= st["t"]
        assert shown["until"] == pytest.approx(was.transfer_until)
    # no task finished; the decision latency is that of the decisions made so far
    n = st["counts"]["decisions"]
    walls = [x["wall_ms"] for x in st["recent_decisions"]]
    assert 1 <= n == len(walls) <= 50
    assert st["stats"] == {"tasks_finished": 0, "throughput_task_s": 0.0, "jct_mean_s": None,
                           "jct_p99_s": None,
                           "decision_ms_mean": pytest.approx(sum(walls) / n),
                           "decision_ms_p99": pytest.approx(float(np.percentile(walls, 99))),
                           "by_workflow": {}}  # nothing finished yet
    assert isinstance(st["event_id"], int) and st["started_ts"] <= time.time()


def test_state_stats_match_the_finished_tasks(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "chain3", "--tasks", "5", speed="max") as d:
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] == 5)
        events = d.http.get("/v1/events", params={"since": 0, "kinds": "decision",
                                                  "max_events": 1}).text
        assert d.stop() == 0
    store = Store(d.db, create=False)
    jct = q.jct_stats(store.db, d.info["run_id"])
    stats = st["stats"]
    assert stats["tasks_finished"] == 5
    assert stats["jct_mean_s"] == pytest.approx(jct["mean_jct_s"])
    assert stats["jct_p99_s"] == pytest.approx(jct["p99_jct_s"])
    assert stats["throughput_task_s"] == pytest.approx(5 / st["t"])
    wall = [r["wall_ms"] for r in q.decisions(store.db, d.info["run_id"])]
    assert stats["decision_ms_mean"] == pytest.approx(sum(wall) / len(wall))
    assert "event: decision" in events
    # "late" is judged by the same per-workflow statistics live and in replay
    live = stats["by_workflow"]["chain3"]
    replayed = q.RunReplay(store.db, d.info["run_id"]).groups_at(st["t"])["chain3"]
    assert live["finished"] == replayed.finished == 5
    assert live["jct_p99_s"] == pytest.approx(replayed.jct_p99_s)
    assert {v: (x["finished"], pytest.approx(x["p99_s"])) for v, x in live["stages"].items()} \
        == dict(replayed.stages) and set(replayed.stages) == {"a", "b", "c"}
    store.close()


def test_metrics_track_prefix_moves() -> None:
    m = Metrics()

    def ev(t: float, kind: EventKind, agent: str = "A", value: float = 0.0) -> None:
        m.event(EngineEvent(t, kind, agent=agent, tokens=100, value=value))

    ev(1.0, EventKind.PREFIX_LOAD_START, value=0.5)
    assert m.transfers["A"].as_dict() == {"kind": "load", "since": 1.0, "until": 1.5}
    ev(1.5, EventKind.PREFIX_LOAD_END)
    assert "A" not in m.transfers
    ev(2.0, EventKind.PREFIX_COMPUTE_START, "B")
    assert m.transfers["B"].as_dict() == {"kind": "compute", "since": 2.0, "until": None}
    ev(2.5, EventKind.PREFIX_LOAD_END, "B")  # another kind's end leaves it
    assert m.transfers["B"].kind == "compute"
    ev(3.0, EventKind.PREFIX_COMPUTE_END, "B")
    ev(3.0, EventKind.PREFIX_OFFLOAD_START, "B", value=0.25)
    ev(3.1, EventKind.PREFIX_EVICT, "B")  # a backup under way outlives the eviction
    assert m.transfers["B"].kind == "offload"
    ev(3.25, EventKind.PREFIX_OFFLOAD_END, "B")
    ev(4.0, EventKind.PREFIX_COMPUTE_START, "C")
    ev(4.1, EventKind.PREFIX_EVICT, "C")  # a cancelled recompute ends
    assert m.transfers == {}


def test_a_brief_state_gives_the_console_the_same_snapshot(tmp_path: Path) -> None:
    """`/v1/state?brief=true`: waiting requests counted by agent, each task's
    active stages' first ready times in place of its stage table, no recent
    decisions; the console's snapshot of it is that of the full state."""
    from console.snapshot import snapshot_from_state
    from topasd.daemon.state import BRIEF_TASK, brief

    with Daemon(tmp_path, "--grace", "0", speed="10") as d:
        for _ in range(60):
            d.http.post("/v1/tasks", json={"workflow": "dag4"}).raise_for_status()
        d.wait_for(lambda s: s["counts"]["requests_waiting"] > 0)
        full_r = d.http.get("/v1/state", params={"limit": 500})
        brief_r = d.http.get("/v1/state", params={"limit": 500, "brief": "true"})
        assert d.stop() == 0
    full, short = full_r.json(), brief_r.json()
    assert full["recent_decisions"] and "recent_decisions" not in short
    assert sum(len(rs) for rs in full["waiting"].values()) > 0
    assert all(isinstance(n, int) for n in short["waiting"].values())
    assert {k for t in short["tasks"] for k in t} == {*BRIEF_TASK, "stages_since"}
    assert len(brief_r.content) < len(full_r.content) / 2
    reduced = brief(full)
    assert reduced["waiting"] == {a: len(rs) for a, rs in full["waiting"].items()}
    assert snapshot_from_state(reduced) == snapshot_from_state(full)
    assert any(r.stage_since for r in snapshot_from_state(full).tasks)

