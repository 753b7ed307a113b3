"""The writer process of one decision log (stdlib only: it starts in milliseconds).

    python store/_child.py DB

Reads frames from stdin, each a little-endian u32 length and a `marshal`
payload `(run_id, events, decisions, candidates, params)` of plain tuples
(layouts below, built by `store.writer`), and commits each frame as one
transaction: the rows, the `tasks` and `requests` rows the frame's events
touched, and the run's row counts, then prints `c` on stdout (the frame is
committed). A frame of length 0 is a barrier: a u64 token follows, which the
writer prints as `b TOKEN` once everything before it is committed. At end of
input (the store closed it, or its process died) it exits; a partial last
frame is dropped. It first checks that it may write the file (a read-only one
fails at once, not at the first frame). On an error it prints one line to
stderr (SQLite's words: "database or disk is full", "attempt to write a
readonly database", ...) and exits 3.

A process of its own, because SQLite binding in a thread of the scheduling
process would hold that process's GIL row by row.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import signal
import sqlite3
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

BUSY_TIMEOUT_MS = 10_000

def _sibling(name: str, path: Path) -> ModuleType:
    """A stdlib-only module of topasd, by path (this process runs with -I -S:
    topasd's packages, and the site packages they import, are not on its path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_HERE = Path(__file__).resolve().parent
columns = _sibling("_topasd_store_columns", _HERE / "columns.py")
score_total = _sibling("_topasd_score", _HERE.parent / "topasd" / "score.py").score_total

# The rows of a frame, in the layouts of store/columns.py: events as EVENT_ROW;
# decisions as DECISION_HEAD (a compact no-op), + DECISION_LISTS, + DECISION_CHOSEN
# (expanded here to DECISION_ROW); candidates per decision as (seq, chosen, indices
# or None for all, rows), each row CANDIDATE_SENT (expanded to CANDIDATE_ROW);
# parameter changes as PARAM_ROW.
EVENT_SQL = columns.insert_sql("engine_events")
DECISION_SQL = columns.insert_sql("decisions")
CANDIDATE_SQL = columns.insert_sql("candidates")
PARAM_SQL = columns.insert_sql("param_changes")
_HEAD = len(columns.DECISION_HEAD)
_LISTED = _HEAD + len(columns.DECISION_LISTS)
# The requests and tasks rows that one frame's events touched, folded in. A request's
# input_tokens is its own input (beyond its agent's prefix) from its arrival
# (`request_ready`; 0 there means not given), else its first admission's. Its
# output_tokens: what it generated, at its finish or when it was withdrawn.
REQUESTS_SQL = """
INSERT INTO requests (run_id, request_id, task_id, stage, agent, ready, admitted, started,
                      finished, input_tokens, output_tokens, service_s, preemptions, retractions,
                      withdrawn)
SELECT run_id, request_id, max(task_id), max(stage), max(agent),
       min(CASE kind WHEN 'request_ready' THEN t END),
       min(CASE kind WHEN 'request_admit' THEN t END),
       min(CASE kind WHEN 'request_start' THEN t END),
       max(CASE kind WHEN 'request_finish' THEN t END),
       coalesce(min(CASE kind WHEN 'request_ready' THEN nullif(tokens, 0) END),
                min(CASE kind WHEN 'request_admit' THEN tokens END)),
       coalesce(max(CASE kind WHEN 'request_finish' THEN tokens END),
                max(CASE kind WHEN 'request_withdraw' THEN tokens END)),
       max(CASE kind WHEN 'request_finish' THEN value END),
       sum(kind = 'preempt'), sum(kind = 'retract'),
       max(CASE kind WHEN 'request_withdraw' THEN t END)
FROM engine_events WHERE id > :lo AND run_id = :run AND request_id IS NOT NULL
GROUP BY request_id
ON CONFLICT (run_id, request_id) DO UPDATE SET
    ready = coalesce(requests.ready, excluded.ready),
    admitted = coalesce(requests.admitted, excluded.admitted),
    started = coalesce(requests.started, excluded.started),
    finished = coalesce(excluded.finished, requests.finished),
    input_tokens = coalesce(requests.input_tokens, excluded.input_tokens),
    output_tokens = coalesce(excluded.output_tokens, requests.output_tokens),
    service_s = coalesce(excluded.service_s, requests.service_s),
    preemptions = requests.preemptions + excluded.preemptions,
    retractions = requests.retractions + excluded.retractions,
    withdrawn = coalesce(excluded.withdrawn, requests.withdrawn)
"""
TASKS_SQL = """
INSERT INTO tasks (run_id, task_id, workflow, arrival, completion, jct)
SELECT run_id, task_id,
       max(CASE kind WHEN 'task_arrive' THEN nullif(note, '') END),
       min(CASE kind WHEN 'task_arrive' THEN t END),
       max(CASE kind WHEN 'task_finish' THEN t END),
       max(CASE kind WHEN 'task_finish' THEN value END)
FROM engine_events
WHERE id > :lo AND run_id = :run AND kind IN ('task_arrive', 'task_finish')
GROUP BY task_id
ON CONFLICT (run_id, task_id) DO UPDATE SET
    workflow = coalesce(tasks.workflow, excluded.workflow),
    arrival = coalesce(tasks.arrival, excluded.arrival),
    completion = coalesce(excluded.completion, tasks.completion),
    jct = coalesce(excluded.jct, tasks.jct)
"""
COUNTS_SQL = ("UPDATE runs SET decisions = decisions + ?, candidates = candidates + ?, "
              "events = events + ? WHERE id = ?")

_HEADER = struct.Struct("<I")
_TOKEN = struct.Struct("<Q")
_NO_TERMS = (None,) * len(columns.DECISION_CHOSEN)


_JSON: dict[tuple[Any, ...], str] = {}


def _list(values: tuple[Any, ...]) -> str:
    """JSON text of a tuple, memoised (resident sets and id lists repeat a lot)."""
    if len(values) > 32:  # long lists (a backlog's holds) rarely repeat: not kept
        return json.dumps(values, separators=(",", ":"))
    text = _JSON.get(values)
    if text is None:
        if len(_JSON) > 200_000:
            _JSON.clear()
        text = _JSON[values] = json.dumps(values, separators=(",", ":"))
    return text


def _decision_row(d: tuple[Any, ...]) -> tuple[Any, ...]:
    """A decision as sent, as DECISION_ROW."""
    held = d[_HEAD - 1]
    head = (*d[:_HEAD - 1], _list(held) if held else None, len(held))
    if len(d) == _HEAD:
        return (*head, 1, None, None, None, None, 0, 0, 0, 0, 0, *_NO_TERMS)
    admit, preempt, load, evict, logged = d[_HEAD:_LISTED]
    noop = int(not (admit or preempt or load or evict))
    lists = (_list(admit), _list(preempt), _list(load), _list(evict))
    sizes = (len(admit), len(preempt), len(load), len(evict))
    if len(d) == _LISTED:
        return (*head, noop, *lists, *sizes, logged, *_NO_TERMS)
    chosen, resident, *terms = d[_LISTED:]
    return (*head, noop, *lists, *sizes, logged, chosen, _list(resident), *terms)


def _candidate_rows(groups: list[tuple[Any, ...]]) -> Any:
    for seq, chosen, indices, rows in groups:
        for k, (resident, admit, preempt, ja, jm, jr, jv, vr) in enumerate(rows):
            idx = k if indices is None else indices[k]
            yield (seq, idx, idx == chosen, _list(resident), _list(admit), _list(preempt),
                   ja, jm, jr, jv, vr, score_total(ja, jm, jr, jv, vr))


def write_frame(conn: sqlite3.Connection, frame: tuple[Any, ...]) -> None:
    """Commit one frame's rows (and the tasks/requests they touch) atomically."""
    run, events, decisions, cands, params = frame
    run = int(run)
    conn.execute("BEGIN IMMEDIATE")
    try:
        lo = conn.execute("SELECT coalesce(max(id), 0) FROM engine_events").fetchone()[0]
        if events:
            conn.executemany(EVENT_SQL.format(run=run), events)
        if decisions:
            conn.executemany(DECISION_SQL.format(run=run), map(_decision_row, decisions))
        if cands:
            conn.executemany(CANDIDATE_SQL.format(run=run), _candidate_rows(cands))
        if params:
            conn.executemany(PARAM_SQL.format(run=run), params)
        if events:
            conn.execute(REQUESTS_SQL, {"lo": lo, "run": run})
            conn.execute(TASKS_SQL, {"lo": lo, "run": run})
        conn.execute(COUNTS_SQL, [len(decisions), sum(len(g[3]) for g in cands), len(events),
                                   run])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            conn.execute("ROLLBACK")
        raise


def read_frames(stream: BinaryIO) -> Any:
    """Complete frames until end of input (a cut-off last frame is dropped);
    a barrier comes out as its int token."""
    while True:
        head = stream.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(head)
        if size == 0:
            token = stream.read(_TOKEN.size)
            if len(token) < _TOKEN.size:
                return
            yield _TOKEN.unpack(token)[0]
            continue
        body = stream.read(size)
        if len(body) < size:
            return
        yield marshal.loads(body)


def main(argv: list[str]) -> int:
    path = argv[1]
    # Ctrl-C in a terminal (or a signal to the daemon's process group) reaches
    # this child too: it must keep writing while the daemon drains, and it
    # stops on end of input when the daemon closes the pipe.
    # A file-size limit (RLIMIT_FSIZE) is a full disk to SQLite, not a reason to die.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("BEGIN IMMEDIATE")  # may this process write the file at all?
        try:
            conn.execute("DELETE FROM runs WHERE 0")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        for frame in read_frames(sys.stdin.buffer):
            if isinstance(frame, int):
                sys.stdout.write(f"b {frame}\n")
            else:
                write_frame(conn, frame)
                sys.stdout.write("c\n")
            sys.stdout.flush()
        conn.close()
    except Exception as exc:
        text = str(exc).strip().splitlines()
        print(f"{type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
