"""Where TOPAS's p99 misses go: every case of a `bench/generalization.py
--json` run whose TOPAS p99 is over the bound (1.10x the best baseline's),
replayed through TOPAS and that case's best-p99 baseline with the sink and
sampler of bench/prefix_room.py.

    python bench/generalization.py --json run.json
    python bench/p99_misses.py run.json [--bound 1.10] [--tasks 100] [--write]

The run must be of the default `topas` with the same `--tasks`: each miss is
replayed so, and the table gives the replayed p99 ratio beside the file's,
so a file from another run shows.

A miss is a *throughput* loss when TOPAS's makespan is more than 5% longer
than the baseline's: its backlog drains slower, so the last tasks finish
later (the columns say where the pool went: the mean batch, the prefix KV
that running agents pin, the KV of running requests). Otherwise it is an
*order* loss: the same work is done in the same time and the tail is in
which tasks wait. `--write` records the table in docs/RESULTS.md (section
"p99-misses").
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _results import command_line, progress, publish  # bench/_results.py
from generalization import CACHE, Cache, capacities, read_ratios
from prefix_room import replay

from workflows.generator import FAMILIES, HOLDOUT

THROUGHPUT = 1.05  # a makespan this many times the baseline's is a throughput loss


@dataclass(frozen=True)
class Miss:
    """A case whose TOPAS p99 is over the bound: (family, draw, load), the
    ratio, the best-p99 baseline, and TOPAS's mean over the best mean."""

    case: tuple[str, int, str]
    p99_ratio: float
    baseline: str
    mean_ratio: float


def misses(rows: Sequence[dict[str, Any]], bound: float) -> list[Miss]:
    """The cases of a `generalization.py --json` file over `bound`, worst first."""
    out = []
    for row in rows:
        family, draw, load = row["case"]
        if family not in (*FAMILIES, *HOLDOUT):
            raise SystemExit(f"p99_misses.py: error: case {family} #{draw} is not a generated "
                             "family (a --calls run?); use a run of the generated families")
        base, best = row["best_p99"]
        ratio = row["policy"]["p99_jct_s"] / best
        if ratio > bound:
            out.append(Miss((family, int(draw), load), ratio, base,
                            row["policy"]["mean_jct_s"] / row["best_mean"][1]))
    return sorted(out, key=lambda m: (-m.p99_ratio, m.case))


def diagnose(miss: Miss, tasks: int, capacity: float) -> dict[str, Any]:
    """TOPAS's and the baseline's prefix-room rows, the replayed p99 ratio,
    and the kind of loss."""
    family, draw, load = miss.case
    topas = replay(family, draw, load, "topas", {}, tasks, capacity)
    base = replay(family, draw, load, miss.baseline, {}, tasks, capacity)
    makespan = topas["makespan_s"] / base["makespan_s"]
    return {"miss": miss, "topas": topas, "base": base, "makespan_ratio": makespan,
            "replayed_p99_ratio": topas["p99_jct_s"] / base["p99_jct_s"],
            "kind": "throughput" if makespan > THROUGHPUT else "order"}


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per miss (TOPAS / the baseline in each pair), then the count by kind."""
    out = ["| case | p99 over the best (run) | replayed | best-p99 baseline | makespan ratio "
           "| mean batch | prefix KV pinned by running agents | KV of running requests | "
           "prefix loads | mean over the best mean | loss |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, t, b = r["miss"], r["topas"], r["base"]
        family, draw, load = m.case
        out.append(
            f"| `{family}` #{draw} {load} | {m.p99_ratio:.3f}x | "
            f"{r['replayed_p99_ratio']:.3f}x | {m.baseline} | "
            f"{r['makespan_ratio']:.3f} | {t['mean_batch']:.2f} / {b['mean_batch']:.2f} | "
            f"{t['pinned_kv']:,.0f} / {b['pinned_kv']:,.0f} | "
            f"{t['running_kv']:,.0f} / {b['running_kv']:,.0f} | "
            f"{t['prefix_loads']} / {b['prefix_loads']} | {m.mean_ratio:.3f}x | {r['kind']} |")
    kinds = [r["kind"] for r in rows]
    out += ["", f"{kinds.count('throughput')} throughput losses (TOPAS's makespan more than "
            f"{THROUGHPUT - 1:.0%} longer), {kinds.count('order')} order losses, of "
            f"{len(rows)} cases over the bound."]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a bench/generalization.py --json file")
    ap.add_argument("--bound", type=float, default=1.10,
                    help="a miss: TOPAS's p99 over this times the best baseline's (1.10)")
    ap.add_argument("--tasks", type=int, default=100,
                    help="tasks per case, as the run was made with (100)")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1),
                    help="processes measuring the cases' capacities (all cores)")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args(argv)
    if args.bound <= 0 or args.tasks < 1 or args.workers < 1:
        ap.error("--bound must be positive, --tasks and --workers at least 1")
    try:
        read_ratios(args.run)  # every row a case's row, and at least one
    except ValueError as e:
        raise SystemExit(f"p99_misses.py: error: {e}") from None
    found = misses(json.loads(args.run.read_text()), args.bound)
    caps = capacities([m.case for m in found], args.tasks, Cache(CACHE), args.workers)
    diagnosed = [diagnose(m, args.tasks, caps[(m.case[0], m.case[1])])
                 for m in progress(found, "misses")]
    publish("p99-misses", "Where TOPAS's p99 misses go (`bench/p99_misses.py`)",
            f"Command: `{command_line('p99_misses.py', argv)}`, the file written by `python "
            f"bench/generalization.py --json {args.run.name}`. Each case whose TOPAS p99 is "
            f"over {args.bound:g}x the best baseline's, replayed through TOPAS and that "
            "baseline (TOPAS / the baseline in each pair; time averages as in \"The room "
            "prefixes hold\").", table(diagnosed), args.write)


if __name__ == "__main__":
    main()
