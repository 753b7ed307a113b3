"""TOPAS's extensions beyond the paper, on the five workloads.

`preempt=False` keeps every running request; `preempt_margin=1` keeps a
preemption only when its candidate scores at least its own J_redo + J_revoke;
`hol_age` holds KV room for the
oldest waiting request once its task has waited that long, as EASY
backfilling does; `pack_order="arrival"` has GreedyPack serve tasks in arrival
order; `start_gate` starts no new task in a candidate that preempts,
after a started task's request did not fit, or in the room of one that
fits now but the candidate leaves out (docs/topas.md, "Extensions").
`topas` runs the last three by default, and with them keep_idle,
preempt_exchange, swap_only, overdue, linear aging and the srpt weight (the
last column; `bench/generalization.py --ablation` takes each away on
workloads nobody tuned for); this script adds each to the paper's
TOPAS (`topas-paper`) and shows what they change, beside it and the best
baseline, at every operating point of `bench/paper.py` (paper set-up: the
baselines recompute evicted prefixes, TOPAS moves them to host memory).

    python bench/extensions.py [--tasks 200] [--seed 1] [--jobs 2] [--no-write]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from _results import at_least, run_all, update_section  # bench/_results.py
from paper import WORKLOADS, operating_point  # bench/paper.py

from backends.sim.engine import SimBackend
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.params import PAPER, TopasParams
from topasd.scheduler.topas import TopasPolicy
from workflows.builtin import load_workload

VARIANTS: dict[str, dict[str, Any]] = {  # each on top of the paper's TOPAS (PAPER)
    "TOPAS": {},
    "no preemption": {"preempt": False},
    "hol 200 s": {"hol_age": 200.0},
    "arrival order": {"pack_order": "arrival"},
    "preempt margin 1": {"preempt_margin": 1.0},
    "preempt margin 1, arrival order, hol 400 s": {
        "preempt_margin": 1.0, "pack_order": "arrival", "hol_age": 400.0},
    "arrival order, hol 0 s, no preemption, rho 16": {
        "pack_order": "arrival", "hol_age": 0.0, "preempt": False, "rho": 16.0},
    "start gate": {"start_gate": True},
    "start gate, preempt margin 1, arrival order": {
        "start_gate": True, "preempt_margin": 1.0, "pack_order": "arrival"},
    # every extension `topas` runs by default (the keys of PAPER, at topas's values)
    "every default (topas)": {k: getattr(TopasParams(), k) for k in PAPER},
}


@dataclass(frozen=True)
class Job:
    workload: str
    rate: float
    policy: str  # a baseline or a key of VARIANTS
    tasks: int
    seed: int


def run_job(job: Job) -> dict[str, Any]:
    topas = job.policy in VARIANTS
    trace, profile = operating_point(job.workload, job.rate, job.tasks, job.seed, topas)
    policy = (TopasPolicy(TopasParams(**{**PAPER, **VARIANTS[job.policy]})) if topas
              else make_policy(job.policy))
    s = Run(trace, policy, SimBackend(profile)).execute().summary()
    return {"workload": job.workload, "rate": job.rate, "policy": job.policy,
            "mean": s["mean_jct_s"], "p99": s["p99_jct_s"], "preemptions": s["preemptions"]}


def averages(rows: list[dict[str, Any]], name: str, key: str) -> dict[str, float]:
    """Each policy's metric averaged over the workload's operating points."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["workload"] == name:
            out.setdefault(r["policy"], []).append(r[key])
    return {p: sum(v) / len(v) for p, v in out.items()}


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = ["## TOPAS extensions beyond the paper", "",
             f"Command: `python bench/extensions.py --tasks {args.tasks} --seed {args.seed}` "
             f"({wall / 60:.1f} min on this machine). Each metric is averaged over the "
             "operating points of `bench/paper.py`; the baseline column is the best "
             "baseline for that metric (paper set-up). Each column adds its extensions to "
             "the paper's TOPAS (`topas-paper`, the column TOPAS); change is against it. "
             "The last column is the default `topas`.",
             ""]
    for key, title in (("mean", "Mean JCT (s)"), ("p99", "p99 JCT (s)")):
        lines += [f"### {title}", "",
                  "| workload | best baseline | " + " | ".join(VARIANTS) + " |",
                  "|---|---|" + "---|" * len(VARIANTS)]
        for name in WORKLOADS:
            avg = averages(rows, name, key)
            best = min(BASELINES, key=avg.__getitem__)
            ref = avg["TOPAS"]
            cells = [f"{avg[v]:.1f}" if v == "TOPAS"
                     else f"{avg[v]:.1f} ({100 * (avg[v] / ref - 1):+.0f}%)" for v in VARIANTS]
            lines.append(f"| {name} | {best} {avg[best]:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=at_least(1), default=200)
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--jobs", type=at_least(1), default=2)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    jobs = [Job(name, rate, policy, args.tasks, args.seed)
            for name in WORKLOADS for rate in load_workload(name).operating_points
            for policy in (*BASELINES, *VARIANTS)]
    t0 = time.perf_counter()
    rows = run_all(run_job, jobs, args.jobs)
    text = render(rows, args, time.perf_counter() - t0)
    print(text)
    if not args.no_write:
        update_section("extensions", text)


if __name__ == "__main__":
    main()
