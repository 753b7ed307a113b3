"""A sweep: every chosen policy at every arrival rate and seed, each replay a
`ReplayJob`; the rows averaged over seeds into one point per (policy, rate),
and each policy's saturation point.

    rates = parse_rates("0.1:0.3:5")                # 0.1, 0.15, 0.2, 0.25, 0.3
    cases = sweep_cases(["topas", "lpm"], rates, seeds=(0, 1))
    rows = pool.run([c.job(...) for c in cases])
    points = average(cases, rows); sat = saturation(points)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
from typing import Any

import numpy as np

from topasd.model import TopasError
from topasd.tuning.replays import ReplayJob, Row, retime
from workflows.trace import Trace

# A policy saturates at the first swept rate whose mean JCT is at least this
# many times its mean JCT at the lowest swept rate (queues, not service, set it).
SATURATION_FACTOR = 2.0
# (column, row key, format) of the sweep table; the values are means over seeds
COLUMNS = (
    ("mean JCT", "mean_jct_s", "{:.1f}"),
    ("p50", "p50_jct_s", "{:.1f}"),
    ("p99", "p99_jct_s", "{:.1f}"),
    ("req/s", "throughput_req_s", "{:.3f}"),
    ("preempt", "preemptions", "{:.1f}"),
    ("recomp tok", "recomputed_tokens", "{:.0f}"),
)
AVERAGED = (*(key for _, key, _ in COLUMNS), "makespan_s", "retractions", "prefix_loads")


def parse_rates(text: str) -> tuple[float, ...]:
    """`--rates`: "LOW:HIGH:N" (N rates evenly from LOW to HIGH), or rates
    separated by commas; each > 0, in increasing order."""
    spec = text.strip()
    if ":" in spec:
        rates = _rate_range(spec)
    else:
        rates = tuple(_rate(part, spec) for part in spec.split(","))
    if any(b <= a for a, b in pairwise(rates)):
        raise TopasError(f"--rates {spec}: give the rates in increasing order, each once")
    return rates


def _rate_range(spec: str) -> tuple[float, ...]:
    parts = spec.split(":")
    if len(parts) != 3:
        raise TopasError(f"--rates {spec}: a range is LOW:HIGH:N (e.g. 0.1:0.3:5)")
    low, high = _rate(parts[0], spec), _rate(parts[1], spec)
    try:
        n = int(parts[2])
    except ValueError:
        raise TopasError(f"--rates {spec}: N={parts[2]!r} is not a whole number of rates"
                         ) from None
    if n < 2 or high <= low:
        raise TopasError(f"--rates {spec}: a range needs LOW < HIGH and N >= 2 rates "
                         "(one rate: --rates 0.2)")
    return tuple(round(float(r), 12) for r in np.linspace(low, high, n))


def _rate(part: str, spec: str) -> float:
    try:
        rate = float(part)
    except ValueError:
        raise TopasError(f"--rates {spec}: {part.strip()!r} is not a number (task/s)") from None
    if not (math.isfinite(rate) and rate > 0):
        raise TopasError(f"--rates {spec}: {part.strip()} is not a rate > 0 task/s")
    return rate


@dataclass(frozen=True, slots=True)
class Case:
    """One replay of a sweep: a policy on the trace of (rate, seed)."""

    policy: str
    rate: float
    seed: int

    @property
    def trace(self) -> str:
        return trace_key(self.rate, self.seed)

    def job(self, params: Mapping[str, Any], profile: str, budget: int | None) -> ReplayJob:
        return ReplayJob.of(self.trace, self.policy, params, profile, budget)


def trace_key(rate: float, seed: int) -> str:
    """The key of the (rate, seed) trace in a sweep's trace table."""
    return f"rate={rate!r} seed={seed}"


def sweep_cases(policies: Sequence[str], rates: Sequence[float],
                seeds: Sequence[int]) -> list[Case]:
    """Every (policy, rate, seed), the heaviest rates first (they take longest,
    so a pool's last jobs are short ones)."""
    return [Case(p, r, s) for r, s, p in product(sorted(rates, reverse=True), seeds, policies)]


def average(cases: Sequence[Case], rows: Sequence[Row]) -> list[Row]:
    """One point per (policy, rate): `AVERAGED` means over the seeds, sorted
    by policy (in the order first given) and rate."""
    groups: dict[tuple[str, float], list[Row]] = {}
    for case, row in zip(cases, rows, strict=True):
        groups.setdefault((case.policy, case.rate), []).append(row)
    order = list(dict.fromkeys(c.policy for c in cases))
    points = [{"policy": p, "rate": r, "seeds": len(g),
               **{k: float(np.mean([row[k] for row in g])) for k in AVERAGED}}
              for (p, r), g in groups.items()]
    return sorted(points, key=lambda pt: (order.index(pt["policy"]), pt["rate"]))


def saturation(points: Sequence[Row]) -> dict[str, float | None]:
    """Each policy's saturation rate: the first whose mean JCT is at least
    `SATURATION_FACTOR` times that at its lowest rate (None: none within the sweep)."""
    out: dict[str, float | None] = {}
    for policy in dict.fromkeys(pt["policy"] for pt in points):
        mine = sorted((pt for pt in points if pt["policy"] == policy), key=lambda pt: pt["rate"])
        light = mine[0]["mean_jct_s"]
        out[policy] = next((pt["rate"] for pt in mine[1:]
                            if pt["mean_jct_s"] >= SATURATION_FACTOR * light), None)
    return out


def sweep_table(points: Sequence[Row], sat: Mapping[str, float | None]) -> str:
    """The sweep as text: one row per (policy, rate), the saturation point marked."""
    head = ["policy", "rate", *(h for h, _, _ in COLUMNS), ""]
    cells = [head] + [[pt["policy"], f"{pt['rate']:g}",
                       *(fmt.format(pt[k]) for _, k, fmt in COLUMNS),
                       "<- saturated" if sat.get(pt["policy"]) == pt["rate"] else ""]
                      for pt in points]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in cells]
    return "\n".join(lines)


def saturation_note(sat: Mapping[str, float | None]) -> str:
    """One line: where each policy saturates."""
    parts = [f"{p} at {r:g} task/s" if r is not None else f"{p} not within the rates"
             for p, r in sat.items()]
    return (f"saturation (mean JCT {SATURATION_FACTOR:g}x that at the lowest rate): "
            + "; ".join(parts))


def workload_traces(workload: str, rates: Sequence[float], seeds: Sequence[int],
                    tasks: int) -> dict[str, Trace]:
    """The sweep's traces of a built-in workload (or spec file): one sample
    per seed, at each rate. A seed draws the same task sizes at every rate
    (`trace_tasks` draws the gaps apart), so each rate's trace is the seed's
    sample re-timed, and the same trace `topasd replay -w W -r RATE -s SEED` runs."""
    from workflows.builtin import load_workload
    from workflows.trace import generate_trace

    wl = load_workload(workload)
    return {trace_key(r, s): generate_trace(wl.workflows, r, tasks, s, name=wl.name)
            for r in rates for s in seeds}


def retimed_traces(trace: Trace, rates: Sequence[float]) -> dict[str, Trace]:
    """The sweep's traces of a trace file: it re-timed to each rate (seed 0)."""
    return {trace_key(r, 0): retime(trace, r) for r in rates}
