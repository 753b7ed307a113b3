"""A call log into a trace (`topasd trace import LOG --format calls`).

Each task's calls form a graph (their parents, their order, or the file
order). A chain of calls of one agent, each the only child of the last,
becomes one stage of several rounds (a ReAct loop, the tool wait between
rounds read from the times); calls of one agent with the same parents and
children become one stage of several branches (a map). Tasks whose stage
graphs are isomorphic (agents as labels) share a workflow, whose stage
profiles are distributions fitted over all its tasks: a policy reading them
as estimates is not handed any task's exact sizes, while the task lines keep
every call's tokens exactly (input = prompt - agent prefix, output =
completion).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx  # type: ignore[import-untyped]
import numpy as np

from topasd.model import is_int64
from workflows.calllog import Call, CallLogError
from workflows.spec import DistSpec, workflow_from_dict
from workflows.trace import RoundSpec, TaskRecord, Trace, check_rate


@dataclass(frozen=True, slots=True)
class StageCalls:
    """One stage of one task: its agent and each branch's calls, in order."""

    agent: str
    branches: tuple[tuple[Call, ...], ...]


@dataclass(frozen=True)
class TaskShape:
    """One task of the log as a stage graph (nodes: indexes into `stages`,
    labelled with their agent)."""

    key: str
    stages: tuple[StageCalls, ...]
    graph: nx.DiGraph

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(c for s in self.stages for b in s.branches for c in b)


@dataclass(frozen=True)
class Imported:
    """A call log as a trace. `placement`: (log task, call id) -> (trace task
    id, stage, branch, round); `task_ids`: trace task id -> the log's task."""

    trace: Trace
    placement: Mapping[tuple[str, str], tuple[int, str, int, int]]
    task_ids: Mapping[int, str]
    shapes: tuple[tuple[str, int], ...]  # (workflow, tasks), largest first
    shared_hints: int = 0  # calls with shared-content hints (not carried by the trace)


# ------------------------------------------------------------------ call graphs


def tasks_of(calls: Sequence[Call]) -> dict[str, list[Call]]:
    """The log's calls by task, tasks in the order they first appear."""
    by_task: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        by_task[c.task].append(c)
    return dict(by_task)


def call_graph(calls: Sequence[Call], name: str) -> nx.DiGraph:
    """A task's calls as a DAG (parent -> child): from `parents` where any call
    gives them, else from `order` (a call depends on every call of the
    nearest lower order), else the calls in file order form a chain."""
    g = nx.DiGraph()
    for c in calls:
        if c.id in g:
            raise CallLogError(f"{name}:{c.line}: task {c.task!r} has call {c.id!r} twice "
                               f"(first on line {g.nodes[c.id]['call'].line}); give each call "
                               "of a task its own id")
        g.add_node(c.id, call=c)
    if any(c.parents is not None for c in calls):
        for c in calls:
            for p in c.parents or ():
                if p not in g:
                    raise CallLogError(f"{name}:{c.line}: call {c.id!r} names parent {p!r}, "
                                       f"which is no call of task {c.task!r}")
                g.add_edge(p, c.id)
    elif any(c.order is not None for c in calls):
        _order_edges(g, calls, name)
    else:
        g.add_edges_from(itertools.pairwise(c.id for c in calls))
    if not nx.is_directed_acyclic_graph(g):
        cycle = " -> ".join(u for u, _ in nx.find_cycle(g))
        raise CallLogError(f"{name}: task {calls[0].task!r}: its calls' parents form a cycle "
                           f"({cycle}); a call can only depend on earlier calls")
    return g


def _order_edges(g: nx.DiGraph, calls: Sequence[Call], name: str) -> None:
    unplaced = next((c for c in calls if c.order is None), None)
    if unplaced is not None:
        raise CallLogError(f"{name}:{unplaced.line}: call {unplaced.id!r} has no order, but "
                           f"other calls of task {unplaced.task!r} do; give every call of a "
                           "task its order (or parents)")
    levels: dict[int, list[str]] = defaultdict(list)
    for c in calls:
        levels[c.order].append(c.id)  # type: ignore[index]
    for lo, hi in itertools.pairwise(sorted(levels)):
        g.add_edges_from((p, c) for p in levels[lo] for c in levels[hi])


def stage_shape(key: str, g: nx.DiGraph) -> TaskShape:
    """The stage graph of a task's call graph: rounds folded, branches merged."""
    node_of: dict[str, int] = {}  # call -> its chain
    chains: list[list[Call]] = []
    for cid in nx.lexicographical_topological_sort(g, key=lambda n: g.nodes[n]["call"].line):
        call = g.nodes[cid]["call"]
        parents = list(g.predecessors(cid))
        if len(parents) == 1 and g.out_degree(parents[0]) == 1 and \
                g.nodes[parents[0]]["call"].agent == call.agent:
            node_of[cid] = node_of[parents[0]]  # the next round of its parent's stage
            chains[node_of[cid]].append(call)
        else:
            node_of[cid] = len(chains)
            chains.append([call])
    edges = {(node_of[u], node_of[v]) for u, v in g.edges if node_of[u] != node_of[v]}
    preds: dict[int, set[int]] = defaultdict(set)
    succs: dict[int, set[int]] = defaultdict(set)
    for u, v in edges:
        preds[v].add(u)
        succs[u].add(v)
    groups: dict[tuple[str, frozenset[int], frozenset[int]], list[int]] = defaultdict(list)
    for i, chain in enumerate(chains):
        groups[chain[0].agent, frozenset(preds[i]), frozenset(succs[i])].append(i)
    stage_of = {i: s for s, members in enumerate(groups.values()) for i in members}
    stages = tuple(StageCalls(chains[m[0]][0].agent, tuple(tuple(chains[i]) for i in m))
                   for m in groups.values())
    graph = nx.DiGraph()
    graph.add_nodes_from((s, {"agent": st.agent}) for s, st in enumerate(stages))
    graph.add_edges_from({(stage_of[u], stage_of[v]) for u, v in edges})
    return TaskShape(key, stages, graph)


# ------------------------------------------------------------------ shapes


def _agent_match(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool(a["agent"] == b["agent"])


def _invariant(g: nx.DiGraph) -> tuple[Any, ...]:
    """What isomorphic stage graphs share: each stage's agent with its in- and
    out-degree (graphs that differ here are not isomorphic)."""
    return tuple(sorted((g.nodes[n]["agent"], g.in_degree(n), g.out_degree(n)) for n in g))


def classify(shapes: Sequence[TaskShape]) -> list[list[tuple[TaskShape, dict[int, int]]]]:
    """Tasks grouped by stage graph up to isomorphism (agents as labels), each
    with its mapping from the group's first task's stages to its own."""
    classes: list[list[tuple[TaskShape, dict[int, int]]]] = []
    by_hash: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for shape in shapes:
        h = _invariant(shape.graph)
        for k in by_hash[h]:
            matcher = nx.isomorphism.DiGraphMatcher(classes[k][0][0].graph, shape.graph,
                                                    node_match=_agent_match)
            if matcher.is_isomorphic():
                classes[k].append((shape, dict(matcher.mapping)))
                break
        else:
            by_hash[h].append(len(classes))
            classes.append([(shape, {s: s for s in shape.graph})])
    return classes


def stage_names(shape: TaskShape) -> dict[int, str]:
    """Stage names of a workflow: its agent's name, numbered where the agent
    serves several stages (`Coder#1`, `Coder#2`), in topological order."""
    order = list(nx.lexicographical_topological_sort(
        shape.graph, key=lambda s: shape.stages[s].branches[0][0].line))
    agents = [shape.stages[s].agent for s in order]
    return {s: agent if agents.count(agent) == 1 else f"{agent}#{agents[:i + 1].count(agent)}"
            for i, (s, agent) in enumerate(zip(order, agents, strict=True))}


# ------------------------------------------------------------------ tasks


def agent_prefixes(calls: Sequence[Call], name: str) -> dict[str, int]:
    """Each agent's prefix: the one `prefix_tokens` its calls give (0 if none)."""
    given: dict[str, Call] = {}
    for c in calls:
        if c.prefix_tokens is None:
            continue
        first = given.setdefault(c.agent, c)
        if first.prefix_tokens != c.prefix_tokens:
            raise CallLogError(f"{name}:{c.line}: agent {c.agent!r} has prefix_tokens "
                               f"{c.prefix_tokens} here but {first.prefix_tokens} on line "
                               f"{first.line}; an agent is one cached prefix, so give it one "
                               "size (or name the roles apart)")
    prefixes = {c.agent: 0 for c in calls} | {a: c.prefix_tokens or 0 for a, c in given.items()}
    short = next((c for c in calls if c.prompt_tokens < prefixes[c.agent]), None)
    if short is not None:
        raise CallLogError(f"{name}:{short.line}: prompt_tokens {short.prompt_tokens} is below "
                           f"agent {short.agent!r}'s prefix_tokens {prefixes[short.agent]}; the "
                           "prefix is part of every prompt of its agent")
    return prefixes


def _timed(calls: Sequence[Call], name: str) -> bool:
    """Whether the log gives times: every call's or none's."""
    untimed = [c for c in calls if c.start is None]
    if untimed and len(untimed) < len(calls):
        raise CallLogError(f"{name}:{untimed[0].line}: call {untimed[0].id!r} has no start and "
                           "end, but other calls do; give every call its times, or none")
    return not untimed


def _gap(later: float | None, earlier: float | None) -> float:
    """A wait read from the times (0 without times, never negative)."""
    if later is None or earlier is None:
        return 0.0
    return round(max(0.0, later - earlier), 6)


def _latest(times: Sequence[float | None]) -> float | None:
    """The last of `times` (None if any is unknown)."""
    known = [t for t in times if t is not None]
    return max(known) if known and len(known) == len(times) else None


def task_record(shape: TaskShape, mapping: Mapping[int, int], names: Mapping[int, str],
                workflow: str, task_id: int, arrival: float,
                prefixes: Mapping[str, int]) -> TaskRecord:
    """One trace task: every call a round (input = prompt - prefix), the waits
    read from the times."""
    ends = {s: max((c.end for b in st.branches for c in b if c.end is not None), default=None)
            for s, st in enumerate(shape.stages)}
    start = min((c.start for c in shape.calls if c.start is not None), default=None)
    stages: dict[str, tuple[RoundSpec, ...]] = {}
    waits: dict[str, float] = {}
    for rep, s in mapping.items():
        st = shape.stages[s]
        preds = [ends[p] for p in shape.graph.predecessors(s)]
        ready = _latest(preds) if preds else start
        wait = _gap(min((b[0].start for b in st.branches if b[0].start is not None),
                        default=None), ready)
        if wait:
            waits[names[rep]] = wait
        stages[names[rep]] = tuple(
            RoundSpec(c.prompt_tokens - prefixes[c.agent], c.completion_tokens,
                      _gap(b[k + 1].start, c.end) if k + 1 < len(b) else 0.0, i)
            for i, b in enumerate(st.branches) for k, c in enumerate(b))
    return TaskRecord(task_id, workflow, arrival, stages, waits=waits)


# ------------------------------------------------------------------ fitting


def fit(values: Sequence[float], kind: str) -> DistSpec:
    """A distribution over `values` (all the tasks of a shape): the value
    itself if they agree; for a wait (`kind` "wait") an exponential of their
    mean clipped to their largest; else a lognormal of their geometric mean
    and log spread clipped to their range (counts and sizes)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        return lo if kind == "wait" else int(lo)
    if kind == "wait":
        return {"exponential": {"mean": round(float(np.mean(values)), 6), "high": hi}}
    logs = np.log(np.maximum(np.asarray(values, dtype=float), 1.0))
    sigma = min(20.0, max(1e-3, round(float(logs.std()), 4)))
    return {"lognormal": {"median": round(math.exp(float(logs.mean())), 2), "sigma": sigma,
                          "low": int(lo), "high": int(hi)}}


def stage_spec(name: str, agent: str, after: list[str],
               records: Sequence[TaskRecord]) -> dict[str, Any]:
    """A stage of an imported workflow, its profile fitted over `records`."""
    branches = [t.branches(name) for t in records]
    rounds = [r for bs in branches for b in bs for r in b]
    waits = [r.tool_wait_s for bs in branches for b in bs for r in b[:-1]]
    spec: dict[str, Any] = {
        "name": name, "agent": agent, "after": after,
        "rounds": fit([len(b) for bs in branches for b in bs], "count"),
        "input_tokens": fit([r.input_tokens for r in rounds], "count"),
        "output_tokens": fit([r.output_tokens for r in rounds], "count"),
        "tool_wait_s": fit(waits or [0.0], "wait"),
        "history": "none", "carry_rounds": False,  # the inputs hold what they carry
        "branches": fit([len(bs) for bs in branches], "count"),
        "wait_before_s": fit([t.waits.get(name, 0.0) for t in records], "wait"),
    }
    return spec


def workflow_for(name: str, rep: TaskShape, names: Mapping[int, str],
                 records: Sequence[TaskRecord], prefixes: Mapping[str, int]) -> Any:
    """The workflow of one shape, validated as any spec is."""
    order = list(names)  # topological (`stage_names`)
    stages = [stage_spec(names[s], rep.stages[s].agent,
                         sorted(names[p] for p in rep.graph.predecessors(s)), records)
              for s in order]
    agents = sorted({rep.stages[s].agent for s in order})
    spec = {"name": name, "description": f"imported: {len(records)} task(s) of this shape",
            "agents": {a: {"prefix_tokens": prefixes[a]} for a in agents}, "stages": stages}
    return workflow_from_dict(spec, where=f"imported workflow {name!r}")


# ------------------------------------------------------------------ the trace


def _arrivals(shapes: Sequence[TaskShape], rate: float | None, seed: int) -> list[float]:
    """Each task's arrival: from its first call's start (the log's first at 0),
    or Poisson at `rate` in the log's task order."""
    if rate is not None:
        check_rate(rate, len(shapes))
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(shapes))
        gaps[0] = 0.0
        return [round(float(t), 6) for t in np.cumsum(gaps)]
    starts = [min(c.start for c in s.calls if c.start is not None) for s in shapes]
    return [round(t - min(starts), 6) for t in starts]


def _trace_ids(keys: Sequence[str]) -> list[int]:
    """The log's task ids where all are integers (and fit the decision log),
    else 0, 1, ... in the given order."""
    try:
        ids = [int(k) for k in keys]
    except ValueError:
        return list(range(len(keys)))
    ok = all(str(i) == k and is_int64(i) for i, k in zip(ids, keys, strict=True))
    return ids if ok else list(range(len(keys)))


def import_calls(calls: Sequence[Call], name: str, source: str = "calls",
                 rate: float | None = None, seed: int = 0) -> Imported:
    """The trace of a call log (`name`: the workload, and the workflows'
    names `name-1`, ... by how many tasks share the shape)."""
    timed = _timed(calls, source)
    if not timed and rate is None:
        raise CallLogError(f"{source}: the calls have no start and end times to place the "
                           "tasks in time; give --rate R (Poisson arrivals, task/s)")
    prefixes = agent_prefixes(calls, source)
    shapes = [stage_shape(k, call_graph(cs, source)) for k, cs in tasks_of(calls).items()]
    arrival = dict(zip((s.key for s in shapes), _arrivals(shapes, rate, seed), strict=True))
    shapes.sort(key=lambda s: (arrival[s.key], s.calls[0].line))
    ids = dict(zip((s.key for s in shapes), _trace_ids([s.key for s in shapes]), strict=True))
    classes = sorted(classify(shapes), key=lambda c: -len(c))
    workflows, records, placement, counts = {}, [], {}, []
    for k, members in enumerate(classes, start=1):
        wf_name = name if len(classes) == 1 else f"{name}-{k}"
        names = stage_names(members[0][0])
        recs = [task_record(s, m, names, wf_name, ids[s.key], arrival[s.key], prefixes)
                for s, m in members]
        workflows[wf_name] = workflow_for(wf_name, members[0][0], names, recs, prefixes)
        records += recs
        counts.append((wf_name, len(members)))
        for (shape, mapping), rec in zip(members, recs, strict=True):
            placement.update(_placement(shape, mapping, names, rec.id))
    meta: dict[str, Any] = {"workload": name, "source": source, "source_format": "calls",
                            "calls": len(calls), "tasks": len(shapes)}
    if rate is not None:
        meta |= {"rate": rate, "seed": seed}
    renamed = {ids[s.key]: s.key for s in shapes if str(ids[s.key]) != s.key}
    if renamed:
        meta["task_ids"] = [renamed[i] for i in sorted(renamed)]
    trace = Trace(workflows, tuple(sorted(records, key=lambda t: (t.arrival, t.id))), meta)
    return Imported(trace, placement, {ids[s.key]: s.key for s in shapes}, tuple(counts),
                    sum(1 for c in calls if c.shared))


def _placement(shape: TaskShape, mapping: Mapping[int, int], names: Mapping[int, str],
               task_id: int) -> dict[tuple[str, str], tuple[int, str, int, int]]:
    return {(shape.key, c.id): (task_id, names[rep], b, k)
            for rep, s in mapping.items()
            for b, calls in enumerate(shape.stages[s].branches) for k, c in enumerate(calls)}


def default_name(path: str | Path) -> str:
    """The workload name of an imported log: its file's stem (`calls` for stdin)."""
    return "calls" if str(path) == "-" else Path(path).stem or "calls"
