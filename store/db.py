"""Opening a decision log: WAL mode, migrations, and the `Store` handle."""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlite_utils import Database

from store.schema import MIGRATIONS_TABLE, migrate, unknown
from topasd.model import TopasError, pid_alive

if TYPE_CHECKING:
    from store.writer import CandidateFilter, StoreSink, WriterProcess

BUSY_TIMEOUT_MS = 10_000


class StoreError(TopasError):
    """A decision log cannot be opened, read or written; the message says why."""


def connect(path: str | Path, *, create: bool = True) -> Database:
    """A connection to the log at `path`: WAL journal, NORMAL sync (a killed
    process loses no committed batch), a busy timeout for concurrent writers.
    Applies pending migrations; refuses a file that is not a topasd log."""
    p = Path(path)
    if not create and not p.is_file():
        raise StoreError(f"{p}: no such decision log (write one with `topasd replay --db {p}`)")
    if create and p.parent and not p.parent.is_dir():
        raise StoreError(f"{p}: the folder {p.parent} does not exist")
    if p.is_dir():
        raise StoreError(f"{p}: is a folder; name the decision log file, e.g. {p / 'topasd.db'}")
    try:
        db = Database(sqlite3.connect(str(p), check_same_thread=False))
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        tables = db.table_names()
        if not create and not tables:
            raise StoreError(f"{p}: an empty file, not a decision log yet (a daemon or "
                             "`topasd replay --db` writes one)")
        if tables and MIGRATIONS_TABLE not in tables:
            raise StoreError(f"{p}: a SQLite database, but not a topasd decision log "
                             f"(it has tables {sorted(tables)[:5]} and no {MIGRATIONS_TABLE})")
        newer = unknown(db)
        if newer:
            raise StoreError(f"{p}: written by a newer topasd (migrations {newer}); upgrade "
                             "topasd to read it")
        db.enable_wal()
        db.execute("PRAGMA synchronous = NORMAL")
        migrate(db)
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):
            raise StoreError(f"{p}: another process holds a write lock on this decision log "
                             "(database is locked); wait for it to finish or stop it, then "
                             "retry") from None
        raise StoreError(f"{p}: cannot open as a decision log ({exc})") from None
    return db


class Store:
    """A decision log file: runs, tasks, requests, decisions, candidates,
    engine events and parameter changes (see `store.schema`).

    `sink()` gives a `RunSink` that records one run (a feeder thread, and the
    file's writer process shared by its runs: `store.writer`); read with the
    functions of `store.queries` on `store.db`. `close()` waits for the writer.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.db = connect(self.path, create=create)
        self._writer: WriterProcess | None = None
        self._lock = threading.Lock()
        self.mark_interrupted()

    def sink(self, log_candidates: str | CandidateFilter = "all", *, batch_rows: int = 2048,
             flush_s: float = 0.05) -> StoreSink:
        """A sink for one run (pass it to `topasd.runner.Run`)."""
        from store.writer import CandidateFilter, StoreSink

        spec = (log_candidates if isinstance(log_candidates, CandidateFilter)
                else CandidateFilter.parse(log_candidates))
        return StoreSink(self, spec, batch_rows=batch_rows, flush_s=flush_s)

    def writer(self, on_exit: Callable[[], None] | None = None) -> WriterProcess:
        """The file's writer process, started on first use, shared by its sinks
        (one that died is replaced); `on_exit` is called when it ends."""
        from store.writer import WriterProcess

        with self._lock:
            if self._writer is not None and not self._writer.alive():
                self._writer.close()  # reap a writer that died
                self._writer = None
            if self._writer is None:
                self._writer = WriterProcess(self.path, on_exit)
            else:
                self._writer.on_exit = on_exit
            return self._writer

    def mark_interrupted(self) -> int:
        """Runs left `running` by a process of this host that no longer exists
        (killed) become `interrupted`; returns how many."""
        host = socket.gethostname()
        stale = [r["id"] for r in self.db.query(
            "SELECT id, pid FROM runs WHERE status = 'running' AND host = ?", [host])
            if not pid_alive(r["pid"])]
        try:
            for run_id in stale:
                self.db.execute("UPDATE runs SET status = 'interrupted' WHERE id = ?",
                                [run_id])
        except sqlite3.Error:  # a read-only file: leave the status as it is
            return 0
        return len(stale)

    def integrity(self) -> str:
        """`PRAGMA integrity_check`: 'ok' for a sound file."""
        return str(self.db.execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        """Wait for the writer to commit everything sent, then close the file."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
