"""Test helper: the real `topasd start` as a subprocess on 127.0.0.1 (a free port)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from store import Store

# guards against a hang only (the wait ends at /ready): the simulator starts in
# seconds; an embedded engine (vLLM, SGLang) loads a model, which on a loaded
# 2-core machine took over 60 s
START_TIMEOUT_S = 60.0
ENGINE_START_TIMEOUT_S = 600.0


def service_counts_until(svc: Any, pred: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Poll an in-process Service's counts until `pred(counts)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        counts = svc.state(1).result(10)["counts"]
        if pred(counts):
            return counts
        assert time.monotonic() < deadline, f"timed out; counts {counts}"
        time.sleep(0.02)


def sse_events(lines: Any) -> list[tuple[int | None, str, dict[str, Any]]]:
    """(id, event, data) of each event in a stream of SSE lines."""
    out: list[tuple[int | None, str, dict[str, Any]]] = []
    eid, name = None, None
    for line in lines:
        if line.startswith("id: "):
            eid = int(line[4:])
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((eid, name or "message", json.loads(line[6:])))
            eid, name = None, None
    return out


def rows(db: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    """The rows of a query on a store file (its own connection, closed after)."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without TOPAS_* settings (a developer's own must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPAS_")}
    env.update(extra)
    return env


class Daemon:
    """`topasd start --port 0 ...` in `workdir`; found through its runtime file."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None,
                 speed: str = "max", token: str | None = None,
                 own_group: bool = False, start_timeout: float | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.runtime = workdir / "daemon.json"
        self.db = workdir / "topasd.db"
        self.log = workdir / "daemon.log"
        self.token = token
        cmd = [sys.executable, "-m", "topasd.cli", "start", "--port", "0",
               "--runtime-file", str(self.runtime), "--db", str(self.db), "--speed", speed,
               "--log-level", "warning", *args]
        self.own_group = own_group
        self._log_fh = open(self.log, "wb")  # noqa: SIM115 (closed in stop)
        # own_group: the daemon leads a process group of its own, as a shell
        # job does, so that `stop(group=True)` signals it and its children
        self.proc = subprocess.Popen(cmd, cwd=workdir, env=env or clean_env(),
                                     stdout=self._log_fh, stderr=subprocess.STDOUT,
                                     start_new_session=own_group)
        if start_timeout is None:
            engine = "--backend" in args and args[args.index("--backend") + 1] != "sim"
            start_timeout = ENGINE_START_TIMEOUT_S if engine else START_TIMEOUT_S
        self.info = self._wait_started(start_timeout)
        self.url: str = self.info["url"]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, timeout=60, headers=headers)

    def _wait_started(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"topasd exited with {self.proc.returncode}:\n"
                                   f"{self.log.read_text(errors='replace')}")
            try:
                info = json.loads(self.runtime.read_text())
            except (OSError, ValueError):
                info = None
            if (info is not None and info.get("pid") == self.proc.pid
                    and httpx.get(f"{info['url']}/ready", timeout=10).status_code == 200):
                return info
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"topasd did not start:\n{self.log.read_text(errors='replace')}")

    def state(self, limit: int = 50) -> dict[str, Any]:
        r = self.http.get("/v1/state", params={"limit": limit})
        r.raise_for_status()
        return r.json()

    def wait_for(self, predicate: Any, timeout: float = 60.0, limit: int = 1) -> dict[str, Any]:
        """Poll /v1/state (`limit`: of its lists) until predicate(state) holds."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.state(limit=limit)
            if predicate(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting; last state counts {st['counts']}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0,
             group: bool = False) -> int:
        """Signal the daemon (with `group`, its whole process group, as Ctrl-C
        in a terminal does) and wait for its exit code."""
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"topasd did not exit after {sig}:\n"
                                 f"{self.log.read_text(errors='replace')}") from None
        finally:
            self.http.close()
            self._log_fh.close()
        return code

    def store(self) -> Store:
        return Store(self.db, create=False)

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            if self.own_group:  # the writer child too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        self.http.close()
        self._log_fh.close()
