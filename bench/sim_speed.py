"""How fast is the simulator? FCFS on Chain-3 at 0.15 task/s, default profile.

Runs the simulator alone (no decision log, no console) on a sampled trace and
reports engine steps per wall second (simulated engine iterations / wall
seconds), simulated time per wall second, and the wall time of a 200-task
operating point, against the targets (>= 50,000 steps/s; 200 tasks < 5 s).

    python bench/sim_speed.py [--tasks 1000] [--small 200] [--repeat 3] [--stepwise] [--json]

`--stepwise` also times the large run with `closed_form=False` (one engine
iteration per decode step): the engine's raw per-step speed.

Each figure is the best of `--repeat` runs (the least disturbed by other
processes); trace sampling is outside the timed region.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

from _results import at_least, update_section  # bench/_results.py

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import Trace, generate_trace

TARGET_STEPS_PER_S = 50_000
TARGET_SMALL_WALL_S = 5.0


def timed_run(trace: Trace, policy: str, profile: str,
              closed_form: bool = True) -> dict[str, Any]:
    backend = SimBackend(get_profile(profile), closed_form=closed_form)
    run = Run(trace, make_policy(policy), backend)
    t0 = time.perf_counter()
    result = run.execute()
    wall = time.perf_counter() - t0
    s = backend.stats
    sim_s = backend.t - trace.tasks[0].arrival
    return {
        "tasks": len(trace.tasks),
        "requests": result.requests_finished,
        "wall_s": wall,
        "steps": s.steps,
        "decode_steps": s.decode_steps,
        "prefill_steps": s.prefill_steps,
        "decisions": result.decisions,
        "simulated_s": sim_s,
        "steps_per_s": s.steps / wall,
        "sim_per_wall": sim_s / wall,
        "decisions_per_s": result.decisions / wall,
        "mean_jct_s": result.summary()["mean_jct_s"],
    }


def best_of(trace: Trace, policy: str, profile: str, repeat: int,
            closed_form: bool = True) -> dict[str, Any]:
    runs = [timed_run(trace, policy, profile, closed_form) for _ in range(max(1, repeat))]
    best = min(runs, key=lambda r: r["wall_s"])
    assert all(r["steps"] == best["steps"] for r in runs), "the simulator is not deterministic"
    return best


def measure(args: argparse.Namespace) -> dict[str, Any]:
    wl = load_workload(args.workload)
    big = generate_trace(wl.workflows, args.rate, args.tasks, args.seed, name=wl.name)
    small = generate_trace(wl.workflows, args.rate, args.small, args.seed, name=wl.name)
    large_run = best_of(big, args.policy, args.profile, args.repeat)
    small_run = best_of(small, args.policy, args.profile, args.repeat)
    stepwise = (best_of(big, args.policy, args.profile, args.repeat, closed_form=False)
                if args.stepwise else None)
    return {
        "workload": wl.name, "rate": args.rate, "policy": args.policy,
        "profile": args.profile, "seed": args.seed, "repeat": args.repeat,
        "python": platform.python_version(), "machine": platform.machine(),
        "large": large_run, "small": small_run, "stepwise": stepwise,
        "targets": {"steps_per_s": TARGET_STEPS_PER_S, "small_wall_s": TARGET_SMALL_WALL_S},
        "meets": {
            "steps_per_s": large_run["steps_per_s"] >= TARGET_STEPS_PER_S,
            "small_wall_s": small_run["wall_s"] < TARGET_SMALL_WALL_S,
        },
    }


def markdown(r: dict[str, Any]) -> str:
    big, small, meets = r["large"], r["small"], r["meets"]
    runs = [("large", big), ("small", small)]
    if r["stepwise"]:
        runs.append(("large, stepwise", r["stepwise"]))

    def ok(flag: bool) -> str:
        return "yes" if flag else "**no**"

    return "\n".join([
        f"Simulator speed: {r['policy']} on {r['workload']} at {r['rate']} task/s, profile "
        f"`{r['profile']}`, seed {r['seed']}, best of {r['repeat']} "
        f"(Python {r['python']}, {r['machine']}).",
        "",
        "| measure | value | target | met |",
        "|---|---:|---:|:---:|",
        f"| engine steps / wall s ({big['tasks']} tasks) | {big['steps_per_s']:,.0f} | "
        f">= {TARGET_STEPS_PER_S:,} | {ok(meets['steps_per_s'])} |",
        f"| simulated s / wall s ({big['tasks']} tasks) | {big['sim_per_wall']:,.0f} | | |",
        *([f"| engine steps / wall s, stepwise (`closed_form=False`) | "
           f"{r['stepwise']['steps_per_s']:,.0f} | | |"] if r["stepwise"] else []),
        f"| wall time, {small['tasks']} tasks | {small['wall_s']:.3f} s | "
        f"< {TARGET_SMALL_WALL_S:g} s | {ok(meets['small_wall_s'])} |",
        "",
        "| run | tasks | requests | engine steps | decode / prefill | decisions | "
        "simulated s | wall s | mean JCT s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {name} | {x['tasks']} | {x['requests']} | {x['steps']:,} | "
          f"{x['decode_steps']:,} / {x['prefill_steps']:,} | {x['decisions']:,} | "
          f"{x['simulated_s']:,.0f} | {x['wall_s']:.3f} | {x['mean_jct_s']:.1f} |"
          for name, x in runs),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="chain3")
    ap.add_argument("--rate", type=float, default=0.15)
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--tasks", type=at_least(1), default=1000)
    ap.add_argument("--small", type=at_least(1), default=200,
                    help="tasks of the small operating point")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--repeat", type=at_least(1), default=3)
    ap.add_argument("--stepwise", action="store_true",
                    help="also time the large run stepping decode one step at a time")
    ap.add_argument("--json", action="store_true", help="print the measurements as JSON")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    result = measure(args)
    text = markdown(result)
    print(json.dumps(result, indent=2) if args.json else text)
    if args.write:

        command = "python " + " ".join(["bench/sim_speed.py", *sys.argv[1:]])
        update_section("sim_speed", f"## Simulator speed\n\nCommand: `{command}`\n\n{text}")


if __name__ == "__main__":
    main()
