"""Recording a run: a `RunSink` whose writes are batched off the scheduling path.

Three steps, so the scheduling thread pays almost nothing:

1. `decision()`/`event()` append the frozen object to a deque (no conversion,
   no I/O).
2. A feeder thread wakes every `flush_s` seconds, or once `batch_rows` events
   are pending, turns what is pending into plain tuples (mostly in C:
   `attrgetter`, `marshal`) and sends it as one frame down a pipe.
3. A writer process (`store/_child.py`, stdlib only; one per `Store`, shared
   by its runs) commits each frame as one transaction: events, decisions,
   candidates, parameter changes, the `tasks` and `requests` rows the frame's
   events touched, and the run's counts. SQLite runs there, beside the
   scheduler, not under its GIL. `run_finished` waits for the writer's
   acknowledgement that every frame of the run is committed.

Crash safety: the file is in WAL mode, so a process killed at any instant
leaves a sound database holding every frame committed before; when the
scheduling process dies, the writer sees end of input, commits the frames it
holds and exits. `Store` marks such a run `interrupted` when it next opens.

Decisions: every decision is stored, one row each, numbered `seq` 1..n in the
order the policy made them (so `runs.decisions` equals the runner's count).
A no-op decision (`Decision.is_noop`) without candidates is a compact row:
time, wall times, reservation, flags, `noop = 1`; its list and score columns
are NULL. Candidates are written per `CandidateFilter`: `all`, `none`, or
`top:N` (the N best by total score, plus the chosen one);
`decisions.n_candidates` always holds how many the policy generated and
`n_logged` how many rows `candidates` holds for it.
"""

from __future__ import annotations

import json
import marshal
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from importlib import metadata
from operator import add, attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from store.columns import CANDIDATE_SENT, EVENT_ROW, TERMS
from store.db import StoreError
from topasd.model import Decision, EngineEvent, EventKind, Reservation, TopasError
from topasd.score import score_total

if TYPE_CHECKING:
    from store.db import Store
    from topasd.runner import RunInfo, RunResult

CHILD = Path(__file__).with_name("_child.py")
MAX_PENDING = 1_000_000  # the scheduling thread waits when the writer is this far behind
FRAME_ROWS = 50_000  # at most this many rows per frame (one transaction)

_HEADER = struct.Struct("<I")
_KIND = attrgetter("kind")
_KIND1 = {k: (k.value,) for k in EventKind}  # EventKind -> (plain str,)
assert EVENT_ROW[0] == "kind"  # sent as its plain value, then the other attributes
_EVENT_REST = attrgetter(*EVENT_ROW[1:])
_RESERVATION = {r: r.value for r in Reservation}
_CAND_LISTS = attrgetter(*CANDIDATE_SENT[:3])
_CAND_TERMS = attrgetter("terms")
_TERMS = attrgetter(*TERMS)


class WriterProcess:
    """The writer process of one store file; frames in on stdin, acks out on stdout."""

    def __init__(self, path: Path) -> None:
        try:
            # its own session: a signal to the daemon's process group (Ctrl-C,
            # `timeout`) must not reach it before `_child.main` ignores signals
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD), str(path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)
        except OSError as exc:
            raise StoreError(f"cannot start the decision-log writer ({exc})") from None
        self._send_lock = threading.Lock()
        self._ack_lock = threading.Lock()
        self._tokens = 0
        self.error: str | None = None

    def send(self, run_id: int, frame: tuple[Any, ...]) -> None:
        """Queue one frame of rows of run `run_id` (BrokenPipeError if the writer died)."""
        try:
            body = marshal.dumps((run_id, *frame), 2)  # version 2: no refs, fastest
        except ValueError:  # numpy scalars or enums inside: convert, then retry
            body = marshal.dumps(_marshalable((run_id, *frame)), 2)
        self._write(_HEADER.pack(len(body)) + body)

    def barrier(self) -> None:
        """Return once every frame sent before is committed (StoreError if not)."""
        with self._ack_lock:
            self._tokens += 1
            token = self._tokens
            try:
                self._write(_HEADER.pack(0) + struct.pack("<Q", token))
                assert self.proc.stdout is not None
                while True:
                    line = self.proc.stdout.readline()
                    if not line:
                        raise BrokenPipeError
                    if int(line) == token:
                        return
            except (BrokenPipeError, ValueError):
                raise StoreError(f"decision log writer failed ({self._reap()})") from None

    def close(self) -> None:
        """End of input: the writer commits what it holds and exits."""
        err = self._reap()
        if err and self.error is None:
            self.error = err

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._send_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def _reap(self) -> str:
        proc = self.proc
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
        except OSError:
            pass
        err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        code = proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        if code != 0:
            return err.splitlines()[-1] if err else f"writer exited with status {code}"
        return ""


@dataclass(frozen=True, slots=True)
class CandidateFilter:
    """Which candidates of a decision are written: `all`, `none` or `top:N`."""

    mode: Literal["all", "top", "none"] = "all"
    n: int = 0

    @staticmethod
    def parse(spec: str) -> CandidateFilter:
        s = spec.strip().lower()
        if s in ("all", "none"):
            return CandidateFilter(s)  # type: ignore[arg-type]
        if s.startswith("top:") and s[4:].isdigit() and int(s[4:]) >= 1:
            return CandidateFilter("top", int(s[4:]))
        raise StoreError(f"--log-candidates: expected all, none or top:N (N >= 1), got {spec!r}")

    def __str__(self) -> str:
        return f"top:{self.n}" if self.mode == "top" else self.mode

    def select(self, d: Decision) -> list[int]:
        """Indices of `d.candidates` written, ascending (top:N keeps the winner)."""
        n = len(d.candidates)
        if self.mode == "none" or not n:
            return []
        if self.mode == "all" or n <= self.n:
            return list(range(n))
        return _top(candidate_rows(d), d.chosen, self.n)


@dataclass(frozen=True, slots=True)
class _ParamChange:
    t: float
    wall_ts: float
    name: str
    old: Any
    new: Any
    source: str
    from_decision: int | None


class StoreSink:
    """Records one run into a `Store` (a `RunSink` with `RunHooks`).

    `Run.execute` calls `run_started`, then `decision`/`event` from the
    scheduling thread, then `run_finished`, which drains the writer and
    completes the run's row. Outside `Run`, call the hooks yourself.
    """

    def __init__(self, store: Store, candidates: CandidateFilter, *, batch_rows: int = 2048,
                 flush_s: float = 0.05) -> None:
        self.store = store
        self.candidates = candidates
        self.batch_rows = max(1, batch_rows)
        self.flush_s = flush_s
        self.run_id: int | None = None
        self.rows_written = 0
        self._events: deque[EngineEvent] = deque()
        self._decisions: deque[tuple[Decision, float]] = deque()
        self._params: deque[_ParamChange] = deque()
        self._wake = threading.Event()
        self._frames = threading.Lock()  # one sender at a time: frames stay in order
        self._stop = False
        self._thread: threading.Thread | None = None
        self._writer: WriterProcess | None = None
        self._error: str | None = None
        self._seq = 0
        self._sent = 0

    # ------------------------------------------------------- RunHooks

    def run_started(self, info: RunInfo) -> None:
        """Create the run's row, then start the writer process and the feeder."""
        if self.run_id is not None:
            raise StoreError("a StoreSink records one run; ask the Store for another sink")
        row = {
            "started_ts": time.time(), "status": "running", "pid": os.getpid(),
            "host": socket.gethostname(), "policy": info.policy, "backend": info.backend,
            "profile": info.profile, "params": to_json(info.params),
            "workload": info.workload, "seed": info.seed,
            "trace_meta": to_json(info.trace_meta), "version": _version(),
            "log_candidates": str(self.candidates), "decisions": 0, "candidates": 0,
            "events": 0,
        }
        try:
            self.run_id = int(self.store.db.table("runs").insert(row).last_pk)  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.store.path}: cannot start a run ({exc})") from None
        self._writer = self.store.writer()
        self._thread = threading.Thread(target=self._feed, name=f"topasd-store-{self.run_id}",
                                        daemon=True)
        self._thread.start()

    def run_finished(self, result: RunResult | None, error: BaseException | None) -> None:
        """Drain pending rows, then mark the run done (with its summary) or failed."""
        self.close()
        status, text = "done", None
        if error is not None:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            text = _one_line(error)
        elif self._error is not None:
            status, text = "failed", f"decision log writer: {self._error}"
        self.store.db.execute(
            "UPDATE runs SET finished_ts = ?, status = ?, summary = ?, error = ? WHERE id = ?",
            [time.time(), status, _summary(result), text, self.run_id])
        if error is None and self._error is not None:
            raise StoreError(f"{self.store.path}: writing the decision log failed "
                             f"({self._error})")

    # ------------------------------------------------------- RunSink

    def decision(self, decision: Decision) -> None:
        if self._error is not None or self._thread is None:
            self._fail()
        self._decisions.append((decision, time.time()))

    def event(self, event: EngineEvent) -> None:
        q = self._events
        q.append(event)
        if len(q) >= self.batch_rows:
            self._wake.set()
            if self._error is not None or self._thread is None:
                self._fail()
            while len(q) > MAX_PENDING and self._error is None:
                time.sleep(0.001)

    def param_change(self, t: float, name: str, old: Any, new: Any, source: str = "api",
                     from_decision: int | None = None) -> None:
        """Record a live parameter change (e.g. beta through `/v1/params`), in force
        from decision `from_decision` on (the next one the policy makes)."""
        if self._error is not None or self._thread is None:
            self._fail()
        self._params.append(_ParamChange(t, time.time(), name, old, new, source,
                                         from_decision))

    def sync(self) -> None:
        """Return once every decision, event and parameter change recorded before
        the call is committed (e.g. a change the API is about to acknowledge)."""
        writer = self._writer
        if self._error is not None or self._thread is None or writer is None:
            self._fail()
        try:  # the rows pending now go in the first frames sent from here on
            self._send_pending(1 + max(len(self._events), len(self._decisions)) // FRAME_ROWS)
            writer.barrier()
        except BrokenPipeError:
            self._error = "the writer process ended early"
            self._fail()

    def close(self) -> None:
        """Send everything pending, wait for the writer to commit it (idempotent)."""
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._error is None:
            try:
                writer.barrier()
            except StoreError as exc:
                self._error = str(exc)
        if self._error is None:
            self.rows_written = self._sent

    # ------------------------------------------------------- feeder thread

    def _fail(self) -> NoReturn:
        if self._thread is None and self._error is None:
            raise StoreError("StoreSink is not recording: call run_started() first (a sink "
                             "records one run, until run_finished())")
        raise StoreError(f"{self.store.path}: writing the decision log failed ({self._error})")

    def _feed(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_s)
                self._wake.clear()
                stopping = self._stop
                self._send_pending()
                if stopping:
                    return
        except BrokenPipeError:
            self._error = "the writer process ended early"
        except StoreError as exc:
            self._error = str(exc)
        except Exception as exc:
            self._error = _one_line(exc)

    def _send_pending(self, frames: int | None = None) -> None:
        """Send what is pending, in at most `frames` frames (None: all of it); one
        sender at a time, so frames stay in order."""
        with self._frames:
            sent = 0
            while (self._events or self._decisions or self._params) and (
                    frames is None or sent < frames):
                self._send_frame()
                sent += 1

    def _send_frame(self) -> None:
        evq, dq, pq = self._events, self._decisions, self._params
        n_ev = min(len(evq), FRAME_ROWS)
        events = [evq.popleft() for _ in range(n_ev)]
        decisions: list[tuple[Any, ...]] = []
        cands: list[tuple[Any, ...]] = []
        for _ in range(min(len(dq), FRAME_ROWS)):
            d, wall_ts = dq.popleft()
            self._decision_rows(d, wall_ts, decisions, cands)
        params = [(p.t, p.wall_ts, p.name, to_json(p.old), to_json(p.new), p.source,
                   p.from_decision)
                  for p in (pq.popleft() for _ in range(len(pq)))]
        rows = list(map(add, map(_KIND1.__getitem__, map(_KIND, events)),
                        map(_EVENT_REST, events)))
        assert self._writer is not None and self.run_id is not None
        self._writer.send(self.run_id, (rows, decisions, cands, params))
        self._sent += len(rows) + len(decisions) + len(params) + sum(len(c[3]) for c in cands)

    def _decision_rows(self, d: Decision, wall_ts: float, out: list[tuple[Any, ...]],
                       cands: list[tuple[Any, ...]]) -> None:
        """`d`'s row in the layouts of `store.columns` (DECISION_HEAD, + DECISION_LISTS,
        + DECISION_CHOSEN), and its logged candidates' rows (CANDIDATE_SENT)."""
        self._seq += 1
        seq, n = self._seq, len(d.candidates)
        head = (seq, d.t, d.wall_ms, wall_ts, _RESERVATION.get(d.reservation, "full"),
                d.blocked, d.retry, n)
        if not n and d.is_noop:
            out.append(head)
            return
        mode = self.candidates.mode
        n_logged = 0 if mode == "none" else n if mode == "all" else min(n, self.candidates.n)
        rows: list[tuple[Any, ...]] = []
        indices: list[int] | None = None
        if n_logged:
            rows = candidate_rows(d)
            if n_logged < n:
                indices = _top(rows, d.chosen, n_logged)
                rows = [rows[i] for i in indices]
                n_logged = len(rows)
        lists = (d.admit, d.preempt, d.load, d.evict, n_logged)
        chosen = d.chosen_candidate
        if chosen is None:
            out.append(head + lists)
        else:
            tm = chosen.terms
            out.append(head + lists + (d.chosen, chosen.resident, *_TERMS(tm), tm.total))
        if rows:
            cands.append((seq, d.chosen, indices, rows))


def candidate_rows(d: Decision) -> list[tuple[Any, ...]]:
    """Every candidate of `d` as (resident, admit, preempt, j_admit, j_move, j_redo,
    j_revoke, v_reuse). A policy whose `Decision.candidates` object has an
    `as_rows()` method returning exactly these tuples, in candidate order, skips
    building `Candidate` objects for the log."""
    fast = getattr(d.candidates, "as_rows", None)
    if fast is not None:
        return list(fast())
    cs = d.candidates
    return list(map(add, map(_CAND_LISTS, cs), map(_TERMS, map(_CAND_TERMS, cs))))


def _top(rows: list[tuple[Any, ...]], chosen: int | None, n: int) -> list[int]:
    """Indices of the n best rows by total score, plus the chosen one, ascending."""
    totals = [score_total(*r[3:8]) for r in rows]
    best = sorted(range(len(rows)), key=totals.__getitem__, reverse=True)[:n]
    if chosen is not None and chosen not in best:
        best.append(chosen)
    return sorted(best)


def _marshalable(obj: Any) -> Any:
    """Builtin scalars in tuples/lists only (enums by value, numpy scalars by .item())."""
    if type(obj) is list:
        return [_marshalable(x) for x in obj]
    if isinstance(obj, (tuple, set, frozenset)):
        return tuple(_marshalable(x) for x in obj)
    if obj is None or type(obj) in (int, float, str, bool):
        return obj
    if isinstance(obj, (EventKind, Reservation)):
        return obj.value
    if hasattr(obj, "item"):
        return obj.item()
    for kind in (bool, int, float, str):
        if isinstance(obj, kind):
            return kind(obj)
    return str(obj)


def to_json(obj: Any) -> str | None:
    """JSON text for a parameter or metadata value (None stays NULL)."""
    if obj is None:
        return None
    return json.dumps(obj, default=_jsonable, sort_keys=True)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _summary(result: RunResult | None) -> str | None:
    if result is None or not result.jct:
        return None
    try:
        return to_json(result.summary())
    except (ValueError, TypeError, TopasError):
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _version() -> str:
    try:
        return metadata.version("topasd")
    except metadata.PackageNotFoundError:
        return "unknown"
