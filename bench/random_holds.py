"""Whether the oracle's gain is structure or a lucky pick: the best of N runs
in which TOPAS's contested decisions take a random other option.

    python bench/random_holds.py [--case chain:6:burst ...] [--runs 20] [--p 0.05] [--write]

At each decision where `bench/oracle_rollout.py --space phases` would fork
(at least two waiting agents), a run takes, with probability p, TOPAS's
decision on one other agent's waiting requests alone (chosen at random;
often a hold), else TOPAS's own. Each of N seeds gives one run; the cost of a
run is its mean plus its p99 JCT, the `tail` oracle's cost. If the best of N
such runs comes near the oracle's cost (docs/RESULTS.md, "What an oracle
rollout buys", phases-tail), most of what the oracle found is the pick of a
lucky perturbation of a sensitive schedule, not a rule its labels could
teach. `--write` records the table in docs/RESULTS.md (section
"random-holds").
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from _results import command_line, progress, publish  # bench/_results.py
from generalization import CACHE, Cache, Job, capacities, job_trace
from oracle_rollout import OWN, Option, Oracle, OraclePolicy, parse_case

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.topas import TopasPolicy

BURSTS = (("chain", 6, "burst"), ("chain", 9, "burst"), ("react", 7, "burst"),
          ("recurrent", 5, "burst"))


class RandomPhases(OraclePolicy):
    """TOPAS whose contested decisions take a random other phase option with
    probability p (seeded); it never forks."""

    def __init__(self, p: float, seed: int) -> None:
        super().__init__(TopasPolicy(), Oracle(horizon=float("inf"), space="phases"))
        self.p, self.rng = p, random.Random(seed)

    def _pick(self, t: float, options: list[Option]) -> Option:
        self.forks += 1
        if self.rng.random() < self.p:
            self.changed += 1
            return self.rng.choice(options[1:])
        return OWN


def replay(job: Job, p: float, seed: int) -> dict[str, Any]:
    """One run of the case under `RandomPhases(p, seed)`."""
    policy = RandomPhases(p, seed)
    run = Run(job_trace(job), policy, SimBackend(get_profile(DEFAULT_PROFILE)))
    policy.run = run
    s = run.execute().summary()
    return {"mean_jct_s": s["mean_jct_s"], "p99_jct_s": s["p99_jct_s"],
            "cost": s["mean_jct_s"] + s["p99_jct_s"], "contested": policy.forks,
            "changed": policy.changed}


def case_row(job: Job, ps: Sequence[float], runs: int) -> dict[str, Any]:
    """TOPAS's own run (p = 0) and, per p, the best and the median of `runs` seeds."""
    own = replay(job, 0.0, 0)
    out: dict[str, Any] = {"case": (job.family, job.seed, job.load), "topas": own, "by_p": {}}
    for p in ps:
        rows = sorted((replay(job, p, seed) for seed in range(runs)),
                      key=lambda r: (r["cost"], r["changed"]))
        out["by_p"][p] = {"best": rows[0], "median": float(np.median([r["cost"] for r in rows]))}
    return out


def table(rows: Sequence[dict[str, Any]], ps: Sequence[float], runs: int) -> list[str]:
    heads = [f"p = {p:g}: best of {runs} (mean / p99, changed) | median" for p in ps]
    out = ["| case | TOPAS: mean + p99 (mean / p99) | " + " | ".join(heads) + " |",
           "|---|---|" + "---|---|" * len(ps)]
    for r in rows:
        family, draw, load = r["case"]
        own = r["topas"]
        cells = []
        for p in ps:
            best, median = r["by_p"][p]["best"], r["by_p"][p]["median"]
            cells.append(f"{best['cost']:.0f} s ({best['mean_jct_s']:.0f} / "
                         f"{best['p99_jct_s']:.0f}, {best['changed']} of "
                         f"{best['contested']}) | {median:.0f} s")
        out.append(f"| `{family}` #{draw} {load} | {own['cost']:.0f} s "
                   f"({own['mean_jct_s']:.0f} / {own['p99_jct_s']:.0f}) | "
                   + " | ".join(cells) + " |")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=parse_case, action="append", metavar="FAMILY:DRAW:LOAD",
                    help="a generated case (repeat; default: the four bursts of the "
                         "oracle's phases-tail table)")
    ap.add_argument("--runs", type=int, default=20, help="seeds per p (20)")
    ap.add_argument("--p", type=float, action="append",
                    help="chance a contested decision takes a random other option "
                         "(repeat; default 0.05)")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args(argv)
    ps = args.p or [0.05]
    if args.runs < 1 or args.tasks < 1 or any(not 0.0 < p <= 1.0 for p in ps):
        ap.error("--runs and --tasks must be at least 1, and each --p in (0, 1]")
    cases = args.case or list(BURSTS)
    caps = capacities(cases, args.tasks, Cache(CACHE), max(1, os.cpu_count() or 1))
    rows = [case_row(Job(family, draw, load, "topas", args.tasks, (), caps[(family, draw)]),
                     ps, args.runs) for family, draw, load in progress(cases, "cases")]
    publish("random-holds", "Random phase choices, best of N (`bench/random_holds.py`)",
            f"Command: `{command_line('random_holds.py', argv)}`. {args.tasks} tasks per "
            "case. Each run takes, at each contested decision, a random other phase option "
            "with probability p (the script's docstring); the cost is mean + p99 JCT, the "
            "`tail` oracle's. Compare with \"What an oracle rollout buys (phases-tail)\".",
            table(rows, ps, args.runs), args.write)


if __name__ == "__main__":
    main()
