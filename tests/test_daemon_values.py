"""Daemon-layer values, not just their presence: the Prometheus counters and
gauges against the decision log and the state, the params version and the
parameter log of PATCH /v1/params, the candidate list of /v1/decisions when
the chosen state is not the best-scoring one, and the recent decisions of
/v1/state. Every daemon runs the sim unpaced; nothing depends on wall time.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from store import Store
from store import queries as q
from tests.daemonkit import Daemon
from topasd.api import create_app
from topasd.config import load_settings
from topasd.daemon.bus import EventBus
from topasd.daemon.metrics import Metrics
from topasd.daemon.recorder import Recorder
from topasd.daemon.service import Service
from topasd.model import Candidate, Decision, ScoreTerms, TopasError

_LIMITS = itertools.count(7001)  # /v1/state caches a snapshot per limit: a new one is fresh


def _metrics(text: str) -> dict[str, float]:
    """Samples of a Prometheus exposition by `name[sorted labels]`."""
    return {s.name + str(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _fresh_state(http: httpx.Client | TestClient) -> dict[str, Any]:
    r = http.get("/v1/state", params={"limit": next(_LIMITS)})
    r.raise_for_status()
    return r.json()


def _settled(http: httpx.Client | TestClient, timeout: float = 60.0
             ) -> tuple[dict[str, float], dict[str, Any]]:
    """/metrics and a state snapshot of an engine at rest: no request or prefix
    move under way, and no event between the two state reads around /metrics."""
    deadline = time.monotonic() + timeout
    while True:
        before = _fresh_state(http)
        text = http.get("/metrics").text
        after = _fresh_state(http)
        c = before["counts"]
        if (c == after["counts"] and not c["requests_running"] and not c["requests_waiting"]
                and all(p["transfer"] is None for p in before["prefixes"])):
            return _metrics(text), before
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine did not settle; last counts {c}")
        time.sleep(0.05)


def _count(store: Store, run_id: int, kind: str) -> int:
    return store.db.execute("SELECT count(*) FROM engine_events WHERE run_id = ? AND kind = ?",
                            [run_id, kind]).fetchone()[0]


def test_swap_and_preemption_counters_match_the_decision_log(tmp_path: Path) -> None:
    """Swaps in/out and preemptions by policy/engine equal what the store logged:
    policy preemptions are the decisions' preempt lists, loads plus recomputes
    are their load lists, and each request row counts its own preemptions."""
    with Daemon(tmp_path, "--workload", "dag4", "--rate", "0.5", "--tasks", "30") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 30)
        metrics, st = _settled(d.http)
        assert d.stop() == 0
    with Store(d.db, create=False) as store:
        run_id = q.get_run(store.db).id
        assert q.counts(store.db, run_id)["engine_events"] == st["counts"]["events"]
        decisions = q.decisions(store.db, run_id)
        assert len(decisions) == st["counts"]["decisions"]
        by_policy = sum(len(x["preempt"] or []) for x in decisions)
        loads = sum(len(x["load"] or []) for x in decisions)
        per_request = store.db.execute(
            "SELECT sum(preemptions), sum(retractions) FROM requests WHERE run_id = ?",
            [run_id]).fetchone()
        swaps_out = _count(store, run_id, "prefix_offload_start")
        swaps_in = _count(store, run_id, "prefix_load_start")
        retracts = _count(store, run_id, "retract")
        preempts = _count(store, run_id, "preempt")

    pre = metrics["topasd_preemptions_total[('by', 'policy')]"]
    by_engine = metrics["topasd_preemptions_total[('by', 'engine')]"]
    assert pre == by_policy == per_request[0] == preempts
    assert by_engine == per_request[1] == retracts
    assert metrics["topasd_prefix_swaps_total[('direction', 'in')]"] == swaps_in
    assert metrics["topasd_prefix_swaps_total[('direction', 'out')]"] == swaps_out
    assert swaps_in + metrics["topasd_prefix_computes_total[]"] == loads
    # the workload exercises each counter, with different values (a swapped label shows)
    assert len({pre, by_engine}) == 2 and min(pre, by_engine) > 0
    assert len({swaps_in, swaps_out}) == 2 and min(swaps_in, swaps_out) > 0


def test_tasks_in_flight_counts_out_finished_and_abandoned_tasks(tmp_path: Path) -> None:
    """The gauge is the state's task book: tasks that finished or were abandoned
    (a first call the engine refused) are out of it, an application's task
    between its calls is in it."""
    settings = load_settings({"db": str(tmp_path / "s.db"), "speed": "max",
                              "task_timeout": 0}, environ={}).settings
    svc = Service(settings)
    engine_submit = svc.backend.submit

    def submit(request: Any) -> None:
        if request.agent == "refused":
            raise TopasError(f"request {request.id} needs more KV in whole blocks")
        engine_submit(request)

    svc.backend.submit = submit  # type: ignore[method-assign]
    svc.start()
    try:
        with TestClient(create_app(svc)) as http:
            small = {"input_tokens": 20, "output_tokens": 5}
            for _ in range(3):
                r = http.post("/v1/tasks", json={"workflow": "chain3", "stages": {
                    v: small for v in "abc"}})
                assert r.status_code == 201, r.text
            for key in ("keep-1", "keep-2"):  # stage a done; the application sends b later
                r = http.post("/v1/completions", json={
                    "model": "m", "prompt": "go", "max_tokens": 4,
                    "topasd": {"task_id": key, "workflow": "chain3", "stage": "a"}})
                assert r.status_code == 200 and not r.json()["topasd"]["task_done"], r.text
            r = http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4,
                                                   "topasd": {"agent": "refused"}})
            assert r.status_code == 422 and "whole blocks" in r.text
            deadline = time.monotonic() + 60
            while _fresh_state(http)["counts"]["tasks_finished"] < 3:
                assert time.monotonic() < deadline, "the submitted tasks did not finish"
                time.sleep(0.05)
            metrics, st = _settled(http)
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()
    c = st["counts"]
    assert (c["tasks_arrived"], c["tasks_finished"], c["tasks_abandoned"]) == (6, 3, 1)
    running = [t for t in st["tasks"] if t["status"] == "running"]
    assert sorted(t["client_task_id"] for t in running) == ["keep-1", "keep-2"]
    assert metrics["topasd_tasks_in_flight[]"] == c["tasks_in_flight"] == len(running) == 2
    assert metrics["topasd_tasks_arrived_total[]"] == 6
    assert metrics["topasd_tasks_finished_total[]"] == 3


def test_params_version_state_and_the_change_log_follow_each_patch(tmp_path: Path) -> None:
    """A PATCH that changes nothing leaves the version (and the log, and the change
    counter) alone; one that changes two parameters bumps it by one; /v1/state and
    /v1/params show the new values at once; a policy switch is logged from the
    first decision the new policy makes."""
    with Daemon(tmp_path, "--workload", "chain3", "--tasks", "4") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 4)
        h = d.http
        _settled(h)  # at rest: no decision comes between the changes below
        assert h.get("/v1/params").json()["version"] == 0
        replies = []

        def patch(body: dict[str, Any]) -> dict[str, Any]:
            cached = h.get("/v1/state", params={"limit": 3}).json()  # a snapshot to outdate
            r = h.patch("/v1/params", json=body)
            assert r.status_code == 200, r.text
            reply = r.json()
            replies.append(reply)
            st = h.get("/v1/state", params={"limit": 3}).json()  # the same limit: no stale copy
            assert (st["params_version"], st["policy"]) == (reply["version"], reply["policy"])
            assert st["params_version"] - cached["params_version"] == (1 if reply["changed"]
                                                                       else 0)
            got = h.get("/v1/params").json()
            assert (got["version"], got["policy"], got["params"]) == (
                reply["version"], reply["policy"], reply["params"])
            metrics = _metrics(h.get("/metrics").text)
            assert metrics["topasd_params_version[]"] == reply["version"]
            assert metrics["topasd_param_changes_total[]"] == sum(
                len(x["changed"]) for x in replies)
            return reply

        same = patch({"beta": 20.0, "M": 6})  # the defaults: nothing changes
        assert same["changed"] == [] and same["version"] == 0
        two = patch({"beta": 5, "M": 4})
        assert two["changed"] == ["beta", "m"] and two["version"] == 1
        assert (two["params"]["beta"], two["params"]["m"]) == (5.0, 4)
        again = patch({"beta": 5})
        assert again["changed"] == [] and again["version"] == 1
        switch = patch({"policy": "lpm"})
        assert switch["changed"] == ["policy"] and switch["version"] == 2
        first = switch["effective_from_decision"]
        for _ in range(2):
            assert h.post("/v1/tasks", json={"workflow": "chain3"}).status_code == 201
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 6)
        by = {seq: h.get(f"/v1/decisions/{seq}").json() for seq in (first - 1, first)}
        assert d.stop() == 0
    assert (by[first - 1]["policy"], by[first]["policy"]) == ("topas", "lpm")
    # the decision before the switch came before every change (the engine was idle)
    assert (by[first - 1]["params_version"], by[first]["params_version"]) == (0, 2)
    with Store(d.db, create=False) as store:
        logged = [(c["name"], c["old"], c["new"], c["from_decision"])
                  for c in q.param_changes(store.db, q.get_run(store.db).id)]
    at = two["effective_from_decision"]
    assert at == first == same["effective_from_decision"]
    assert logged == [("beta", 20.0, 5.0, at), ("m", 6, 4, at),
                      ("policy", "topas", "lpm", first)]


def _hand_built(chosen: int) -> Decision:
    """A decision with five candidates of totals 3, 9, 1, 9, 5 (idx 0..4)."""
    totals = (3.0, 9.0, 1.0, 9.0, 5.0)
    cands = [Candidate(resident=(f"A{i}",), admit=(i,), preempt=(),
                       terms=ScoreTerms(j_admit=v + 1.0, j_move=1.0)) for i, v in enumerate(totals)]
    return Decision(t=4.5, policy="topas", admit=(chosen,), load=(f"A{chosen}",),
                    candidates=cands, chosen=chosen, seq=17, wall_ms=0.3)


class _Sink:
    """The store side of a recorder, kept in memory."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def decision(self, d: Decision) -> None:
        self.decisions.append(d)


def test_decision_detail_keeps_a_chosen_candidate_that_does_not_score_best() -> None:
    """Cut to `limit` candidates, best total first (ties by index), the chosen one
    takes the last place when it would not make the cut; limit 0 gives none."""
    rec = Recorder(_Sink(), EventBus(), Metrics(), lambda: 3)  # type: ignore[arg-type]
    rec.decision(_hand_built(chosen=2))  # the lowest total

    def idx(limit: int) -> list[int]:
        detail = rec.detail(17, limit)
        assert detail is not None and detail["chosen"] == 2 and detail["n_candidates"] == 5
        assert [c["won"] for c in detail["candidates"]] == [
            c["idx"] == 2 for c in detail["candidates"]]
        return [c["idx"] for c in detail["candidates"]]

    assert idx(1) == [2]
    assert idx(2) == [1, 2]
    assert idx(3) == [1, 3, 2]
    assert idx(4) == [1, 3, 4, 2]
    assert idx(5) == idx(50) == [1, 3, 4, 0, 2]
    assert idx(0) == []
    detail = rec.detail(17, 2)
    assert detail is not None and detail["params_version"] == 3
    assert [c["total"] for c in detail["candidates"]] == [9.0, 1.0]

    best = Recorder(_Sink(), EventBus(), Metrics(), lambda: 0)  # type: ignore[arg-type]
    best.decision(_hand_built(chosen=3))  # ties the best total, after it by index
    top = best.detail(17, 1)
    assert top is not None and [c["idx"] for c in top["candidates"]] == [3]
    two = best.detail(17, 2)
    assert two is not None and [c["idx"] for c in two["candidates"]] == [1, 3]


def test_recent_decisions_are_the_newest_ones_up_to_the_limit(tmp_path: Path) -> None:
    """/v1/state's `recent_decisions` with limit=2 are the last two decisions
    (oldest of them first, as the console's feed appends), as the log has them."""
    with Daemon(tmp_path, "--workload", "chain3", "--tasks", "4") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 4)
        _settled(d.http)  # at rest: both reads below see the same decisions
        st = d.state(limit=2)
        wide = d.state(limit=5)
        assert d.stop() == 0
    n = st["counts"]["decisions"]
    assert n == wide["counts"]["decisions"] > 5
    assert [x["seq"] for x in st["recent_decisions"]] == [n - 1, n]
    assert [x["seq"] for x in wide["recent_decisions"]] == list(range(n - 4, n + 1))
    with Store(d.db, create=False) as store:
        run_id = q.get_run(store.db).id
        rows = [q.decision_row(store.db, run_id, seq) for seq in (n - 1, n)]
    for got, row in zip(st["recent_decisions"], rows, strict=True):
        assert got["t"] == row["t"] and got["admit"] == (row["admit"] or [])
        assert got["load"] == (row["load"] or []) and got["evict"] == (row["evict"] or [])


def test_a_decisions_holds_reach_its_detail_its_event_and_the_gauge() -> None:
    """The recorder passes `Decision.held` on: the detail lists them, the
    decision event counts them, and `Metrics.held` (`topasd_requests_held`)
    is the last decision's count."""
    bus, metrics = EventBus(), Metrics()
    rec = Recorder(_Sink(), bus, metrics, lambda: 0)  # type: ignore[arg-type]
    rec.decision(replace(_hand_built(chosen=1), held=(40, 41, 42)))
    detail = rec.detail(17, 0)
    assert detail is not None and detail["held"] == [40, 41, 42]
    assert rec.recent[-1].as_dict()["n_held"] == 3 and metrics.held == 3
    rec.decision(replace(_hand_built(chosen=1), seq=18))
    assert rec.recent[-1].as_dict()["n_held"] == 0 and metrics.held == 0
