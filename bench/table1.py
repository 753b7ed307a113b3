"""Reproduce Table I of the paper: Grouped vs Alternating under FCFS.

Two agents with distinct long prefixes, n requests each, all present at t=0,
identical suffix, 800-900 generated tokens (see the workload's notes); only
the request order differs.

    python bench/table1.py [--profile qwen2.5-32b-a100] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import Trace, sample_task

PAPER = {  # n: (makespan G, A), (mean batch G, A), (peak batch G, A)
    100: ((1145.5, 2086.0), (9.3, 4.7), (15, 8)),
    150: ((1639.3, 3104.4), (10.0, 4.8), (16, 8)),
    200: ((2143.5, 4079.1), (11.5, 5.0), (16, 7)),
}


def table1_trace(n: int, grouped: bool, seed: int = 0) -> Trace:
    """n tasks of each agent at t=0; task ids give the FCFS order."""
    wl = load_workload("table1")
    wa, wb = wl.workflows
    order = [wa] * n + [wb] * n if grouped else [w for _ in range(n) for w in (wa, wb)]
    rng = np.random.default_rng(seed)
    tasks = [sample_task(wf, i, 0.0, rng) for i, wf in enumerate(order)]
    return Trace({wa.name: wa, wb.name: wb}, tuple(tasks), {"workload": "table1", "n": n})


def run(n: int, grouped: bool, profile: str) -> dict[str, float]:
    res = Run(table1_trace(n, grouped), make_policy("fcfs"), SimBackend(get_profile(profile)))
    s = res.execute().summary()
    return {"makespan": s["makespan_s"], "mean_batch": s["mean_batch"],
            "peak_batch": s["peak_batch"], "retractions": s["retractions"]}


def table_row(n: int, profile: str) -> dict:
    """Grouped and Alternating runs for n requests per agent, beside the paper."""
    mk, mb, pk = PAPER[n]
    return {"n": n, "grouped": run(n, True, profile), "alternating": run(n, False, profile),
            "paper": {"makespan": mk, "mean_batch": mb, "peak_batch": pk}}


def checks(rows: list[dict]) -> list[tuple[str, bool]]:
    """The acceptance criteria of the foundation issue, one line each."""
    out = []
    for r in rows:
        g, a, p = r["grouped"], r["alternating"], r["paper"]
        n = r["n"]
        mk_ok = all(abs(sim / ref - 1) <= 0.20 for sim, ref in
                    ((g["makespan"], p["makespan"][0]), (a["makespan"], p["makespan"][1])))
        ratio = a["makespan"] / g["makespan"]
        batch_ratio = g["mean_batch"] / a["mean_batch"]
        peaks = ((g["peak_batch"], p["peak_batch"][0]), (a["peak_batch"], p["peak_batch"][1]))
        peak_ok = all(abs(sim / ref - 1) <= 0.25 for sim, ref in peaks)
        above = g["peak_batch"] > g["mean_batch"] and a["peak_batch"] > a["mean_batch"]
        out += [(f"n={n}: makespans within 20% of the paper", mk_ok),
                (f"n={n}: makespan ratio {ratio:.2f} in [1.7, 2.1]", 1.7 <= ratio <= 2.1),
                (f"n={n}: mean-batch ratio {batch_ratio:.2f} in [1.7, 2.3]",
                 1.7 <= batch_ratio <= 2.3),
                (f"n={n}: peak batches within 25% of the paper's", peak_ok),
                (f"n={n}: peak above mean (both orders)", above)]
    return out


def render(rows: list[dict], profile: str) -> str:
    lines = [f"## Table I: Grouped vs Alternating under FCFS (profile `{profile}`)", "",
             f"Command: `python bench/table1.py --profile {profile} --write`. Two agents with "
             "6,000-token prefixes, n requests each (512-token suffix, 800-900 output tokens), "
             "all present at t = 0; slash-separated values are Grouped / Alternating.", "",
             "| n | makespan s (sim) | makespan s (paper) | Alternating / Grouped: sim / paper "
             "| mean batch (sim) | mean batch (paper) | peak batch (sim) | peak batch (paper) "
             "| retractions (sim) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, a, p = r["grouped"], r["alternating"], r["paper"]
        lines.append(
            f"| {r['n']} | {g['makespan']:.1f} / {a['makespan']:.1f} "
            f"| {p['makespan'][0]} / {p['makespan'][1]} "
            f"| {a['makespan'] / g['makespan']:.2f} / {p['makespan'][1] / p['makespan'][0]:.2f} "
            f"| {g['mean_batch']:.1f} / {a['mean_batch']:.1f} "
            f"| {p['mean_batch'][0]} / {p['mean_batch'][1]} "
            f"| {g['peak_batch']} / {a['peak_batch']} "
            f"| {p['peak_batch'][0]} / {p['peak_batch'][1]} "
            f"| {g['retractions']} / {a['retractions']} |")
    lines += ["", "Checks:", ""]
    lines += [f"- {'pass' if ok else 'FAIL'}: {text}" for text, ok in checks(rows)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    rows = [table_row(n, args.profile) for n in PAPER]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    text = render(rows, args.profile)
    print(text)
    if args.write:
        from _results import update_section  # bench/_results.py

        update_section(f"table1-{args.profile}", text)


if __name__ == "__main__":
    main()
