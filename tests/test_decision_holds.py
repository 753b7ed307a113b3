"""The requests a decision held out of W_t (`Decision.held`: TOPAS's
`phases` and `lot_size`) in a real decision log: the column, the
`decision_actions` view, a task's request trails and the console's words,
and a log written before the column (migration m006)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlite_utils import Database

from backends.sim.engine import SimBackend
from console.app import ConsoleApp
from console.gantt import build_gantt
from console.snapshot import DecisionRow, detail_from_store, task_from_api
from console.sources import ReplaySource
from console.widgets.decisions import (
    ACTIONS_WIDTH,
    DecisionDetailView,
    action_runs,
    fit_runs,
    held_phrase,
)
from store import Store
from store import queries as q
from store.schema import MIGRATIONS, migrate
from topasd.model import Decision, EngineView
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run, RunInfo
from topasd.scheduler.params import TopasParams
from topasd.scheduler.topas import TopasPolicy
from workflows.generator import case_trace, draw_workload


class Recording(TopasPolicy):
    """TOPAS that keeps every decision it made and the holds `unripe` gave."""

    def __init__(self) -> None:
        super().__init__(TopasParams(phases=1.0))
        self.made: list[tuple[Decision, frozenset[int]]] = []

    def decide(self, view: EngineView) -> Decision:
        held = self.unripe(view)
        d = super().decide(view)
        self.made.append((d, held))
        return d


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Recording, Path]]:
    """A burst of 100 generated chain tasks, whose backlog makes `phases` hold."""
    path = tmp_path_factory.mktemp("holds") / "run.db"
    policy = Recording()
    store = Store(path)
    trace = case_trace(draw_workload("chain", 6), "burst", 100, 0.05, 6)
    Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)),
        sink=store.sink("top:3")).execute()
    store.close()
    yield policy, path


def test_each_decision_holds_what_the_rule_held_and_admits_none_of_it(
        run: tuple[Recording, Path]) -> None:
    policy, _ = run
    assert sum(1 for d, _ in policy.made if d.held) >= 10  # the burst holds: the test means it
    for d, held in policy.made:
        assert d.held == tuple(sorted(held))
        assert held.isdisjoint(d.admit)


def test_the_log_keeps_every_hold_even_on_a_compact_no_op(run: tuple[Recording, Path]) -> None:
    policy, path = run
    with sqlite3.connect(path) as conn:
        rows = {seq: (held, n, noop) for seq, held, n, noop in conn.execute(
            "SELECT seq, held, n_held, noop FROM decisions")}
        hold_rows = conn.execute("SELECT decision, request_id FROM decision_actions "
                                 "WHERE action = 'hold'").fetchall()
    assert len(rows) == len(policy.made)
    for seq, (d, _) in enumerate(policy.made, 1):  # the log numbers decisions from 1
        held, n, _ = rows[seq]
        assert (json.loads(held) if held else []) == list(d.held)
        assert n == len(d.held)
    assert any(n and noop for _, n, noop in rows.values())  # a no-op that held requests
    assert sorted(hold_rows) == sorted((seq, rid) for seq, (d, _) in enumerate(policy.made, 1)
                                       for rid in d.held)


def test_a_request_trail_counts_the_decisions_that_held_it(run: tuple[Recording, Path]
                                                           ) -> None:
    policy, path = run
    holds: dict[int, list[int]] = {}
    for seq, (d, _) in enumerate(policy.made, 1):
        for rid in d.held:
            holds.setdefault(rid, []).append(seq)
    rid, seqs = max(holds.items(), key=lambda kv: len(kv[1]))
    db = Database(path)
    task_id = db.execute("SELECT task_id FROM requests WHERE request_id = ?", [rid]).fetchone()[0]
    end = db.execute("SELECT max(t) FROM decisions").fetchone()[0]
    answer = q.task_at(db, 1, task_id, end)
    assert answer is not None
    trail = next(r for r in answer["requests"] if r["id"] == rid)
    assert (trail["held"], trail["last_held"]) == (len(seqs), max(seqs))
    assert all(d["action"] in ("admit", "preempt") for d in trail["decisions"])
    detail = task_from_api(answer)
    assert (max(seqs), "hold", len(seqs)) in [(s, a, r.held) for s, a, r in detail.decisions()
                                               if r.id == rid]


def test_the_console_names_what_a_decision_held(run: tuple[Recording, Path]) -> None:
    policy, path = run
    seq, d = max(((seq, d) for seq, (d, _) in enumerate(policy.made, 1)),
                 key=lambda sd: len(sd[1].held))
    db = Database(path)
    row = q.decision_row(db, 1, seq)
    ids = [*(row["admit"] or ()), *(row["preempt"] or ()), *row["held"]]
    detail = detail_from_store(row, q.candidates(db, 1, seq), "topas",
                               q.request_names(db, 1, ids))
    assert detail.held == d.held and detail.row.n_held == len(d.held)
    phrase = held_phrase(detail)
    assert phrase is not None and f"held {len(d.held)}" in phrase.plain
    agents = {db.execute("SELECT agent FROM requests WHERE request_id = ?", [rid]).fetchone()[0]
              for rid in d.held}
    assert all(f"{a} ×" in phrase.plain for a in agents)
    assert (f"h{len(d.held)}", "yellow") in action_runs(detail.row)


def test_a_log_from_before_holds_reads_as_none_held(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = Database(path)
    before = [name for name, _ in MIGRATIONS].index("m006_decision_held")
    migrate(db, upto=MIGRATIONS[before - 1][0])
    db["runs"].insert({"id": 1, "status": "done", "policy": "topas", "backend": "sim"})
    db["decisions"].insert({"run_id": 1, "seq": 1, "t": 0.0, "noop": 0, "admit": "[7]",
                            "preempt": "[]", "load": "[]", "evict": "[]"})
    assert migrate(db) == ["m006_decision_held"]
    row = q.decision_row(db, 1, 1)
    assert (row["held"], row["n_held"], row["admit"]) == (None, None, [7])
    assert [r["action"] for r in db.query("SELECT action FROM decision_actions")] == ["admit"]


def test_the_console_replay_shows_the_holds_of_a_decision(run: tuple[Recording, Path]) -> None:
    """Through Pilot: the replayed decision's detail says what it held, by agent."""
    _, path = run
    db = Database(path)
    seq, held = max(((r["seq"], json.loads(r["held"])) for r in db.query(
        "SELECT seq, held FROM decisions WHERE n_held > 0")), key=lambda sh: len(sh[1]))
    agents = sorted({a for (a,) in db.execute(
        f"SELECT agent FROM requests WHERE request_id IN ({','.join('?' * len(held))})",
        held).fetchall()})
    out: dict[str, str] = {}

    async def main() -> None:
        app = ConsoleApp(replay=ReplaySource(path))
        async with app.run_test(size=(160, 48)) as pilot:
            app.goto_decision(seq)
            await pilot.pause()
            view = app.dashboard.query_one(DecisionDetailView)
            await pilot.pause()
            out["summary"] = str(view.query_one("#detail-summary").render())

    asyncio.run(main())
    assert f"held {len(held)}:" in out["summary"]
    assert all(f"{a} ×" in out["summary"] for a in agents)


def test_a_no_op_that_only_held_is_a_compact_row_that_keeps_its_holds(tmp_path: Path
                                                                       ) -> None:
    store = Store(tmp_path / "compact.db")
    sink = store.sink("all")
    sink.run_started(RunInfo("topas", "sim", "small", {}, "chain3", 1, {}))
    sink.decision(Decision(0.5, "topas", held=(3, 5)))  # no action, no candidate
    sink.decision(Decision(1.0, "topas"))
    sink.run_finished(None, None)
    store.close()
    with sqlite3.connect(tmp_path / "compact.db") as conn:
        rows = conn.execute("SELECT seq, noop, admit, held, n_held FROM decisions "
                            "ORDER BY seq").fetchall()
        holds = conn.execute("SELECT decision, request_id FROM decision_actions "
                             "WHERE action = 'hold'").fetchall()
    assert rows == [(1, 1, None, "[3,5]", 2), (2, 1, None, None, 0)]  # compact: no lists
    assert holds == [(1, 3), (1, 5)]


def test_the_feed_shows_the_holds_however_full_the_actions_are() -> None:
    row = DecisionRow(seq=1, t=0.0, admit=(1, 2), preempt=(), load=("planner",),
                      evict=("reviewer",), blocked=True, wall_ms=0.1, n_candidates=3,
                      total=1.0, n_held=123)
    shown = "".join(t for t, _ in fit_runs(action_runs(row), ACTIONS_WIDTH))
    assert "h123" in shown and "⇣1" in shown  # prefixes counted to make room
    assert "  " not in shown
    idle = DecisionRow(seq=2, t=0.0, admit=(), preempt=(), load=(), evict=(), blocked=False,
                       wall_ms=0.1, n_candidates=0, total=None, n_held=7)
    assert "".join(t for t, _ in action_runs(idle)) == "no-op h7"


def test_the_gantt_chart_says_how_often_a_queued_request_was_held(
        run: tuple[Recording, Path]) -> None:
    """Each queued bar's hover counts the decisions inside that stay that held
    its request, as the log lists them."""
    _, path = run
    with Store(path) as store:
        g = build_gantt(store, view="agents", max_bars=100_000)
        holds = q.request_holds(store.db, 1)
        waits = {(w.request_id, w.start): w for w in q.request_waits(store.db, 1)}
    assert g.mode == "detailed"
    said = 0
    for trace in g.figure.data:
        if trace.meta != "queued":
            continue
        for start, hover in zip(trace.base, trace.hovertext, strict=True):
            rid = int(hover.split("request ")[1].split("<")[0])
            w = waits[(rid, start)]
            n = sum(w.start <= t <= w.end for t in holds.get(rid, ()))
            assert (f"held out of the queue by {n} decision" in hover) == (n > 0)
            said += n > 0
    assert said >= 5  # the burst holds: the test means it
