"""Bursts on the built-in workloads: every policy far beyond capacity.

    python bench/bursts.py [--tasks 200] [--factor 4] [--seed 1] [--jobs 2]
        [--engine same|paper] [--no-write]

Each of the paper's five workloads gets `--tasks` arrivals (Poisson) at
`--factor` times its heaviest operating point, one trace shared by every
policy. The queue grows for the whole arrival window and drains after it:
what decides the mean is the order in which started tasks finish. By default
every policy runs on the same engine (the host cache for all, so only the
decisions differ); `--engine paper` gives the baselines the paper's set-up
(no host cache; the peers keep the same engine). TOPAS is set against the
best paper baseline and against the best of all, the peers included. Writes
the `bursts` section of docs/RESULTS.md.
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
from topasd.scheduler.peers import PEERS
from workflows.builtin import load_workload

POLICIES = ("topas", "topas-paper", *BASELINES, *PEERS)


@dataclass(frozen=True)
class Job:
    workload: str
    rate: float
    policy: str
    tasks: int
    seed: int
    engine: str


def run_job(job: Job) -> dict[str, Any]:
    host_cache = job.policy.startswith("topas") or job.policy in PEERS
    trace, profile = operating_point(job.workload, job.rate, job.tasks, job.seed,
                                     host_cache, job.engine)
    s = Run(trace, make_policy(job.policy), SimBackend(profile)).execute().summary()
    return {"workload": job.workload, "rate": job.rate, "policy": job.policy,
            "mean": s["mean_jct_s"], "p99": s["p99_jct_s"], "makespan": s["makespan_s"],
            "preemptions": s["preemptions"]}


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    by = {(r["workload"], r["policy"]): r for r in rows}
    engine = ("every policy on the same engine (host cache)" if args.engine == "same" else
              "the baselines without a host cache, TOPAS and the peers with it")
    lines = ["## Bursts (`bench/bursts.py`)", "",
             f"Command: `python bench/bursts.py --tasks {args.tasks} --factor {args.factor:g} "
             f"--seed {args.seed} --engine {args.engine}` ({wall:.0f} s on this machine). "
             f"{args.tasks} tasks per workload at {args.factor:g}x its heaviest operating "
             f"point; {engine}. Mean JCT, s (p99 in brackets); the ratios are `topas`'s "
             "mean over the best paper baseline's and over the best of all (peers "
             "included), in bold where above 1.", "",
             "| workload | rate | " + " | ".join(POLICIES) + " | topas / best baseline "
             "| topas / best of all |", "|---|---|" + "---|" * (len(POLICIES) + 2)]
    for name in WORKLOADS:
        rate = by[(name, "topas")]["rate"]
        cells = [f"{by[(name, p)]['mean']:.1f} ({by[(name, p)]['p99']:.0f})" for p in POLICIES]
        ours = by[(name, "topas")]["mean"]
        ratios = [ours / min(by[(name, b)]["mean"] for b in group)
                  for group in (BASELINES, (*BASELINES, *PEERS))]
        lines.append(f"| {name} | {rate:g} | " + " | ".join(cells) + " | "
                     + " | ".join(_ratio(x) for x in ratios) + " |")
    return "\n".join(lines) + "\n"


def _ratio(x: float) -> str:
    return f"**{x:.3f}**" if x > 1 else f"{x:.3f}"


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
