"""Shared task context and a task's conversation across tool waits (issue 29):
what sharing changes in the simulator, per policy.

    python bench/shared_context.py [--tasks 100] [--seed 1] [--write]

Two workflows, each replayed without and with sharing (the same sampled sizes:
`share_history` and `share_rounds` draw nothing):

- **map-reduce**: a planner writes ~600 tokens that eight parallel workers
  each carry (`history: parents`); with `share_history` the workers of a task
  hold one copy of it, as a radix cache would.
- **ReAct**: a solver's four rounds each carry the earlier rounds' inputs and
  outputs across ~2 s tool waits; with `share_rounds` that conversation stays
  on the engine through the wait (unless its room is needed) instead of
  being prefilled again by every round.

Reports each run's mean decode batch, mean JCT, the tokens prefilled for
shared content (context hits against computes) and the tokens prefilled
again. Writes the `shared-context` section of docs/RESULTS.md with `--write`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
from _results import update_section  # bench/_results.py

from backends.sim.engine import SimBackend
from topasd.model import Workflow
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import generate_trace

POLICIES = ("fcfs", "lpm", "parrot-fcfs", "topas")
RATES = {"map-reduce": 0.5, "react": 0.8}  # task/s: both past light load on the default profile


def map_reduce(share: bool) -> Workflow:
    return workflow_from_dict({
        "name": "map-reduce",
        "agents": {"P": {"prefix_tokens": 300}, "W": {"prefix_tokens": 300}},
        "stages": [
            {"name": "plan", "agent": "P", "input_tokens": 100,
             "output_tokens": {"lognormal": {"median": 600, "sigma": 0.3, "low": 1,
                                                         "high": 2000}}},
            {"name": "map", "agent": "W", "after": ["plan"], "history": "parents",
             "branches": 8, "input_tokens": 60,
             "output_tokens": {"lognormal": {"median": 120, "sigma": 0.5, "low": 1,
                                              "high": 1000}},
             "share_history": share},
            {"name": "reduce", "agent": "P", "after": ["map"], "input_tokens": 50,
             "output_tokens": 60}]})


def react(share: bool) -> Workflow:
    return workflow_from_dict({
        "name": "react",
        "agents": {"S": {"prefix_tokens": 400}},
        "stages": [
            {"name": "solve", "agent": "S", "input_tokens": 300,
             "output_tokens": {"lognormal": {"median": 150, "sigma": 0.5, "low": 1,
                                              "high": 1000}},
             "rounds": 4, "observation_tokens": 200,
             "tool_wait_s": {"exponential": {"mean": 2.0, "high": 30.0}},
             "carry_rounds": True, "share_rounds": share}]})


def replay(name: str, policy: str, share: bool, args: argparse.Namespace) -> dict[str, Any]:
    wf = (map_reduce if name == "map-reduce" else react)(share)
    trace = generate_trace([wf], RATES[name], args.tasks, args.seed, name=name)
    backend = SimBackend(get_profile(DEFAULT_PROFILE))
    result = Run(trace, make_policy(policy), backend).execute()
    s = backend.stats
    return {"workflow": name, "policy": policy, "share": share,
            "mean_batch": s.mean_batch, "mean_jct_s": float(np.mean(list(result.jct.values()))),
            "hits": s.context_hits, "hit_tokens": s.context_hit_tokens,
            "computes": s.context_computes, "recomputed": s.recomputed_tokens}


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = ["## Shared task context (`bench/shared_context.py`)", "",
             f"Command: `python bench/shared_context.py --tasks {args.tasks} --seed {args.seed} "
             f"--write`. Simulator, default profile; map-reduce at {RATES['map-reduce']:g} "
             f"task/s, ReAct at {RATES['react']:g} task/s; load average "
             f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (simulated time: the "
             "numbers do not depend on it).", "",
             "| workflow | policy | sharing | mean batch | mean JCT s | context hits "
             "(tokens) | context computes | tokens prefilled again |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workflow']} | {r['policy']} | {'yes' if r['share'] else 'no'} "
                     f"| {r['mean_batch']:.2f} | {r['mean_jct_s']:.1f} | {r['hits']} "
                     f"({r['hit_tokens']}) | {r['computes']} | {r['recomputed']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    rows = [replay(name, policy, share, args) for name in RATES for policy in POLICIES
            for share in (False, True)]
    text = render(rows, args)
    print(text)
    if args.write:
        print(f"wrote {update_section('shared-context', text)}")


if __name__ == "__main__":
    main()
