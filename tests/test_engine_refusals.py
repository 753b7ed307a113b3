"""The simulator carries out any feasible Decision and refuses an infeasible one
with a clear error, changing nothing (backends/base.py `decision_problems`)."""

from __future__ import annotations

import pytest

from backends.base import InfeasibleDecision
from backends.sim.engine import SimBackend
from topasd.model import Decision, EventKind, Request, Reservation
from topasd.profiles import get_profile


def request(rid: int, agent: str, input_tokens: int = 100, output_tokens: int = 50) -> Request:
    return Request(id=rid, task_id=rid, workflow="w", stage="s", agent=agent, round=0,
                   input_tokens=input_tokens, output_tokens=output_tokens, ready_at=0.0,
                   task_arrival=0.0, prefix_tokens=1000)


def engine(budget: int = 2000) -> SimBackend:
    """Two requests of agent A and one of B waiting at t=0, A's prefix loaded
    and request 1 running (full reservation: 150 + the 1,000-token prefix)."""
    backend = SimBackend(get_profile("small").with_overrides(budget_tokens=budget),
                         warm_host=True)
    for r in (request(1, "A"), request(2, "A"), request(3, "B")):
        backend.submit(r)
    events = backend.run_until(0.0)
    assert any(ev.kind is EventKind.SCHEDULE for ev in events)
    backend.apply(Decision(0.0, "test", admit=(1,), load=("A",)))
    return backend


def state(b: SimBackend) -> tuple[object, ...]:
    v = b.view({}, {})
    return (tuple(r.id for r in v.running), tuple(r.id for r in v.waiting),
            tuple(sorted(v.gpu_prefixes())))


@pytest.mark.parametrize(("decision", "says"), [
    (Decision(0.0, "p", admit=(9,)), "admit names requests that are not waiting: [9]"),
    (Decision(0.0, "p", preempt=(2,)), "preempt names requests that are not running: [2]"),
    (Decision(0.0, "p", admit=(2, 2)), "listed twice"),
    (Decision(0.0, "p", admit=(3,)), "admit needs prefixes ['B'] resident"),
    (Decision(0.0, "p", evict=("A",)), "evict 'A': requests of this agent keep running"),
    (Decision(0.0, "p", evict=("B",)), "evict 'B': its prefix is not resident"),
    (Decision(0.0, "p", load=("A",)), "load 'A': unknown agent or already resident"),
    (Decision(0.0, "p", admit=(3,), load=("B",)), "needs 2300 KV tokens but the budget is 2000"),
])
def test_an_infeasible_decision_is_refused_and_changes_nothing(decision: Decision,
                                                                 says: str) -> None:
    b = engine()
    before = state(b)
    with pytest.raises(InfeasibleDecision, match=r"p decision at t=0\.000s refused") as err:
        b.apply(decision)
    assert says in str(err.value)
    assert state(b) == before
    b.apply(Decision(0.0, "p", admit=(2,), reservation=Reservation.FULL))  # still works
    assert state(b) == ((1, 2), (3,), ("A",))


def test_preempting_to_make_room_for_another_agent_is_carried_out() -> None:
    b = engine()
    b.apply(Decision(0.0, "p", preempt=(1,), evict=("A",), load=("B",), admit=(3,)))
    assert state(b) == ((3,), (2, 1), ("B",))
