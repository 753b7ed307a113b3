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
misreads the machine, and the bench stops on it. It also reports the plan
a policy could make without knowing future arrivals (`present_plan`: the
optimum over the tasks already arrived, replanned whenever the machine is
free), against SRPT.

    python bench/fig2_optimal.py [--scenarios 60] [--seed 0] [--batches 1,2,3,5] [--write]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from _results import at_least, update_section  # bench/_results.py
from fig2_grid import POLICIES, batch_sizes, run, scenarios  # bench/fig2_grid.py

from workflows.fig2 import MAX_BATCH, OUTPUT_TOKENS, PREFIX_TOKENS, fig2_profile, fig2_workflow

BATCH = 1
SETUP = fig2_profile(BATCH).t_swap(PREFIX_TOKENS)  # a prefix over the host link: 1 unit
SERVICE = float(OUTPUT_TOKENS)  # 1 prefill step (the first token) + 3 decode steps
AGENTS = tuple(s.agent for s in fig2_workflow().stages.values())  # A, B, C: stage i's agent
EPS = 1e-9
PRESENT = "present plan"  # `present_plan`'s row


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
    total, steps = _best(arr, (0,) * len(arr), "", 0.0)
    return total / len(arr), steps


@functools.cache
def _best(arr: tuple[float, ...], done: tuple[int, ...], resident: str,
          t: float) -> tuple[float, tuple[Step, ...]]:
    """(least total JCT of the tasks of `arr` still to finish, its steps)
    from a free machine at `t` with `resident`'s prefix on the GPU; task i
    has run its first done[i] stages."""
    stages = len(AGENTS)
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
        rest, steps = _best(arr, nxt, agent, end)
        if jct + rest < out[0] - EPS:
            out = (jct + rest, (Step(i, agent, start, end), *steps))
    return out


Running = tuple[tuple[float, int], ...]  # (end, task) of each running request, by end
Action = tuple[str, tuple[int, ...]]  # (agent, tasks whose next request starts now); ("", ()): wait


def present_plan(arrivals: Sequence[float], batch: int = BATCH) -> float:
    """Mean JCT of replanning at every event on the machine with room for
    `batch` requests: the best plan over the tasks already arrived
    (`_plan`), of which only the first action is taken. It uses no future
    arrival, as a policy cannot, and sees every event of an instant before
    deciding, as the simulator does (a task arriving as a request ends is
    seen at the decision of that end)."""
    arr = tuple(float(a) for a in arrivals)
    done, ends = [0] * len(arr), [0.0] * len(arr)
    running: Running = ()
    t, resident = 0.0, ""
    while any(k < len(AGENTS) for k in done):
        here = _present(arr, done, running, t)
        agent, tasks = _first(arr, here, done, running, resident, t, batch) if here else ("", ())
        if tasks:
            running, resident = _start(running, tasks, agent, resident, t), agent
            continue
        t, finished, running = _next_event(arr, done, running, t)
        for i in finished:
            done[i] += 1
            ends[i] = t
    return float(np.mean([e - a for e, a in zip(ends, arr, strict=True)]))


def _present(arr: tuple[float, ...], done: list[int], running: Running,
             t: float) -> list[int]:
    """The tasks a decision at t sees (unfinished, arrived by t), and those
    with a request running."""
    seen = [i for i, k in enumerate(done) if k < len(AGENTS) and arr[i] <= t + EPS]
    return sorted(set(seen) | {i for _, i in running})


def _first(arr: tuple[float, ...], here: list[int], done: list[int], running: Running,
           resident: str, t: float, batch: int) -> Action:
    """The first action of `_plan` over the tasks `here`, in the tasks' own ids."""
    place = {i: k for k, i in enumerate(here)}
    _, (agent, tasks) = _plan(tuple(arr[i] for i in here), tuple(done[i] for i in here),
                              tuple(sorted((e, place[i]) for e, i in running)), resident, t,
                              batch)
    return agent, tuple(here[k] for k in tasks)


def _next_event(arr: tuple[float, ...], done: list[int], running: Running,
                t: float) -> tuple[float, list[int], Running]:
    """(time, tasks whose request ends then, requests still running) of the
    next event: the first end, or else the next arrival."""
    later = [a for i, a in enumerate(arr) if a > t + EPS and done[i] < len(AGENTS)]
    arrival = min(later, default=float("inf"))
    if running and running[0][0] <= arrival + EPS:
        return _first_end(running)
    return arrival, [], running


def _start(running: Running, tasks: tuple[int, ...], agent: str, resident: str,
           t: float) -> Running:
    """`running` with the next requests of `tasks` on `agent` started at t,
    after a setup if `agent` is not `resident`."""
    start = t + (0.0 if agent == resident else SETUP)
    return tuple(sorted((*running, *((start + SERVICE, i) for i in tasks))))


def _first_end(running: Running) -> tuple[float, list[int], Running]:
    """(the first end of `running`, the tasks whose request ends then, the
    requests still running after it)."""
    end = running[0][0]
    return end, [i for e, i in running if e <= end + EPS], tuple(
        r for r in running if r[0] > end + EPS)


@functools.cache
def _plan(arr: tuple[float, ...], done: tuple[int, ...], running: Running, resident: str,
          t: float, batch: int) -> tuple[float, Action]:
    """(least total JCT of the tasks of `arr`, all arrived, from this state;
    its first action): start requests of the resident agent in the free
    room, bring in another agent's prefix once nothing runs (a setup) and
    start its requests, or wait for the first running request to end.
    Requests of one agent start together, as many as the room holds
    (requests are alike, so a free slot left idle serves no one sooner)."""
    if all(k == len(AGENTS) for k in done):
        return 0.0, ("", ())
    best: tuple[float, Action] = (float("inf"), ("", ()))
    for agent, tasks in _actions(done, running, resident, batch):
        cost = _plan(arr, done, _start(running, tasks, agent, resident, t), agent, t, batch)[0]
        if cost < best[0] - EPS:
            best = (cost, (agent, tasks))
    if running:
        end, finished, rest = _first_end(running)
        nxt = list(done)
        jct = 0.0
        for i in finished:
            nxt[i] += 1
            jct += end - arr[i] if nxt[i] == len(AGENTS) else 0.0
        cost = jct + _plan(arr, tuple(nxt), rest, resident, end, batch)[0]
        if cost < best[0] - EPS:
            best = (cost, ("", ()))
    return best


def _actions(done: tuple[int, ...], running: Running, resident: str,
             batch: int) -> list[Action]:
    """`_plan`'s starts: each largest set of waiting requests of one agent
    (the resident one, or with nothing running any other)."""
    busy = {i for _, i in running}
    free = batch - len(running)
    out: list[Action] = []
    for agent in AGENTS:
        if free <= 0 or (agent != resident and running):
            continue
        ready = [i for i, k in enumerate(done) if k < len(AGENTS) and AGENTS[k] == agent
                 and i not in busy]
        out.extend((agent, c) for c in itertools.combinations(ready, min(free, len(ready)))
                   if c)
    return out


def timeline(steps: Sequence[Step]) -> str:
    """`T0.A 1-5, T1.A 5-9, ...`: who runs when."""
    return ", ".join(f"T{s.task}.{s.agent} {s.start:g}-{s.end:g}" for s in steps)


def measure(arrival_lists: Sequence[tuple[float, ...]]) -> list[dict[str, float]]:
    """Per arrival list: the optimum and every policy's mean JCT at room 1."""
    rows = []
    for i, arrivals in enumerate(arrival_lists):
        row = {"optimum": optimal(arrivals)[0], PRESENT: present_plan(arrivals)}
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
             f"{args.seed} --batches {','.join(map(str, args.batches))} --write` "
             f"({wall:.0f} s). The arrival lists of `bench/fig2_grid.py` "
             "(same seed); the optimum is the least mean JCT of any schedule that never "
             "preempts, found exactly by a dynamic program over the order of the requests "
             f"(average {opt.mean():.3f}).", "",
             "| policy | average mean JCT | above the optimum (average) | lists at the optimum |"
             " below / above SRPT |",
             "|---|---|---|---|---|"]
    srpt = np.array([r["spf"] for r in rows])
    for p in (PRESENT, *POLICIES):
        v = np.array([r[p] for r in rows])
        lines.append(f"| {p} | {v.mean():.3f} | {(v - opt).mean():.3f} | "
                     f"{int((v - opt < EPS).sum())} / {len(rows)} | "
                     f"{int((v < srpt - EPS).sum())} / {int((v > srpt + EPS).sum())} |")
    lines += ["", f"`{PRESENT}`: at every event, the best plan over the tasks already "
              "arrived, of which only the first action is taken (replanned at the next); it "
              "uses no future arrival, as a policy cannot."]
    off = [(a, r) for a, r in zip(lists, rows, strict=True) if r["spf"] > r["optimum"] + EPS]
    if off:
        arrivals, r = off[0]
        lines += ["", f"The first list where SRPT (`spf`) is above the optimum: arrivals "
                  f"{', '.join(f'{a:g}' for a in arrivals)}; SRPT {r['spf']:.2f}, TOPAS "
                  f"{r['topas']:.2f}, optimum {r['optimum']:.2f}: "
                  f"{timeline(optimal(arrivals)[1])}."]
    return "\n".join(lines)


def present_rows(lists: Sequence[tuple[float, ...]], batches: Sequence[int]
                 ) -> dict[int, dict[str, np.ndarray]]:
    """Per room size: the present plan's, SRPT's and TOPAS's mean JCT on each list."""
    out = {}
    for batch in batches:
        out[batch] = {PRESENT: np.array([present_plan(a, batch) for a in lists]),
                      "spf": np.array([run("spf", a, batch)[0] for a in lists]),
                      "topas": np.array([run("topas", a, batch)[0] for a in lists])}
        print(f"room {batch}: present plan done", file=sys.stderr)
    return out


def render_present(rows: dict[int, dict[str, np.ndarray]]) -> str:
    """The present plan against SRPT and TOPAS at each room size."""
    lines = ["### Without future arrivals: the present plan at each room size", "",
             f"`{PRESENT}` (above) with room for 1 to 5 requests: requests of the resident "
             "agent start together in the free room, another agent's prefix comes in once "
             "nothing runs, and no request is preempted. It is what planning exactly over the "
             "tasks present, ignoring those to come, reaches.", "",
             "| room for | present plan (avg) | SRPT (avg) | TOPAS (avg) | "
             "plan below / above SRPT | TOPAS at or below the plan |",
             "|---|---|---|---|---|---|"]
    for batch, r in rows.items():
        plan, srpt, topas = r[PRESENT], r["spf"], r["topas"]
        lines.append(f"| {batch} | {plan.mean():.3f} | {srpt.mean():.3f} | {topas.mean():.3f} "
                     f"| {int((plan < srpt - EPS).sum())} / {int((plan > srpt + EPS).sum())} "
                     f"| {int((topas <= plan + EPS).sum())} / {len(plan)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=at_least(1), default=60,
                    help="arrival lists (bench/fig2_grid.py's, same seed)")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--batches", type=batch_sizes, default=(1, 2, 3, 5),
                    help=f"room sizes of the present-plan table, comma-separated (1-{MAX_BATCH})")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lists = scenarios(args.scenarios, args.seed)
    rows, present = measure(lists), present_rows(lists, args.batches)
    text = (render(rows, lists, args, time.perf_counter() - t0) + "\n\n"
            + render_present(present))
    print(text)
    if args.write:
        update_section("fig2_optimal", text)


if __name__ == "__main__":
    main()
