"""TOPAS against the published peers (issue 30) and the paper's baselines on
the paper's five workloads, every policy on the same engine.

    python bench/peers.py [--tasks 200] [--seed 1] [--jobs 2] [--write]

The operating points and arrival traces are `bench/paper.py`'s (one trace per
point, shared by every policy), on its "same engine" set-up (host cache on,
so only the decisions differ). Each metric is averaged over a workload's
operating points, as the paper does; "best other" is the policy other than
TOPAS with the lowest average, peers and baselines alike. Writes the `peers`
section of docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import os
import time
from multiprocessing import Pool
from typing import Any

from _results import update_section  # bench/_results.py
from paper import WORKLOADS, Job, run_job  # bench/paper.py

from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.peers import PEERS
from workflows.builtin import load_workload

OTHERS = (*PEERS, *BASELINES)


def jobs_for(args: argparse.Namespace) -> list[Job]:
    return [Job(name, rate, policy, "same", args.tasks, args.seed)
            for name in WORKLOADS for rate in load_workload(name).operating_points
            for policy in ("topas", *OTHERS)]


def averages(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    """{workload: {policy: the metric averaged over the workload's points}}."""
    out: dict[str, dict[str, float]] = {}
    for name in WORKLOADS:
        for policy in ("topas", *OTHERS):
            vals = [r[key] for r in rows if r["workload"] == name and r["policy"] == policy]
            out.setdefault(name, {})[policy] = sum(vals) / len(vals)
    return out


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> str:
    lines = ["## TOPAS against the peers (`bench/peers.py`)", "",
             f"Command: `python bench/peers.py --tasks {args.tasks} --seed {args.seed} "
             f"--write` ({wall_s / 60:.1f} min; load average {os.getloadavg()[0]:.2f} on "
             f"{os.cpu_count()} CPUs; simulated time, so the numbers do not depend on it). "
             "`bench/paper.py`'s operating points and traces, every policy on the same "
             "engine (host cache on); each cell averages the workload's operating points. "
             "The peers are our readings of their papers (docs/topas.md, \"Peers\").", ""]
    for key, title in (("mean_jct_s", "Mean JCT (s)"), ("p99_jct_s", "p99 JCT (s)")):
        avg = averages(rows, key)
        lines += [f"{title}:", "", "| workload | topas | " + " | ".join(OTHERS)
                  + " | best other | TOPAS vs it |", "|---|" + "---|" * (len(OTHERS) + 3)]
        for name in WORKLOADS:
            best = min(OTHERS, key=avg[name].__getitem__)
            change = 100 * (avg[name]["topas"] / avg[name][best] - 1)
            lines.append(f"| {name} | {avg[name]['topas']:.1f} | "
                         + " | ".join(f"{avg[name][p]:.1f}" for p in OTHERS)
                         + f" | {best} | {change:+.1f}% |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    jobs = jobs_for(args)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with Pool(args.jobs) as pool:
        for i, row in enumerate(pool.imap(run_job, jobs), 1):
            rows.append(row)
            print(f"\r{i}/{len(jobs)} replays", end="", flush=True)
    print()
    text = render(rows, args, time.perf_counter() - t0)
    print(text)
    if args.write:
        print(f"wrote {update_section('peers', text)}")


if __name__ == "__main__":
    main()
