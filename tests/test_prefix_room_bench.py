"""bench/prefix_room.py's time averages, on hand-made events and on a replay:
an agent runs (and pins its prefix) from a request's admission to its end,
and the prefix KV on the GPU follows loads and evictions."""

from __future__ import annotations

import pytest

from tests.benchkit import load_bench
from topasd.model import EngineEvent, EventKind


def test_the_averages_follow_admissions_ends_and_residency() -> None:
    bench = load_bench("prefix_room")
    sink = bench.PrefixRoom({"A": 100, "B": 300})
    for ev in (
        EngineEvent(0.0, EventKind.REQUEST_READY, request_id=1, agent="A"),
        EngineEvent(0.0, EventKind.REQUEST_READY, request_id=2, agent="B"),
        EngineEvent(0.0, EventKind.PREFIX_LOAD_START, agent="A"),
        EngineEvent(0.0, EventKind.REQUEST_ADMIT, request_id=1, agent="A"),
        EngineEvent(1.0, EventKind.REQUEST_START, request_id=1, agent="A"),
        EngineEvent(1.0, EventKind.REQUEST_READY, request_id=3, agent="B"),
        EngineEvent(2.0, EventKind.PREFIX_LOAD_START, agent="B"),
        EngineEvent(2.0, EventKind.REQUEST_ADMIT, request_id=2, agent="B"),
        EngineEvent(2.0, EventKind.REQUEST_ADMIT, request_id=3, agent="B"),
        EngineEvent(3.0, EventKind.REQUEST_START, request_id=2, agent="B"),
        EngineEvent(3.0, EventKind.REQUEST_START, request_id=3, agent="B"),
        EngineEvent(4.0, EventKind.REQUEST_FINISH, request_id=1, agent="A"),
        EngineEvent(6.0, EventKind.PREEMPT, request_id=2, agent="B"),
        EngineEvent(6.0, EventKind.REQUEST_READY, request_id=2, agent="B"),
        EngineEvent(7.0, EventKind.REQUEST_START, request_id=2, agent="B"),
        EngineEvent(8.0, EventKind.RETRACT, request_id=3, agent="B"),
        EngineEvent(8.0, EventKind.PREFIX_EVICT, agent="B"),
        EngineEvent(10.0, EventKind.TASK_FINISH, task_id=1),
    ):
        sink.event(ev)
    avg = sink.averages()
    # running agents: A over [0, 4), B over [2, 8): 10 agent-seconds in 10 s
    assert avg["agents_running"] == pytest.approx(1.0)
    # pinned: 100 x 4 + 300 x 6 = 2,200 token-seconds
    assert avg["pinned_kv"] == pytest.approx(220.0)
    # on the GPU: A all 10 s (never evicted), B over [2, 8)
    assert avg["resident_kv"] == pytest.approx((100 * 10 + 300 * 6) / 10)
    # per agent: A on the GPU all 10 s with one request over [0, 4); B over [2, 8)
    # with two requests over [2, 6) and one over [6, 8)
    a, b = avg["agents"]["A"], avg["agents"]["B"]
    assert (a["on_gpu"], a["running_on_gpu"], a["loads"]) == pytest.approx((1.0, 0.4, 1.0))
    assert (b["on_gpu"], b["running_on_gpu"], b["loads"]) == pytest.approx((0.6, 10 / 6, 1.0))
    # waits from first ready to first start: A's request 1 s; B's 3 s and 2 s (request 2's
    # start after its preemption is not its first)
    assert (a["wait_s"], b["wait_s"]) == pytest.approx((1.0, 2.5))


def test_a_replay_pins_no_more_than_it_holds_and_runs_some_agent() -> None:
    bench = load_bench("prefix_room")
    row = bench.replay("fork_join", 0, "overload", "lpm", {}, 20, 0.0234)
    assert row["agents_running"] > 0.0 and row["policy"] == "lpm"
    assert 0.0 < row["pinned_kv"] <= row["resident_kv"] <= 18_000


def test_the_pool_samples_hold_from_one_decision_to_the_next() -> None:
    bench = load_bench("prefix_room")
    sampler = bench.PoolSampler(None)
    # at t=0: running KV 100, prefixes 50, 2 waiting with 30 input tokens in all;
    # at t=4: running KV 200, no prefix, none waiting; the run ends at t=10
    sampler.samples = [(0.0, 100, 50, 2, 30), (4.0, 200, 0, 0, 0)]
    avg = sampler.averages(10.0)
    assert avg["running_kv"] == pytest.approx((100 * 4 + 200 * 6) / 10)
    assert avg["waiting"] == pytest.approx(2 * 4 / 10)
    assert avg["waiting_input"] == pytest.approx(15.0)  # per waiting request
    assert avg["most_held"] == 200.0


def test_a_replays_samples_never_hold_more_than_the_pool() -> None:
    bench = load_bench("prefix_room")
    row = bench.replay("fork_join", 0, "overload", "topas", {}, 20, 0.0234)
    assert row["running_kv"] > 0.0 and 0.0 < row["most_held"] <= 18_000
    assert row["waiting"] > 0.0 and row["waiting_input"] > 0.0
