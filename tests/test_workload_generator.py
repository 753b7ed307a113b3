"""workflows/generator.py: seeded random workflow families and their traces
(what bench/generalization.py replays), checked for the shapes and ranges
the generalization issue asks for, determinism, and clear errors."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topasd.model import TopasError, Workflow
from workflows.calllog import load_calls
from workflows.generator import (
    ALL_FAMILIES,
    BURST_WINDOW,
    DEFAULT_BUDGET,
    FAMILIES,
    HOLDOUT,
    LOAD_SHARE,
    MAX_PREFIX,
    arrivals,
    burst_trace,
    case_trace,
    draw_workload,
    log_case_trace,
)
from workflows.importer import import_calls
from workflows.spec import workflow_to_dict
from workflows.trace import Trace, write_trace

SEEDS = st.integers(0, 10_000)


def dumps_trace(trace: Trace) -> str:
    out = io.StringIO()
    write_trace(trace, out)
    return out.getvalue()


def _shape(wf: Workflow) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(v, s.agent, s.after) for v, s in sorted(wf.stages.items())]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ALL_FAMILIES), SEEDS)
def test_a_draw_is_a_function_of_family_and_seed(family: str, seed: int) -> None:
    a, b = draw_workload(family, seed), draw_workload(family, seed)
    assert [_shape(w) for w in a.workflows] == [_shape(w) for w in b.workflows]
    ta, tb = case_trace(a, "heavy", 12, 0.05, seed), case_trace(b, "heavy", 12, 0.05, seed)
    assert dumps_trace(ta) == dumps_trace(tb)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL_FAMILIES), SEEDS)
def test_every_request_fits_the_budget_and_prefixes_stay_in_range(family: str,
                                                                 seed: int) -> None:
    wl = draw_workload(family, seed)
    for wf in wl.workflows:
        assert all(0 <= a.prefix_tokens <= MAX_PREFIX for a in wf.agents.values())
    trace = case_trace(wl, "overload", 20, 0.1, seed)
    for task in trace.tasks:
        wf = trace.workflows[task.workflow]
        for v, rounds in task.stages.items():
            for r in rounds:
                assert r.input_tokens >= 0 and r.output_tokens >= 1 and r.tool_wait_s >= 0
                assert wf.prefix_tokens(v) + r.input_tokens + r.output_tokens <= DEFAULT_BUDGET


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_a_draw_for_another_pool_keeps_its_shape_and_fits_the_pool(family: str) -> None:
    default = draw_workload(family, 3)
    larger = draw_workload(family, 3, 2 * DEFAULT_BUDGET)  # the same prefixes, larger requests
    smaller = draw_workload(family, 3, DEFAULT_BUDGET // 3)
    shape = [[(v, s.agent, s.after) for v, s in wf.stages.items()] for wf in default.workflows]
    for wl in (larger, smaller):
        assert [[(v, s.agent, s.after) for v, s in wf.stages.items()]
                for wf in wl.workflows] == shape
    prefixes = {a: x.prefix_tokens for wf in default.workflows for a, x in wf.agents.items()}
    assert {a: x.prefix_tokens for wf in larger.workflows
            for a, x in wf.agents.items()} == prefixes
    for wf in smaller.workflows:  # the same share of the smaller pool
        assert all(x.prefix_tokens <= MAX_PREFIX / 3 + 1 for x in wf.agents.values())
    trace = case_trace(smaller, "overload", 20, 0.1, 3, DEFAULT_BUDGET // 3)
    for task in trace.tasks:
        wf = trace.workflows[task.workflow]
        assert all(wf.prefix_tokens(v) + r.input_tokens + r.output_tokens <= DEFAULT_BUDGET // 3
                   for v, rounds in task.stages.items() for r in rounds)


# Each original family's fixed draws (seeds 0-9: the bench's case list) and a
# trace of each, serialized: every cached and recorded number depends on them.
PINNED = {
    "chain": "866bbf3e7a72ba7a",
    "fork_join": "0342abf61bee4ad0",
    "react": "43374f946f7e1b39",
    "recurrent": "cf573d8e5a6621ab",
    "shared_fanout": "d1ab7a5e01566be9",
    "debate": "016bb53ca8aee939",
    "coding": "35f4b80d013afbcd",
    "mixed": "b6f6ab0a0a61e350",
}


@pytest.mark.parametrize("family", sorted(PINNED))
def test_the_original_families_draw_what_they_always_drew(family: str) -> None:
    h = hashlib.sha256()
    for seed in range(10):
        wl = draw_workload(family, seed)
        h.update(json.dumps([workflow_to_dict(w) for w in wl.workflows], sort_keys=True).encode())
        h.update(dumps_trace(case_trace(wl, "heavy", 20, 0.1, seed)).encode())
    assert h.hexdigest()[:16] == PINNED[family]


def _after(wf: Workflow, stages: tuple[str, ...]) -> list[str]:
    return [v for v, st_ in wf.stages.items() if st_.after == stages]


def _stage_counts(family: str, seeds: range) -> list[int]:
    return [len(draw_workload(family, s).workflows[0].stages) for s in seeds]


def test_the_families_have_the_shapes_they_name() -> None:
    seeds = range(60)
    chains = _stage_counts("chain", seeds)
    assert min(chains) == 2 and max(chains) == 8  # 2-8 stages
    for s in seeds:
        wf = draw_workload("chain", s).workflows[0]
        assert wf.is_chain
    widths = []
    for s in seeds:
        wf = draw_workload("fork_join", s).workflows[0]
        entry_children = _after(wf, ("entry",))
        widths.append(len(entry_children))
    assert min(widths) == 2 and max(widths) >= 11  # 2-12 branches
    # one agent serves every parallel branch
    for s in seeds:
        wf = draw_workload("shared_fanout", s).workflows[0]
        branch_agents = {wf.stages[v].agent for v in _after(wf, ("plan",))}
        assert len(branch_agents) == 1
    # a central agent recurs across rounds
    for s in seeds:
        wf = draw_workload("recurrent", s).workflows[0]
        assert Counter(st_.agent for st_ in wf.stages.values()).most_common(1)[0][1] >= 2


def test_the_holdout_shapes_are_what_they_name_and_never_in_the_fixed_list() -> None:
    assert not set(HOLDOUT) & set(FAMILIES)  # the bench's default list is `FAMILIES`
    seeds = range(40)
    for s in seeds:
        wf = draw_workload("map_reduce", s).workflows[0]
        first, second = _after(wf, ("plan",)), _after(wf, ("combine",))
        assert 2 <= len(first) <= 6 and 2 <= len(second) <= 6
        assert len({wf.stages[v].agent for v in first}) == 1  # one agent maps
        assert wf.stages["reduce"].after == tuple(sorted(second))
    attempts, tool_loops = [], 0
    for s in seeds:
        wf = draw_workload("validate_loop", s).workflows[0]
        loops = [v for v in wf.stages if v.startswith("w")]
        attempts.append(len(loops))
        assert [wf.stages[f"v{i}"].after for i in range(len(loops))] == [
            (f"w{i}",) for i in range(len(loops))]  # each attempt is validated
        tool_loops += sum(wf.stages[v].profile.tool_wait_s.kind == "lognormal" for v in loops)
        assert wf.stages["sum"].agent == wf.stages["plan"].agent  # the planner again
    assert min(attempts) == 1 and max(attempts) == 3
    assert tool_loops > len(seeds)  # workers mostly run ReAct loops with tool waits
    widths = [len(_after(draw_workload("wide_merge", s).workflows[0], ("split",)))
              for s in seeds]
    assert min(widths) >= 12 and max(widths) <= 24
    for s in seeds:
        wf = draw_workload("long_tail", s).workflows[0]
        assert wf.is_chain and len(wf.stages) == 3
        outs = [wf.stages[v].profile.output_tokens.median for v in ("s0", "s1", "s2")]
        assert outs[1] > 4 * max(outs[0], outs[2])  # the middle stage writes long answers
    for s in seeds:
        wf = draw_workload("tree", s).workflows[0]
        fanned = [v for v in wf.stages if v.startswith("root_")]
        leaves = [v for v in fanned if not wf.succs[v][0].startswith("root_")]
        assert (len(fanned), len(leaves)) in ((6, 4), (14, 8))  # 2-3 binary levels
        assert all(len(wf.succs[v]) == 2 for v in ("root", *fanned) if v not in leaves)
        joins = [v for v in wf.stages if v.startswith("j")]
        assert len(joins) == len(leaves) - 1 and all(len(wf.preds[v]) == 2 for v in joins)
        assert [v for v in wf.stages if not wf.succs[v]] == joins[-1:]  # one final join


def test_react_rounds_wait_for_tools_and_mixed_workflows_share_agents() -> None:
    rounds, waits = [], []
    for s in range(40):
        trace = case_trace(draw_workload("react", s), "light", 5, 0.1, s)
        for task in trace.tasks:
            for rs in task.stages.values():
                rounds.append(len(rs))
                waits += [r.tool_wait_s for r in rs[:-1]]  # after each round but the last
    assert min(rounds) == 1 and max(rounds) == 8 and min(waits) > 0
    shared = 0
    for s in range(40):
        wl = draw_workload("mixed", s)
        assert 2 <= len(wl.workflows) <= 3
        agents = [set(wf.agents) for wf in wl.workflows]
        shared += any(a & b for i, a in enumerate(agents) for b in agents[i + 1:])
    assert shared >= 10  # several workflows sharing agents in one trace


def test_token_sizes_are_heavy_tailed() -> None:
    trace = case_trace(draw_workload("chain", 3), "heavy", 200, 0.1, 3)
    outputs = np.array([r.output_tokens for t in trace.tasks for rs in t.stages.values()
                        for r in rs])
    assert np.percentile(outputs, 99) > 4 * np.median(outputs)


def test_loads_are_set_relative_to_the_capacity() -> None:
    capacity = 0.2
    for load, share in LOAD_SHARE.items():
        times = arrivals(load, 2000, capacity, 1)
        rate = (len(times) - 1) / (times[-1] - times[0])
        assert rate == pytest.approx(share * capacity, rel=0.1)
    burst = arrivals("burst", 100, capacity, 1)
    assert max(burst) <= BURST_WINDOW * 100 / capacity
    assert all(t == 0.0 for t in
               (task.arrival for task in burst_trace(draw_workload("debate", 1), 10, 1).tasks))


def _logged() -> Trace:
    return import_calls(load_calls("docs/examples/calls.jsonl"), "calls", rate=1.0).trace


def test_a_logged_case_draws_the_logs_tasks_exactly_at_the_load() -> None:
    log = _logged()
    by_rounds = {repr(sorted(t.stages.items())): t.workflow for t in log.tasks}
    few = log_case_trace(log, "heavy", len(log.tasks), 0.05, 3)  # each task once
    assert sorted(repr(sorted(t.stages.items())) for t in few.tasks) == sorted(by_rounds)
    assert [t.id for t in few.tasks] == list(range(len(log.tasks)))
    assert [t.arrival for t in few.tasks] == arrivals("heavy", len(log.tasks), 0.05, 3)
    many = log_case_trace(log, "overload", 40, 0.05, 3)  # more than the log holds: repeats
    assert len(many.tasks) == 40 and len({t.id for t in many.tasks}) == 40
    for task in many.tasks:  # every call as logged, under its shape's workflow
        assert by_rounds[repr(sorted(task.stages.items()))] == task.workflow
        assert task.workflow in many.workflows
    assert set(many.workflows) == {t.workflow for t in many.tasks}
    assert many == log_case_trace(log, "overload", 40, 0.05, 3)
    assert many != log_case_trace(log, "overload", 40, 0.05, 4)
    burst = log_case_trace(log, "capacity", 12, 0.0, 3)  # measures the capacity
    assert {t.arrival for t in burst.tasks} == {0.0}
    with pytest.raises(TopasError, match="no tasks to draw a case from"):
        log_case_trace(Trace(log.workflows, (), {}), "heavy", 5, 0.05, 3)


def test_bad_input_is_named() -> None:
    with pytest.raises(TopasError, match="unknown workflow family 'star'; use one of chain"):
        draw_workload("star", 1)
    with pytest.raises(TopasError, match="a 999-token KV pool is too small to draw a "
                                         "workload for; give at least 1,000 tokens"):
        draw_workload("chain", 1, 999)
    with pytest.raises(TopasError, match="unknown load 'medium'"):
        arrivals("medium", 10, 1.0, 1)
    with pytest.raises(TopasError, match="capacity must be a finite number > 0"):
        arrivals("heavy", 10, 0.0, 1)
