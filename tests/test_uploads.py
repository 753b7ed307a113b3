"""Copies loaded back ahead of their holders and timed wake-ups: the engine
seam (`Decision.load` naming a copy on the host, `Decision.wake_at`) that
Tokencake's predictive upload uses, on real simulator runs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from backends.base import InfeasibleDecision
from tests.simkit import CheckedSim, RecordingSink, run_checked
from tests.test_react_context import OBS, WAIT, Dropping, react
from topasd.model import Decision, EngineView, EventKind, Location
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler.baselines import committed
from workflows.spec import workflow_from_dict
from workflows.trace import Trace, generate_trace

LEAD = 0.5  # the upload starts this long before the tool call ends


class Uploading(Dropping):
    """Offloads each conversation entering a tool wait (`Dropping` on a host
    tier), asks to be woken `lead` before the wait ends and loads the copy
    back then, ahead of the next round, where the decision admits nothing
    and the room allows (None: never; its holder loads it)."""

    name = "upload-early"

    def __init__(self, lead: float | None = LEAD) -> None:
        super().__init__()
        self.lead = lead
        self.due: dict[str, float] = {}  # offloaded copy -> when to load it back
        self.loaded: set[str] = set()  # copies loaded back (cached again: left there)

    def decide(self, view: EngineView) -> Decision:
        d = super().decide(view)
        if self.lead is None:
            return d
        evict = tuple(k for k in d.evict if k not in self.loaded)
        for key in evict:
            self.due[key] = view.contexts[key].last_used + WAIT - self.lead
        used, _ = committed(view)
        load: tuple[str, ...] = ()
        for k, t in list(self.due.items()):  # due, and room for it beside the state
            if k in evict:
                continue
            if view.contexts[k].location is not Location.HOST:  # its holder loaded it
                del self.due[k]
                continue
            tokens = view.contexts[k].tokens
            if t <= view.t and not d.admit and used + tokens <= view.budget_tokens:
                used += tokens
                load += (k,)
                del self.due[k]
        self.loaded.update(load)
        return replace(d, evict=evict, load=d.load + load,
                       wake_at=min(self.due.values(), default=None))


def crowded(tasks: int = 6) -> Trace:
    """`react`'s tasks arriving together (50 a second): their rounds contend for KV."""
    spec = {"name": "react", "agents": {"A": {"prefix_tokens": 200}},
            "stages": [{"name": "r", "agent": "A", "rounds": 4, "input_tokens": 100,
                        "output_tokens": 40, "tool_wait_s": WAIT, "observation_tokens": OBS,
                        "share_rounds": True}]}
    return generate_trace([workflow_from_dict(spec)], 50.0, tasks, 0)


def kinds_at(sink: RecordingSink, t: float) -> list[EventKind]:
    return [e.kind for e in sink.events if e.t == pytest.approx(t, abs=1e-12)]


def test_a_copy_loaded_back_ahead_of_its_holder_is_ready_when_the_call_ends() -> None:
    """Round 0 (100 + 40 tokens) ends at t0; its 140-token copy goes to the
    host and the policy asks to be woken at t0 + 1.5: a decision comes then,
    with no engine event, and loads the copy back over the link (T_up =
    140 x 16,384 B / 1 GB/s = 2.29 ms). The tool call ends at t0 + 2: round
    1 finds its copy ready (a hit), is admitted and starts at once,
    prefilling only the observation; loaded at its admission instead, it
    would start T_up later."""
    trace = react()
    profile = get_profile("small")
    t_up = profile.t_swap(140)
    assert t_up == pytest.approx(140 * 16384 / 1e9)
    policy = Uploading()
    _, sink, backend = run_checked(trace, policy, {"budget_tokens": 4096}, False, True)
    t0 = next(e.t for e in sink.events if e.kind is EventKind.REQUEST_FINISH)
    wake = t0 + WAIT - LEAD
    assert wake in {d.wake_at for d in sink.decisions}
    woken = next(d for d in sink.decisions if d.t == wake)
    assert woken.load == ("A/0/r.0.1",) and not woken.admit
    # nothing happened at the wake but what its decision did: the upload's start
    assert kinds_at(sink, wake) == [EventKind.CONTEXT_LOAD_START]
    start = next(e for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_START)
    assert start.request_id is None and start.tokens == 140
    assert start.value == pytest.approx(t_up)
    end = next(e for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_END)
    assert end.t == pytest.approx(wake + t_up)
    admit = next(e for e in sink.events if e.kind is EventKind.REQUEST_ADMIT
                 and e.request_id != start.request_id and e.t > t0)
    begin = next(e for e in sink.events if e.kind is EventKind.REQUEST_START
                 and e.request_id == admit.request_id)
    assert admit.t == begin.t == pytest.approx(t0 + WAIT)  # no wait for the transfer
    assert admit.tokens == OBS
    assert EventKind.CONTEXT_HIT in kinds_at(sink, admit.t)
    # each wait's new copy came back ahead of its holder (the older ones,
    # loaded back before, stay cached): three loads, none at an admission
    loads = [e for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_START]
    assert len(loads) == backend.stats.context_loads == 3
    assert all(e.request_id is None for e in loads)

    _, late, _ = run_checked(trace, Uploading(None), {"budget_tokens": 4096}, False, True)
    first = next(e for e in late.events if e.kind is EventKind.REQUEST_START and e.t > t0)
    assert first.t == pytest.approx(t0 + WAIT + t_up)  # loaded with its holder


def test_a_wake_up_is_a_scheduling_point_at_its_time_and_nothing_else() -> None:
    """A policy asking for t = 7.25, when no event falls, decides at exactly
    7.25 once; the run's events are those of a run that never asked."""

    class Waking(Dropping):
        name = "waking"

        def decide(self, view: EngineView) -> Decision:
            return replace(super().decide(view), evict=(), wake_at=7.25)

    _, sink, _ = run_checked(react(), Waking(), {"budget_tokens": 4096}, False, True)
    _, plain, _ = run_checked(react(), "fcfs", {"budget_tokens": 4096}, False, True)
    assert not kinds_at(plain, 7.25)
    assert [d.t for d in sink.decisions].count(7.25) == 1
    assert [e.as_row() for e in sink.events] == [e.as_row() for e in plain.events]


def test_a_copy_is_loaded_back_only_where_its_room_is() -> None:
    """The engine refuses, changing nothing, a load of a copy on the host
    that would overfill the budget (Eq. 2), a load of a copy that is not on
    the host, and a wake-up that is not a finite time."""
    refusals: list[str] = []

    class Probing(Uploading):
        def decide(self, view: EngineView) -> Decision:
            used, _ = committed(view)
            probes = [Decision(view.t, self.name, wake_at=math.nan)]
            probes += [Decision(view.t, self.name, load=(k,)) for k, c in view.contexts.items()
                       if c.location is Location.GPU]
            host = tuple(k for k, c in view.contexts.items() if c.location is Location.HOST)
            if used + sum(view.contexts[k].tokens for k in host) > view.budget_tokens:
                probes.append(Decision(view.t, self.name, load=host))
            for probe in probes:
                with pytest.raises(InfeasibleDecision) as refused:
                    backend.apply(probe)
                refusals.append(str(refused.value))
            return super().decide(view)

    backend = CheckedSim(get_profile("small").with_overrides(budget_tokens=700))
    result = Run(crowded(), Probing(), backend, sink=RecordingSink()).execute()
    assert result.requests_finished == 6 * 4
    assert any("unknown agent or already resident" in r for r in refusals)
    assert any("wake_at must be a finite engine time" in r for r in refusals)
    assert any("but the budget is 700 (Eq. 2)" in r for r in refusals), refusals


def test_an_upload_gives_its_room_to_a_decode_step_and_stays_on_the_host() -> None:
    """A decode step out of KV stops a copy's load back before it retracts
    a request: the copy goes back to the host (an offload with no transfer)
    and its holder loads it back at its admission."""
    knobs = {"budget_tokens": 600, "swap_bytes_per_s": 3e6}  # uploads stay in flight
    result, sink, _ = run_checked(crowded(), Uploading(1.9), knobs, False, True)
    assert result.requests_finished == 6 * 4
    uploading: set[str] = set()
    stopped: list[str] = []
    for e in sink.events:
        if e.kind is EventKind.CONTEXT_LOAD_START and e.request_id is None:
            uploading.add(e.note)
        elif e.kind in (EventKind.CONTEXT_LOAD_END, EventKind.CONTEXT_HIT):
            uploading.discard(e.note)
        elif e.kind is EventKind.CONTEXT_OFFLOAD and e.note in uploading:
            assert e.value == 0.0
            stopped.append(e.note)
            uploading.discard(e.note)
    assert stopped
    held = [e.note for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_START
            and e.request_id is not None]
    assert set(stopped) <= set(held)  # each came back with its holder
