"""The decision log on real SQLite files: schema and migrations, a replay whose
every decision, candidate and event is in the file and agrees with the run's
own metrics, candidate volume options, and crash safety under SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlite_utils import Database

from backends.sim.engine import SimBackend
from store import CandidateFilter, Store, StoreError
from store import queries as q
from store.schema import MIGRATIONS, MIGRATIONS_TABLE, migrate
from store.writer import CHILD
from topasd.cli import main
from topasd.model import (
    Candidate,
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    ScoreTerms,
)
from topasd.profiles import get_profile
from topasd.runner import Run, RunHooks, RunInfo, RunResult
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import Trace, generate_trace

# ------------------------------------------------------------------ helpers


class CandidatePolicy:
    """A baseline (lpm) whose decisions carry synthetic candidates: the chosen
    state (index 1) plus alternatives, one of them scoring higher than the
    chosen one, alternative i preempting the first i running requests. Every
    other no-op decision keeps no candidates, as a baseline."""

    def __init__(self, base: str = "lpm", alternatives: int = 3) -> None:
        self.inner = make_policy(base)
        self.name = f"{base}+candidates"
        self.alternatives = alternatives
        self.calls = 0

    def decide(self, view: EngineView) -> Decision:
        d = self.inner.decide(view)
        self.calls += 1
        if d.is_noop and self.calls % 2:
            return d
        resident = tuple(sorted((set(view.gpu_prefixes()) - set(d.evict)) | set(d.load)))
        chosen = Candidate(resident, d.admit, d.preempt,
                           ScoreTerms(j_admit=len(d.admit) + 1.0, j_move=0.5 * len(d.load),
                                      v_reuse=0.25))
        alts = [Candidate(resident[:i], d.admit[:i], tuple(r.id for r in view.running[:i]),
                          ScoreTerms(j_admit=100.0 if i == 2 else float(i), j_redo=1.0 + i,
                                     j_revoke=0.125 * i))
                for i in range(self.alternatives)]
        return replace(d, candidates=(alts[0], chosen, *alts[1:]), chosen=1)

    def observe(self, event: EngineEvent) -> None:
        self.inner.observe(event)


class Tee:
    """Forwards to a StoreSink and keeps every decision and event in memory."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.decisions: list[Decision] = []
        self.events: list[EngineEvent] = []

    def run_started(self, info: RunInfo) -> None:
        self.sink.run_started(info)

    def run_finished(self, result: RunResult | None, error: BaseException | None) -> None:
        self.sink.run_finished(result, error)

    def decision(self, decision: Decision) -> None:
        self.decisions.append(decision)
        self.sink.decision(decision)

    def event(self, event: EngineEvent) -> None:
        self.events.append(event)
        self.sink.event(event)


def small_trace(tasks: int = 12, workload: str = "dag4", rate: float | None = None) -> Trace:
    wl = load_workload(workload)
    return generate_trace(wl.workflows, rate or wl.operating_points[-1], tasks, seed=3,
                          name=wl.name)


def logged_run(path: Path, policy: Any, trace: Trace, spec: str = "all",
               profile: str = "small") -> tuple[Tee, RunResult, int]:
    store = Store(path)
    try:
        tee = Tee(store.sink(spec))
        assert isinstance(tee, RunHooks)
        result = Run(trace, policy, SimBackend(get_profile(profile)), sink=tee).execute()
        run_id = tee.sink.run_id
    finally:
        store.close()
    return tee, result, run_id


def rows(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    db = Database(path)
    try:
        return list(db.query(sql, args))
    finally:
        db.close()


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ------------------------------------------------------------ schema


def test_a_new_file_gets_every_migration_in_order_wal_and_indexes(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with Store(path) as store:
        assert store.integrity() == "ok"
        db = store.db
        recorded = [r["name"] for r in db.query(f"SELECT name FROM {MIGRATIONS_TABLE} "
                                                 "ORDER BY rowid")]
        assert recorded == [name for name, _ in MIGRATIONS]
        assert db.journal_mode == "wal"
        assert {"runs", "tasks", "requests", "decisions", "candidates", "engine_events",
                "param_changes"} <= set(db.table_names())
        indexes = {ix.name for t in ("engine_events", "decisions", "requests", "tasks")
                   for ix in db[t].indexes}
        assert {"ix_events_run", "ix_decisions_run_t", "ix_requests_run_agent",
                "ix_tasks_run_arrival"} <= indexes
        assert db["decisions"].pks == ["run_id", "seq"]
        assert db["candidates"].pks == ["run_id", "decision_seq", "idx"]
    with Store(path) as again:  # reopening applies nothing and keeps the records
        assert migrate(again.db) == []
        assert len(list(again.db.query(f"SELECT * FROM {MIGRATIONS_TABLE}"))) == len(MIGRATIONS)


def test_an_older_file_is_migrated_forward(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = Database(path)
    first = MIGRATIONS[0][0]
    assert migrate(db, upto=first) == [first]
    db["runs"].insert({"policy": "fcfs", "backend": "sim", "status": "done"})
    assert "ix_events_run" not in {ix.name for ix in db["engine_events"].indexes}
    db.close()
    with Store(path) as store:
        names = [r["name"] for r in store.db.query(f"SELECT name FROM {MIGRATIONS_TABLE}")]
        assert names == [name for name, _ in MIGRATIONS]
        assert "ix_events_run" in {ix.name for ix in store.db["engine_events"].indexes}
        assert [r.policy for r in q.runs(store.db)] == ["fcfs"]  # data kept


def test_the_tables_have_the_columns_store_columns_lists_old_files_too(tmp_path: Path) -> None:
    """store/columns.py is the one list: a new file and one migrated from the
    first migration hold exactly its columns, in its order, and every row the
    writer process inserts names columns of its table."""
    from store import columns

    old = Database(tmp_path / "old.db")
    migrate(old, upto=MIGRATIONS[0][0])
    old.close()
    for path in (tmp_path / "new.db", tmp_path / "old.db"):
        with Store(path) as store:
            for table in columns.TABLES:
                got = [r[1] for r in store.db.execute(f"PRAGMA table_info({table})")]
                assert got == list(columns.columns(table)), (path.name, table)
    for table, row in columns.ROWS.items():
        assert set(row) <= set(columns.columns(table)) and "run_id" not in row


def test_a_migration_that_fails_halfway_leaves_the_file_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each migration and its record commit together: a migration that dies
    after some of its statements (a crash, a full disk) leaves neither its
    tables nor its record, the runs already logged stay, and the next open
    applies it whole."""
    import store.schema

    path = tmp_path / "half.db"
    db = Database(path)
    first = MIGRATIONS[0][0]
    migrate(db, upto=first)
    db["runs"].insert({"policy": "fcfs", "backend": "sim", "status": "done"})

    def half_done(d: Database) -> None:
        d["extra"].create({"id": int}, pk="id")
        d["runs"].create_index(["policy"], index_name="ix_half")
        raise OSError("disk full")

    monkeypatch.setattr(store.schema, "MIGRATIONS", [*MIGRATIONS[:1], ("m002_half", half_done)])
    with pytest.raises(OSError, match="disk full"):
        store.schema.migrate(db)
    assert "extra" not in db.table_names()
    assert "ix_half" not in {ix.name for ix in db["runs"].indexes}
    assert store.schema.applied(db) == [first]
    db.close()
    monkeypatch.undo()
    with Store(path) as opened:
        assert store.schema.applied(opened.db) == [name for name, _ in MIGRATIONS]
        assert [r.policy for r in q.runs(opened.db)] == ["fcfs"]


def test_files_that_are_not_a_log_of_this_topasd_are_refused(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    with Store(newer) as store:
        store.db.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES ('m999_future', 'x')")
    with pytest.raises(StoreError, match="newer topasd"):
        Store(newer)
    other = tmp_path / "other.db"
    Database(other)["things"].insert({"a": 1})
    with pytest.raises(StoreError, match="not a topasd decision log"):
        Store(other)
    text = tmp_path / "text.db"
    text.write_text("hello, not sqlite\n" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store(text)
    with pytest.raises(StoreError, match="no such decision log"):
        Store(tmp_path / "missing.db", create=False)
    with pytest.raises(StoreError, match="expected all, none or top:N"):
        CandidateFilter.parse("top:0")


def test_a_log_locked_by_another_process_says_so(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    import store.db

    monkeypatch.setattr(store.db, "BUSY_TIMEOUT_MS", 100)
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="another process holds a write lock"):
            Store(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# ------------------------------------------------------------ a replay


def test_every_decision_candidate_and_event_is_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    tee, result, run_id = logged_run(path, CandidatePolicy(), small_trace())
    run = rows(path, "SELECT * FROM runs WHERE id = ?", (run_id,))[0]
    assert run["status"] == "done" and run["policy"] == "lpm+candidates"
    assert run["workload"] == "dag4" and run["seed"] == 3 and run["profile"] == "small"
    assert _loads(run["params"])["profile"]["budget_tokens"] == 4096
    assert _loads(run["summary"])["decisions"] == result.decisions

    decisions = rows(path, "SELECT * FROM decisions WHERE run_id = ? ORDER BY seq", (run_id,))
    assert len(decisions) == len(tee.decisions) == result.decisions == run["decisions"]
    assert [d["seq"] for d in decisions] == list(range(1, len(decisions) + 1))
    compact = with_candidates = 0
    for row, d in zip(decisions, tee.decisions, strict=True):
        assert row["t"] == d.t and row["wall_ms"] == pytest.approx(d.wall_ms)
        assert row["noop"] == int(d.is_noop) and row["n_candidates"] == len(d.candidates)
        assert row["blocked"] == int(d.blocked) and row["reservation"] == str(d.reservation)
        if d.is_noop and not d.candidates:  # the compact form
            compact += 1
            assert row["admit"] is None and row["total"] is None and row["n_admit"] == 0
            continue
        assert _loads(row["admit"]) == list(d.admit) and row["n_admit"] == len(d.admit)
        assert _loads(row["preempt"]) == list(d.preempt)
        assert _loads(row["load"]) == list(d.load) and _loads(row["evict"]) == list(d.evict)
        chosen = d.chosen_candidate
        assert chosen is not None and row["chosen"] == d.chosen == 1
        with_candidates += 1
        assert _loads(row["chosen_resident"]) == list(chosen.resident)
        for term in ("j_admit", "j_move", "j_redo", "j_revoke", "v_reuse", "total"):
            assert row[term] == pytest.approx(getattr(chosen.terms, term))
    assert compact > 0 and with_candidates > 0

    cands = rows(path, "SELECT * FROM candidates WHERE run_id = ? ORDER BY decision_seq, idx",
                 (run_id,))
    expected = [(seq, i, c) for seq, d in enumerate(tee.decisions, start=1)
                for i, c in enumerate(d.candidates)]
    assert len(cands) == len(expected) == run["candidates"]
    for row, (seq, i, c) in zip(cands, expected, strict=True):
        assert (row["decision_seq"], row["idx"]) == (seq, i)
        assert row["won"] == int(i == 1)
        assert _loads(row["resident"]) == list(c.resident)
        assert _loads(row["admit"]) == list(c.admit)
        assert _loads(row["preempt"]) == list(c.preempt)
        for term in ("j_admit", "j_move", "j_redo", "j_revoke", "v_reuse", "total"):
            assert row[term] == pytest.approx(getattr(c.terms, term))
    assert any(row["preempt"] != "[]" and row["j_redo"] != row["j_revoke"] for row in cands)

    events = rows(path, "SELECT * FROM engine_events WHERE run_id = ? ORDER BY id", (run_id,))
    assert len(events) == len(tee.events) == run["events"]
    for row, ev in zip(events, tee.events, strict=True):
        assert (row["t"], row["kind"], row["request_id"], row["task_id"], row["agent"],
                row["stage"], row["tokens"]) == (ev.t, str(ev.kind), ev.request_id,
                                                  ev.task_id, ev.agent, ev.stage, ev.tokens)

    tasks = rows(path, "SELECT * FROM tasks WHERE run_id = ? ORDER BY task_id", (run_id,))
    assert {t["task_id"]: t["completion"] - t["arrival"] for t in tasks} == pytest.approx(
        result.jct)
    assert all(t["workflow"] == "dag4" and t["jct"] == pytest.approx(result.jct[t["task_id"]])
               for t in tasks)
    with Store(path) as store:
        stats = q.jct_stats(store.db, run_id)
    summary = result.summary()
    for key in ("mean_jct_s", "p50_jct_s", "p99_jct_s"):
        assert stats[key] == pytest.approx(summary[key])

    reqs = rows(path, "SELECT * FROM requests WHERE run_id = ?", (run_id,))
    finishes = [ev for ev in tee.events if ev.kind is EventKind.REQUEST_FINISH]
    assert len(reqs) == len(finishes) == result.requests_finished
    by_id = {r["request_id"]: r for r in reqs}
    for ev in finishes:
        r = by_id[ev.request_id]
        assert r["finished"] == ev.t and r["output_tokens"] == ev.tokens
        assert r["task_id"] == ev.task_id and r["stage"] == ev.stage and r["agent"] == ev.agent
        assert r["ready"] <= r["admitted"] <= r["started"] <= r["finished"]
    ready = {ev.request_id: ev.tokens for ev in tee.events if ev.kind is EventKind.REQUEST_READY}
    assert {r["request_id"]: r["input_tokens"] for r in reqs} == ready  # from arrival on
    assert all(n > 0 for n in ready.values())
    lost = {kind: Counter(ev.request_id for ev in tee.events if ev.kind is kind)
            for kind in (EventKind.PREEMPT, EventKind.RETRACT)}
    assert {r["request_id"]: (r["preemptions"], r["retractions"]) for r in reqs} == {
        rid: (lost[EventKind.PREEMPT][rid], lost[EventKind.RETRACT][rid]) for rid in by_id}


def test_top_n_keeps_the_best_and_the_chosen_and_none_keeps_counts(tmp_path: Path) -> None:
    trace = small_trace(tasks=6)
    top = tmp_path / "top.db"
    tee, _, run_id = logged_run(top, CandidatePolicy(alternatives=4), trace, spec="top:1")
    assert rows(top, "SELECT log_candidates FROM runs")[0]["log_candidates"] == "top:1"
    for seq, d in enumerate(tee.decisions, start=1):
        got = rows(top, "SELECT idx, won FROM candidates WHERE run_id = ? AND decision_seq = ? "
                        "ORDER BY idx", (run_id, seq))
        if not d.candidates:
            assert got == []
            continue
        best = max(range(len(d.candidates)), key=lambda i: d.candidates[i].terms.total)
        assert [g["idx"] for g in got] == sorted({best, 1})  # the best, plus the chosen
        assert [g["won"] for g in got] == [int(g["idx"] == 1) for g in got]
        n_logged = rows(top, "SELECT n_logged, n_candidates FROM decisions WHERE run_id = ? "
                             "AND seq = ?", (run_id, seq))[0]
        assert n_logged == {"n_logged": len(got), "n_candidates": len(d.candidates)}

    none = tmp_path / "none.db"
    tee, _, run_id = logged_run(none, CandidatePolicy(), trace, spec="none")
    assert rows(none, "SELECT count(*) AS n FROM candidates")[0]["n"] == 0
    generated = sum(len(d.candidates) for d in tee.decisions)
    assert generated > 0
    assert rows(none, "SELECT sum(n_candidates) AS n, sum(n_logged) AS l FROM decisions")[0] == {
        "n": generated, "l": 0}


def test_parameter_changes_and_a_failed_run_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    store = Store(path)
    sink = store.sink()
    info = RunInfo("topas", "sim", "small", {"policy": {"beta": 1.0}}, "chain3", 1, {})
    sink.run_started(info)
    sink.event(EngineEvent(0.0, EventKind.TASK_ARRIVE, task_id=0, note="chain3"))
    sink.param_change(1.5, "beta", 1.0, np.float64(2.5), source="test")
    sink.run_finished(None, RuntimeError("the policy stopped admitting\nsecond line"))
    changes = q.param_changes(store.db, sink.run_id)
    assert [(c["t"], c["name"], c["old"], c["new"], c["source"]) for c in changes] == [
        (1.5, "beta", 1.0, 2.5, "test")]
    run = q.get_run(store.db, sink.run_id)
    assert run.status == "failed" and run.error == "RuntimeError: the policy stopped admitting"
    assert q.tasks(store.db, sink.run_id)[0].workflow == "chain3"
    with pytest.raises(StoreError, match="run_started"):
        sink.decision(Decision(0.0, "x"))
    store.close()


def test_replay_cli_writes_one_run_per_policy_matching_the_printed_metrics(
        tmp_path: Path) -> None:
    path = tmp_path / "cli.db"
    args = ["replay", "--workload", "chain3", "--tasks", "15", "--policy", "lpm", "--policy",
            "spf", "--db", str(path), "--json", "-q"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)["runs"]
    assert [r["run_id"] for r in printed] == [1, 2]
    with Store(path) as store:
        runs = q.runs(store.db)
        assert [(r.id, r.policy, r.status) for r in runs] == [(1, "lpm", "done"),
                                                              (2, "spf", "done")]
        for row, run in zip(printed, runs, strict=True):
            stats = q.jct_stats(store.db, run.id)
            assert stats["tasks"] == row["tasks"] == 15
            for key in ("mean_jct_s", "p50_jct_s", "p99_jct_s"):
                assert stats[key] == pytest.approx(row[key])
            assert run.decisions == row["decisions"] == q.counts(store.db, run.id)["decisions"]
            assert run.summary is not None and run.summary["mean_jct_s"] == row["mean_jct_s"]
    # a second replay appends to the same file
    res = CliRunner().invoke(main, [*args[:-4], "--db", str(path), "-q",
                                    "--log-candidates", "top:2"])
    assert res.exit_code == 0, res.output
    with Store(path) as store:
        assert [r.id for r in q.runs(store.db)] == [1, 2, 3, 4]
        assert q.get_run(store.db, 4).log_candidates == "top:2"


def test_a_trace_whose_header_seed_no_integer_column_holds_is_logged(tmp_path: Path) -> None:
    """A trace header is free metadata: a seed beyond SQLite's 64-bit INTEGER
    is kept in the run's trace_meta, not the seed column (it stopped the
    replay with an OverflowError)."""
    trace_file = tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["trace", "gen", "-w", "chain3", "-r", "1", "-n", "2",
                                    "-s", "1", "-o", str(trace_file)])
    assert res.exit_code == 0, res.output
    lines = trace_file.read_text().splitlines()
    lines[0] = lines[0].replace('"seed": 1', f'"seed": {2**70}')
    trace_file.write_text("\n".join(lines) + "\n")
    path = tmp_path / "big.db"
    res = CliRunner().invoke(main, ["replay", str(trace_file), "-p", "fcfs", "--db", str(path),
                                    "-q"])
    assert res.exit_code == 0, res.output
    with Store(path) as store:
        run = q.get_run(store.db)
        assert run.seed is None and run.trace_meta["seed"] == 2**70


@pytest.mark.parametrize("spec", ["top:x", "most", "top:-1"])
def test_replay_cli_rejects_a_bad_candidate_spec_in_one_line(tmp_path: Path, spec: str) -> None:
    res = CliRunner().invoke(main, ["replay", "--workload", "chain3", "--tasks", "2", "--db",
                                    str(tmp_path / "x.db"), "--log-candidates", spec])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"error: --log-candidates: expected all, none or top:N (N >= 1), got {spec!r}"]
    res = CliRunner().invoke(main, ["replay", "--workload", "chain3", "--tasks", "2",
                                    "--log-candidates", "all"])
    assert res.exit_code == 2 and "needs --db" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------ crash safety


def _poll(path: Path, deadline: float) -> Iterator[int]:
    """Committed decisions of run 1, read through a separate connection."""
    while time.monotonic() < deadline:
        if path.exists():
            try:
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
                try:
                    row = conn.execute("SELECT decisions FROM runs WHERE id = 1").fetchone()
                finally:
                    conn.close()
                yield row[0] if row else 0
            except sqlite3.Error:
                yield 0
        else:
            yield 0
        time.sleep(0.02)


def _writers_of(path: Path) -> list[int]:
    """The writer processes (`store/_child.py`) of the file at `path` (Linux /proc)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:  # it ended while listed
                continue
            if str(CHILD).encode() in argv and str(path).encode() in argv:
                found.append(int(proc_dir.name))
    return found


def _ended(pid: int) -> bool:
    """Process `pid` is gone, or a zombie nobody reaped (it ran to its end)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(),
                    reason="finds the store's writer process through Linux's /proc")
@pytest.mark.parametrize("kill", ["process", "writer-too"])
def test_sigkill_mid_run_leaves_a_sound_file_that_the_next_run_appends_to(
        tmp_path: Path, kill: str) -> None:
    path = tmp_path / "crash.db"
    cmd = [sys.executable, "-m", "topasd.cli", "replay", "--workload", "dag10wide", "--rate",
           "0.1", "--tasks", "3000", "--policy", "fcfs", "--policy", "lpm", "--db", str(path),
           "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        for committed in _poll(path, time.monotonic() + 120):
            if committed >= 50 or proc.poll() is not None:
                break
        assert proc.poll() is None, f"the replay ended before the kill: {proc.stderr.read()!r}"
        writers = _writers_of(path)
        assert writers, "the replay's decision-log writer was not found"
        os.killpg(proc.pid, signal.SIGKILL)  # the writer, in a session of its own, lives on
        if kill == "writer-too":  # it dies as well, maybe mid-transaction
            for pid in writers:
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    # an orphaned writer commits the frames it holds and exits: the checks read that
    deadline = time.monotonic() + 120
    while not all(_ended(pid) for pid in writers):
        assert time.monotonic() < deadline, "the orphaned writer never exited"
        time.sleep(0.02)
    with Store(path) as store:
        assert store.integrity() == "ok"
        run = q.get_run(store.db, 1)
        assert run.status == "interrupted" and run.policy == "fcfs"
        seqs = [r[0] for r in store.db.execute(
            "SELECT seq FROM decisions WHERE run_id = 1 ORDER BY seq")]
        assert len(seqs) >= 50 and seqs == list(range(1, len(seqs) + 1))  # no gaps
        assert len(seqs) == run.decisions  # rows and counts committed together
        assert q.counts(store.db, 1)["engine_events"] == run.events
        kept = q.counts(store.db, 1)

    res = CliRunner().invoke(main, ["replay", "--workload", "chain3", "--tasks", "5",
                                    "--policy", "lpm", "--db", str(path), "-q"])
    assert res.exit_code == 0, res.output
    with Store(path) as store:
        assert store.integrity() == "ok"
        assert [(r.id, r.status) for r in q.runs(store.db)] == [(1, "interrupted"),
                                                                (2, "done")]
        assert q.counts(store.db, 1) == kept
        assert q.jct_stats(store.db, 2)["tasks"] == 5


def test_runs_of_one_store_share_one_writer_and_a_killed_writer_is_replaced_losing_nothing(
        tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    trace = small_trace(tasks=3)
    store = Store(path)
    pids = []
    for _ in range(2):
        sink = store.sink()
        Run(trace, make_policy("fcfs"), SimBackend(get_profile("small")), sink=sink).execute()
        pids.append(store.writer().proc.pid)
    assert pids[0] == pids[1]  # started once, shared by both runs
    writer = store.writer()
    # a signal to this process's group (Ctrl-C) never reaches it, even while it starts
    assert os.getsid(writer.proc.pid) != os.getsid(0)
    assert os.getpgid(writer.proc.pid) != os.getpgid(0)
    sink = store.sink()
    sink.run_started(RunInfo("fcfs", "sim", "small", {}, "dag4", 0, {}))
    killed = set()
    for i in range(20_000):  # killed four times while its frames are on the way
        sink.event(EngineEvent(float(i), EventKind.TASK_ARRIVE, task_id=i))
        if i % 5000 == 4999:
            victim = store.writer().proc  # the sink's writer (it took over the last one)
            killed.add(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while sink.restarts < len(killed):  # the sink notices the end by itself
                assert time.monotonic() < deadline, "the killed writer was not replaced"
                time.sleep(0.01)
    sink.run_finished(None, None)
    assert sink.restarts == len(killed) == 4 and store.writer().proc.pid not in killed
    run = q.get_run(store.db, sink.run_id)
    assert run.status == "done" and run.error is None
    n, distinct = store.db.execute(
        "SELECT count(*), count(DISTINCT task_id) FROM engine_events WHERE run_id = ?",
        [sink.run_id]).fetchone()
    assert n == distinct == 20_000  # every event once: none lost, none twice
    store.close()
    with Store(path) as again:
        assert again.integrity() == "ok"


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (e2fsprogs)")
def test_a_writer_the_file_refuses_is_not_restarted_and_the_run_says_why(
        tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    store = Store(path)
    sink = store.sink()
    failures: list[str] = []
    sink.on_failure = failures.append
    sink.run_started(RunInfo("fcfs", "sim", "small", {}, "dag4", 0, {}))
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute")
    try:
        victim = store.writer().proc
        os.kill(victim.pid, signal.SIGKILL)  # its successor cannot write the file
        with pytest.raises(StoreError, match="the file is read-only") as failure:
            for i in range(100_000):
                sink.event(EngineEvent(float(i), EventKind.TASK_ARRIVE, task_id=i))
            sink.sync()
        assert "attempt to write a readonly database" in str(failure.value)
        assert failures == ["the file is read-only (SQLite: OperationalError: attempt to "
                            "write a readonly database)"]
        assert sink.restarts == 1  # the killed one was replaced; the refused one is not
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    with pytest.raises(StoreError, match="writing the decision log failed: the file is "
                       "read-only"):
        sink.run_finished(None, None)
    assert q.get_run(store.db, sink.run_id).error.startswith(
        "decision log writer: the file is read-only")
    store.close()


def test_readers_do_not_write_into_an_empty_file_and_failed_replays_leave_no_log(
        tmp_path: Path) -> None:
    """A 0-byte file opened to read (console, gantt) is refused as it is; a
    replay whose input is bad stops before it creates its --db."""
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(StoreError, match="an empty file, not a decision log yet"):
        Store(empty, create=False)
    assert empty.stat().st_size == 0
    gantt = CliRunner().invoke(main, ["gantt", str(empty), "-o", str(tmp_path / "g.html")])
    assert gantt.exit_code != 0 and "empty file" in gantt.output
    assert empty.stat().st_size == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header", "format": "topasd-trace", "version": 2}\n')
    log = tmp_path / "never.db"
    for args in (["replay", str(bad)], ["replay", "-w", "chain3", "-n", "3", "--param", "zz=1"]):
        result = CliRunner().invoke(main, [*args, "--db", str(log)])
        assert result.exit_code == 2, result.output
        assert not log.exists()
