"""A real daemon whose decision-log writer dies: killed, it is replaced at once
(idle or busy) and nothing is lost; refused by a full disk, the daemon stops
admitting work, `/ready` says why at once, and the log, the run's row and the
last line name the cause instead of claiming a flush."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from store import Store
from store import queries as q
from tests.daemonkit import Daemon

MiB = 1024 * 1024


def writer_pid(daemon_pid: int) -> int | None:
    """The pid of the daemon's decision-log writer (its child running store/_child.py)."""
    for children in Path(f"/proc/{daemon_pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            with contextlib.suppress(OSError):
                if b"_child.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return int(pid)
    return None


def wait_until(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.02)


def call(d: Daemon, i: int) -> httpx.Response:
    return d.http.post("/v1/chat/completions", json={
        "model": "m", "max_tokens": 4, "messages": [
            {"role": "system", "content": f"agent {i % 3}"}, {"role": "user", "content": "go"}]})


def test_a_killed_writer_is_replaced_idle_or_busy_and_nothing_is_lost(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--log-level", "info") as d:
        first = writer_pid(d.proc.pid)
        assert first is not None
        os.kill(first, signal.SIGKILL)  # while idle: noticed without a call
        wait_until("a new writer", lambda: writer_pid(d.proc.pid) not in (None, first))
        assert d.http.get("/ready").status_code == 200
        for i in range(30):
            assert call(d, i).status_code == 200
            if i == 15:  # and while busy
                second = writer_pid(d.proc.pid)
                assert second is not None
                os.kill(second, signal.SIGKILL)
        wait_until("a third writer", lambda: writer_pid(d.proc.pid) not in (None, second))
        counts = d.state(1)["counts"]
        assert d.http.get("/ready").status_code == 200
        assert d.stop() == 0
    log = d.log.read_text()
    assert log.count("the writer process was killed (SIGKILL); a new writer took over") == 2
    assert "topasd stopped (store" in log and "flushed, exit 0)" in log
    with d.store() as store:
        run = q.get_run(store.db)
        assert run.status == "done" and run.error is None
        seqs = [r[0] for r in store.db.execute(
            "SELECT seq FROM decisions WHERE run_id = ? ORDER BY seq", [run.id])]
        assert seqs == list(range(1, counts["decisions"] + 1))  # every decision, once
        assert store.integrity() == "ok"


@contextlib.contextmanager
def small_disk(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted at `path` (skips where mounting is not allowed)."""
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                          str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk`; the filler file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (MiB, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_stops_admitting_and_is_named_everywhere(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 8) as disk, \
            Daemon(tmp_path, "--db", str(disk / "full.db"), "--log-level", "info") as d:
        filler = fill(disk)
        for i in range(2000):  # until a batch no longer fits
            if call(d, i).status_code != 200 or d.http.get("/ready").status_code != 200:
                break
        wait_until("/ready 503", lambda: d.http.get("/ready").status_code == 503)
        ready = d.http.get("/ready").json()["error"]["message"]
        assert ready.startswith("the decision log failed (the disk is full (SQLite: ")
        r = call(d, 0)
        assert r.status_code == 503 and "not admitting work: the decision log failed (the " \
            "disk is full" in r.json()["error"]["message"]
        assert d.http.post("/v1/tasks", json={"workflow": "chain3"}).status_code == 503
        assert d.http.get("/health").status_code == 200  # it still answers
        filler.unlink()  # room for the run's row
        assert d.stop() == 1
        log = d.log.read_text()
        with Store(disk / "full.db", create=False) as store:
            run = q.get_run(store.db)
        assert run.status == "failed"
        assert run.error.startswith("decision log writer: the disk is full (SQLite: "
                                    "OperationalError: database or disk is full)")
    assert "database or disk is full" in log and "ended early" not in log
    last = log.strip().splitlines()[-1]
    assert "topasd stopped (store" in last and "NOT fully written: the disk is full" in last
    assert "flushed" not in last
