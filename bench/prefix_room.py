"""The room prefixes hold: one generated case replayed through TOPAS and
baselines, following the engine's events to measure how many agents run at
once and how much of the KV pool their prefixes pin.

    python bench/prefix_room.py [--family fork_join] [--draw 0] [--load overload]
        [-p topas -p lpm ...] [--tasks 100] [--write]

The case is `bench/generalization.py`'s (the same trace, capacity from its
cache). An agent *runs* while one of its requests is admitted and not yet
finished, preempted or retracted; its prefix is then pinned on the GPU. Every
quantity is a time average over the run (simulated seconds): the agents
running, the prefix KV those agents pin, all prefix KV on the GPU (idle
prefixes kept while free KV holds them included), and the mean batch; and,
sampled at each decision and held until the next, the KV the running
requests hold (input and tokens generated so far) and the waiting requests
(how many, and their mean input). Per agent: the share of the run its
prefix is on the GPU, how many of its requests run while it is there (the
batch its prefix's room is spent on), its loads, and how long its requests
wait from first ready to first start (the queue its residency leaves).
Under overload the pool is the bottleneck, so prefix KV pinned by running
agents is room the batch does not get. `--write` records the table in
docs/RESULTS.md (section "prefix-room").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _one_case import CaseBench  # bench/_one_case.py

from backends.sim.engine import SimBackend
from topasd.model import Decision, EngineEvent, EngineView, EventKind
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.generator import case_trace, draw_workload

ENDS = (EventKind.REQUEST_FINISH, EventKind.PREEMPT, EventKind.RETRACT,
        EventKind.REQUEST_WITHDRAW)
ON_GPU = (EventKind.PREFIX_LOAD_START, EventKind.PREFIX_COMPUTE_START)
OFF_GPU = EventKind.PREFIX_EVICT  # (PREFIX_OFFLOAD_* is a host copy made beside the GPU's)


@dataclass
class PrefixRoom:
    """A run sink: time integrals of the running agents and of the prefix KV
    they pin, and of all prefix KV on the GPU."""

    prefix_tokens: dict[str, int]
    running: dict[int, str] = field(default_factory=dict)  # request -> agent
    per_agent: Counter[str] = field(default_factory=Counter)
    on_gpu: set[str] = field(default_factory=set)
    t: float = 0.0
    agent_s: float = 0.0
    pinned_s: float = 0.0
    resident_s: float = 0.0
    gpu_s: Counter[str] = field(default_factory=Counter)  # per agent: seconds on the GPU
    request_s: Counter[str] = field(default_factory=Counter)  # per agent: request-seconds run
    loads: Counter[str] = field(default_factory=Counter)  # per agent: times put on the GPU
    # request -> (first ready, agent) until it first starts, then None
    ready: dict[int, tuple[float, str] | None] = field(default_factory=dict)
    waited: dict[str, list[float]] = field(default_factory=dict)  # per agent: first waits

    def decision(self, decision: Any) -> None:
        return None

    def event(self, ev: EngineEvent) -> None:
        dt = ev.t - self.t
        if dt > 0:
            busy = [a for a, n in self.per_agent.items() if n > 0]
            self.agent_s += dt * len(busy)
            self.pinned_s += dt * sum(self.prefix_tokens.get(a, 0) for a in busy)
            self.resident_s += dt * sum(self.prefix_tokens.get(a, 0) for a in self.on_gpu)
            for a in self.on_gpu:
                self.gpu_s[a] += dt
            for a in busy:
                self.request_s[a] += dt * self.per_agent[a]
            self.t = ev.t
        kind, rid, agent = ev.kind, ev.request_id, ev.agent or ""
        if rid is not None:
            self._first_wait(kind, rid, ev.t, agent)
        if kind is EventKind.REQUEST_ADMIT and rid is not None and rid not in self.running:
            self.running[rid] = agent
            self.per_agent[agent] += 1
        elif kind in ENDS and rid in self.running:
            self.per_agent[self.running.pop(rid)] -= 1  # type: ignore[arg-type]
        elif kind in ON_GPU:
            self.on_gpu.add(agent)
            self.loads[agent] += 1
        elif kind is OFF_GPU:
            self.on_gpu.discard(agent)

    def _first_wait(self, kind: EventKind, rid: int, t: float, agent: str) -> None:
        """A request's wait from its first readiness to its first start."""
        if kind is EventKind.REQUEST_READY:
            self.ready.setdefault(rid, (t, agent))
        elif kind is EventKind.REQUEST_START and (first := self.ready.get(rid)) is not None:
            self.waited.setdefault(first[1], []).append(t - first[0])
            self.ready[rid] = None  # a start after a preemption is not its first

    def averages(self) -> dict[str, float]:
        span = self.t or 1.0
        return {"agents_running": self.agent_s / span, "pinned_kv": self.pinned_s / span,
                "resident_kv": self.resident_s / span, "agents": self.by_agent()}

    def by_agent(self) -> dict[str, dict[str, float]]:
        """Per agent whose prefix was on the GPU or whose request started: its
        share of the run on the GPU, its mean running requests while there,
        its loads, and its requests' mean wait from first ready to first start."""
        span = self.t or 1.0
        return {a: {"prefix": float(self.prefix_tokens.get(a, 0)),
                    "on_gpu": self.gpu_s[a] / span,
                    "running_on_gpu": self.request_s[a] / self.gpu_s[a] if self.gpu_s[a] else 0.0,
                    "loads": float(self.loads[a]),
                    "wait_s": float(np.mean(self.waited[a])) if a in self.waited else 0.0}
                for a in sorted(set(self.gpu_s) | set(self.waited))}


class PoolSampler:
    """A policy that samples the pool at each of its decisions: the KV the
    running requests hold (input and tokens generated so far), the prefix KV
    on the GPU, the waiting requests and their input; each sample holds until
    the next decision."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.samples: list[tuple[float, int, int, int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def decide(self, view: EngineView) -> Decision:
        self.samples.append((
            view.t, sum(r.input_tokens + r.generated for r in view.running),
            sum(view.prefix_tokens(a) for a in view.gpu_prefixes()),
            len(view.waiting), sum(r.input_tokens for r in view.waiting)))
        return self.policy.decide(view)

    def averages(self, end: float) -> dict[str, float]:
        """Time averages up to `end`: running requests' KV, waiting requests,
        a waiting request's mean input; and the most KV running requests and
        GPU prefixes held together at a decision."""
        if not self.samples:
            return {"running_kv": 0.0, "waiting": 0.0, "waiting_input": 0.0, "most_held": 0.0}
        a = np.array(self.samples, dtype=float)
        dt = np.diff(np.append(a[:, 0], max(end, a[-1, 0])))
        span = float(dt.sum()) or 1.0
        waited = float((dt * a[:, 3]).sum())
        return {"running_kv": float((dt * a[:, 1]).sum()) / span,
                "waiting": waited / span,
                "waiting_input": float((dt * a[:, 4]).sum()) / waited if waited else 0.0,
                "most_held": float((a[:, 1] + a[:, 2]).max())}


def replay(family: str, draw: int, load: str, policy: str, params: dict[str, Any],
           tasks: int, capacity: float) -> dict[str, Any]:
    """One policy on the case: its summary, the sink's and the sampler's averages."""
    wl = draw_workload(family, draw)
    sink = PrefixRoom({a.name: a.prefix_tokens for w in wl.workflows
                       for a in w.agents.values()})
    trace = case_trace(wl, load, tasks, capacity, draw)
    sampler = PoolSampler(make_policy(policy, **params))
    result = Run(trace, sampler, SimBackend(get_profile(DEFAULT_PROFILE)),
                 sink=sink).execute()
    return {**result.summary(), **sink.averages(), **sampler.averages(sink.t)}


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| policy | mean JCT s | makespan s | mean batch | agents running | prefix KV "
            "pinned by running agents (tokens) | prefix KV on the GPU (tokens) | prefix loads "
            "| KV of running requests at decisions (tokens) | waiting requests | their mean "
            "input (tokens) |")
    out = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['policy']} | {r['mean_jct_s']:.1f} | {r['makespan_s']:.0f} | "
                   f"{r['mean_batch']:.2f} | {r['agents_running']:.2f} | "
                   f"{r['pinned_kv']:,.0f} | {r['resident_kv']:,.0f} | {r['prefix_loads']} | "
                   f"{r['running_kv']:,.0f} | {r['waiting']:.1f} | {r['waiting_input']:,.0f} |")
    agents = sorted({a for r in rows for a in r["agents"]})
    prefix = {a: v["prefix"] for r in rows for a, v in r["agents"].items()}
    out += ["", "Per agent (one row each): the share of the run its prefix is on the GPU, "
            "the mean number of its requests running while it is there, its loads, and its "
            "requests' mean wait from first ready to first start (s).", "",
            "| agent | prefix (tokens) | " + " | ".join(r["policy"] for r in rows) + " |",
            "|---|---|" + "---|" * len(rows)]
    for a in agents:
        cells = [(f"{v['on_gpu']:.0%}, {v['running_on_gpu']:.2f}, {v['loads']:.0f}, "
                  f"{v['wait_s']:.1f} s"
                  if (v := r["agents"].get(a)) else "-") for r in rows]
        out.append(f"| {a} | {prefix[a]:,.0f} | " + " | ".join(cells) + " |")
    return out


BENCH = CaseBench(
    "prefix_room.py", "The room prefixes hold (`bench/prefix_room.py`)",
    f"{get_profile(DEFAULT_PROFILE).budget_tokens:,}-token pool. Time averages over the run: "
    "agents with a request admitted, the prefix KV those agents pin, and all prefix KV on "
    "the GPU; sampled at each decision and held until the next, the KV of the running "
    "requests (input and output so far) and the waiting requests.", "prefix-room",
    draw=0, load="overload", replay=replay, table=table)


def main(argv: list[str] | None = None) -> None:
    BENCH.main(__doc__, argv)


if __name__ == "__main__":
    main()
