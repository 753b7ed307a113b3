"""Read side of the decision log: the queries the console and the Gantt export use.

Every function takes a `sqlite_utils.Database` (e.g. `Store(path).db`) and a
run id, and returns plain frozen rows; callers never write SQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlite_utils import Database

from store.db import StoreError

# ------------------------------------------------------------------- runs


@dataclass(frozen=True, slots=True)
class RunRow:
    """One recorded run."""

    id: int
    policy: str
    backend: str
    profile: str | None
    workload: str | None
    seed: int | None
    status: str
    started_ts: float | None
    finished_ts: float | None
    version: str | None
    log_candidates: str | None
    decisions: int
    candidates: int
    events: int
    error: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    trace_meta: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"run {self.id} ({self.policy}, {self.workload or '?'}, {self.status})"


def runs(db: Database) -> list[RunRow]:
    """Every run in the file, oldest first."""
    return [_run_row(r) for r in db.query("SELECT * FROM runs ORDER BY id")]


def get_run(db: Database, run_id: int | None = None) -> RunRow:
    """One run by id; the latest when `run_id` is None. Raises StoreError."""
    if run_id is None:
        row = next(db.query("SELECT * FROM runs ORDER BY id DESC LIMIT 1"), None)
        if row is None:
            raise StoreError("the decision log holds no runs yet")
        return _run_row(row)
    row = next(db.query("SELECT * FROM runs WHERE id = ?", [run_id]), None)
    if row is None:
        have = ", ".join(f"{r.id} ({r.policy})" for r in runs(db)) or "none"
        raise StoreError(f"no run {run_id} in the decision log; runs: {have}")
    return _run_row(row)


def _run_row(r: dict[str, Any]) -> RunRow:
    return RunRow(
        id=r["id"], policy=r["policy"], backend=r["backend"], profile=r["profile"],
        workload=r["workload"], seed=r["seed"], status=r["status"],
        started_ts=r["started_ts"], finished_ts=r["finished_ts"], version=r["version"],
        log_candidates=r["log_candidates"], decisions=r["decisions"] or 0,
        candidates=r["candidates"] or 0, events=r["events"] or 0, error=r["error"],
        params=_loads(r["params"]) or {}, trace_meta=_loads(r["trace_meta"]) or {},
        summary=_loads(r["summary"]),
    )


def time_span(db: Database, run_id: int) -> tuple[float, float]:
    """(first, last) event time of a run; (0, 0) when it has no events."""
    row = db.execute(
        "SELECT min(t), max(t + CASE WHEN kind IN ('prefix_load_start', 'prefix_offload_start') "
        "THEN value ELSE 0 END) FROM engine_events WHERE run_id = ?", [run_id]).fetchone()
    return (row[0] or 0.0, row[1] or 0.0)


# ------------------------------------------------------------------ tasks


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: int
    workflow: str | None
    arrival: float | None
    completion: float | None
    jct: float | None


def tasks(db: Database, run_id: int) -> list[TaskRow]:
    """A run's tasks by arrival."""
    return [TaskRow(*r) for r in db.execute(
        "SELECT task_id, workflow, arrival, completion, jct FROM tasks WHERE run_id = ? "
        "ORDER BY arrival, task_id", [run_id])]


def jct_stats(db: Database, run_id: int) -> dict[str, float]:
    """Mean/p50/p99 JCT recomputed as completion - arrival from `tasks`
    (finished tasks only), with the count of finished and unfinished tasks."""
    rows = db.execute("SELECT completion - arrival FROM tasks WHERE run_id = ?",
                      [run_id]).fetchall()
    done = np.array([r[0] for r in rows if r[0] is not None], dtype=float)
    out = {"tasks": float(len(done)), "unfinished": float(len(rows) - len(done))}
    if len(done):
        out.update(mean_jct_s=float(done.mean()), p50_jct_s=float(np.percentile(done, 50)),
                   p99_jct_s=float(np.percentile(done, 99)))
    return out


# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Segment:
    """One admission episode of a request: admitted, started (first prefill
    chunk), prefill end (when the backend reports it), and its end: finish,
    preempt, retract or open (the log ends first)."""

    request_id: int
    task_id: int | None
    stage: str | None
    agent: str | None
    attempt: int
    admitted: float
    started: float | None
    prefill_end: float | None
    end: float
    end_kind: str


_SEGMENT_KINDS = ("request_admit", "request_start", "prefill_end", "request_finish",
                  "preempt", "retract")


def request_segments(db: Database, run_id: int) -> list[Segment]:
    """Every admission episode of every request of a run, by admission time."""
    _, t_end = time_span(db, run_id)
    marks = ", ".join("?" * len(_SEGMENT_KINDS))
    rows = db.execute(
        f"SELECT request_id, t, kind, task_id, stage, agent FROM engine_events "
        f"WHERE run_id = ? AND request_id IS NOT NULL AND kind IN ({marks}) "
        f"ORDER BY request_id, id", [run_id, *_SEGMENT_KINDS])
    out: list[Segment] = []
    for rid, group in _by_request(rows):
        attempt = 0
        open_: dict[str, Any] | None = None
        for _, t, kind, task, stage, agent in group:
            if kind == "request_admit":
                attempt += 1
                open_ = {"admitted": t, "started": None, "prefill_end": None, "task": task,
                         "stage": stage, "agent": agent}
            elif open_ is None:
                continue
            elif kind == "request_start":
                open_["started"] = t
            elif kind == "prefill_end":
                open_["prefill_end"] = t
            else:
                out.append(_segment(rid, attempt, open_, t, kind.removeprefix("request_")))
                open_ = None
        if open_ is not None:
            out.append(_segment(rid, attempt, open_, max(t_end, open_["admitted"]), "open"))
    out.sort(key=lambda s: (s.admitted, s.request_id))
    return out


def _by_request(rows: Any) -> Iterator[tuple[int, list[tuple[Any, ...]]]]:
    current: list[tuple[Any, ...]] = []
    for row in rows:
        if current and row[0] != current[0][0]:
            yield current[0][0], current
            current = []
        current.append(row)
    if current:
        yield current[0][0], current


def _segment(rid: int, attempt: int, o: dict[str, Any], end: float, kind: str) -> Segment:
    return Segment(rid, o["task"], o["stage"], o["agent"], attempt, o["admitted"], o["started"],
                   o["prefill_end"], end, kind)


@dataclass(frozen=True, slots=True)
class Mark:
    """A preemption (by the policy) or a retraction (by the engine)."""

    t: float
    kind: str
    request_id: int | None
    task_id: int | None
    stage: str | None
    agent: str | None
    tokens: int


def preemptions(db: Database, run_id: int) -> list[Mark]:
    """Every preemption and retraction of a run, by time."""
    return [Mark(*r) for r in db.execute(
        "SELECT t, kind, request_id, task_id, stage, agent, tokens FROM engine_events "
        "WHERE run_id = ? AND kind IN ('preempt', 'retract') ORDER BY t, id", [run_id])]


# ---------------------------------------------------------------- prefixes


@dataclass(frozen=True, slots=True)
class PrefixSpan:
    """A prefix interval on one agent's lane. `kind`: resident (on the GPU),
    compute (recomputed by prefill), load (host -> GPU), offload (GPU ->
    host backup). `note`: why a residency ended (policy/engine eviction)."""

    agent: str
    kind: str
    start: float
    end: float
    tokens: int
    note: str = ""


def prefix_spans(db: Database, run_id: int) -> list[PrefixSpan]:
    """Prefix residency, recomputation and host transfers of a run, by start."""
    _, t_end = time_span(db, run_id)
    rows = db.execute(
        "SELECT agent, t, kind, tokens, value, note FROM engine_events "
        "WHERE run_id = ? AND request_id IS NULL AND agent IS NOT NULL "
        "AND kind LIKE 'prefix_%' ORDER BY id", [run_id])
    out: list[PrefixSpan] = []
    resident: dict[str, tuple[float, int]] = {}
    computing: dict[str, float] = {}
    for agent, t, kind, tokens, value, note in rows:
        if kind in ("prefix_load_start", "prefix_compute_start") and agent not in resident:
            resident[agent] = (t, tokens)
        if kind in ("prefix_load_start", "prefix_offload_start"):
            out.append(PrefixSpan(agent, "load" if kind == "prefix_load_start" else "offload",
                                  t, t + (value or 0.0), tokens))
        elif kind == "prefix_compute_start":
            computing[agent] = t
        elif kind == "prefix_compute_end" and agent in computing:
            out.append(PrefixSpan(agent, "compute", computing.pop(agent), t, tokens))
        elif kind == "prefix_evict":
            if agent in computing:
                out.append(PrefixSpan(agent, "compute", computing.pop(agent), t, tokens,
                                      "cancelled"))
            if agent in resident:
                start, tok = resident.pop(agent)
                out.append(PrefixSpan(agent, "resident", start, max(t, start), tok,
                                      note or "evicted"))
    for agent, (start, tok) in resident.items():
        out.append(PrefixSpan(agent, "resident", start, max(t_end, start), tok, "still resident"))
    out.sort(key=lambda s: (s.start, s.agent, s.kind))
    return out


def agents(db: Database, run_id: int) -> list[str]:
    """A run's agents in order of first appearance (lane order)."""
    return [r[0] for r in db.execute(
        "SELECT agent FROM engine_events WHERE run_id = ? AND agent IS NOT NULL "
        "GROUP BY agent ORDER BY min(t), agent", [run_id])]


# ---------------------------------------------------------------- decisions


def decisions(db: Database, run_id: int, *, t0: float | None = None, t1: float | None = None,
              noop: bool = True, limit: int | None = None) -> list[dict[str, Any]]:
    """Decision rows of a run by seq, optionally in [t0, t1] and without no-ops;
    JSON columns decoded."""
    sql = "SELECT * FROM decisions WHERE run_id = ?"
    args: list[Any] = [run_id]
    if t0 is not None:
        sql += " AND t >= ?"
        args.append(t0)
    if t1 is not None:
        sql += " AND t <= ?"
        args.append(t1)
    if not noop:
        sql += " AND noop = 0"
    sql += " ORDER BY seq"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return [_decode(r, ("admit", "preempt", "load", "evict", "chosen_resident"))
            for r in db.query(sql, args)]


def candidates(db: Database, run_id: int, seq: int) -> list[dict[str, Any]]:
    """The logged candidates of decision `seq`, best total first."""
    return [_decode(r, ("resident", "admit", "preempt")) for r in db.query(
        "SELECT * FROM candidates WHERE run_id = ? AND decision_seq = ? "
        "ORDER BY total DESC, idx", [run_id, seq])]


def param_changes(db: Database, run_id: int) -> list[dict[str, Any]]:
    """Live parameter changes of a run, by time."""
    return [_decode(r, ("old", "new")) for r in db.query(
        "SELECT * FROM param_changes WHERE run_id = ? ORDER BY t, id", [run_id])]


def counts(db: Database, run_id: int) -> dict[str, int]:
    """Rows per table for one run (what the file actually holds)."""
    out: dict[str, int] = {}
    for table in ("tasks", "requests", "decisions", "candidates", "engine_events",
                  "param_changes"):
        out[table] = db.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?",
                                [run_id]).fetchone()[0]
    return out


def _decode(row: dict[str, Any], cols: tuple[str, ...]) -> dict[str, Any]:
    for c in cols:
        row[c] = _loads(row.get(c))
    return row


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
