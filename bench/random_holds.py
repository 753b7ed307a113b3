"""Whether the oracle's gain is structure or a lucky pick: the best of N runs
in which TOPAS's contested decisions take a random other option.

    python bench/random_holds.py [--case chain:6:burst ...] [--run fixed.json]
        [--runs 20] [--p 0.05] [--workers 2] [--write]

At each decision where `bench/oracle_rollout.py --space phases` would fork
(at least two waiting agents), a run takes, with probability p, TOPAS's
decision on one other agent's waiting requests alone (chosen at random;
often a hold), else TOPAS's own. Each of N seeds gives one run; the cost of a
run is its mean plus its p99 JCT, the `tail` oracle's cost. If the best of N
such runs comes near the oracle's cost (docs/RESULTS.md, "What an oracle
rollout buys", phases-tail), most of what the oracle found is the pick of a
lucky perturbation of a sensitive schedule, not a rule its labels could
teach. The default cases are the four bursts of that table, whose TOPAS
p99 misses the bound, and four bursts of the same families whose p99 does
not (controls): how many runs cost less than TOPAS's own on each shows
whether a miss is TOPAS's schedule sitting at an unlucky point of a
sensitive landscape (most perturbations help) or a schedule that small
changes do not better (few do, as on the controls). With `--run FILE` (a
`bench/generalization.py --json` file) the cases are that run's p99 misses
and any `--case` given, and each row also gives the p99 over the
case's best baseline: TOPAS's, the median run's, and how many runs come
within `--bound` of it. `--write` records the table in docs/RESULTS.md
(section "random-holds").
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _results import command_line, publish, run_all  # bench/_results.py
from generalization import CACHE, Cache, Case, Job, capacities, job_trace, read_ratios
from oracle_rollout import OWN, Option, Oracle, OraclePolicy, parse_case
from p99_misses import misses

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.topas import TopasPolicy

BURSTS = (("chain", 6, "burst"), ("chain", 9, "burst"), ("react", 7, "burst"),
          ("recurrent", 5, "burst"))
# bursts of the same families whose TOPAS p99 is within 1.10x the best baseline's
CONTROLS = (("chain", 3, "burst"), ("chain", 2, "burst"), ("react", 5, "burst"),
            ("recurrent", 8, "burst"))


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


def _replay_job(spec: tuple[Job, float, int]) -> dict[str, Any]:
    job, p, seed = spec
    return {"case": (job.family, job.seed, job.load), "p": p, "seed": seed,
            **replay(job, p, seed)}


def case_row(case: Case, runs: Sequence[dict[str, Any]], ps: Sequence[float],
             best_p99: float | None) -> dict[str, Any]:
    """A case's TOPAS run (p = 0) and, per p, the best run, the median cost,
    how many runs cost less than TOPAS's, and with `best_p99` (the best
    baseline's p99 of the case) the median run's p99."""
    own = next(r for r in runs if r["p"] == 0.0)
    out: dict[str, Any] = {"case": case, "topas": own, "best_p99": best_p99, "by_p": {}}
    for p in ps:
        rows = sorted((r for r in runs if r["p"] == p), key=lambda r: (r["cost"], r["changed"]))
        out["by_p"][p] = {"best": rows[0], "median": float(np.median([r["cost"] for r in rows])),
                          "cheaper": sum(r["cost"] < own["cost"] for r in rows),
                          "median_p99": float(np.median([r["p99_jct_s"] for r in rows])),
                          "p99s": [r["p99_jct_s"] for r in rows]}
    return out


def table(rows: Sequence[dict[str, Any]], ps: Sequence[float], runs: int,
          bound: float = 1.10) -> list[str]:
    """One line per case; with a case's best baseline p99 known, its p99
    columns (TOPAS's over it, the median run's, the runs within `bound`)."""
    with_p99 = any(r.get("best_p99") for r in rows)
    heads = []
    for p in ps:
        heads.append(f"p = {p:g}: best of {runs} (mean / p99, changed) | median | "
                     "runs cheaper than TOPAS")
        if with_p99:
            heads.append(f"p99 over the best baseline's: TOPAS / median run | runs within "
                         f"{bound:g}x")
    cols = sum(3 + 2 * with_p99 for _ in ps)
    out = ["| case | TOPAS: mean + p99 (mean / p99) | " + " | ".join(heads) + " |",
           "|---|---|" + "---|" * cols]
    for r in rows:
        family, draw, load = r["case"]
        own, best_p99 = r["topas"], r.get("best_p99")
        cells = []
        for p in ps:
            by = r["by_p"][p]
            best = by["best"]
            cells.append(f"{best['cost']:.0f} s ({best['mean_jct_s']:.0f} / "
                         f"{best['p99_jct_s']:.0f}, {best['changed']} of "
                         f"{best['contested']}) | {by['median']:.0f} s | "
                         f"{by['cheaper']} of {runs}")
            if with_p99 and best_p99:
                within = sum(q <= bound * best_p99 for q in by["p99s"])
                cells.append(f"{own['p99_jct_s'] / best_p99:.3f}x / "
                             f"{by['median_p99'] / best_p99:.3f}x | {within} of {runs}")
            elif with_p99:
                cells.append("- | -")
        out.append(f"| `{family}` #{draw} {load} | {own['cost']:.0f} s "
                   f"({own['mean_jct_s']:.0f} / {own['p99_jct_s']:.0f}) | "
                   + " | ".join(cells) + " |")
    return out


def best_p99s(path: Path) -> dict[Case, float]:
    """Each case's best baseline p99 (s) in a `generalization.py --json` file;
    SystemExit naming the file and the fix if it is not one."""
    try:
        read_ratios(path)
    except ValueError as e:
        raise SystemExit(f"random_holds.py: error: {e}") from None
    return {(str(r["case"][0]), int(r["case"][1]), str(r["case"][2])): float(r["best_p99"][1])
            for r in json.loads(path.read_text())}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=parse_case, action="append", metavar="FAMILY:DRAW:LOAD",
                    help="a generated case (repeat; default: the four bursts of the "
                         "oracle's phases-tail table and four controls; with --run, "
                         "cases to add to that run's p99 misses)")
    ap.add_argument("--run", type=Path, metavar="FILE",
                    help="a bench/generalization.py --json file: its best baselines' p99s")
    ap.add_argument("--bound", type=float, default=1.10,
                    help="with --run: a miss is a p99 over this times the best (1.10)")
    ap.add_argument("--runs", type=int, default=20, help="seeds per p (20)")
    ap.add_argument("--p", type=float, action="append",
                    help="chance a contested decision takes a random other option "
                         "(repeat; default 0.05)")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1),
                    help="processes (all cores)")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args(argv)
    ps = args.p or [0.05]
    if (args.runs < 1 or args.tasks < 1 or args.workers < 1 or args.bound <= 0
            or any(not 0.0 < p <= 1.0 for p in ps)):
        ap.error("--runs, --tasks and --workers must be at least 1, --bound positive, "
                 "and each --p in (0, 1]")
    best = best_p99s(args.run) if args.run else {}
    if args.run:
        found = [m.case for m in misses(json.loads(args.run.read_text()), args.bound)]
        cases = [*found, *(c for c in args.case or () if c not in found)]
    else:
        cases = list(args.case or (*BURSTS, *CONTROLS))
    caps = capacities(cases, args.tasks, Cache(CACHE), args.workers)
    jobs = {c: Job(c[0], c[1], c[2], "topas", args.tasks, (), caps[(c[0], c[1])]) for c in cases}
    specs = [(jobs[c], 0.0, 0) for c in cases] + [
        (jobs[c], p, seed) for c in cases for p in ps for seed in range(args.runs)]
    done = run_all(_replay_job, specs, args.workers)
    rows = [case_row(c, [r for r in done if tuple(r["case"]) == c], ps, best.get(c))
            for c in cases]
    publish("random-holds", "Random phase choices, best of N (`bench/random_holds.py`)",
            f"Command: `{command_line('random_holds.py', argv)}`"
            + (f", the file written by `python bench/generalization.py --json {args.run.name}`; "
               "its p99 misses first, then the cases `--case` adds (controls)"
               if args.run else "") +
            f". {args.tasks} tasks per case. Each run takes, at each contested decision, "
            "a random other phase option with probability p (the script's docstring); "
            "the cost is mean + p99 JCT, the `tail` oracle's. Compare with \"What an oracle "
            "rollout buys (phases-tail)\".",
            table(rows, ps, args.runs, args.bound), args.write)


if __name__ == "__main__":
    main()
