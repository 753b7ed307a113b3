"""TOPAS with in-range parameters whose cost explodes (`m=16`, `samples=4096`),
with and without `search_budget` (docs/topas.md, "Candidate window").

    python bench/search_budget.py [--workload dag10wide] [--rate 0.16]
        [--tasks 60] [--seed 1] [--write]

Replays one trace under TOPAS with `m=16 samples=4096`, once at the default
search budget and once without one (`search_budget=0`), one after the other
in this process, and reports each run's CPU time, its decisions' median, p99
and longest wall time, and the mean JCT. Writes the `search-budget` section
of docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
from _results import parse_trace_args, trace_parser, update_section  # bench/_results.py

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.native import status as native_status
from topasd.scheduler.params import TopasParams
from workflows.builtin import load_workload
from workflows.trace import generate_trace

COSTLY = {"m": 16, "samples": 4096}


def replay(budget: int, args: argparse.Namespace) -> dict[str, Any]:
    wl = load_workload(args.workload)
    trace = generate_trace(wl.workflows, args.rate, args.tasks, args.seed, name=wl.name)
    policy = make_policy("topas")
    policy.set_params(**COSTLY, search_budget=budget)  # type: ignore[attr-defined]
    c0 = time.process_time()
    result = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE))).execute()
    ms = np.array(result.decision_ms)
    return {"budget": budget, "cpu_s": time.process_time() - c0, "decisions": len(ms),
            "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()), "mean_jct_s": float(np.mean(list(result.jct.values())))}


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = ["## TOPAS's search budget (`bench/search_budget.py`)", "",
             f"Command: `python bench/search_budget.py --workload {args.workload} --rate "
             f"{args.rate:g} --tasks {args.tasks} --seed {args.seed} --write`. TOPAS with "
             f"{', '.join(f'{k}={v}' for k, v in COSTLY.items())} (in range, costly). "
             f"Scheduler: {native_status().reason}; load average {os.getloadavg()[0]:.2f} "
             f"on {os.cpu_count()} CPUs.", "",
             "| search_budget | CPU s | decisions | median ms | p99 ms | longest ms "
             "| mean JCT s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{r['budget']} (default)" if r["budget"] == TopasParams().search_budget \
            else f"{r['budget']} (none)" if r["budget"] == 0 else str(r["budget"])
        lines.append(f"| {name} | {r['cpu_s']:.1f} | {r['decisions']} | {r['median_ms']:.1f} "
                     f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['mean_jct_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = trace_parser(__doc__, rate=0.16, tasks=60)
    args = parse_trace_args(ap)
    text = render([replay(b, args) for b in (TopasParams().search_budget, 0)], args)
    print(text)
    if args.write:
        print(f"wrote {update_section('search-budget', text)}")


if __name__ == "__main__":
    main()
