"""Shared task context (issue 29): segments a task's requests hold once, as a
radix cache would. KV use computed by hand on a small case; a copy recomputed
after it gave up its room; the trace format; a fan-out's batch."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest

from tests.simkit import CheckedSim, RecordingSink, run_checked
from topasd.model import EventKind, Location, Segment, segment_keys
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import POLICY_NAMES, make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import (
    RoundSpec,
    TaskRecord,
    Trace,
    TraceError,
    generate_trace,
    read_trace,
    write_trace,
)

P, S = 100, 600  # agent prefix, shared segment
OWN = (40, 70)  # each branch's own input
OUT = (10, 50)


class PeakSim(CheckedSim):
    """CheckedSim that keeps the largest KV use it checked."""

    def _assert_within_budget(self, where: str) -> None:
        super()._assert_within_budget(where)
        self.peak = max(getattr(self, "peak", 0), self._used_tokens())


def fan_trace(shared: bool, stage_x: bool = False, wait_x: float = 0.0) -> Trace:
    """One task: stage w of two branches whose inputs start with the segment
    `doc` (S tokens), optionally a stage x after w naming it too."""
    stages = [{"name": "w", "agent": "A"}]
    if stage_x:
        stages.append({"name": "x", "agent": "A", "after": ["w"], "wait_before_s": wait_x})
    wf = workflow_from_dict({"name": "fan", "agents": {"A": {"prefix_tokens": P}},
                             "stages": stages})
    names = ("doc",) if shared else ()
    rounds = {"w": tuple(RoundSpec(S + own, out, 0.0, b, names)
                         for b, (own, out) in enumerate(zip(OWN, OUT, strict=True)))}
    if stage_x:
        rounds["x"] = (RoundSpec(S + 30, 20, 0.0, 0, names),)
    task = TaskRecord(0, "fan", 0.0, rounds, context={"doc": S} if shared else {},
                      waits={"x": wait_x} if wait_x else {})
    return Trace({"fan": wf}, (task,), {"workload": "fan"})


def run(trace: Trace, policy: str = "fcfs", budget: int = 4096, extra: tuple = ()):
    prof = get_profile("small").with_overrides(budget_tokens=budget, host_cache=False)
    backend = PeakSim(prof, closed_form=False)
    sink = RecordingSink()
    if extra:
        trace = replace(trace, tasks=trace.tasks + extra)
    Run(trace, make_policy(policy), backend, sink=sink).execute()
    return backend, sink


@pytest.mark.parametrize("policy", ["fcfs", "topas"])
def test_two_holders_hold_one_copy_as_a_radix_cache_would(policy: str) -> None:
    shared, _ = run(fan_trace(True), policy)
    alone, _ = run(fan_trace(False), policy)
    # both branches decode together until the shorter finishes: the peak is one
    # step before that, each having generated OUT[0] - 1 tokens
    both = OWN[0] + OWN[1] + 2 * (OUT[0] - 1)
    assert shared.peak == P + S + both
    assert alone.peak == P + 2 * S + both
    assert (shared.stats.context_computes, shared.stats.context_hits) == (1, 1)
    assert shared.stats.context_hit_tokens == S
    # once both finished, the copy stays cached in free KV beside the prefix
    assert shared._used_tokens() == P + S
    (ctx,) = shared.state({}, {}).contexts.values()
    assert (ctx.key, ctx.tokens, ctx.location, ctx.ready, ctx.holders) == (
        "A/0/doc", S, Location.GPU, True, 0)


def test_a_later_stage_of_the_task_hits_the_cached_copy() -> None:
    backend, sink = run(fan_trace(True, stage_x=True))
    assert (backend.stats.context_computes, backend.stats.context_hits) == (1, 2)
    hits = [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_HIT]
    assert [ev.stage for ev in hits] == ["w", "x"] and {ev.note for ev in hits} == {"A/0/doc"}


def test_a_copy_that_gave_up_its_room_is_recomputed() -> None:
    """Between w and x (60 s apart) another agent's long request needs the
    room the cached copy holds: the copy is dropped, and x computes it again."""
    big = TaskRecord(1, "big", 1.0, {"b": (RoundSpec(2000, 40),)})
    wf_big = workflow_from_dict({"name": "big", "agents": {"B": {"prefix_tokens": 200}},
                                 "stages": [{"name": "b", "agent": "B"}]})
    trace = fan_trace(True, stage_x=True, wait_x=60.0)
    trace = replace(trace, workflows={**trace.workflows, "big": wf_big})
    budget = P + S + 200 + 2000 + 40 - 10  # the copy and the big request do not fit together
    backend, sink = run(trace, budget=budget, extra=(big,))
    kinds = [(ev.kind, ev.stage) for ev in sink.events if ev.kind in (
        EventKind.CONTEXT_DROP, EventKind.CONTEXT_COMPUTE_START, EventKind.CONTEXT_HIT)]
    assert kinds == [(EventKind.CONTEXT_COMPUTE_START, "w"), (EventKind.CONTEXT_HIT, "w"),
                     (EventKind.CONTEXT_DROP, None), (EventKind.CONTEXT_COMPUTE_START, "x")]
    assert backend.stats.context_computes == 2


def test_the_invariants_hold_with_shared_context_under_every_policy() -> None:
    trace = fan_trace(True, stage_x=True)
    for policy in POLICY_NAMES:
        result, _, backend = run_checked(trace, policy, {"budget_tokens": 1600}, False, True)
        assert result.requests_finished == 3
        assert backend.stats.context_computes >= 1


# ------------------------------------------------------------------ the trace


def test_a_trace_with_shared_context_round_trips_as_version_2() -> None:
    trace = fan_trace(True, stage_x=True)
    out = io.StringIO()
    write_trace(trace, out)
    lines = out.getvalue().splitlines()
    assert json.loads(lines[0])["version"] == 2
    task = json.loads(lines[2])
    assert task["context"] == {"doc": S}
    assert task["stages"]["x"] == [[S + 30, 20, 0.0, ["doc"]]]
    back = read_trace(lines, "t.jsonl")
    assert back.tasks[0].context == {"doc": S}
    assert back.tasks[0].stages == trace.tasks[0].stages


def _task_line(context: object, round_: list) -> list[str]:
    trace = fan_trace(False)
    out = io.StringIO()
    write_trace(trace, out)
    lines = out.getvalue().splitlines()
    header = lines[0].replace('"version": 1', '"version": 2')
    task = json.loads(lines[2])
    task["stages"]["w"] = {"branches": [[round_]]}
    if context is not None:
        task["context"] = context
    return [header, lines[1], json.dumps(task)]


@pytest.mark.parametrize(("context", "round_", "says"), [
    ({"doc": 100}, [50, 5, 0, ["doc"]],
     "t.jsonl:3: task 0, stage 'w', round 0: its shared context ['doc'] is 100 tokens, more "
     "than its input_tokens 50 (the input includes the shared segments it names)"),
    ({"doc": 10}, [50, 5, 0, ["plan"]],
     "t.jsonl:3: task 0, stage 'w', round 0: names shared context ['plan'] that the task's "
     "\"context\" does not define (it has ['doc'])"),
    ({"a b": 10}, [50, 5, 0],
     "t.jsonl:3: task 0: context must be an object of segment name -> tokens (names of "
     "letters, digits and _.:-; tokens 1 to 1e+07), got {\"a b\": 10}"),
    ({"doc": 10}, [50, 5, 0, ["doc", "doc"]],
     "t.jsonl:3: task 0, stage 'w', round 0: names a shared segment twice (['doc', 'doc'])"),
])
def test_bad_shared_context_is_named(context: object, round_: list, says: str) -> None:
    with pytest.raises(TraceError) as err:
        read_trace(_task_line(context, round_), "t.jsonl")
    assert str(err.value) == says


def test_version_1_cannot_say_shared_context() -> None:
    lines = _task_line({"doc": 10}, [50, 5, 0, ["doc"]])
    lines[0] = lines[0].replace('"version": 2', '"version": 1')
    task = json.loads(lines[2])
    task["stages"]["w"] = [[50, 5, 0, ["doc"]]]
    lines[2] = json.dumps(task)
    with pytest.raises(TraceError) as err:
        read_trace(lines, "t.jsonl")
    assert str(err.value) == (
        "t.jsonl:3: task 0: shared task context (\"context\") needs trace version 2, but the "
        "header says version 1; set \"version\": 2 in the header")


def test_segment_keys_are_radix_paths() -> None:
    assert segment_keys("W", 7, ("plan", "doc")) == ("W/7/plan", "W/7/plan/doc")


# ------------------------------------------------------------- a fan-out


def fanout(share: bool) -> list:
    spec = {"name": "fanout", "agents": {"P": {"prefix_tokens": 300}, "W": {"prefix_tokens": 300}},
            "stages": [
                {"name": "plan", "agent": "P", "input_tokens": 100, "output_tokens": 600},
                {"name": "map", "agent": "W", "after": ["plan"], "history": "parents",
                 "branches": 8, "input_tokens": 60, "output_tokens": 120,
                 "share_history": share},
                {"name": "reduce", "agent": "P", "after": ["map"], "input_tokens": 50,
                 "output_tokens": 60}]}
    return [workflow_from_dict(spec)]


@pytest.mark.parametrize("policy", ["fcfs", "topas"])
def test_on_a_fan_out_the_mean_batch_grows_with_shared_context(policy: str) -> None:
    """Eight workers each carry the planner's 600 tokens: held once, the KV a
    task's map stage needs falls from ~8 x 780 to ~600 + 8 x 180 tokens, so
    more workers (of more tasks) decode together in the 4,096-token pool."""
    batches = {}
    for share in (False, True):
        trace = generate_trace(fanout(share), 0.5, 12, 3)
        assert bool(trace.tasks[0].context) == share
        result, _, backend = run_checked(trace, policy, {}, False, True)
        assert result.requests_finished == 12 * 10
        batches[share] = backend.stats.mean_batch
        if share:
            assert backend.stats.context_hits >= 12 * 7
    assert batches[True] > 1.3 * batches[False]


def test_sharing_leaves_the_sampled_sizes_as_they_were() -> None:
    """`share_history` names the carried history; it draws nothing."""
    plain, shared = (generate_trace(fanout(s), 0.5, 5, 3) for s in (False, True))
    for a, b in zip(plain.tasks, shared.tasks, strict=True):
        assert a.arrival == b.arrival
        for v in a.stages:
            assert [(r.input_tokens, r.output_tokens) for r in a.stages[v]] == \
                [(r.input_tokens, r.output_tokens) for r in b.stages[v]]
        assert b.stages["map"][0].shared == ("map.history",)
        assert b.context == {"map.history": a.stages["plan"][0].output_tokens}


def test_a_request_own_input_excludes_its_segments() -> None:
    trace = fan_trace(True)
    from workflows.driver import TaskDriver
    reqs = TaskDriver(trace.workflows).start(trace.tasks[0], 0.0)
    assert [r.shared for r in reqs] == [(Segment("A/0/doc", S),)] * 2
    assert [r.own_input for r in reqs] == list(OWN)
    assert [r.admit_demand() for r in reqs] == [OWN[0] + OUT[0], OWN[1] + OUT[1]]


def test_sglang_prompts_share_the_ids_of_a_shared_copy() -> None:
    """SGLang's radix cache shares what the prompts have in common: the agent
    prefix and the copies of shared context, not the holders' own input."""
    from backends.sglang.backend import prompt_ids
    from workflows.driver import TaskDriver

    a, b = TaskDriver(fan_trace(True).workflows).start(fan_trace(True).tasks[0], 0.0)
    ids_a, ids_b = prompt_ids(a, 50_000), prompt_ids(b, 50_000)
    assert (len(ids_a), len(ids_b)) == (P + S + OWN[0], P + S + OWN[1])
    assert ids_a[:P + S] == ids_b[:P + S] and ids_a[P + S] != ids_b[P + S]
    plain = TaskDriver(fan_trace(False).workflows).start(fan_trace(False).tasks[0], 0.0)
    assert prompt_ids(plain[0], 50_000)[P:P + S] != prompt_ids(plain[1], 50_000)[P:P + S]
