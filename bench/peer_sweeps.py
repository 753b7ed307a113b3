"""Each peer's chosen parameters against their neighbours (issue 30): is the
setting we run a peer with a weak one for it?

    python bench/peer_sweeps.py [--tasks 60] [--seed 1] [--jobs 1] [--peer P]... [--write]

For each peer (docs/topas.md, "Peers"), every parameter we had to choose is
varied over a small grid, one at a time, the others at their defaults. The
cases are fixed and few: the paper's five workloads at their heaviest
operating point (`bench/paper.py`'s traces, same engine: host cache on) and
four generated cases (`bench/generalization.py`'s, draw 0: react heavy,
fork_join heavy, mixed overload, coding burst; capacity from the paper
baselines' bursts, cached as that bench caches it), and the ReAct workflow
whose conversations stay on the engine through ~2 s tool waits
(`bench/shared_context.py`'s, `share_rounds`) at 0.8 and 1.6 task/s: the
generated workflows keep no conversation across a tool wait, so only these
two cases exercise the peers' tool-wait rules (pins, TTLs, waste choices,
offloads). `--tasks` tasks each.
Per setting: mean JCT per case, their geometric mean (cases differ in scale),
its ratio to the chosen setting's, and the chosen value's rank among its
parameter's values (1: the lowest geometric mean). Writes the `peer-sweeps`
section of docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import Pool
from typing import Any

from _results import at_least, update_section  # bench/_results.py
from generalization import CACHE, Cache, capacities, geomean  # bench/generalization.py
from paper import WORKLOADS, operating_point  # bench/paper.py
from shared_context import react  # bench/shared_context.py

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.peers import PEERS
from workflows.builtin import load_workload
from workflows.generator import case_trace, draw_workload
from workflows.trace import generate_trace

# parameter -> the values tried; each grid holds the peer's default
GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "continuum": {"eta": (0.5, 1.0, 2.0, 4.0), "min_samples": (10, 100, 1000)},
    "astraea": {"levels": (2, 4, 8), "base_tokens": (1024, 2048, 4096, 8192),
                "aging": (4.0, 8.0, 16.0), "watermark": (0.8, 0.9, 0.95)},
    "kairos": {"slot_s": (0.25, 0.5, 1.0, 2.0), "max_slots": (128, 512, 2048)},
    "saga": {"deadline_slack": (1.0, 1.5, 2.0, 3.0), "ttl_cap_s": (60.0, 300.0, 900.0),
             "prior_p95": (1.0, 2.0, math.log(20.0), 5.0)},
    "tokencake": {"critical_share": (0.5, 0.75, 1.0), "ratio_max": (0.1, 0.3, 0.5),
                  "offload_use": (0.4, 0.6, 0.8), "aging": (0.0, 0.1, 1.0, 10.0)},
}
GENERATED = (("react", 0, "heavy"), ("fork_join", 0, "heavy"), ("mixed", 0, "overload"),
             ("coding", 0, "burst"))
KEPT_NAME = "react-kept"
KEPT = (0.8, 1.6)  # task/s of the ReAct workflow that keeps its conversations

Params = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Case:
    """A workload replayed: a paper workload or the kept-conversation ReAct
    (`KEPT_NAME`) at a rate, or a generated draw at a load."""

    name: str
    rate: float = 0.0  # paper workloads
    seed: int = 0  # generated draws
    load: str = ""
    capacity: float = 0.0

    @property
    def label(self) -> str:
        if self.load:
            return f"{self.name} #{self.seed} {self.load}"
        return f"{self.name} @ {self.rate:g}" if self.name == KEPT_NAME else self.name


@dataclass(frozen=True)
class Job:
    peer: str
    params: Params  # () is the chosen setting
    case: Case
    tasks: int
    seed: int


def defaults(peer: str) -> dict[str, Any]:
    """The peer's chosen setting: its constructor's defaults."""
    sig = inspect.signature(PEERS[peer])
    return {k: p.default for k, p in sig.parameters.items() if k != "name"}


def settings(peer: str) -> list[Params]:
    """The chosen setting `()`, then each parameter's other values alone."""
    chosen = defaults(peer)
    out: list[Params] = [()]
    for name, values in GRIDS[peer].items():
        if chosen[name] not in values:
            raise ValueError(f"{peer}: the grid of {name} misses the chosen {chosen[name]!r}")
        out += [((name, v),) for v in values if v != chosen[name]]
    return out


def run_job(job: Job) -> dict[str, Any]:
    c = job.case
    if c.load:
        trace = case_trace(draw_workload(c.name, c.seed), c.load, job.tasks, c.capacity,
                           c.seed)
        profile = get_profile(DEFAULT_PROFILE)
    elif c.name == KEPT_NAME:
        trace = generate_trace([react(True)], c.rate, job.tasks, job.seed, name=c.name)
        profile = get_profile(DEFAULT_PROFILE)
    else:
        trace, profile = operating_point(c.name, c.rate, job.tasks, job.seed, False, "same")
    policy = PEERS[job.peer](**dict(job.params))  # type: ignore[call-arg]
    s = Run(trace, policy, SimBackend(profile)).execute().summary()
    return {"peer": job.peer, "params": job.params, "case": c.label, "mean": s["mean_jct_s"]}


# ----------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Point:
    """One value of one parameter: its mean JCT per case and their geometric mean."""

    value: Any
    chosen: bool
    means: dict[str, float]

    @property
    def geo(self) -> float:
        return geomean(self.means.values())


def sweep(rows: Sequence[dict[str, Any]], peer: str, param: str,
          chosen: Any) -> list[Point]:
    """The values of `param` tried, each with its cases' mean JCT (the chosen
    value's from the chosen setting's rows), in grid order."""
    out = []
    for value in GRIDS[peer][param]:
        params = () if value == chosen else ((param, value),)
        means = {r["case"]: r["mean"] for r in rows
                 if r["peer"] == peer and tuple(r["params"]) == params}
        out.append(Point(value, value == chosen, means))
    return out


def rank(points: Sequence[Point]) -> int:
    """The chosen value's rank by geometric mean (1: the lowest)."""
    mine = next(p.geo for p in points if p.chosen)
    return 1 + sum(p.geo < mine for p in points)


def summary(rows: Sequence[dict[str, Any]], peers: Sequence[str]) -> list[str]:
    lines = ["| peer | parameter | chosen | its rank | best value | best vs chosen "
             "| spread (worst / best - 1) |", "|---|---|---|---|---|---|---|"]
    for peer in peers:
        chosen = defaults(peer)
        for param in GRIDS[peer]:
            pts = sweep(rows, peer, param, chosen[param])
            mine = next(p for p in pts if p.chosen)
            best = min(pts, key=lambda p: p.geo)
            spread = max(p.geo for p in pts) / best.geo - 1
            lines.append(f"| {peer} | {param} | {_fmt(chosen[param])} | {rank(pts)} of "
                         f"{len(pts)} | {_fmt(best.value)} | {best.geo / mine.geo - 1:+.1%} "
                         f"| {spread:.1%} |")
    return lines


def detail(rows: Sequence[dict[str, Any]], peer: str, cases: Sequence[str]) -> list[str]:
    chosen = defaults(peer)
    lines = [f"**{peer}** (mean JCT, s)", "",
             "| parameter | value | " + " | ".join(cases) + " | geometric mean | vs chosen |",
             "|---|---|" + "---|" * (len(cases) + 2)]
    for param in GRIDS[peer]:
        pts = sweep(rows, peer, param, chosen[param])
        mine = next(p for p in pts if p.chosen).geo
        for p in pts:
            value = f"**{_fmt(p.value)}** (chosen)" if p.chosen else _fmt(p.value)
            lines.append(f"| {param} | {value} | "
                         + " | ".join(f"{p.means[c]:.1f}" for c in cases)
                         + f" | {p.geo:.1f} | {p.geo / mine - 1:+.1%} |")
    return [*lines, ""]


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def render(rows: Sequence[dict[str, Any]], cases: Sequence[Case], args: argparse.Namespace,
           wall_s: float) -> str:
    labels = [c.label for c in cases]
    return "\n".join([
        "## Each peer's parameters swept (`bench/peer_sweeps.py`)", "",
        f"Command: `python bench/peer_sweeps.py --tasks {args.tasks} --seed {args.seed}"
        + "".join(f" --peer {p}" for p in args.peer or ()) + f" --write` "
        f"({wall_s / 60:.1f} min; load average {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs; simulated time). {len(cases)} cases, {args.tasks} tasks "
        "each: the paper's five workloads at their heaviest operating point (same engine), "
        f"{len(GENERATED)} generated cases (`workflows/generator.py`, draw 0) and the "
        f"ReAct workflow that keeps its conversations through tool waits at "
        f"{' and '.join(f'{r:g}' for r in KEPT)} task/s (the only cases where the peers' "
        "tool-wait rules act). Each "
        "parameter varied alone, the others at the chosen setting (docs/topas.md, "
        "\"Peers\"); geometric mean over the cases of their mean JCT; rank 1 is the "
        "lowest.", "", *summary(rows, _peers(args)), "",
        *[line for peer in _peers(args) for line in detail(rows, peer, labels)]])


def _peers(args: argparse.Namespace) -> list[str]:
    return list(args.peer or GRIDS)


def make_cases(tasks: int, jobs: int) -> list[Case]:
    out = [Case(w, rate=max(load_workload(w).operating_points)) for w in WORKLOADS]
    caps = capacities(list(GENERATED), tasks, Cache(CACHE), jobs)
    out += [Case(f, seed=s, load=load, capacity=caps[(f, s)]) for f, s, load in GENERATED]
    return out + [Case(KEPT_NAME, rate=rate) for rate in KEPT]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=at_least(2), default=60)
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--jobs", type=at_least(1), default=1, help="worker processes (1)")
    ap.add_argument("--peer", action="append", choices=tuple(GRIDS),
                    help="sweep only this peer (repeatable; default every peer)")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = make_cases(args.tasks, args.jobs)
    jobs = [Job(peer, params, case, args.tasks, args.seed) for peer in _peers(args)
            for params in settings(peer) for case in cases]
    rows = []
    with Pool(args.jobs) as pool:
        for i, row in enumerate(pool.imap_unordered(run_job, jobs), 1):
            rows.append(row)
            print(f"\r{i}/{len(jobs)} replays", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    text = render(rows, cases, args, time.perf_counter() - t0)
    print(text)
    if args.write:
        print(f"wrote {update_section('peer-sweeps', text)}", file=sys.stderr)


if __name__ == "__main__":
    main()
