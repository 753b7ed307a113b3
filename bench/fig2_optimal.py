"""The best schedule of the Fig. 2 machine with room for one request, against
TOPAS and the baselines on the arrival lists of `bench/fig2_grid.py`.

With room for one request beside one prefix (`workflows/fig2.py`, batch 1)
the machine serves one request at a time: 4 units each, plus a 1-unit setup
whenever the next request's agent is not the resident one. A schedule is
then an order of the requests (each task's a, b, c in turn), each started
when the machine is free and its task has arrived. A dynamic program over
(each task's stages done, the resident agent, the time) finds the order with
the least total JCT, exactly, among schedules that never preempt (a
preempted request loses its progress, and every request is as long as every
other). The bench replays every policy on each arrival list and reports how
far each is above that optimum; a policy below it would mean the model
misreads the machine, and the bench stops on it.

    python bench/fig2_optimal.py [--scenarios 60] [--seed 0] [--write]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from _results import at_least, update_section  # bench/_results.py
from fig2_grid import POLICIES, run, scenarios  # bench/fig2_grid.py

from workflows.fig2 import OUTPUT_TOKENS, PREFIX_TOKENS, fig2_profile, fig2_workflow

BATCH = 1
SETUP = fig2_profile(BATCH).t_swap(PREFIX_TOKENS)  # a prefix over the host link: 1 unit
SERVICE = float(OUTPUT_TOKENS)  # 1 prefill step (the first token) + 3 decode steps
AGENTS = tuple(s.agent for s in fig2_workflow().stages.values())  # A, B, C: stage i's agent
EPS = 1e-9


@dataclass(frozen=True)
class Step:
    """One request of an optimal schedule: task `task`'s stage on `agent`,
    run from `start` to `end` (a setup, if any, ends at `start`)."""

    task: int
    agent: str
    start: float
    end: float


def optimal(arrivals: Sequence[float]) -> tuple[float, tuple[Step, ...]]:
    """The least mean JCT of any non-preemptive schedule of `arrivals` on the
    room-1 machine, and one schedule that reaches it."""
    arr = tuple(float(a) for a in arrivals)
    stages = len(AGENTS)

    @functools.cache
    def best(done: tuple[int, ...], resident: str, t: float) -> tuple[float, tuple[Step, ...]]:
        """(least total JCT of the tasks still to finish, its steps) from a
        free machine at `t` with `resident`'s prefix on the GPU."""
        if all(k == stages for k in done):
            return 0.0, ()
        out: tuple[float, tuple[Step, ...]] = (float("inf"), ())
        for i, k in enumerate(done):
            if k == stages:
                continue
            agent = AGENTS[k]
            start = max(t, arr[i]) + (0.0 if agent == resident else SETUP)
            end = start + SERVICE
            nxt = (*done[:i], k + 1, *done[i + 1:])
            jct = end - arr[i] if k + 1 == stages else 0.0
            rest, steps = best(nxt, agent, end)
            if jct + rest < out[0] - EPS:
                out = (jct + rest, (Step(i, agent, start, end), *steps))
        return out

    total, steps = best((0,) * len(arr), "", 0.0)
    return total / len(arr), steps


def timeline(steps: Sequence[Step]) -> str:
    """`T0.A 1-5, T1.A 5-9, ...`: who runs when."""
    return ", ".join(f"T{s.task}.{s.agent} {s.start:g}-{s.end:g}" for s in steps)


def measure(arrival_lists: Sequence[tuple[float, ...]]) -> list[dict[str, float]]:
    """Per arrival list: the optimum and every policy's mean JCT at room 1."""
    rows = []
    for i, arrivals in enumerate(arrival_lists):
        row = {"optimum": optimal(arrivals)[0]}
        for p in POLICIES:
            row[p] = run(p, arrivals, BATCH)[0]
            if row[p] < row["optimum"] - EPS:
                raise SystemExit(f"fig2_optimal.py: {p} takes {row[p]:.3f} on arrivals "
                                 f"{arrivals}, below the optimum {row['optimum']:.3f}: the "
                                 "model does not match the machine")
        rows.append(row)
        print(f"\r{i + 1}/{len(arrival_lists)}", end="", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    return rows


def render(rows: list[dict[str, float]], lists: Sequence[tuple[float, ...]],
           args: argparse.Namespace, wall: float) -> str:
    opt = np.array([r["optimum"] for r in rows])
    lines = ["## Fig. 2 machine with room for one request: the optimum", "",
             f"Command: `python bench/fig2_optimal.py --scenarios {args.scenarios} --seed "
             f"{args.seed} --write` ({wall:.0f} s). The arrival lists of `bench/fig2_grid.py` "
             "(same seed); the optimum is the least mean JCT of any schedule that never "
             "preempts, found exactly by a dynamic program over the order of the requests "
             f"(average {opt.mean():.3f}).", "",
             "| policy | average mean JCT | above the optimum (average) | lists at the optimum |",
             "|---|---|---|---|"]
    for p in POLICIES:
        v = np.array([r[p] for r in rows])
        lines.append(f"| {p} | {v.mean():.3f} | {(v - opt).mean():.3f} | "
                     f"{int((v - opt < EPS).sum())} / {len(rows)} |")
    off = [(a, r) for a, r in zip(lists, rows, strict=True) if r["spf"] > r["optimum"] + EPS]
    if off:
        arrivals, r = off[0]
        lines += ["", f"The first list where SRPT (`spf`) is above the optimum: arrivals "
                  f"{', '.join(f'{a:g}' for a in arrivals)}; SRPT {r['spf']:.2f}, TOPAS "
                  f"{r['topas']:.2f}, optimum {r['optimum']:.2f}: "
                  f"{timeline(optimal(arrivals)[1])}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=at_least(1), default=60,
                    help="arrival lists (bench/fig2_grid.py's, same seed)")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lists = scenarios(args.scenarios, args.seed)
    text = render(measure(lists), lists, args, time.perf_counter() - t0)
    print(text)
    if args.write:
        update_section("fig2_optimal", text)


if __name__ == "__main__":
    main()
