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
time, wall times, reservation, flags, the requests it held, `noop = 1`; its
list and score columns are NULL. Candidates are written per `CandidateFilter`: `all`, `none`, or
`top:N` (the N best by total score, plus the chosen one);
`decisions.n_candidates` always holds how many the policy generated and
`n_logged` how many rows `candidates` holds for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from operator import add, attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from store.columns import CANDIDATE_SENT, EVENT_ROW, TERMS
from store.db import StoreError
from topasd import version
from topasd.model import Decision, EngineEvent, EventKind, Reservation, TopasError
from topasd.score import score_total

if TYPE_CHECKING:
    from store.db import Store
    from topasd.runner import RunInfo, RunResult

log = logging.getLogger("topasd")

CHILD = Path(__file__).with_name("_child.py")
MAX_RESTARTS = 5  # writers a sink starts after the first one died
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


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame as sent: its run, how many rows of the run it and the frames
    before it hold (events, decisions and parameter changes: what the file
    counts), and its bytes (kept until the writer says it is committed)."""

    run_id: int
    rows_through: int
    data: bytes


class _GaveUp(Exception):
    """The sink stopped writing (its cause is recorded)."""


class WriterDied(TopasError):
    """The writer process ended; `cause` says why, `restartable` whether a new
    writer may go on (it was killed, not refused by the file or the disk)."""

    def __init__(self, cause: str, restartable: bool) -> None:
        super().__init__(cause)
        self.cause = cause
        self.restartable = restartable


def death_cause(code: int, err: str) -> WriterDied:
    """Why a writer that exited with `code` and last stderr line `err` ended."""
    low = err.lower()
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return WriterDied(f"the writer process was killed ({name})", True)
    if "disk is full" in low or "no space" in low:
        return WriterDied(f"the disk is full (SQLite: {err})", False)
    if "readonly" in low or "read-only" in low:
        return WriterDied(f"the file is read-only (SQLite: {err})", False)
    if "disk i/o error" in low:
        return WriterDied(f"a disk I/O error (SQLite: {err})", False)
    if code == 0 and not err:
        return WriterDied("the writer process ended early (exit 0)", True)
    return WriterDied(f"the writer process failed ({err or f'exit status {code}'})", False)


class WriterProcess:
    """The writer process of one store file: frames in on stdin, `c` (committed)
    and `b TOKEN` (barrier) lines out on stdout, read by a thread of its own.
    The frames sent and not yet committed are kept, so that a new writer can
    be given them when this one dies."""

    def __init__(self, path: Path, on_exit: Callable[[], None] | None = None) -> None:
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
        self._acks = threading.Condition()
        self._tokens = 0
        self._acked_token = 0
        self.unacked: deque[Frame] = deque()
        self.ended = False
        self.on_exit = on_exit
        self.error: str | None = None
        self._death: WriterDied | None = None
        self._stderr: str | None = None
        threading.Thread(target=self._read_acks, name=f"topasd-writer-acks-{self.proc.pid}",
                         daemon=True).start()

    def send(self, run_id: int, frame: tuple[Any, ...], rows_through: int) -> None:
        """Queue one frame of rows of run `run_id` (BrokenPipeError if the writer died)."""
        try:
            body = marshal.dumps((run_id, *frame), 2)  # version 2: no refs, fastest
        except ValueError:  # numpy scalars or enums inside: convert, then retry
            body = marshal.dumps(_marshalable((run_id, *frame)), 2)
        self.adopt([Frame(run_id, rows_through, _HEADER.pack(len(body)) + body)])



    def adopt(self, frames: list[Frame]) -> None:
        """Send `frames`, built before (e.g. for a writer that died); all of them
        count as unacknowledged at once, so none is lost if this one dies too
        (BrokenPipeError then)."""
        with self._acks:
            self.unacked.extend(frames)
        for frame in frames:
            self._write(frame.data)

    def barrier(self) -> None:
        """Return once every frame sent before is committed (WriterDied if not)."""
        with self._ack_lock:
            self._tokens += 1
            token = self._tokens
            with contextlib.suppress(BrokenPipeError):  # the wait below sees the end
                self._write(_HEADER.pack(0) + struct.pack("<Q", token))
            with self._acks:
                while self._acked_token < token and not self.ended:
                    self._acks.wait()
                if self._acked_token >= token:
                    return
        raise self.death()

    def death(self) -> WriterDied:
        """Why the writer ended (waits for it to exit)."""
        if self._death is None:
            err = self._reap()
            self._death = death_cause(self.proc.returncode, err)
        return self._death

    def close(self) -> None:
        """End of input: the writer commits what it holds and exits."""
        err = self._reap()
        if err and self.error is None:
            self.error = err

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.ended

    def _read_acks(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.proc.stdout:
                with self._acks:
                    if line == b"c\n":
                        self.unacked.popleft()
                    elif line.startswith(b"b "):
                        self._acked_token = int(line[2:])
                        self._acks.notify_all()
        with self._acks:
            self.ended = True
            self._acks.notify_all()
        with contextlib.suppress(OSError):
            self.proc.stdout.close()
        if self.on_exit is not None:
            self.on_exit()

    def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._send_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except ValueError:  # closed by _reap: as a writer that is gone
                raise BrokenPipeError from None

    def _reap(self) -> str:
        """Close the input, wait for the exit; the last stderr line of a failure."""
        proc = self.proc
        with self._send_lock:
            with contextlib.suppress(OSError):
                if proc.stdin is not None and not proc.stdin.closed:
                    proc.stdin.close()
            if self._stderr is None:
                self._stderr = proc.stderr.read().decode(errors="replace").strip() \
                    if proc.stderr else ""
                if proc.stderr is not None:
                    proc.stderr.close()
        code = proc.wait()
        if code != 0:
            return self._stderr.splitlines()[-1] if self._stderr else \
                f"writer exited with status {code}"
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
        self._giving_up = threading.Lock()  # `_give_up` from the feeder and a caller at once
        self._seq = 0
        self._sent = 0
        self._rows = 0  # rows of the run sent so far, as the file counts them
        self.restarts = 0  # writers that took over from one that died
        self.on_failure: Callable[[str], None] | None = None  # told the cause, once

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
            "trace_meta": to_json(info.trace_meta), "version": version(),
            "log_candidates": str(self.candidates), "decisions": 0, "candidates": 0,
            "events": 0,
        }
        try:
            self.run_id = int(self.store.db.table("runs").insert(row).last_pk)  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.store.path}: cannot start a run ({exc})") from None
        self._writer = self.store.writer(on_exit=self._wake.set)
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
        try:
            self.store.db.execute(
                "UPDATE runs SET finished_ts = ?, status = ?, summary = ?, error = ? "
                "WHERE id = ?", [time.time(), status, _summary(result), text, self.run_id])
            row = ""
        except sqlite3.Error as exc:
            row = f"; the run's row could not be updated either ({exc})"
        if error is None and self._error is not None:
            raise StoreError(f"{self.store.path}: writing the decision log failed: "
                             f"{self._error}{row}")
        if row:
            raise StoreError(f"{self.store.path}: the run is logged{row}")

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
        if self._error is not None or self._thread is None or self._writer is None:
            self._fail()
        try:  # the rows pending now go in the first frames sent from here on
            self._send_pending(1 + max(len(self._events), len(self._decisions)) // FRAME_ROWS)
            self._barrier()
        except _GaveUp:
            self._fail()

    def close(self) -> None:
        """Send everything pending, wait for the writer to commit it (idempotent)."""
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        if self._writer is None:
            return
        if self._error is None:
            with contextlib.suppress(_GaveUp):
                self._barrier()
        self._writer = None
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
        except _GaveUp:
            pass
        except Exception as exc:
            self._give_up(_one_line(exc), raise_=False)

    def _send_pending(self, frames: int | None = None) -> None:
        """Send what is pending, in at most `frames` frames (None: all of it); one
        sender at a time, so frames stay in order."""
        with self._frames:
            if self._writer is not None and self._writer.ended:
                self._recover()
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
        self._rows += len(rows) + len(decisions) + len(params)
        try:
            self._writer.send(self.run_id, (rows, decisions, cands, params), self._rows)
        except BrokenPipeError:  # kept among the writer's unacknowledged frames
            self._recover()
        self._sent += len(rows) + len(decisions) + len(params) + sum(len(c[3]) for c in cands)

    # ------------------------------------------------------- a writer that died

    def _barrier(self) -> None:
        """`WriterProcess.barrier` on the current writer, through its restarts."""
        while True:
            assert self._writer is not None
            try:
                self._writer.barrier()
                return
            except WriterDied:
                with self._frames:
                    self._recover()

    def _recover(self) -> None:
        """The writer died: when it was killed (not refused by the disk or the
        file), the file is sound and MAX_RESTARTS is not reached, a new writer
        gets every frame the file does not hold yet, so nothing is lost; else
        `_give_up` with the cause. Call with `_frames` held."""
        while self._writer is not None and self._writer.ended:
            old = self._writer
            death = old.death()
            if not death.restartable:
                self._give_up(death.cause)
            if self.restarts >= MAX_RESTARTS:
                self._give_up(f"{death.cause}, after {self.restarts} restarts")
            problem = self._unsound()
            if problem is not None:
                self._give_up(f"{death.cause}; {problem}")
            frames = self._uncommitted(old.unacked)
            self._writer = self.store.writer(on_exit=self._wake.set)
            self.restarts += 1
            log.warning("decision log %s: %s; a new writer took over (%d frame(s) sent again, "
                        "none lost)", self.store.path, death.cause, len(frames))
            with contextlib.suppress(BrokenPipeError):  # (it died too: the loop sees it)
                self._writer.adopt(frames)

    def _unsound(self) -> str | None:
        """Why the file may not be written on (None: `PRAGMA quick_check` is ok)."""
        try:
            verdict = str(self.store.db.execute("PRAGMA quick_check").fetchone()[0])
        except sqlite3.Error as exc:
            return f"the file cannot be checked ({exc})"
        return None if verdict == "ok" else f"the file is not sound (quick_check: {verdict})"

    def _uncommitted(self, frames: deque[Frame]) -> list[Frame]:
        """`frames` the file does not hold: by each run's row counts, which a
        frame's transaction updates with its rows."""
        held: dict[int, int] = {}
        for run_id in {f.run_id for f in frames}:
            held[run_id] = self.store.db.execute(
                "SELECT (SELECT events + decisions FROM runs WHERE id = :r) + "
                "(SELECT count(*) FROM param_changes WHERE run_id = :r)",
                {"r": run_id}).fetchone()[0] or 0
        return [f for f in frames if f.rows_through > held[f.run_id]]

    def _give_up(self, cause: str, raise_: bool = True) -> None:
        """Record the cause (the run's error, the sink's failures) and tell
        `on_failure`, once; raises _GaveUp unless told not to."""
        with self._giving_up:
            if self._error is None:
                log.error("decision log %s: %s; nothing more is written to it",
                          self.store.path, cause)
                try:
                    if self.on_failure is not None:
                        self.on_failure(cause)
                finally:  # published after on_failure is told: a caller that sees
                    self._error = cause  # the error (StoreError) sees it told
        if raise_:
            raise _GaveUp

    def _decision_rows(self, d: Decision, wall_ts: float, out: list[tuple[Any, ...]],
                       cands: list[tuple[Any, ...]]) -> None:
        """`d`'s row in the layouts of `store.columns` (DECISION_HEAD, + DECISION_LISTS,
        + DECISION_CHOSEN), and its logged candidates' rows (CANDIDATE_SENT)."""
        self._seq += 1
        seq, n = self._seq, len(d.candidates)
        head = (seq, d.t, d.wall_ms, wall_ts, _RESERVATION.get(d.reservation, "full"),
                d.blocked, d.retry, n, d.held)
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
