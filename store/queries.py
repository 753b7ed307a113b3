"""Read side of the decision log: the queries the console and the Gantt export use.

Every function takes a `sqlite_utils.Database` (e.g. `Store(path).db`) and a
run id, and returns plain frozen rows; callers never write SQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from sqlite_utils import Database

from store.db import StoreError
from topasd.lifecycle import (
    REQUEST_PHASE,
    RUNNING,
    WAITING,
    PrefixPhase,
    Trail,
    episode_ends,
    prefix_after,
    request_phase,
    stage_after,
)
from topasd.model import Location, StageProgress

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
    switched_to: tuple[str, ...] = ()  # policies switched to live (the daemon), in order

    @property
    def label(self) -> str:
        return (f"run {self.id} ({self.policies_text}, {self.workload or 'no workload'}, "
                f"{self.status})")

    @property
    def policies_text(self) -> str:
        """The policy, or the policies it ran in turn: "topas → fcfs"."""
        seq = [self.policy, *self.switched_to]
        if len(seq) <= 3:
            return " → ".join(seq)
        return f"{seq[0]} → … → {seq[-1]} ({len(seq) - 1} switches)"


def runs(db: Database) -> list[RunRow]:
    """Every run in the file, oldest first."""
    switched = _policy_switches(db)
    return [_with_switches(_run_row(r), switched)
            for r in db.query("SELECT * FROM runs ORDER BY id")]


def _policy_switches(db: Database, run_id: int | None = None) -> dict[int, list[str]]:
    """The policies each run (or run `run_id`) switched to live, in order (one query)."""
    where, args = ("AND run_id = ?", [run_id]) if run_id is not None else ("", [])
    out: dict[int, list[str]] = {}
    for r in db.query("SELECT run_id, new FROM param_changes WHERE name = 'policy' "
                      f"{where} ORDER BY run_id, t, id", args):
        out.setdefault(r["run_id"], []).append(str(_loads(r["new"])))
    return out


def _with_switches(run: RunRow, switched: Mapping[int, list[str]]) -> RunRow:
    to = switched.get(run.id)
    return replace(run, switched_to=tuple(to)) if to else run


def _switches(db: Database, run: RunRow) -> RunRow:
    """`run` with the policies the daemon switched to live."""
    return _with_switches(run, _policy_switches(db, run.id))


def get_run(db: Database, run_id: int | None = None) -> RunRow:
    """One run by id; the latest when `run_id` is None. Raises StoreError."""
    if run_id is None:
        row = next(db.query("SELECT * FROM runs ORDER BY id DESC LIMIT 1"), None)
        if row is None:
            raise StoreError(f"{_file(db)}: the decision log holds no runs yet (a daemon or "
                             "`topasd replay --db` writes them)")
        return _switches(db, _run_row(row))
    row = next(db.query("SELECT * FROM runs WHERE id = ?", [run_id]), None)
    if row is None:
        have = ", ".join(f"{r.id} ({r.policy})" for r in runs(db)) or "none"
        raise StoreError(f"{_file(db)}: no run {run_id} in the decision log; runs: {have}")
    return _switches(db, _run_row(row))


def _file(db: Database) -> str:
    """The file `db` is connected to (for messages)."""
    row = db.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row and row[2] else "the decision log"


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
    """(first event time, last event time or planned end of a prefix transfer)
    of a run; (0, 0) when it has no events."""
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
                  "preempt", "retract", "request_withdraw")


def request_segments(db: Database, run_id: int) -> list[Segment]:
    """Every admission episode of every request of a run, by admission time
    (an episode as `topasd.lifecycle` defines it: from the request's turn to
    running until it leaves running)."""
    _, t_end = time_span(db, run_id)
    marks = ", ".join("?" * len(_SEGMENT_KINDS))
    rows = db.execute(
        f"SELECT request_id, t, kind, task_id, stage, agent FROM engine_events "
        f"WHERE run_id = ? AND request_id IS NOT NULL AND kind IN ({marks}) "
        f"ORDER BY request_id, id", [run_id, *_SEGMENT_KINDS])
    out: list[Segment] = []
    for rid, group in _by_request(rows):
        attempt, phase = 0, None
        open_: dict[str, Any] | None = None
        for _, t, kind, task, stage, agent in group:
            new = REQUEST_PHASE.get(kind, phase)
            if new == RUNNING and phase != RUNNING:
                attempt += 1
                open_ = {"admitted": t, "started": None, "prefill_end": None, "task": task,
                         "stage": stage, "agent": agent}
            elif open_ is not None and kind in ("request_start", "prefill_end"):
                open_["started" if kind == "request_start" else "prefill_end"] = t
            elif open_ is not None and episode_ends(phase, new):
                out.append(_segment(rid, attempt, open_, t, kind.removeprefix("request_")))
                open_ = None
            phase = new
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
class Wait:
    """A request in the waiting queue: from when it became ready (or was
    preempted or retracted: `after`) until admitted, withdrawn or the log's end
    (`end_kind`: admit, withdraw, open)."""

    request_id: int
    task_id: int | None
    stage: str | None
    agent: str | None
    after: str  # ready | preempt | retract
    start: float
    end: float
    end_kind: str


def request_waits(db: Database, run_id: int) -> list[Wait]:
    """Every stay of every request of a run in the waiting queue, by start (a
    request never admitted waits until it is withdrawn or the log ends)."""
    _, t_end = time_span(db, run_id)
    rows = db.execute(
        f"SELECT request_id, t, kind, task_id, stage, agent FROM engine_events "
        f"WHERE run_id = ? AND request_id IS NOT NULL AND kind IN "
        f"({', '.join('?' * len(REQUEST_PHASE))}) ORDER BY request_id, id",
        [run_id, *map(str, REQUEST_PHASE)])
    out: list[Wait] = []
    for rid, group in _by_request(rows):
        phase: str | None = None
        since: tuple[Any, ...] | None = None
        for _, t, kind, task, stage, agent in group:
            new = request_phase(phase, kind)
            if new == WAITING and phase != WAITING:
                since = (t, kind.removeprefix("request_"), task, stage, agent)
            elif since is not None and phase == WAITING and new != WAITING:
                out.append(Wait(rid, since[2], since[3], since[4], since[1], since[0], t,
                                kind.removeprefix("request_")))
                since = None
            phase = new
        if since is not None:
            out.append(Wait(rid, since[2], since[3], since[4], since[1], since[0],
                            max(t_end, since[0]), "open"))
    out.sort(key=lambda w: (w.start, w.request_id))
    return out


def request_holds(db: Database, run_id: int) -> dict[int, list[float]]:
    """The times of the decisions that held each request out of W_t
    (`decisions.held`: TOPAS's `phases` and `lot_size`), ascending."""
    out: dict[int, list[float]] = {}
    for rid, t in db.execute("SELECT json_each.value, t FROM decisions, json_each(held) "
                             "WHERE run_id = ? AND n_held > 0 ORDER BY t, seq", [run_id]):
        out.setdefault(int(rid), []).append(t)
    return out


@dataclass(frozen=True, slots=True)
class Mark:
    """A preemption (by the policy, with its decision and the totals of the
    chosen and best rejected states) or a retraction (by the engine)."""

    t: float
    kind: str
    request_id: int | None
    task_id: int | None
    stage: str | None
    agent: str | None
    tokens: int
    decision: int | None = None
    chosen_total: float | None = None
    best_rejected_total: float | None = None


def preemptions(db: Database, run_id: int) -> list[Mark]:
    """Every preemption and retraction of a run, by time (`preemption_log`)."""
    return [Mark(*r) for r in db.execute(
        "SELECT t, CASE by WHEN 'policy' THEN 'preempt' ELSE 'retract' END, request_id, "
        "task_id, stage, agent, generated, decision, chosen_total, best_rejected_total "
        "FROM preemption_log WHERE run_id = ? ORDER BY t, id", [run_id])]


def request_names(db: Database, run_id: int, ids: list[int]
                  ) -> dict[int, tuple[int | None, str, str]]:
    """(task, stage, agent) of each request of `ids`."""
    out: dict[int, tuple[int | None, str, str]] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        for rid, task, stage, agent in db.execute(
                f"SELECT request_id, task_id, stage, agent FROM requests WHERE run_id = ? AND "
                f"request_id IN ({', '.join('?' * len(chunk))})", [run_id, *chunk]):
            out[rid] = (task, stage or "?", agent or "?")
    return out


def task_at(db: Database, run_id: int, task_id: int, t: float) -> dict[str, Any] | None:
    """Task `task_id` as of `t`, in the shape of the daemon's `GET /v1/tasks/{id}`:
    its stages (those its requests reached), and its requests' trails
    (`lifecycle.Trail`) with the decisions up to `t` that admitted, preempted
    or held them. None: no such task, or it had not arrived by `t`."""
    row = db.execute("SELECT workflow, arrival, completion FROM tasks WHERE run_id = ? AND "
                     "task_id = ?", [run_id, task_id]).fetchone()
    if row is None or row[1] is None or row[1] > t:
        return None
    workflow, arrival, completion = row
    trails: dict[int, Trail] = {}
    stages: dict[str, StageProgress] = {}
    abandoned = False
    for when, kind, rid, stage, agent, value in db.execute(
            "SELECT t, kind, request_id, stage, agent, value FROM engine_events WHERE run_id = ? "
            "AND task_id = ? AND t <= ? ORDER BY id", [run_id, task_id, t]):
        abandoned = abandoned or kind == "task_abandon"
        if stage is not None and kind in ("request_ready", "request_finish", "stage_finish"):
            stages[stage] = stage_after(stages.get(stage, StageProgress()), kind, when, value)
        if rid is None:
            continue
        if kind == "request_ready":
            trails[rid] = Trail(rid, stage or "", agent or "", when)
        elif rid in trails:
            trails[rid].after(kind, when)
    marks = ", ".join("?" * len(trails))
    for seq, action, rid in db.execute(
            f"SELECT decision, action, request_id FROM decision_actions WHERE run_id = ? AND "
            f"t <= ? AND request_id IN ({marks}) ORDER BY decision", [run_id, t, *trails]):
        trails[rid].on_decision(seq, action)
    done = completion is not None and completion <= t
    return {"id": task_id, "workflow": workflow, "client_task_id": None,
            "status": "done" if done else "abandoned" if abandoned else "running",
            "arrival": arrival, "finished": completion if done else None,
            "stages": {v: {"status": str(p.status), "rounds_done": p.rounds_done,
                           "started_at": p.started_at, "finished_at": p.finished_at}
                       for v, p in stages.items()},
            "requests": [tr.as_dict() for tr in trails.values()]}


# ---------------------------------------------------------------- prefixes


@dataclass(frozen=True, slots=True)
class PrefixSpan:
    """A prefix interval on one agent's lane. `kind`: resident (on the GPU),
    compute (recomputed by prefill), load (host -> GPU), offload (GPU ->
    host backup). `note`: why a residency ended (policy/engine eviction), or
    that a transfer first waited for the host link."""

    agent: str
    kind: str
    start: float
    end: float
    tokens: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A ReAct round's tool call: from its request's finish (`request_id`) to
    when the next round is ready (the end the log records, else the planned)."""

    request_id: int
    task_id: int | None
    stage: str | None
    agent: str | None
    start: float
    end: float
    note: str


def tool_calls(db: Database, run_id: int) -> list[ToolCall]:
    """Every tool call of a run, by start (TOOL_CALL_START / TOOL_CALL_END)."""
    rows = db.execute(
        "SELECT request_id, task_id, stage, agent, t, value, note FROM engine_events "
        "WHERE run_id = ? AND kind = 'tool_call_start' ORDER BY t, id", [run_id])
    return [ToolCall(rid, task, stage, agent, t, t + value, note or "")
            for rid, task, stage, agent, t, value, note in rows]


def prefix_spans(db: Database, run_id: int) -> list[PrefixSpan]:
    """Prefix residency, recomputation and host transfers of a run, by start:
    the changes `topasd.lifecycle.prefix_after` makes to each prefix, as
    intervals (a host transfer drawn to its planned end unless a load ends
    early; one the log outlives keeps its planned end)."""
    _, t_end = time_span(db, run_id)
    rows = db.execute(
        "SELECT agent, t, kind, tokens, value, note FROM engine_events "
        "WHERE run_id = ? AND request_id IS NULL AND agent IS NOT NULL "
        "AND kind LIKE 'prefix_%' ORDER BY id", [run_id])
    spans = _Spans()
    for agent, t, kind, tokens, value, note in rows:
        spans.event(agent, t, kind, tokens, value, note or "")
    return spans.close(t_end)


class _Spans:
    """Prefix intervals from each prefix's changes of state."""

    def __init__(self) -> None:
        self.out: list[PrefixSpan] = []
        self.state: dict[str, PrefixPhase] = {}
        self.resident: dict[str, tuple[float, int]] = {}  # agent -> (since, tokens)
        self.moving: dict[str, int] = {}  # agent -> index in `out` of its host transfer

    def event(self, agent: str, t: float, kind: str, tokens: int, value: float,
              note: str) -> None:
        old = self.state.get(agent)
        new = self.state[agent] = prefix_after(old, t, kind, tokens, value, note)
        was_on = old is not None and old.location is Location.GPU
        if new.location is Location.GPU and not was_on:
            self.resident[agent] = (t, tokens)
        started = new.transfer is not None and new.since == t and (
            old is None or (old.transfer, old.since) != (new.transfer, new.since))
        if old is not None and old.transfer is not None and (
                started or new.transfer != old.transfer):
            self._ended(agent, old, t, kind, tokens)
        if started and new.transfer in ("load", "offload"):
            self.moving[agent] = len(self.out)
            self.out.append(PrefixSpan(agent, new.transfer, t, t + (value or 0.0), tokens,
                                       note))
        if was_on and new.location is not Location.GPU and agent in self.resident:
            start, tok = self.resident.pop(agent)
            self.out.append(PrefixSpan(agent, "resident", start, max(t, start), tok,
                                       note or "evicted"))

    def _ended(self, agent: str, old: PrefixPhase, t: float, kind: str, tokens: int) -> None:
        """`old`'s move ended at `t`: a load where it ended (cancelled by an
        eviction before its planned end), a recompute from its start."""
        evicted = kind == "prefix_evict"
        if old.transfer == "compute" and old.since is not None:
            self.out.append(PrefixSpan(agent, "compute", old.since, t, tokens,
                                       "cancelled" if evicted else ""))
        elif old.transfer == "load" and agent in self.moving:
            i = self.moving.pop(agent)
            span = self.out[i]
            if not evicted:  # its end (or the next move): drawn to where it ended
                self.out[i] = replace(span, end=max(t, span.start))
            elif t < span.end:
                self.out[i] = replace(span, end=max(t, span.start), note="cancelled")
        elif old.transfer == "offload":
            self.moving.pop(agent, None)  # drawn to its planned end

    def close(self, t_end: float) -> list[PrefixSpan]:
        for agent, (start, tok) in self.resident.items():
            self.out.append(PrefixSpan(agent, "resident", start, max(t_end, start), tok,
                                       "still resident"))
        self.out.sort(key=lambda s: (s.start, s.agent, s.kind))
        return self.out


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
    return [_decode(r, DECISION_JSON)
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


DECISION_JSON = ("admit", "preempt", "load", "evict", "chosen_resident", "held")  # JSON text


def _decode(row: dict[str, Any], cols: tuple[str, ...]) -> dict[str, Any]:
    for c in cols:
        row[c] = _loads(row.get(c))
    return row


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def decision_row(db: Database, run_id: int, seq: int) -> dict[str, Any]:
    """One decision row (JSON columns decoded); StoreError if the run has no `seq`."""
    row = next(db.query("SELECT * FROM decisions WHERE run_id = ? AND seq = ?", [run_id, seq]),
               None)
    if row is None:
        raise StoreError(f"run {run_id} has no decision {seq}")
    return _decode(row, DECISION_JSON)


def decisions_before(db: Database, run_id: int, t: float, *, limit: int = 200,
                     noop: bool = True) -> list[dict[str, Any]]:
    """The last `limit` decisions made at or before `t`, oldest first (no-ops optional)."""
    sql = "SELECT * FROM decisions WHERE run_id = ? AND t <= ?"
    if not noop:
        sql += " AND noop = 0"
    sql += f" ORDER BY seq DESC LIMIT {int(limit)}"
    rows = [_decode(r, DECISION_JSON)
            for r in db.query(sql, [run_id, t])]
    rows.reverse()
    return rows


def params_at(db: Database, run: RunRow, t: float, seq: int | None = None
              ) -> tuple[str, dict[str, Any]]:
    """The policy and its parameters in force at `t`: the run's starting ones with
    every logged change up to `t` applied; with `seq`, those decision `seq` used
    (a change at the same `t` may come after it: its `from_decision` says). A
    policy switch starts the parameters afresh: the daemon logs every parameter
    of the new policy right after it."""
    policy = run.policy
    params = dict(run.params.get("policy") or {})
    where = "t <= ?" if seq is None else \
        "(CASE WHEN from_decision IS NULL THEN t <= ? ELSE from_decision <= ? END)"
    args = [run.id, t] if seq is None else [run.id, t, seq]
    for change in db.query(f"SELECT name, new FROM param_changes WHERE run_id = ? AND {where} "
                           "ORDER BY t, id", args):
        value = _loads(change["new"])
        if change["name"] == "policy":
            policy, params = str(value), {}
        else:
            params[change["name"]] = value
    return policy, params


# the replay (store/replay.py), as these queries' callers have long read it
from store.replay import (  # noqa: E402
    GroupStats,
    Headline,
    PrefixAt,
    RequestAt,
    RunReplay,
    StateAt,
    TaskAt,
    group_stats,
)

__all__ = ["GroupStats", "Headline", "PrefixAt", "RequestAt", "RunReplay", "StateAt", "TaskAt",
           "group_stats"]
