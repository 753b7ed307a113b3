"""TOPAS's decision cost far beyond capacity: does it stay bounded?

    python bench/overload.py [--workload dag10wide] [--rate 1.0] [--tasks 1000]
        [--seed 1] [--daemon] [--write]

Replays one trace of `--tasks` arrivals at `--rate` task/s (DAG-10-Wide at
1.0 task/s is about 6x its heaviest operating point, so the waiting queue
grows for the whole run) under FCFS and under TOPAS, one after the other in
this process, and reports each one's wall and CPU time, its decisions' median
and p99 (wall and CPU), and the longest waiting queue a decision saw, against
the targets of issue 28 (wall time at most 20x FCFS's, p99 decision at most
50 ms). With `--daemon` the same arrivals run inside `topasd start` (its
workload driver at `--speed max`), reporting the longest waiting queue the
daemon showed. Writes the `overload` (or `overload-daemon`) section of
docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _daemon import start_daemon  # bench/_daemon.py
from _results import (  # bench/_results.py
    TimedPolicy,
    parse_trace_args,
    trace_parser,
    update_section,
)

from backends.sim.engine import SimBackend
from topasd.cli.options import param_flags
from topasd.model import Decision, EngineEvent, EventKind
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.native import status as native_status
from workflows.builtin import load_workload
from workflows.trace import generate_trace

WALL_RATIO = 20.0  # issue 28: TOPAS's wall time at most this times FCFS's
DECISION_P99_MS = 50.0


class QueueWatch:
    """A sink that follows the waiting queue through the engine's events and
    keeps the longest one a decision was made on."""

    def __init__(self) -> None:
        self.waiting = self.most_waiting = 0

    def decision(self, d: Decision) -> None:
        self.most_waiting = max(self.most_waiting, self.waiting)

    def event(self, ev: EngineEvent) -> None:
        if ev.kind in (EventKind.REQUEST_READY, EventKind.PREEMPT, EventKind.RETRACT):
            self.waiting += 1
        elif ev.kind is EventKind.REQUEST_ADMIT:
            self.waiting -= 1


def replay(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    wl = load_workload(args.workload)
    trace = generate_trace(wl.workflows, args.rate, args.tasks, args.seed, name=wl.name)
    backend = SimBackend(get_profile(DEFAULT_PROFILE))
    pol = make_policy(policy)
    if policy == "topas" and args.param:
        pol.set_params(**param_flags(tuple(args.param)))  # type: ignore[attr-defined]
    watch, timed = QueueWatch(), TimedPolicy(pol, clock=time.process_time)  # CPU time
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    result = Run(trace, timed, backend, sink=watch).execute()  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ms = np.array(result.decision_ms) if result.decision_ms else np.zeros(1)
    cpu_ms = np.array(timed.times) if timed.times else np.zeros(1)
    return {"policy": policy, "wall_s": wall, "cpu_s": cpu, "decisions": len(result.decision_ms),
            "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "cpu_median_ms": float(np.median(cpu_ms)),
            "cpu_p99_ms": float(np.percentile(cpu_ms, 99)),
            "most_waiting": watch.most_waiting, "tasks": len(result.jct),
            "mean_jct_s": float(np.mean(list(result.jct.values())))}


def daemon_replay(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """The same arrivals fed by `topasd start`'s workload driver at `--speed
    max`: the daemon's own loop, store and API around the policy. Polls
    /v1/state (twice a second) for the longest waiting queue until every task
    finished; decision times from the store's `wall_ms`."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc, url = start_daemon(Path(tmp), "--speed", "max", "--policy", policy,
                                 "--workload", args.workload, "--rate", str(args.rate),
                                 "--tasks", str(args.tasks), "--seed", str(args.seed))
        most = 0
        with httpx.Client(base_url=url, timeout=120) as http:
            while True:
                counts = http.get("/v1/state", params={"limit": 1}).json()["counts"]
                most = max(most, counts["requests_waiting"])
                if counts["tasks_finished"] >= args.tasks:
                    break
                time.sleep(0.5)
        wall = time.perf_counter() - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        with sqlite3.connect(Path(tmp) / "bench.db") as db:
            ms = np.array([r[0] for r in db.execute("SELECT wall_ms FROM decisions")])
    return {"policy": policy, "wall_s": wall, "decisions": len(ms),
            "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "most_waiting": most}


def render_daemon(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    fcfs, topas = rows
    lines = ["### In the daemon", "",
             f"`python bench/overload.py --daemon --workload {args.workload} --rate "
             f"{args.rate:g} --tasks {args.tasks} --seed {args.seed} --write`: the same "
             "arrivals fed by `topasd start`'s driver at `--speed max` (the daemon's loop, "
             "store and API around the policy); wall time from start until every task "
             f"finished; load average {os.getloadavg()[0]:.2f}.", "",
             "| policy | wall s | decisions | median ms | p99 ms | most requests waiting |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['wall_s']:.1f} | {r['decisions']} | {r['median_ms']:.2f} "
              f"| {r['p99_ms']:.2f} | {r['most_waiting']} |" for r in rows]
    lines += ["", f"TOPAS's wall time is {topas['wall_s'] / fcfs['wall_s']:.1f}x FCFS's; its "
              f"p99 decision {topas['p99_ms']:.1f} ms with up to {topas['most_waiting']} "
              "requests waiting."]
    return "\n".join(lines) + "\n"


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    fcfs, topas = rows
    ratio, cpu_ratio = topas["wall_s"] / fcfs["wall_s"], topas["cpu_s"] / fcfs["cpu_s"]
    lines = ["## Overload: decision cost (`bench/overload.py`)", "",
             f"Command: `python bench/overload.py --workload {args.workload} --rate "
             f"{args.rate:g} --tasks {args.tasks} --seed {args.seed} --write`. "
             f"Scheduler: {native_status().reason}; load average "
             f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs while measuring. "
             "Wall time counts what other processes take from this one on a loaded "
             "machine; CPU time (`time.process_time`) does not.", "",
             "| policy | tasks finished | wall s | CPU s | decisions | median ms | p99 ms "
             "| CPU median ms | CPU p99 ms | longest waiting queue | mean JCT s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['tasks']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
                     f"| {r['decisions']} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} "
                     f"| {r['cpu_median_ms']:.2f} | {r['cpu_p99_ms']:.2f} "
                     f"| {r['most_waiting']} | {r['mean_jct_s']:.0f} |")
    lines += ["", f"TOPAS's wall time is {ratio:.1f}x FCFS's, its CPU time {cpu_ratio:.1f}x "
              f"(target <= {WALL_RATIO:g}x); its p99 decision {topas['p99_ms']:.1f} ms wall, "
              f"{topas['cpu_p99_ms']:.1f} ms CPU (target <= {DECISION_P99_MS:g} ms)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = trace_parser(__doc__, rate=1.0, tasks=1000)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a TOPAS parameter (repeatable; not with --daemon)")
    ap.add_argument("--daemon", action="store_true",
                    help="run the policies inside `topasd start` (section overload-daemon)")
    args = parse_trace_args(ap)
    if args.daemon and args.param:
        ap.error("--param is for the replay in this process; the daemon runs its defaults")
    run, draw, section = ((daemon_replay, render_daemon, "overload-daemon") if args.daemon
                          else (replay, render, "overload"))
    text = draw([run(p, args) for p in ("fcfs", "topas")], args)
    print(text)
    if args.write:
        print(f"wrote {update_section(section, text)}")


if __name__ == "__main__":
    main()
