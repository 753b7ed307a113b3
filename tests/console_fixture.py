"""The recorded run the console's replay and snapshot tests read.

`tests/data/console_run.sqlite` is committed so that the snapshots do not move
when the scheduler or the simulator change; regenerate it (and review the
snapshots: `pytest tests/test_console_snapshots.py --snapshot-update`) with

    python -m tests.console_fixture

It is a TOPAS replay of 14 DAG-4 tasks on the default profile with every
candidate logged; the wall-clock columns (policy wall time, timestamps, pid,
host) are replaced by fixed values so the screens are the same on every run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

FIXTURE = Path(__file__).with_name("data") / "console_run.sqlite"


def make_fixture(path: Path = FIXTURE) -> Path:
    """Record the run into `path` (replacing it) and fix its wall-clock columns."""
    from backends.sim.engine import SimBackend
    from store import Store
    from topasd.profiles import get_profile
    from topasd.runner import Run
    from topasd.scheduler import make_policy
    from workflows.builtin import load_workload
    from workflows.trace import generate_trace

    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    wl = load_workload("dag4")
    trace = generate_trace(wl.workflows, 0.2, 14, 3, name=wl.name)
    store = Store(path)
    sink = store.sink("all")
    Run(trace, make_policy("topas"), SimBackend(get_profile("qwen2.5-32b-a100")),
        sink=sink).execute()
    store.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE decisions SET wall_ms = 0.25 + (seq % 7) * 0.125, "
                     "wall_ts = 1700000000 + seq")
        conn.execute("UPDATE runs SET started_ts = 1700000000, finished_ts = 1700000100, "
                     "pid = 1, host = 'fixture', version = 'fixture'")
        conn.execute("UPDATE runs SET summary = NULL")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("VACUUM")
    conn.close()
    return path


if __name__ == "__main__":
    print(make_fixture())
