"""The decision log's views (store/views.py, docs/decision-log.md) on a real
recorded run: each one's rows against the raw tables, the decision number on
every preemption event, and a parameter given as text matching an id."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from backends.sim.engine import SimBackend
from store import Store
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import generate_trace


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    """A TOPAS run of 40 DAG-4 tasks at a rate that makes it preempt."""
    path = tmp_path_factory.mktemp("views") / "run.db"
    wl = load_workload("dag4")
    store = Store(path)
    Run(generate_trace(wl.workflows, 0.3, 40, 2, name=wl.name), make_policy("topas"),
        SimBackend(get_profile("qwen2.5-32b-a100")), sink=store.sink("all")).execute()
    store.close()
    conn = sqlite3.connect(path)
    yield conn
    conn.close()


def all_rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    cur = conn.execute(sql, args)
    names = [c[0] for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_every_preemption_event_names_the_decision_that_made_it(db: sqlite3.Connection
                                                                ) -> None:
    events = all_rows(db, "SELECT * FROM engine_events WHERE kind = 'preempt'")
    assert len(events) >= 10  # the run preempts: the test means something
    for ev in events:
        assert ev["decision"] is not None
        (preempt,) = db.execute("SELECT preempt FROM decisions WHERE seq = ?",
                                [ev["decision"]]).fetchone()
        assert ev["request_id"] in json.loads(preempt)
    assert db.execute("SELECT count(*) FROM engine_events WHERE kind != 'preempt' AND "
                      "decision IS NOT NULL").fetchone()[0] == 0


def test_decision_actions_lists_each_thing_each_decision_did(db: sqlite3.Connection) -> None:
    want = []
    for seq, *lists in db.execute("SELECT seq, admit, preempt, load, evict FROM decisions"):
        for action, text in zip(("admit", "preempt", "load", "evict"), lists, strict=True):
            want += [(seq, action, x) for x in json.loads(text or "[]")]
    got = [(r["decision"], r["action"], r["request_id"] if r["agent"] is None else r["agent"])
           for r in all_rows(db, "SELECT * FROM decision_actions")]
    assert sorted(got, key=str) == sorted(want, key=str)
    assert {a for _, a, _ in got} == {"admit", "preempt", "load", "evict"}


def test_a_request_id_given_as_text_matches_as_sqlite_utils_p_sends_it(db: sqlite3.Connection
                                                                      ) -> None:
    rid = db.execute("SELECT request_id FROM engine_events WHERE kind = 'preempt'").fetchone()[0]
    database = Database(db)
    rows = list(database.query("SELECT decision FROM decision_actions WHERE action = 'preempt' "
                               "AND request_id = :rid", {"rid": str(rid)}))
    assert rows  # the JSON list text would not have matched a text parameter
    rows = list(database.query("SELECT * FROM preemption_log WHERE request_id = :rid",
                               {"rid": str(rid)}))
    assert rows and all(r["request_id"] == rid for r in rows)


def test_preemption_log_has_one_row_per_preemption_with_its_scores(db: sqlite3.Connection
                                                                  ) -> None:
    log = all_rows(db, "SELECT * FROM preemption_log ORDER BY t, request_id")
    n = db.execute("SELECT count(*) FROM engine_events WHERE kind IN ('preempt', 'retract')"
                   ).fetchone()[0]
    assert len(log) == n
    for row in log:
        req = all_rows(db, "SELECT r.task_id, r.stage, r.agent, tk.workflow FROM requests r "
                       "JOIN tasks tk USING (run_id, task_id) WHERE r.request_id = ?",
                       row["request_id"])[0]
        assert {k: row[k] for k in req} == req
        if row["by"] == "engine":
            assert row["decision"] is None
            continue
        chosen, = db.execute("SELECT total FROM decisions WHERE seq = ?",
                             [row["decision"]]).fetchone()
        best = db.execute("SELECT max(total) FROM candidates WHERE decision_seq = ? AND "
                          "won = 0", [row["decision"]]).fetchone()[0]
        assert row["chosen_total"] == chosen and row["best_rejected_total"] == best
        if best is not None:  # the highest total wins
            assert row["margin"] == pytest.approx(chosen - best) and row["margin"] >= 0


def test_an_older_log_finds_the_decision_through_the_actions(tmp_path: Path,
                                                           db: sqlite3.Connection) -> None:
    """Events written before m005 carry no decision: the view finds it."""
    before = all_rows(db, "SELECT t, request_id, decision FROM preemption_log")
    db.execute("SAVEPOINT old")
    db.execute("UPDATE engine_events SET decision = NULL")
    after = all_rows(db, "SELECT t, request_id, decision FROM preemption_log")
    db.execute("ROLLBACK TO old")
    db.execute("RELEASE old")
    assert after == before


def test_request_and_task_logs_add_up(db: sqlite3.Connection) -> None:
    reqs = all_rows(db, "SELECT * FROM request_log")
    assert len(reqs) == db.execute("SELECT count(*) FROM requests").fetchone()[0]
    for r in reqs:
        assert r["queue_s"] == pytest.approx(r["admitted"] - r["ready"])
        assert r["e2e_s"] == pytest.approx(r["finished"] - r["ready"])
        assert r["workflow"] == "dag4"
    tasks = all_rows(db, "SELECT * FROM task_log")
    assert len(tasks) == 40
    for t in tasks:
        mine = [r for r in reqs if r["task_id"] == t["task_id"]]
        assert t["requests"] == len(mine)
        assert t["queue_s"] == pytest.approx(sum(r["queue_s"] for r in mine))
        assert t["preemptions"] == sum(r["preemptions"] for r in mine)
        assert t["jct"] == pytest.approx(t["completion"] - t["arrival"])
