"""Digest of every TOPAS decision and JCT over several workloads and
parameter sets, printed as JSON (tests/test_native.py runs it once with the
compiled search and once in pure Python, in fresh processes).

    python -m tests.native_digest
"""

from __future__ import annotations

import hashlib
import json
import pickle
from typing import Any

from backends.sim.engine import SimBackend
from topasd.model import Agent, Decision, Stage, StageProfile, Workflow
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy, native
from workflows.builtin import load_workload
from workflows.trace import RoundSpec, TaskRecord, Trace, generate_trace

CASES: list[tuple[str, int, str, dict[str, Any]]] = [  # workload, tasks, policy, params
    ("chain3", 40, "topas", {}),
    ("dag4", 40, "topas", {"k": 2, "reservation": "full"}),
    ("dag10wide", 40, "topas", {}),
    ("dag10wide", 30, "topas", {"m": 3, "pack_order": "arrival", "hol_age": 0.0}),
    ("metagpt-sop", 12, "topas-base", {"preempt": False}),
    ("metagpt-tl", 8, "topas", {"rho": 3, "h_age": 30.0, "decode_peak": "backfill"}),
    ("chain3", 40, "topas", {"preempt_margin": 1.0, "decode_peak": "always"}),
]


def _number(v: Any) -> Any:
    """Scores compared as values: 0 and 0.0 are the same score."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


class _Recorder:
    """The policy, with every decision folded into a hash (native classes
    cannot be patched, so the policy is wrapped)."""

    def __init__(self, name: str, params: dict[str, Any]) -> None:
        self.inner = make_policy(name, **params)
        self.name = self.inner.name
        self.hash = hashlib.sha256()
        self.decisions = 0
        self.last: Decision | None = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def decide(self, view: Any) -> Decision:
        d = self.inner.decide(view)
        rows = [tuple(_number(v) for v in row) for row in d.candidates.as_rows()]
        self.hash.update(repr((d.admit, d.preempt, d.load, d.evict, d.chosen, rows)).encode())
        self.decisions += 1
        self.last = d
        return d


def crowd(n_agents: int = 40, n_requests: int = 600) -> Trace:
    """One-stage workflows over many agents, every request waiting at t = 0:
    a large active pool (greedy additions, duality bounds, > 64 items)."""
    wfs = {}
    for i in range(n_agents):
        name = f"agent{i:02d}"
        wfs[name] = Workflow(name, {name: Agent(name, 800 + 40 * i)},
                             {"call": Stage("call", name, (), StageProfile())})
    names = sorted(wfs)
    tasks = tuple(TaskRecord(j, names[j % n_agents], 0.0,
                             {"call": (RoundSpec(100 + (j * 37) % 300, 40 + (j * 11) % 90),)})
                  for j in range(n_requests))
    return Trace(wfs, tasks, {"workload": "crowd", "tasks": n_requests})


def _case(label: str, trace: Trace, name: str, params: dict[str, Any]) -> dict[str, Any]:
    policy = _Recorder(name, params)
    result = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE))).execute()
    return {"case": label, "decisions": policy.decisions, "digest": policy.hash.hexdigest(),
            "jct": sorted(result.jct.items()),
            "pickles": pickle.loads(pickle.dumps(policy.last)) == policy.last}


def digest() -> dict[str, Any]:
    out: dict[str, Any] = {"native": native.status().active, "cases": []}
    for workload, tasks, name, params in CASES:
        wl = load_workload(workload)
        trace = generate_trace(wl.workflows, max(wl.operating_points), tasks, 1, name=workload)
        out["cases"].append(_case(f"{workload} {name} {params}", trace, name, params))
    out["cases"].append(_case("crowd", crowd(), "topas", {}))
    return out


if __name__ == "__main__":
    print(json.dumps(digest()))
