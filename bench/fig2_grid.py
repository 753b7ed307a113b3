"""TOPAS on many Fig. 2 machines: random arrivals, room for 1 to 5 requests.

The paper's Fig. 2 fixes the machine (A -> B -> C, one prefix resident at a
time, 4-unit requests, 1-unit prefix setups; `workflows/fig2.py`) but not the
arrivals or how many requests fit beside the prefix. This bench draws
`--scenarios` arrival lists (2-5 tasks at integer times 0-12, seeded), runs
every policy on each for every batch size of `--batches`, and counts how
often TOPAS's mean JCT beats, ties or trails the better of LPM and SRPT
(`spf`).

    python bench/fig2_grid.py [--scenarios 60] [--seed 0] [--batches 1,2,3,5] [--write]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

import numpy as np
from _results import at_least, update_section  # bench/_results.py

from backends.sim.engine import SimBackend
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES
from workflows.fig2 import MAX_BATCH, fig2_profile, fig2_trace

POLICIES = ("topas", "topas-paper", *BASELINES)
CANONICAL = ((0.0, 0.0, 0.0), (0.0, 0.0, 3.0))  # the test scenarios (tests/test_fig2.py)


def run(policy: str, arrivals: Sequence[float], batch: int) -> tuple[float, int]:
    """(mean JCT, preemptions) of one policy on one scenario."""
    pol = make_policy(policy)
    backend = SimBackend(fig2_profile(batch), warm_host=True)
    jct = Run(fig2_trace(arrivals), pol, backend).execute().jct
    return float(np.mean(list(jct.values()))), backend.stats.preemptions


def mean_jct(policy: str, arrivals: Sequence[float], batch: int) -> float:
    return run(policy, arrivals, batch)[0]


# distinct sorted lists of 2-5 arrivals at times 0-12: multisets, C(13 + k - 1, k)
DISTINCT = sum(math.comb(12 + k, k) for k in range(2, 6))  # 8,554


def scenarios(n: int, seed: int) -> list[tuple[float, ...]]:
    """`n` distinct sorted arrival lists of 2-5 tasks at integer times 0-12."""
    if n > DISTINCT:
        raise SystemExit(f"fig2_grid.py: error: --scenarios {n}: only {DISTINCT:,} distinct "
                         "arrival lists exist")
    rng = np.random.default_rng(seed)
    out: set[tuple[float, ...]] = set()
    while len(out) < n:
        k = int(rng.integers(2, 6))
        out.add(tuple(sorted(float(x) for x in rng.integers(0, 13, size=k))))
    return sorted(out)


def verdict(topas: float, lpm: float, srpt: float) -> str:
    best = min(lpm, srpt)
    return "tie" if abs(topas - best) < 1e-9 else ("win" if topas < best else "loss")


def render(rows: dict[int, list[dict[str, float]]], canon: dict[tuple[int, tuple[float, ...]],
           dict[str, float]], args: argparse.Namespace, wall: float) -> str:
    lines = ["## Fig. 2 machines: TOPAS vs LPM and SRPT on random arrivals", "",
             f"Command: `python bench/fig2_grid.py --scenarios {args.scenarios} --seed "
             f"{args.seed} --batches {','.join(map(str, args.batches))} --write` "
             f"({wall:.0f} s). The machine of `workflows/fig2.py`; "
             "each scenario is 2-5 tasks at integer times 0-12. W/T/L: TOPAS's mean JCT "
             "against the better of LPM and SRPT (`spf`) in the same scenario.", "",
             "| requests beside the prefix | scenarios | TOPAS W / T / L | "
             "TOPAS losses that preempt | topas-paper W / T / L | "
             + " | ".join(f"{p} (avg)" for p in POLICIES) + " |",
             "|---|---|---|---|---|" + "---|" * len(POLICIES)]
    for batch, runs in rows.items():
        counts = {}
        for name in ("topas", "topas-paper"):
            v = [verdict(r[name], r["lpm"], r["spf"]) for r in runs]
            counts[name] = " / ".join(str(v.count(k)) for k in ("win", "tie", "loss"))
        avgs = " | ".join(f"{np.mean([r[p] for r in runs]):.2f}" for p in POLICIES)
        preempting = sum(1 for r in runs if verdict(r["topas"], r["lpm"], r["spf"]) == "loss"
                         and r["topas preemptions"] > 0)
        lines.append(f"| {batch} | {len(runs)} | {counts['topas']} | {preempting} | "
                     f"{counts['topas-paper']} | {avgs} |")
    lines += ["", "The two scenarios of `tests/test_fig2.py` (mean JCT, time units):", "",
              "| requests | arrivals | " + " | ".join(POLICIES) + " |",
              "|---|---|" + "---|" * len(POLICIES)]
    for (batch, arrivals), m in canon.items():
        lines.append(f"| {batch} | {', '.join(f'{a:g}' for a in arrivals)} | "
                     + " | ".join(f"{m[p]:.2f}" for p in POLICIES) + " |")
    return "\n".join(lines)


def batch_sizes(text: str) -> tuple[int, ...]:
    """`--batches`: comma-separated batch sizes in 1..MAX_BATCH."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers, e.g. 1,2,3,5") from None
    if not sizes or any(not 1 <= b <= MAX_BATCH for b in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: each batch size must be in 1-{MAX_BATCH}")
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=at_least(1), default=60,
                    help="arrival lists per batch size")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--batches", type=batch_sizes, default=(1, 2, 3, 5),
                    help=f"requests that fit beside the prefix, comma-separated (1-{MAX_BATCH})")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows: dict[int, list[dict[str, float]]] = {}
    for batch in args.batches:
        rows[batch] = []
        for i, arrivals in enumerate(scenarios(args.scenarios, args.seed)):
            row = {p: mean_jct(p, arrivals, batch) for p in POLICIES if p != "topas"}
            row["topas"], row["topas preemptions"] = run("topas", arrivals, batch)
            rows[batch].append(row)
            print(f"\rbatch {batch}: {i + 1}/{args.scenarios}", end="", flush=True,
                  file=sys.stderr)
        print(file=sys.stderr)
    canon = {(b, a): {p: mean_jct(p, a, b) for p in POLICIES} for b in args.batches
             for a in CANONICAL}
    text = render(rows, canon, args, time.perf_counter() - t0)
    print(text)
    if args.write:

        update_section("fig2_grid", text)


if __name__ == "__main__":
    main()
