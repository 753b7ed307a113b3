"""The closed-form decode advance equals stepping one decode step at a time.

`SimBackend(closed_form=True)` advances a run of identical decode steps in one
go; `closed_form=False` steps one by one. Both must produce the same sequence
of (kind, request id) events, the same times (to 1e-6 relative), the same
task completions and the same engine counters.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim.engine import SimBackend
from tests.simkit import RecordingSink, run_checked, scenarios
from topasd.model import Decision, EventKind, Request
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES, OrderPolicy
from workflows.builtin import load_workload
from workflows.spec import workflow_from_dict
from workflows.trace import Trace, generate_trace

COUNTERS = ("steps", "decode_steps", "prefill_steps", "batch_token_steps", "peak_batch",
            "prefix_loads", "prefix_load_bytes", "prefix_computes", "preemptions",
            "retractions", "recomputed_tokens")


class CountingSim(SimBackend):
    """Counts the engine's decode advances (one per closed-form run)."""

    decode_calls = 0

    def _decode_run(self, decoding, stop, max_steps=0) -> None:
        self.decode_calls += 1
        super()._decode_run(decoding, stop, max_steps)


def replay(trace: Trace, policy: str, profile, closed_form: bool, warm: bool = False):
    backend = CountingSim(profile, closed_form=closed_form, warm_host=warm)
    sink = RecordingSink()
    result = Run(trace, OrderPolicy(policy, BASELINES[policy]), backend, sink=sink).execute()
    return result, sink, backend


def assert_same_run(a, b) -> None:
    (res_a, sink_a, be_a), (res_b, sink_b, be_b) = a, b
    kinds_a = [(str(e.kind), e.request_id, e.task_id, e.agent) for e in sink_a.events]
    kinds_b = [(str(e.kind), e.request_id, e.task_id, e.agent) for e in sink_b.events]
    assert kinds_a == kinds_b
    times_a = [e.t for e in sink_a.events]
    times_b = [e.t for e in sink_b.events]
    assert times_a == pytest.approx(times_b, rel=1e-6, abs=1e-9)
    # event payloads: token counts exactly, durations to the same tolerance
    assert [e.tokens for e in sink_a.events] == [e.tokens for e in sink_b.events]
    assert [e.value for e in sink_a.events] == pytest.approx(
        [e.value for e in sink_b.events], rel=1e-6, abs=1e-9)
    # the same decisions at the same scheduling points
    assert ([(d.admit, d.preempt, d.load, d.evict, d.blocked) for d in sink_a.decisions]
            == [(d.admit, d.preempt, d.load, d.evict, d.blocked) for d in sink_b.decisions])
    stats_a, stats_b = asdict(be_a.stats), asdict(be_b.stats)
    assert {k: stats_a[k] for k in COUNTERS} == {k: stats_b[k] for k in COUNTERS}
    assert stats_a["busy_s"] == pytest.approx(stats_b["busy_s"], rel=1e-6)
    assert res_a.finishes.keys() == res_b.finishes.keys()
    for tid in res_a.finishes:
        assert res_a.finishes[tid] == pytest.approx(res_b.finishes[tid], rel=1e-6)


def contention_trace(n_tasks: int, seed: int) -> Trace:
    """Two agents, long and variable outputs, arrivals faster than service:
    optimistic admission overcommits and decode steps run out of KV."""
    wf = workflow_from_dict({
        "name": "contention",
        "agents": {"P": {"prefix_tokens": 300}, "Q": {"prefix_tokens": 500}},
        "stages": [
            {"name": "plan", "agent": "P", "input_tokens": {"uniform_int": [20, 200]},
             "output_tokens": {"uniform_int": [100, 700]}},
            {"name": "act", "agent": "Q", "after": ["plan"], "rounds": {"uniform_int": [1, 3]},
             "input_tokens": 50, "output_tokens": {"uniform_int": [50, 400]},
             "tool_wait_s": {"uniform": [0.0, 0.5]}, "history": "parents"},
        ],
    })
    return generate_trace([wf], rate=4.0, n_tasks=n_tasks, seed=seed, name="contention")


CASES = {
    # (workload, tasks, rate index, policy, profile, budget override, warm host)
    "chain3-fcfs-a100": ("chain3", 30, 1, "fcfs", "qwen2.5-32b-a100", None, False),
    "chain3-lpm-a100-warm": ("chain3", 30, 2, "lpm", "qwen2.5-32b-a100", None, True),
    "dag4-spf-a100": ("dag4", 25, 1, "spf", "qwen2.5-32b-a100", None, False),
    "dag10wide-las-a100": ("dag10wide", 12, 1, "autellix-las", "qwen2.5-32b-a100", None, False),
    "table1-parrot-a100": ("table1", 30, 2, "parrot-fcfs", "qwen2.5-32b-a100", None, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_builtin_workloads_closed_form_equals_stepwise(case: str) -> None:
    name, n, point, policy, profile_name, budget, warm = CASES[case]
    wl = load_workload(name)
    rate = wl.operating_points[min(point, len(wl.operating_points) - 1)]
    trace = generate_trace(wl.workflows, rate, n, seed=3, name=wl.name)
    profile = get_profile(profile_name)
    if budget is not None:
        profile = profile.with_overrides(budget_tokens=budget)
    fast = replay(trace, policy, profile, True, warm)
    slow = replay(trace, policy, profile, False, warm)
    assert_same_run(fast, slow)
    # the closed form really folded decode steps; stepping took one call per step
    assert fast[2].decode_calls * 5 < fast[2].stats.decode_steps
    assert slow[2].decode_calls >= slow[2].stats.decode_steps


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "autellix-las"])
@pytest.mark.parametrize("profile_name", ["small", "qwen2.5-32b-a100"])
def test_retractions_closed_form_equals_stepwise(policy: str, profile_name: str) -> None:
    """A tight budget: decode runs out of KV and the engine retracts requests.
    The closed form must stop where stepping would run out, and retract the same."""
    trace = contention_trace(25, seed=7)
    profile = get_profile(profile_name).with_overrides(budget_tokens=2200)
    trace.check_fits(profile.budget_tokens)
    fast = replay(trace, policy, profile, True)
    slow = replay(trace, policy, profile, False)
    assert fast[2].stats.retractions > 0, "the case must exercise retraction"
    assert_same_run(fast, slow)


def test_mixed_chunk_closed_form_equals_stepwise() -> None:
    trace = contention_trace(15, seed=2)
    profile = get_profile("small").with_overrides(budget_tokens=2500, mixed_chunk=True)
    assert_same_run(replay(trace, "fcfs", profile, True), replay(trace, "fcfs", profile, False))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_random_workloads_closed_form_equals_stepwise(scenario) -> None:
    trace, knobs, warm, _ = scenario
    for policy in ("fcfs", "lpm", "spf"):
        fast = run_checked(trace, policy, knobs, warm, True)
        slow = run_checked(trace, policy, knobs, warm, False)
        assert_same_run(fast, slow)


def _execute_cut(trace: Trace, policy: str, profile, warm: bool, cuts: list[float]):
    """Replay `trace`, but stop the engine at every time of `cuts` too, as the
    daemon's paced slices do (nothing happens at a cut: no arrival, no call)."""
    backend = SimBackend(profile, warm_host=warm)
    sink = RecordingSink()
    run = Run(trace, make_policy(policy), backend, sink=sink)
    stops = sorted(cuts)

    def pump(t: float | None) -> None:
        while stops and (t is None or stops[0] < t):
            run.loop.pump(stops.pop(0))
        run.loop.pump(t)

    tasks = trace.tasks
    i = 0
    while i < len(tasks):
        pump(tasks[i].arrival)
        while i < len(tasks) and tasks[i].arrival <= backend.t:
            run.loop.arrive(tasks[i])
            i += 1
    pump(None)
    return sink, backend, dict(run.loop.book.finishes)


def _exact(sink: RecordingSink, backend: SimBackend, finishes: dict) -> tuple:
    return ([tuple(asdict(e).values()) for e in sink.events],
            [(d.t, d.admit, d.preempt, d.load, d.evict, d.blocked) for d in sink.decisions],
            asdict(backend.stats), backend.ratio, finishes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), policy=st.sampled_from(["fcfs", "spf", "topas"]),
       cuts=st.lists(st.floats(0.0, 40.0, allow_nan=False), max_size=40))
def test_cutting_the_engine_at_any_times_changes_nothing_bit_for_bit(
        scenario, policy: str, cuts: list[float]) -> None:
    """The daemon runs the engine in slices that end wherever the wall clock
    is. A decode run cut by such a stop continues from where it started, so
    every event time, decision, counter and completion is the very float a
    replay computes (before, the split closed form rounded differently, and a
    paced daemon drifted from `topasd replay` of its own trace)."""
    trace, knobs, warm, _ = scenario
    profile = get_profile("small").with_overrides(**knobs)
    whole = _execute_cut(trace, policy, profile, warm, [])
    assert _exact(*_execute_cut(trace, policy, profile, warm, cuts)) == _exact(*whole)


def test_a_run_cut_into_slices_matches_the_uncut_run_on_a_paper_workload() -> None:
    """DAG-4 under TOPAS at its heaviest point, cut every 0.37 s of engine time
    (thousands of cuts inside closed-form decode runs)."""
    wl = load_workload("dag4")
    trace = generate_trace(wl.workflows, max(wl.operating_points), 25, seed=2, name="dag4")
    profile = get_profile("qwen2.5-32b-a100")
    whole = _execute_cut(trace, "topas", profile, False, [])
    end = whole[1].t
    cut = _execute_cut(trace, "topas", profile, False, [k * 0.37 for k in range(int(end / 0.37))])
    assert len(whole[0].decisions) > 50
    assert _exact(*cut) == _exact(*whole)


def _drive(profile, submits: list[tuple[float, Request]], cuts: list[float],
           script=None) -> tuple:
    """The engine driven by hand: requests submitted at their times, each
    SCHEDULE answered by `script(backend, view)` (default: admit everything
    waiting whose prefix is on the GPU, loading the others), stops at `cuts`."""
    be = SimBackend(profile, warm_host=True)
    events, decisions = [], []

    def admit_all(backend: SimBackend, view) -> Decision:
        gpu = set(view.gpu_prefixes())
        return Decision(backend.t, "script", admit=tuple(r.id for r in view.waiting),
                        load=tuple(sorted({r.agent for r in view.waiting} - gpu)))

    decide = script or admit_all

    def pump(stop: float | None) -> None:
        for ev in be.run_until(stop):
            if ev.kind is EventKind.SCHEDULE:
                d = decide(be, be.view({}, {}))
                be.apply(d)
                decisions.append((d.t, d.admit, d.load, d.evict))
            else:
                events.append(tuple(asdict(ev).values()))

    stops = sorted([(t, 0, r) for t, r in submits] + [(c, 1, None) for c in cuts],
                   key=lambda x: (x[0], x[1]))
    for t, _, r in stops:
        pump(t)
        if r is not None:
            be.submit(r)
    pump(None)
    return events, decisions, asdict(be.stats), be.ratio, be.t


def _req(rid: int, agent: str, t: float, inp: int, out: int, prefix: int) -> Request:
    return Request(rid, rid, "w", "s", agent, 0, inp, out, t, t, prefix)


def test_a_cut_just_before_a_prefix_load_that_was_cancelled_changes_nothing() -> None:
    """A prefix evicted while still loading leaves a timed load end that fires
    without an event; the uncut run still ends its closed form there, so a run
    cut just before it must not be continued across it (a review found the
    continued run's floats one ulp off)."""
    prof = get_profile("small").with_overrides(swap_bytes_per_s=1e7, host_cache=True)
    submits = [(0.0, _req(1, "a", 0.0, 100, 1000, 200)), (1.0, _req(2, "b", 1.0, 50, 50, 500)),
               (1.2, _req(3, "c", 1.2, 50, 50, 100))]

    def script(backend: SimBackend, view) -> Decision:
        waiting = {r.id for r in view.waiting}
        gpu = set(view.gpu_prefixes())
        if 1 in waiting:
            return Decision(backend.t, "script", admit=(1,), load=("a",))
        if 2 in waiting and "b" not in gpu and 3 not in waiting:
            return Decision(backend.t, "script", load=("b",))
        if 3 in waiting and "b" in gpu:
            return Decision(backend.t, "script", evict=("b",))  # b is still loading
        return Decision(backend.t, "script")

    whole = _drive(prof, submits, [], script)
    load_end = 1.0 + prof.t_swap(500)
    for before in (1e-4, 1e-3, 3e-3):
        assert _drive(prof, submits, [load_end - before], script) == whole


def test_cuts_an_ulp_past_a_decode_step_with_constant_step_times_change_nothing() -> None:
    """With no KV-read term every decode step takes the same time; a cut a few
    ulps past a step's end counted that step as reaching it (the division's
    rounding), stopped short and restarted the run fresh."""
    import math

    prof = get_profile("small").with_overrides(t_kv_read_per_token_s=0.0)
    submits = [(0.0, _req(1, "a", 0.0, 64, 3000, 100))]
    whole = _drive(prof, submits, [])
    be = SimBackend(prof, warm_host=True)  # the run's start and step time, as the engine has them
    be.submit(submits[0][1])
    for ev in be.run_until(whole[4] / 3):
        if ev.kind is EventKind.SCHEDULE:
            view = be.view({}, {})
            be.apply(Decision(be.t, "script", admit=tuple(r.id for r in view.waiting),
                              load=() if "a" in view.gpu_prefixes() else ("a",)))
    anchor = be._anchor
    assert anchor is not None
    for k in range(5, 2900, 97):
        cut = anchor.t0 + k * anchor.first
        for _ in range(3):
            cut = math.nextafter(cut, math.inf)
            assert _drive(prof, submits, [cut]) == whole, k


def test_a_retry_with_no_step_to_run_decides_at_the_next_event_not_at_a_cut() -> None:
    """A decision asking to decide again after the next step, when no step can
    run (its prefix still loading), is answered at the next event; it was
    answered wherever the caller stopped the engine, so a cut added a decision
    (found by the random-cut property test)."""
    prof = get_profile("small").with_overrides(swap_bytes_per_s=1e7, host_cache=True)
    submits = [(0.0, _req(1, "a", 0.0, 100, 50, 500))]

    def script(backend: SimBackend, view) -> Decision:
        if not view.waiting:
            return Decision(backend.t, "script")
        if "a" not in view.gpu_prefixes():
            return Decision(backend.t, "script", load=("a",), retry=True)
        return Decision(backend.t, "script", admit=(1,))

    whole = _drive(prof, submits, [], script)
    load_end = prof.t_swap(500)
    assert [d[0] for d in whole[1]][:2] == [0.0, load_end]  # decided again at the load end
    assert _drive(prof, submits, [load_end / 2], script) == whole
