"""The daemon's periodic summary line (`--summary-every`), read from the log
of a real daemon: its counts add up to what `/v1/state` reports."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.daemonkit import Daemon

LINE = re.compile(r"summary t=\S+: tasks (\d+) in flight, \+(\d+) arrived, \+(\d+) finished, "
                  r".*requests (\d+) running, (\d+) waiting, \+(\d+) finished; "
                  r"JCT mean (\S+), p99 (\S+); decisions \+(\d+).*; preemptions \+(\d+) by "
                  r"the policy, \+(\d+) by the engine; KV (\d+)% used")


def summaries(log: Path) -> list[tuple[str, ...]]:
    return [m.groups() for m in LINE.finditer(log.read_text(errors="replace"))]


def test_the_summary_lines_add_up_to_the_run(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag4", "--rate", "0.5", "--tasks", "20",
                "--summary-every", "0.2", "--log-level", "info", speed="40") as d:
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] == 20)
        deadline = time.monotonic() + 30
        while True:  # a line after the last task finished
            lines = summaries(d.log)
            if sum(int(x[2]) for x in lines) == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(lines) >= 2, d.log.read_text()
        assert sum(int(x[1]) for x in lines) == 20  # arrived
        assert sum(int(x[2]) for x in lines) == 20  # finished
        assert sum(int(x[5]) for x in lines) == st["counts"]["requests_finished"]
        assert sum(int(x[8]) for x in lines) <= st["counts"]["decisions"]
        assert sum(int(x[9]) for x in lines) == st["counts"]["preemptions"]
        last = lines[-1]
        assert last[0] == last[3] == last[4] == "0"  # nothing in flight at the end
        assert float(last[6].rstrip("s")) > 0
        assert d.stop() == 0
