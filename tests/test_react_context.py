"""A task's own conversation across tool waits (issue 29): a ReAct round's
history is the previous rounds' sequences, kept as context copies through the
tool wait (or dropped, a scheduling decision), seen in the engine view with the
wait's start and expected end; tool calls are events in the log and the Gantt."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from console.gantt import build_gantt
from store import Store
from tests.simkit import RecordingSink, run_checked
from topasd.model import Decision, EngineView, EventKind, Location
from topasd.scheduler import POLICY_NAMES, make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import Trace, generate_trace, name_rounds

WAIT, OBS = 2.0, 20


def react(share_rounds: bool = True, tasks: int = 1) -> Trace:
    spec = {"name": "react", "agents": {"A": {"prefix_tokens": 200}},
            "stages": [{"name": "r", "agent": "A", "rounds": 4, "input_tokens": 100,
                        "output_tokens": 40, "tool_wait_s": WAIT, "observation_tokens": OBS,
                        "share_rounds": share_rounds}]}
    return generate_trace([workflow_from_dict(spec)], 0.01, tasks, 0)


class Dropping:
    """FCFS that drops every conversation copy waiting out a tool call."""

    name = "drop-waits"

    def __init__(self) -> None:
        self.inner = make_policy("fcfs")
        self.views: list[EngineView] = []

    def decide(self, view: EngineView) -> Decision:
        self.views.append(view)
        d = self.inner.decide(view)
        waiting = tuple(k for k, c in view.contexts.items()
                        if c.location is Location.GPU and not c.holders and c.next_use)
        return Decision(d.t, self.name, d.admit, d.preempt, d.load, d.evict + waiting,
                        d.reservation, d.blocked, d.retry)

    def observe(self, ev) -> None:
        self.inner.observe(ev)


def admitted_tokens(sink: RecordingSink) -> list[int]:
    return [ev.tokens for ev in sink.events if ev.kind is EventKind.REQUEST_ADMIT]


def test_a_conversation_kept_through_its_tool_waits_re_prefills_none_of_its_history() -> None:
    trace = react()
    rounds = trace.tasks[0].stages["r"]
    _, sink, backend = run_checked(trace, "fcfs", {"budget_tokens": 4096}, False, True)
    # round k prefills only what round k-1 did not hold: the tool's observation
    assert admitted_tokens(sink) == [rounds[0].input_tokens] + [OBS] * 3
    history = [rounds[k - 1].input_tokens + rounds[k - 1].output_tokens for k in (1, 2, 3)]
    hits = [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_HIT]
    assert sum(ev.tokens for ev in hits) == sum(history)
    assert backend.stats.context_computes == 0
    kept = [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_KEEP]
    assert [ev.tokens for ev in kept] == [history[0]] + [
        h - p for p, h in itertools.pairwise(history)]


def test_a_conversation_dropped_in_its_tool_waits_re_prefills_all_of_it() -> None:
    trace = react()
    rounds = trace.tasks[0].stages["r"]
    policy = Dropping()
    _, sink, backend = run_checked(trace, policy, {"budget_tokens": 4096, "host_cache": False},
                                   False, True)
    assert admitted_tokens(sink) == [r.input_tokens for r in rounds]
    assert not [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_HIT]
    drops = [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_DROP]
    # each wait drops every copy of the conversation so far: round k computes k copies
    assert len(drops) == backend.stats.context_computes == 1 + 2 + 3
    # the policy saw each copy in its tool wait: kept since the round's finish, until
    # the next round is ready
    finish = [ev.t for ev in sink.events if ev.kind is EventKind.REQUEST_FINISH]
    seen = [(c.last_used, c.next_use) for v in policy.views for c in v.contexts.values()
            if not c.holders and c.location is Location.GPU and c.next_use is not None]
    assert len(seen) == 6 and all(end == pytest.approx(start + WAIT) for start, end in seen)
    assert {start for start, _ in seen} <= set(finish)


def test_a_conversation_offloaded_in_its_tool_waits_comes_back_from_the_host() -> None:
    """With a host tier the policy's eviction offloads the copy; the next round
    loads it back over the link (no recompute) and prefills the observation."""
    trace = react()
    rounds = trace.tasks[0].stages["r"]
    _, sink, backend = run_checked(trace, Dropping(), {"budget_tokens": 4096,
                                                       "host_cache": True}, False, True)
    assert admitted_tokens(sink) == [rounds[0].input_tokens] + [OBS] * 3
    kinds = [ev.kind for ev in sink.events if ev.kind.value.startswith("context_")]
    assert kinds.count(EventKind.CONTEXT_OFFLOAD) == 1 + 2 + 3
    assert kinds.count(EventKind.CONTEXT_LOAD_START) == kinds.count(
        EventKind.CONTEXT_LOAD_END) == backend.stats.context_loads == 1 + 2 + 3
    assert backend.stats.context_computes == 0
    starts = {ev.request_id: ev for ev in sink.events if ev.kind is EventKind.REQUEST_START}
    loads = [ev for ev in sink.events if ev.kind is EventKind.CONTEXT_LOAD_START]
    for ev in loads:  # its request starts once the copy is back
        assert starts[ev.request_id].t >= ev.t + ev.value - 1e-9


def test_the_invariants_hold_with_kept_and_dropped_conversations() -> None:
    trace = react(tasks=6)
    for policy in [*POLICY_NAMES, Dropping()]:
        for budget in (700, 1500):  # tight: kept copies give up their room
            for host in (False, True):
                result, _, _ = run_checked(trace, policy, {"budget_tokens": budget,
                                                           "host_cache": host}, False, True)
                assert result.requests_finished == 6 * 4


def test_without_share_rounds_nothing_is_kept() -> None:
    trace = react(share_rounds=False)
    _, sink, backend = run_checked(trace, "fcfs", {"budget_tokens": 4096}, False, True)
    rounds = trace.tasks[0].stages["r"]
    assert admitted_tokens(sink) == [r.input_tokens for r in rounds]
    assert backend.stats.context_hits == 0


def test_tool_calls_are_events_in_the_log_and_bars_in_the_gantt(tmp_path: Path) -> None:
    trace = react()
    db = tmp_path / "run.db"
    with Store(db) as store:
        sink = store.sink("all")
        run_checked(trace, "fcfs", {"budget_tokens": 4096}, False, True, sink=sink)
    with Store(db) as store:
        rows = list(store.db.query(
            "SELECT kind, t, value, request_id FROM engine_events WHERE kind LIKE 'tool_%' "
            "ORDER BY id"))
        finishes = {r["request_id"]: r["t"] for r in store.db.query(
            "SELECT request_id, t FROM engine_events WHERE kind = 'request_finish'")}
        g = build_gantt(store, view="tasks")
        agents = build_gantt(store, view="agents")
    assert [r["kind"] for r in rows] == ["tool_call_start", "tool_call_end"] * 3
    for start, end in zip(rows[::2], rows[1::2], strict=True):
        assert start["t"] == finishes[start["request_id"]]
        assert start["value"] == pytest.approx(WAIT) and end["value"] == pytest.approx(WAIT)
        assert end["t"] == pytest.approx(start["t"] + WAIT)
    for chart in (g, agents):
        tools = [tr for tr in chart.figure.data if tr.type == "bar" and tr.meta == "tool"]
        spans = sorted((b, b + x) for tr in tools for b, x in zip(tr.base, tr.x, strict=True))
        assert spans == pytest.approx([(r["t"], r["t"] + WAIT) for r in rows[::2]])


def test_topas_drops_the_conversation_whose_tool_wait_ends_last() -> None:
    """Two conversations wait out tool calls (A's ends at ~5 s, B's at ~60 s)
    when another agent's request needs the room of one copy: the engine's own
    rule (FCFS) drops the oldest copy, A's, which A's next round computes again
    within seconds; TOPAS drops B's, whose next use is last, and A hits its copy."""
    wf = workflow_from_dict({"name": "two", "agents": {"R": {"prefix_tokens": 0},
                                                       "Z": {"prefix_tokens": 0}},
                             "stages": [{"name": "r", "agent": "R"}]})
    wf_z = workflow_from_dict({"name": "z", "agents": {"Z": {"prefix_tokens": 0}},
                               "stages": [{"name": "z", "agent": "Z"}]})
    from workflows.trace import RoundSpec, TaskRecord

    def conversation(task: int, out: int, wait: float) -> TaskRecord:
        rounds = [RoundSpec(50, out, wait), RoundSpec(50 + out + 10, 20)]
        context: dict[str, int] = {}
        return TaskRecord(task, "two", 0.0, {"r": tuple(name_rounds(rounds, "r", context))},
                          context=context)

    tasks = (conversation(0, 50, 5.0), conversation(1, 150, 60.0),
             TaskRecord(2, "z", 3.0, {"z": (RoundSpec(100, 50),)}))
    trace = Trace({"two": wf, "z": wf_z}, tasks, {"workload": "two"})
    dropped = {}
    for policy in ("fcfs", "topas"):
        _, sink, _ = run_checked(trace, policy, {"budget_tokens": 400, "host_cache": False},
                                 False, True)
        dropped[policy] = [ev.note for ev in sink.events if ev.kind is EventKind.CONTEXT_DROP]
        computed = [ev.note for ev in sink.events
                    if ev.kind is EventKind.CONTEXT_COMPUTE_START]
        assert computed == dropped[policy]  # the dropped copy, by its next round
    assert dropped == {"fcfs": ["R/0/r.1"], "topas": ["R/1/r.1"]}
