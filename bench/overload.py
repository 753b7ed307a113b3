"""TOPAS's decision cost far beyond capacity: does it stay bounded?

    python bench/overload.py [--workload dag10wide] [--rate 1.0] [--tasks 1000]
        [--seed 1] [--write]

Replays one trace of `--tasks` arrivals at `--rate` task/s (DAG-10-Wide at
1.0 task/s is about 6x its heaviest operating point, so the waiting queue
grows for the whole run) under FCFS and under TOPAS, one after the other in
this process, and reports each one's wall and CPU time, its decisions' median
and p99 (wall and CPU), and the longest waiting queue a decision saw, against
the targets of issue 28 (wall time at most 20x FCFS's, p99 decision at most
50 ms). Writes the `overload` section of docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Any

import numpy as np
from _results import at_least, update_section  # bench/_results.py

from backends.sim.engine import SimBackend
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


class CpuTimed:
    """A policy as given, with each decision's CPU time (`time.process_time`:
    what a loaded machine's other processes do not add) kept in `cpu_ms`."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.cpu_ms: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def decide(self, view: Any) -> Decision:
        c0 = time.process_time()
        decision = self.policy.decide(view)
        self.cpu_ms.append((time.process_time() - c0) * 1e3)
        return decision


def replay(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    wl = load_workload(args.workload)
    trace = generate_trace(wl.workflows, args.rate, args.tasks, args.seed, name=wl.name)
    backend = SimBackend(get_profile(DEFAULT_PROFILE))
    watch, timed = QueueWatch(), CpuTimed(make_policy(policy))
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    result = Run(trace, timed, backend, sink=watch).execute()  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ms = np.array(result.decision_ms) if result.decision_ms else np.zeros(1)
    cpu_ms = np.array(timed.cpu_ms) if timed.cpu_ms else np.zeros(1)
    return {"policy": policy, "wall_s": wall, "cpu_s": cpu, "decisions": len(result.decision_ms),
            "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "cpu_median_ms": float(np.median(cpu_ms)),
            "cpu_p99_ms": float(np.percentile(cpu_ms, 99)),
            "most_waiting": watch.most_waiting, "tasks": len(result.jct),
            "mean_jct_s": float(np.mean(list(result.jct.values())))}


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="dag10wide")
    ap.add_argument("--rate", type=float, default=1.0, help="task/s (1.0)")
    ap.add_argument("--tasks", type=at_least(1), default=1000)
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    if not args.rate > 0:
        ap.error("--rate: use a positive number of task/s")
    rows = [replay(p, args) for p in ("fcfs", "topas")]
    text = render(rows, args)
    print(text)
    if args.write:
        print(f"wrote {update_section('overload', text)}")


if __name__ == "__main__":
    main()
