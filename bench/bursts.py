"""Bursts on the built-in workloads: every policy far beyond capacity.

    python bench/bursts.py [--tasks 200] [--factor 4] [--seed 1] [--jobs 2]
        [--engine same|paper] [--no-write]

Each of the paper's five workloads gets `--tasks` arrivals (Poisson) at
`--factor` times its heaviest operating point, one trace shared by every
policy. The queue grows for the whole arrival window and drains after it:
what decides the mean is the order in which started tasks finish. By default
every policy runs on the same engine (the host cache for all, so only the
decisions differ); `--engine paper` gives the baselines the paper's set-up
(no host cache). Writes the `bursts` section of docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from _results import at_least, run_all, update_section  # bench/_results.py
from paper import WORKLOADS, operating_point  # bench/paper.py

from backends.sim.engine import SimBackend
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES
from workflows.builtin import load_workload

POLICIES = ("topas", "topas-paper", *BASELINES)


@dataclass(frozen=True)
class Job:
    workload: str
    rate: float
    policy: str
    tasks: int
    seed: int
    engine: str


def run_job(job: Job) -> dict[str, Any]:
    trace, profile = operating_point(job.workload, job.rate, job.tasks, job.seed,
                                     job.policy.startswith("topas"), job.engine)
    s = Run(trace, make_policy(job.policy), SimBackend(profile)).execute().summary()
    return {"workload": job.workload, "rate": job.rate, "policy": job.policy,
            "mean": s["mean_jct_s"], "p99": s["p99_jct_s"], "makespan": s["makespan_s"],
            "preemptions": s["preemptions"]}


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    by = {(r["workload"], r["policy"]): r for r in rows}
    lines = ["## Bursts (`bench/bursts.py`)", "",
             f"Command: `python bench/bursts.py --tasks {args.tasks} --factor {args.factor:g} "
             f"--seed {args.seed} --engine {args.engine}` ({wall:.0f} s on this machine). "
             f"{args.tasks} tasks per workload at {args.factor:g}x its heaviest operating "
             f"point; {'every policy on the same engine (host cache)' if args.engine == 'same' else 'the baselines without a host cache'}. "  # noqa: E501
             "Mean JCT, s (p99 in brackets); ratio: `topas` / the best baseline's mean.", "",
             "| workload | rate | " + " | ".join(POLICIES) + " | topas / best |",
             "|---|---|" + "---|" * (len(POLICIES) + 1)]
    for name in WORKLOADS:
        rate = by[(name, "topas")]["rate"]
        best = min(by[(name, b)]["mean"] for b in BASELINES)
        cells = [f"{by[(name, p)]['mean']:.1f} ({by[(name, p)]['p99']:.0f})" for p in POLICIES]
        ratio = by[(name, "topas")]["mean"] / best
        lines.append(f"| {name} | {rate:g} | " + " | ".join(cells)
                     + f" | {'**' if ratio > 1 else ''}{ratio:.3f}{'**' if ratio > 1 else ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=at_least(1), default=200)
    ap.add_argument("--factor", type=float, default=4.0,
                    help="times the workload's heaviest operating point (4)")
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--jobs", type=at_least(1), default=2)
    ap.add_argument("--engine", choices=("same", "paper"), default="same")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch docs/")
    args = ap.parse_args()
    if args.factor <= 0:
        ap.error("--factor: use a positive number")
    jobs = [Job(name, args.factor * max(load_workload(name).operating_points), p, args.tasks,
                args.seed, args.engine) for name in WORKLOADS for p in POLICIES]
    t0 = time.perf_counter()
    rows = run_all(run_job, jobs, args.jobs)
    text = render(rows, args, time.perf_counter() - t0)
    print(text)
    if not args.no_write:
        print(f"wrote {update_section('bursts', text)}", file=sys.stderr)


if __name__ == "__main__":
    main()
