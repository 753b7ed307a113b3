"""What the decision log costs: DAG-10-Wide at its heaviest operating point,
replayed without a log, then with `--log-candidates none` and `all`.

Each repeat runs the three variants back to back (same trace, fresh policy and
backend), so machine noise hits them alike; the table shows the median and
the best of the repeats. A logged run's time spans `Run.execute()` through
the sink's `run_finished`, which waits until the writer process has
committed every row. CPU: this process (scheduler + feeder thread) and the
store's writer process, apart. Rows per second = rows written / median wall
time. Budget (the decision-log issue's comparison): `--log-candidates all` at
most 15% above `--log-candidates none`; the "vs no log" columns show what any
log costs.

    python bench/log_overhead.py [--policy topas] [--tasks 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import at_least, update_section  # bench/_results.py

from backends.sim.engine import SimBackend
from store import Store
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import POLICY_NAMES, make_policy
from workflows.builtin import load_workload
from workflows.trace import Trace, generate_trace

VARIANTS = ("off", "none", "all")  # no log, log without candidates, log everything
BUDGET = 0.15


def heaviest_trace(tasks: int, seed: int) -> Trace:
    wl = load_workload("dag10wide")
    return generate_trace(wl.workflows, max(wl.operating_points), tasks, seed, name=wl.name)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _writer_cpu(store: Store | None) -> float:
    """CPU seconds of the store's writer process so far (Linux /proc)."""
    writer = None if store is None else store._writer
    if writer is None:
        return 0.0
    try:
        fields = Path(f"/proc/{writer.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(trace: Trace, policy: str, variant: str, store: Store | None) -> dict[str, float]:
    """Wall and CPU seconds (this process, the writer) of one replay."""
    sink = None if variant == "off" or store is None else store.sink(variant)
    backend = SimBackend(get_profile(DEFAULT_PROFILE))
    if sink is not None:
        store.writer()  # started once per store file, before the clock (as by earlier runs)
    w0, cpu0, t0 = _writer_cpu(store), _cpu(), time.perf_counter()
    Run(trace, make_policy(policy), backend, sink=sink).execute()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": _cpu() - cpu0, "writer_cpu_s": _writer_cpu(store) - w0,
            "rows": float(sink.rows_written if sink is not None else 0)}


def measure(policy: str, tasks: int, repeats: int, seed: int) -> dict[str, Any]:
    trace = heaviest_trace(tasks, seed)
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="log-overhead-") as tmp:
        t0 = time.perf_counter()
        store = Store(Path(tmp) / "log.db")
        open_s = time.perf_counter() - t0
        one_run(trace, policy, "off", None)  # warm-up: imports, caches
        for _ in range(repeats):
            for variant in VARIANTS:
                samples[variant].append(one_run(trace, policy, variant, store))
        db_mb = (Path(tmp) / "log.db").stat().st_size / 1e6
        store.close()
    med = {v: {k: statistics.median(s[k] for s in samples[v]) for k in samples[v][0]}
           for v in VARIANTS}
    best = {v: min(s["wall_s"] for s in samples[v]) for v in VARIANTS}
    return {
        "policy": policy, "tasks": tasks, "rate": trace.meta["rate"], "repeats": repeats,
        "store_open_s": open_s, "db_mb": db_mb, "median": med, "best": best,
        "overhead": {v: med[v]["wall_s"] / med["off"]["wall_s"] - 1.0 for v in VARIANTS},
        "overhead_best": {v: best[v] / best["off"] - 1.0 for v in VARIANTS},
        "walls": {v: [s["wall_s"] for s in samples[v]] for v in VARIANTS},
    }


def markdown(results: list[dict[str, Any]], command: str) -> str:
    lines = [f"Decision-log overhead, DAG-10-Wide at {results[0]['rate']} task/s "
             f"({results[0]['tasks']} tasks, profile {DEFAULT_PROFILE}, median of "
             f"{results[0]['repeats']}):", "",
             "| policy | log | wall s (median) | vs no log | wall s (best) | vs no log "
             "| CPU s scheduler proc. | CPU s writer proc. | rows | rows/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for v in VARIANTS:
            m = r["median"][v]
            rate = f"{m['rows'] / m['wall_s']:,.0f}" if m["rows"] else "–"
            label = {"off": "off", "none": "`--log-candidates none`",
                     "all": "`--log-candidates all`"}[v]
            lines.append(f"| {r['policy']} | {label} | {m['wall_s']:.3f} "
                         f"| {r['overhead'][v]:+.1%} | {r['best'][v]:.3f} "
                         f"| {r['overhead_best'][v]:+.1%} | {m['cpu_s']:.3f} "
                         f"| {m['writer_cpu_s']:.3f} | {m['rows']:,.0f} | {rate} |")
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = "topas" if "topas" in POLICY_NAMES else "lpm"
    ap.add_argument("--policy", action="append", default=None,
                    help=f"policy to replay, repeatable (default: {default})")
    ap.add_argument("--tasks", type=at_least(1), default=200)
    ap.add_argument("--repeats", type=at_least(1), default=5)
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    results = []
    for policy in args.policy or [default]:
        r = measure(policy, args.tasks, args.repeats, args.seed)
        results.append(r)
        walls = {v: ", ".join(f"{w:.3f}" for w in r["walls"][v]) for v in VARIANTS}
        print(f"{policy}: walls {walls}; store open {r['store_open_s'] * 1e3:.0f} ms, "
              f"file {r['db_mb']:.1f} MB", file=sys.stderr)
    command = "python " + " ".join(["bench/log_overhead.py", *sys.argv[1:]])
    print(markdown(results, command))
    # The comparison: `--log-candidates all` against `--log-candidates none`.
    worst = max(r["median"]["all"]["wall_s"] / r["median"]["none"]["wall_s"] - 1
                for r in results)
    worst_best = max(r["best"]["all"] / r["best"]["none"] - 1 for r in results)
    verdict = "within" if worst <= BUDGET else "OVER"
    summary = (f"`--log-candidates all` costs at most {worst:+.1%} median wall time over "
               f"`none` ({worst_best:+.1%} best of {args.repeats}): {verdict} the "
               f"{BUDGET:.0%} budget; load average "
               f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("\n" + summary, file=sys.stderr)
    if args.write:

        update_section("log_overhead", "## Decision-log overhead\n\n"
                       + markdown(results, command) + "\n\n" + summary + ".")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
