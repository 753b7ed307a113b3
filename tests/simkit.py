"""Shared test helpers for the simulator: a recording sink, an instrumented
engine (`CheckedSim`), hypothesis strategies for random workloads, and the
check that a built-in workload file ships."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import networkx as nx
from hypothesis import strategies as st

from backends.sim.engine import SimBackend
from topasd.model import Decision, EngineEvent, EventKind, Location
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.base import Policy
from workflows.spec import workflow_from_dict
from workflows.trace import RoundSpec, TaskRecord, Trace, generate_trace, name_rounds

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "workflows" / "builtin"


def builtin_present(name: str) -> None:
    """Every built-in workload ships with the package: a missing file fails."""
    path = BUILTIN_DIR / f"{name}.yaml"
    assert path.exists(), f"built-in workload file {path} is missing"


class RecordingSink:
    """A RunSink keeping every event and decision in order."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self.decisions: list[Decision] = []

    def event(self, event: EngineEvent) -> None:
        self.events.append(event)

    def decision(self, decision: Decision) -> None:
        self.decisions.append(decision)


class CheckedSim(SimBackend):
    """SimBackend asserting the KV and prefix invariants around every step."""

    checks = 0
    peak_used = 0

    def _assert_within_budget(self, where: str) -> None:
        used = self._used_tokens()
        self.peak_used = max(self.peak_used, used)
        assert used <= self.profile.budget_tokens, (
            f"{where} at t={self._t}: {used} KV tokens held, budget {self.profile.budget_tokens}")
        # the same sum, from first principles
        prefixes = sum(p.tokens for p in self._prefixes.values()
                       if p.location is Location.GPU or p.kept)  # a kept copy holds KV too
        # shared task context: every copy a running request holds is on the GPU,
        # counted once; an unheld copy is on the GPU only cached (in `_kept`) or
        # loading back ahead of its holder (in `_uploads`, not ready)
        held = {s.key: s.tokens for lv in self._running.values() for s in lv.req.shared}
        contexts = {k: c.tokens for k, c in self._contexts.items()
                    if c.location is Location.GPU}
        assert held.keys() <= contexts.keys()
        assert all(k in held or k in self._kept or k in self._uploads
                   for k in contexts), "a copy nobody holds"
        assert not any(self._contexts[k].ready for k in self._uploads), "an upload ended"
        requests = sum(lv.req.input_tokens - sum(s.tokens for s in lv.req.shared)
                       + lv.generated for lv in self._running.values())
        assert prefixes + sum(contexts.values()) + requests == used
        CheckedSim.checks += 1

    def _snapshot_running(self) -> list[tuple[object, int, bool, set[str]]]:
        out = []
        for lv in self._running.values():
            pieces = [self._prefixes[lv.req.agent],
                      *(self._contexts[s.key] for s in lv.req.shared)]
            out.append((lv, lv.generated, all(p.location is Location.GPU for p in pieces),
                        {p.agent for p in pieces if not p.ready}))  # keys not ready
        return out

    def _assert_generated_on_ready_prefix(self, before, where: str, computed: set[str]) -> None:
        """A request generates only while its prefix and shared context are on the
        GPU and ready (or became ready by prefill earlier in the same step)."""
        for lv, gen, on_gpu_before, unready_before in before:
            if lv.generated == gen:
                continue
            keys = [lv.req.agent, *(s.key for s in lv.req.shared)]
            pieces = [self._prefixes[lv.req.agent], *(self._contexts[k] for k in keys[1:])]
            assert on_gpu_before and all(p.location is Location.GPU for p in pieces), (
                f"{where} at t={self._t}: request {lv.req.id} generated tokens while prefix "
                f"or context {keys} was not on the GPU")
            assert all(p.ready for p in pieces) and unready_before <= computed, (
                f"{where} at t={self._t}: request {lv.req.id} generated tokens while prefix "
                f"or context {keys} was not ready")

    def apply(self, decision: Decision) -> None:
        super().apply(decision)
        self._assert_within_budget(f"after {decision.policy} decision")

    def _prefill_step(self) -> None:
        before = self._snapshot_running()
        n_events = len(self._events)
        super()._prefill_step()
        computed = {ev.agent for ev in self._events[n_events:]
                    if ev.kind is EventKind.PREFIX_COMPUTE_END}
        computed |= {ev.note for ev in self._events[n_events:]
                     if ev.kind is EventKind.CONTEXT_COMPUTE_END}
        self._assert_generated_on_ready_prefix(before, "prefill step", computed)
        self._assert_within_budget("prefill step")

    def _decode_run(self, decoding, stop, max_steps=0) -> None:
        before = self._snapshot_running()
        super()._decode_run(decoding, stop, max_steps)
        self._assert_generated_on_ready_prefix(before, "decode run", set())
        self._assert_within_budget("decode run")


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------


@st.composite
def dags(draw) -> nx.DiGraph:
    """A random DAG on 1-5 stages; names are shuffled so that topological order
    is not alphabetical."""
    n = draw(st.integers(1, 5))
    names = draw(st.permutations([f"s{i}" for i in range(n)]))
    g = nx.DiGraph()
    g.add_nodes_from(names)
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()):
                g.add_edge(names[i], names[j])
    assert nx.is_directed_acyclic_graph(g)
    return g


@st.composite
def scenarios(draw):
    """(trace, profile overrides, warm_host, closed_form): 1-2 random workflows
    over 1-3 shared agents, 1-7 tasks of 1-3 rounds each, and a KV budget from
    exactly the largest request up to three times it."""
    n_agents = draw(st.integers(1, 3))
    agents = {f"A{k}": draw(st.sampled_from([0, 16, 64, 200, 500]) | st.integers(0, 600))
              for k in range(n_agents)}
    workflows = []
    for w in range(draw(st.integers(1, 2))):
        g = draw(dags())
        stages = [{"name": v, "agent": draw(st.sampled_from(sorted(agents))),
                   "after": sorted(g.predecessors(v))} for v in g.nodes]
        workflows.append(workflow_from_dict({
            "name": f"w{w}",
            "agents": {a: {"prefix_tokens": t} for a, t in agents.items()},
            "stages": stages,
        }))
    n_tasks = draw(st.integers(1, 7))
    arrivals = sorted(draw(st.lists(
        st.sampled_from([0.0, 0.5]) | st.floats(0, 4, allow_nan=False).map(lambda x: round(x, 3)),
        min_size=n_tasks, max_size=n_tasks)))
    tasks = []
    shared = draw(st.booleans())  # shared task context: rounds starting with `doc`
    converse = draw(st.booleans())  # ReAct rounds carrying their conversation
    for i, t in enumerate(arrivals):
        wf = workflows[i % len(workflows)]
        stages = {}
        doc = draw(st.integers(1, 200)) if shared else 0
        context = {"doc": doc} if doc else {}
        for v in wf.stages:
            stages[v] = draw(stage_rounds(v, doc, converse, context))
        tasks.append(TaskRecord(i, wf.name, t, stages, context=context))
    trace = Trace({wf.name: wf for wf in workflows}, tuple(tasks), {"workload": "random"})
    need = max(wf.prefix_tokens(v) + r.input_tokens + r.output_tokens
               for task in tasks for v, rounds in task.stages.items()
               for r in rounds for wf in [trace.workflows[task.workflow]])
    budget = need + draw(st.sampled_from([0, 1, 7]) | st.integers(0, 2 * need))
    knobs = {  # overrides of the `small` profile
        "budget_tokens": budget,
        "host_cache": draw(st.booleans()),
        "keep_evicted": draw(st.booleans()),  # evicted prefixes held in free KV
        "mixed_chunk": draw(st.booleans()),
        # a slow host link keeps prefixes loading while other agents decode
        "swap_bytes_per_s": draw(st.sampled_from([1e9, 1e9, 3e7])),
    }
    warm = draw(st.booleans())
    closed_form = draw(st.booleans())
    return trace, knobs, warm, closed_form


@st.composite
def stage_rounds(draw, stage: str, doc: int, converse: bool,
                 context: dict[str, int]) -> tuple[RoundSpec, ...]:
    """1-3 rounds of a stage, some starting with the task's `doc` segment; with
    `converse`, maybe a ReAct conversation kept across its waits (its
    segments added to `context`)."""
    n_rounds = draw(st.integers(1, 3))
    sizes = [draw(st.integers(0, 300)) for _ in range(n_rounds)]
    rounds = [RoundSpec(n, draw(st.integers(1, 80)),
                        draw(st.sampled_from([0.0, 0.0, 0.05, 0.4])),
                        shared=("doc",) if doc and n >= doc and draw(st.booleans()) else ())
              for n in sizes]
    if converse and draw(st.booleans()):
        for k in range(1, n_rounds):
            grown = rounds[k - 1].input_tokens + rounds[k - 1].output_tokens
            rounds[k] = replace(rounds[k], input_tokens=grown + sizes[k] % 40,
                                shared=rounds[0].shared)
        rounds = name_rounds(rounds, f"{stage}.c", context)
    return tuple(rounds)


@st.composite
def tool_wait_scenarios(draw):
    """(trace, profile overrides, warm_host, closed_form): ReAct tasks of 1-2
    agents whose conversations are kept through tool waits that are long
    against the host link (fixed, or exponential: calls end before and after
    their mean), on a tight budget with a host tier: Tokencake offloads them
    and loads them back ahead of their holders."""
    stages = []
    for name, agent in (("r", "A"), ("s", "B"))[:draw(st.integers(1, 2))]:
        wait = draw(st.sampled_from([0.3, 1.0, 3.0]))
        stages.append({"name": name, "agent": agent, "after": ["r"] if name == "s" else [],
                       "rounds": draw(st.integers(2, 4)),
                       "input_tokens": draw(st.integers(20, 150)),
                       "output_tokens": draw(st.integers(5, 60)),
                       "tool_wait_s": draw(st.sampled_from(
                           [wait, {"exponential": {"mean": wait, "high": 10 * wait}}])),
                       "observation_tokens": draw(st.integers(0, 40)), "share_rounds": True})
    spec = {"name": "calls", "stages": stages,
            "agents": {a: {"prefix_tokens": draw(st.sampled_from([0, 64, 200]))} for a in "AB"}}
    trace = generate_trace([workflow_from_dict(spec)], draw(st.sampled_from([0.5, 2.0, 20.0])),
                           draw(st.integers(2, 8)), draw(st.integers(0, 1000)))
    need = max(trace.workflows["calls"].prefix_tokens(v) + r.input_tokens + r.output_tokens
               for t in trace.tasks for v, rounds in t.stages.items() for r in rounds)
    knobs = {"budget_tokens": need + draw(st.integers(0, 3 * need)), "host_cache": True,
             "mixed_chunk": draw(st.booleans()),
             "swap_bytes_per_s": draw(st.sampled_from([1e9, 3e7, 3e6]))}
    return trace, knobs, draw(st.booleans()), draw(st.booleans())


def run_checked(trace: Trace, policy: str | Policy, knobs: dict, warm: bool,
                closed_form: bool, profile: str = "small", sink: Any = None):
    """Run `trace` under a policy (by name: a baseline or a TOPAS variant) on an
    instrumented engine, into `sink` (default: a `RecordingSink`); (result,
    sink, backend)."""
    prof = get_profile(profile).with_overrides(**knobs)
    trace.check_fits(prof.budget_tokens)
    backend = CheckedSim(prof, warm_host=warm, closed_form=closed_form)
    sink = RecordingSink() if sink is None else sink
    pol = make_policy(policy) if isinstance(policy, str) else policy
    result = Run(trace, pol, backend, sink=sink).execute()
    return result, sink, backend
