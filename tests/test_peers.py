"""The published peers (topasd/scheduler/peers): each rule pinned on a small
hand-computed case, and each peer's KV handling in tool waits on the engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.simkit import run_checked
from tests.test_react_context import react
from tests.topas_views import CHAIN, COSTS, request, task, view, workflow
from topasd.model import (
    ContextState,
    CostHints,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    Reservation,
    Segment,
    StageProgress,
    StageStatus,
)
from topasd.profiles import get_profile
from topasd.scheduler import ALL_POLICY_NAMES, POLICY_NAMES, make_policy
from topasd.scheduler.peers import (
    PEERS,
    AstraeaPolicy,
    ContinuumPolicy,
    KairosPolicy,
    SagaPolicy,
    TokencakePolicy,
)
from topasd.scheduler.peers.astraea import hrrn, waste
from topasd.scheduler.peers.continuum import ttl
from topasd.scheduler.peers.estimates import allocated, remaining_latency
from topasd.scheduler.peers.saga import evict_score, percentile95, tool_ttl, urgency
from topasd.scheduler.peers.tokencake import next_ratio, reserves, shared_use

ONE = workflow("one", {"a": ()}, prefix=0)


def ev(t: float, kind: EventKind, rid: int | None = None, tid: int | None = None, *,
       value: float = 0.0, stage: str = "a") -> EngineEvent:
    return EngineEvent(t, kind, rid, tid, stage.upper(), stage, value=value)


def waiting_copy(tokens: int, since: float, task_id: int = 1) -> dict[str, ContextState]:
    """A conversation of task `task_id` in a tool wait since `since`."""
    key = f"A/{task_id}/a.0.1"
    return {key: ContextState(key, "A", task_id, tokens, Location.GPU, ready=True,
                              last_used=since, next_use=since + 100.0)}


def test_every_peer_is_a_policy_in_all() -> None:
    for name in PEERS:
        assert name in POLICY_NAMES and make_policy(name).name == name


# ------------------------------------------------------------------ continuum


def test_continuum_ttl_is_the_argmax_of_eq_2() -> None:
    # gains over {0, 1, 2, 10} with benefit 6: 0, 1/3*6-1 = 1, 2/3*6-2 = 2, 6-10 = -4
    assert ttl([1.0, 2.0, 10.0], 6.0, 0.0) == 2.0
    assert ttl([1.0, 2.0, 10.0], 0.5, 0.0) == 0.0  # no wait is worth pinning for
    # no samples: the exponential prior with mean m gives m ln(B / m)
    assert ttl([], 1.0 * 2.718281828459045 ** 2, 1.0) == pytest.approx(2.0)
    assert ttl([], 0.9, 1.0) == 0.0


def pinned_continuum() -> ContinuumPolicy:
    """Observed tool waits 1, 2 and 10 s and one queueing delay of 6 s:
    with free prefill (COSTS) tau* = 2 s, as above."""
    policy = ContinuumPolicy(min_samples=0)
    for w in (1.0, 2.0, 10.0):
        policy.observe(ev(0.0, EventKind.TOOL_CALL_END, value=w))
    policy.observe(ev(0.0, EventKind.REQUEST_READY, 99, 9))
    policy.observe(ev(6.0, EventKind.REQUEST_ADMIT, 99, 9))
    return policy


def continuum_view(t: float, running: bool = True) -> EngineView:
    """Task 1's 500-token conversation waits out a tool call since t = 0 while
    task 2's request needs 600 of the 1000 tokens beside task 3's running 20."""
    req = request(5, 2, ONE, "a", input_tokens=300, output_tokens=300, arrival=0.5)
    run = [request(9, 3, ONE, "a", running=True, started_at=0.0)] if running else []
    tasks = [task(1, ONE, a="active"), task(2, ONE, 0.5, a="active"), task(3, ONE, a="active")]
    v = view(ONE, tasks, run, [req], t=t, budget=1000, gpu=("A",))
    return replace(v, contexts=waiting_copy(500, 0.0))


def test_continuum_holds_a_pinned_conversations_room_until_its_ttl_expires() -> None:
    policy = pinned_continuum()
    inside = policy.decide(continuum_view(1.5))
    assert inside.admit == () and inside.blocked
    assert policy.pins == {(1, "A", 0.0): 2.0}
    assert policy.decide(continuum_view(2.5)).admit == (5,)  # the pin expired
    # the engine's own rule gives the cached copy's room at once
    assert make_policy("fcfs").decide(continuum_view(1.5)).admit == (5,)


def test_continuum_takes_preempted_then_pinned_programs_first() -> None:
    policy = pinned_continuum()
    late = request(6, 1, ONE, "a", arrival=3.0)  # task 1: its conversation is pinned
    early = request(7, 3, ONE, "a", arrival=0.0)
    again = replace(request(8, 4, ONE, "a", arrival=2.0), preemptions=1)
    v = replace(view(ONE, [task(i, ONE, a="active") for i in (1, 3, 4)], [],
                     [early, late, again], t=1.0), contexts=waiting_copy(10, 0.0))
    assert [r.id for r in policy.order(v, {c.task_id for c in policy.pinned(v)})] == [8, 6, 7]


def test_continuum_unpins_when_nothing_runs_and_nothing_else_can() -> None:
    """Nothing runs and the only request cannot fit beside the pinned copies:
    the deadlock guard unpins programs rather than idle until the TTL."""
    policy = pinned_continuum()
    v = continuum_view(1.5, running=False)
    v = replace(v, contexts=waiting_copy(500, 0.0) | waiting_copy(450, 0.0, task_id=2))
    assert policy.decide(v).admit == (5,)
    assert policy.decide(continuum_view(1.5)).admit == ()  # something runs: the pin holds


# -------------------------------------------------------------------- astraea


def test_astraea_orders_a_level_by_highest_response_ratio() -> None:
    """A waited 10 s for 5 s of service (ratio 3), B 2 s for 0.5 s (ratio 5):
    B first though A arrived first; demoted, B goes after A."""
    a = replace(request(1, 1, ONE, "a", output_tokens=50), queued_at=0.0)
    b = replace(request(2, 2, ONE, "a", output_tokens=5, arrival=1.0), queued_at=8.0)
    v = view(ONE, [task(1, ONE, a="active"), task(2, ONE, 1.0, a="active")], [], [a, b], t=10.0)
    policy = AstraeaPolicy()
    assert policy.ratio(v, a) == pytest.approx(hrrn(10.0, 5.0)) == pytest.approx(3.0)
    assert policy.ratio(v, b) == pytest.approx(5.0)
    assert [r.id for r in policy.order(v)] == [2, 1]
    policy.level[2] = 1
    assert [r.id for r in policy.order(v)] == [1, 2]


def test_astraea_demotes_compute_bound_and_promotes_io_bound_tasks() -> None:
    policy = AstraeaPolicy(base_tokens=100)
    big = request(1, 1, ONE, "a", input_tokens=80, output_tokens=40)  # 120 > 100
    small = request(2, 2, ONE, "a", input_tokens=30, output_tokens=20)
    policy.decide(view(ONE, [task(1, ONE), task(2, ONE)], [], [big, small], budget=10))
    policy.level[2] = 2
    for r in (big, small):
        policy.observe(ev(1.0, EventKind.REQUEST_FINISH, r.id, r.task_id, value=1.0))
        policy.observe(ev(1.0, EventKind.TOOL_CALL_START, r.id, r.task_id, value=3.0))
    assert (policy.level[1], policy.level[2]) == (1, 1)  # down one; up one


def test_astraea_ages_a_starving_last_level_task_to_the_top() -> None:
    policy = AstraeaPolicy()
    old = replace(request(1, 1, ONE, "a", output_tokens=10), queued_at=0.0)  # 1 s of service
    v = view(ONE, [task(1, ONE)], [], [old], t=8.5)  # ratio 9.5 > 8
    policy.level[1] = policy.levels - 1
    policy.order(v)
    assert policy.level[1] == 0


@pytest.mark.parametrize(("api", "want"), [(20.0, "discard"), (0.5, "preserve")])
def test_astraea_picks_the_least_waste_for_a_paused_conversation(api: float, want: str) -> None:
    # 500 tokens, 0.5 s to recompute or to move each way, 600 tokens waiting
    assert waste(api, 0.5, 0.5, 500, 600.0) == want  # pres 500*api; disc 300; swap 600
    assert waste(1.0, 0.5, 0.1, 500, 600.0) == "swap"  # 500 vs 300 vs 120


def test_astraea_keeps_tool_waits_below_its_watermark_and_evicts_above() -> None:
    costs = CostHints(t_decode_s=0.1, prefill_s_per_token=0.001, prefill_base_s=0.0,
                      kv_bytes_per_token=1000.0, swap_bytes_per_s=1e6)
    big = request(5, 2, ONE, "a", input_tokens=300, output_tokens=300)
    v = view(ONE, [task(1, ONE, a="active"), task(2, ONE, a="active")], [], [big], budget=1000)
    v = replace(v, costs=costs, contexts=waiting_copy(500, 0.0), t=0.0)
    policy = AstraeaPolicy(watermark=0.9)  # 500 of 1000 in use: below
    assert policy.tool_wait_evictions(v, set()) == ()
    policy = AstraeaPolicy(watermark=0.4)
    # the wait's trace mean is 0 (no tool_wait_s): T_api 0, preserving wastes nothing
    assert policy.tool_wait_evictions(v, set()) == ()
    policy.observe(EngineEvent(0.0, EventKind.TOOL_CALL_END, agent="A", stage="a", value=20.0))
    kept = replace(request(4, 1, ONE, "a"), keeps=Segment("A/1/a.0.1", 500))
    policy.origins.learn(replace(v, waiting=(kept,)))  # the round the copy was kept from
    assert policy.tool_wait_evictions(v, set()) == ("A/1/a.0.1",)  # W_pres 1e4 > W_disc 300


def run_react(policy: str | AstraeaPolicy, host: bool, budget: int = 1500):
    return run_checked(react(tasks=6), policy, {"budget_tokens": budget, "host_cache": host},
                       False, True)


def test_astraea_offloads_conversations_in_tool_waits_and_loads_them_back() -> None:
    """With a host tier its evictions are swaps: each offloaded copy comes back
    over the link when its next round is admitted (nothing recomputed). The
    watermark at half the budget: six tasks' conversations never fill 90% of it."""
    _, sink, backend = run_react(AstraeaPolicy(watermark=0.5), True)
    kinds = [e.kind for e in sink.events]
    offloads = kinds.count(EventKind.CONTEXT_OFFLOAD)
    assert offloads > 0 and backend.stats.context_loads == offloads
    assert backend.stats.context_computes == 0
    first = kinds.index(EventKind.CONTEXT_OFFLOAD)
    assert EventKind.CONTEXT_LOAD_START in kinds[first:]
    _, _, dropped = run_react(AstraeaPolicy(watermark=0.5), False)  # no host: recomputed
    assert dropped.stats.context_computes > 0 and dropped.stats.context_loads == 0


# --------------------------------------------------------------------- kairos


def test_kairos_puts_the_request_with_the_least_workflow_left_first() -> None:
    assert remaining_latency(CHAIN, {"a": 1.0, "b": 2.0, "c": 4.0}) == {
        "a": 6.0, "b": 4.0, "c": 0.0}
    first = request(1, 1, CHAIN, "a", arrival=0.0)
    last = request(2, 2, CHAIN, "c", arrival=5.0)
    tasks = [task(1, CHAIN, a="active"), task(2, CHAIN, 5.0, a="done", b="done", c="active")]
    v = view(CHAIN, tasks, [], [first, last], t=6.0)
    assert [r.id for r in KairosPolicy().order(v)] == [2, 1]


def kairos_view(budget: int) -> EngineView:
    """A running request (100 in, 400 out, 40 s) and a waiting one (300 in,
    100 out, 10 s), both growing 10 tokens/s: together they peak at
    195 + 395 = 590 tokens in the slot at 9.5 s, while the engine's
    optimistic reservation (ratio 0.1) counts 140 + 400 = 540 now."""
    run = replace(request(1, 1, ONE, "a", running=True, input_tokens=100, output_tokens=400,
                          started_at=0.0), reservation=Reservation.OPTIMISTIC)
    new = request(2, 2, ONE, "a", input_tokens=300, output_tokens=100)
    v = view(ONE, [task(1, ONE, a="active"), task(2, ONE, a="active")], [run], [new],
             budget=budget, gpu=("A",))
    return replace(v, new_token_ratio=0.1)


def test_kairos_refuses_a_request_whose_projected_kv_overflows_a_slot() -> None:
    assert make_policy("fcfs").decide(kairos_view(550)).admit == (2,)
    assert KairosPolicy().decide(kairos_view(550)).admit == ()
    assert KairosPolicy().decide(kairos_view(590)).admit == (2,)


def test_kairos_admits_head_of_line_only() -> None:
    """The head does not fit the projection: a smaller request behind it waits."""
    v = kairos_view(550)
    small = request(3, 3, ONE, "a", input_tokens=10, output_tokens=10, arrival=1.0)
    v = replace(v, waiting=(*v.waiting, small), tasks={**v.tasks, 3: task(3, ONE, 1.0)})
    assert KairosPolicy().decide(v).admit == ()


# ---------------------------------------------------------------- all of them


@pytest.mark.parametrize("name", sorted(PEERS))
def test_each_peer_finishes_every_conversation_under_a_tight_budget(name: str) -> None:
    for budget in (700, 1500):
        for host in (False, True):
            result, _, _ = run_checked(react(tasks=6), name, {"budget_tokens": budget,
                                                              "host_cache": host}, False, True)
            assert result.requests_finished == 6 * 4


def test_peers_decide_only_on_the_view() -> None:
    """A peer's decision does not depend on the oracle end of a tool wait."""
    for name in sorted(PEERS):
        policy = make_policy(name)
        a = replace(continuum_view(1.0), costs=COSTS)
        b = replace(a, contexts={k: replace(c, next_use=c.last_used + 1.5)
                                 for k, c in a.contexts.items()})
        assert policy.decide(a).admit == make_policy(name).decide(b).admit


# ----------------------------------------------------------------------- saga


def test_saga_serves_the_task_with_the_most_work_left_per_time_to_deadline() -> None:
    """One 25.6 s stage (256 in, 256 out at 0.1 s/token): deadline = arrival
    + 1.5 x 25.6 = arrival + 38.4 s. At t = 20 task 1 (arrived 0, 20 s served)
    has 5.6 s left over 18.4 s (0.30), task 2 (arrived 10, none) 25.6 over
    28.4 s (0.90): task 2 first, though task 1 arrived first."""
    served = replace(task(1, ONE, a="active"), stages={"a": StageProgress(
        StageStatus.ACTIVE, service_s=20.0, started_at=0.0)})
    one, two = request(1, 1, ONE, "a"), request(2, 2, ONE, "a", arrival=10.0)
    v = view(ONE, [served, task(2, ONE, 10.0, a="active")], [], [one, two], t=20.0)
    policy = SagaPolicy()
    assert policy.work_and_tct(v, "one") == pytest.approx((25.6, 25.6))
    assert urgency(served, 25.6, 25.6, 20.0) == pytest.approx(5.6 / 18.4)
    assert [r.id for r in policy.order(v)] == [2, 1]
    assert [r.id for r in policy.order(replace(v, tasks={**v.tasks, 1: task(1, ONE)}))] == [1, 2]


def test_saga_tool_ttl_shrinks_under_memory_pressure() -> None:
    assert percentile95([float(x) for x in range(1, 21)]) == 19.0
    assert tool_ttl(10.0, 0.5) == 10.0  # below 70% of the budget: the whole p95
    assert tool_ttl(10.0, 0.8) == pytest.approx(7.5)  # m = 0.5
    assert tool_ttl(10.0, 1.0) == pytest.approx(5.0)
    assert tool_ttl(1000.0, 0.0) == 300.0


def test_saga_evicts_by_workflow_aware_lru_not_by_age() -> None:
    """X (300 tokens, idle 10 s) waits for its next round; Y (300, idle 5 s)
    has no holder coming. P_evict: X 0.3 + 0 + 0.2 = 0.5, Y 0.15 + 0.5 + 0.2
    = 0.85: Y goes, where the engine would give up the oldest, X."""
    assert evict_score(10.0, 10.0, 1.0, 300, 300) == pytest.approx(0.5)
    assert evict_score(5.0, 10.0, 0.0, 300, 300) == pytest.approx(0.85)
    new = request(5, 2, ONE, "a", input_tokens=300, output_tokens=300)
    v = view(ONE, [task(1, ONE, a="active"), task(2, ONE, a="active"), task(3, ONE)], [], [new],
             t=10.0, budget=1000, gpu=("A",))
    doc = ContextState("A/3/doc", "A", 3, 300, Location.GPU, ready=True, last_used=5.0)
    v = replace(v, contexts={**waiting_copy(300, 0.0), doc.key: doc})
    d = SagaPolicy().decide(v)
    assert d.admit == (5,) and d.evict == ("A/3/doc",)


def test_saga_protects_a_conversation_inside_its_ttl() -> None:
    policy = SagaPolicy()
    for w in (1.0, 2.0, 4.0):  # p95 4 s
        policy.observe(EngineEvent(0.0, EventKind.TOOL_CALL_END, agent="A", stage="a", value=w))
    kept = replace(request(4, 1, ONE, "a"), keeps=Segment("A/1/a.0.1", 500))
    policy.origins.learn(replace(continuum_view(0.0), waiting=(kept,)))
    assert policy.decide(continuum_view(3.0)).admit == ()  # 500 protected: 600 does not fit
    assert policy.protect == {(1, "A", 0.0): 4.0}
    assert policy.decide(continuum_view(4.5)).admit == (5,)


# ------------------------------------------------------------------ tokencake

CHAIN0 = workflow("chain0", {"a": (), "b": ("a",), "c": ("b",)}, prefix=0)


def test_tokencake_reserve_ratio_and_shares_follow_alg_2() -> None:
    assert next_ratio(0.05, 0.8) == pytest.approx(0.10)
    assert next_ratio(0.05, 0.2) == 0.05 and next_ratio(0.10, 0.9) == 0.10
    assert next_ratio(0.30, 0.9, most=0.30) == 0.30  # the later version's clamp
    # scores (depth + 1)(out-degree + 1) on a chain: a 2, b 4, c 3; the top
    # 75% of three agents are two: B and C, sharing R = 100 by use and score
    got = reserves({"A": 2.0, "B": 4.0, "C": 3.0}, {"B": 100.0}, 100.0, 1000)
    assert got == pytest.approx({"B": 100 * (0.1 + 4 / 7) / 2, "C": 100 * (3 / 7) / 2})
    assert shared_use({"A": 30.0, "B": 50.0}, got) == pytest.approx(30.0 + 50.0 - got["B"])


def test_tokencake_refuses_a_non_critical_request_its_shared_pool_cannot_hold() -> None:
    """Agents A (stage a, score 2) and C (stage c, score 3) are active; one of
    two is critical: C, with a reserve of 50 x (0 + 1) / 2 = 25 of R = 50
    (ratio 0.05). A's 960 tokens exceed the shared pool of 950 though the
    engine has room; C's small request is admitted beside a running one."""
    big = request(1, 1, CHAIN0, "a", input_tokens=480, output_tokens=480)
    small = request(2, 2, CHAIN0, "c", input_tokens=10, output_tokens=10)
    busy = request(3, 3, CHAIN0, "c", running=True, input_tokens=5, output_tokens=5,
                   started_at=0.0)
    tasks = [task(1, CHAIN0, a="active"), task(2, CHAIN0, a="done", b="done", c="active"),
             task(3, CHAIN0, c="active")]
    v = view(CHAIN0, tasks, [busy], [big, small], budget=1000, gpu=("A", "C"))
    assert make_policy("fcfs").decide(replace(v, running=())).admit == (1, 2)
    assert TokencakePolicy().decide(v).admit == (2,)
    bigger_pool = replace(v, budget_tokens=1020)  # pool 969: it fits
    assert set(TokencakePolicy().decide(bigger_pool).admit) == {1, 2}


def test_tokencake_counts_an_idle_cached_prefix_as_free_not_as_use() -> None:
    """A's 400-token prefix is cached on the GPU with no request of A: the
    engine's to evict, as vLLM counts such blocks free. In use are only C's
    prefix and running request (410 of 1000: the ratio stays 0.05), so B's
    request (100 tokens and its prefix's 400) fits the shared pool of 950
    beside them; counting A's idle prefix (1,310) refused it and raised the
    ratio on a machine nobody crowds."""
    wf = workflow("chain400", {"a": (), "b": ("a",), "c": ("b",)}, prefix=400)
    busy = request(3, 3, wf, "c", running=True, input_tokens=5, output_tokens=5,
                   started_at=0.0)
    new = request(2, 2, wf, "b", input_tokens=50, output_tokens=50)
    tasks = [task(2, wf, a="done", b="active"), task(3, wf, a="done", b="done", c="active")]
    v = view(wf, tasks, [busy], [new], budget=1000, gpu=("A", "C"))
    assert make_policy("fcfs").decide(v).admit == (2,)
    policy = TokencakePolicy()
    assert allocated(v) == {"C": 410.0}
    assert policy.decide(v).admit == (2,)
    assert policy.ratio == 0.05


def tokencake_view(call_s: float, running_tokens: int = 100) -> tuple[TokencakePolicy, EngineView]:
    """A 500-token conversation enters a tool call whose observed mean is
    `call_s` (trace mean 0: T_fc = call_s / 2); a 60-token request waits."""
    policy = TokencakePolicy()
    policy.observe(EngineEvent(0.0, EventKind.TOOL_CALL_END, agent="A", stage="a", value=call_s))
    run = request(9, 3, ONE, "a", running=True, input_tokens=running_tokens // 2,
                  output_tokens=running_tokens // 2, started_at=0.0)
    new = request(5, 2, ONE, "a", input_tokens=30, output_tokens=30)
    v = view(ONE, [task(1, ONE, a="active"), task(2, ONE, a="active"), task(3, ONE)], [run],
             [new], budget=1000, gpu=("A",))
    kept = replace(request(4, 1, ONE, "a"), keeps=Segment("A/1/a.0.1", 500))
    policy.origins.learn(replace(v, waiting=(kept,)))
    return policy, replace(v, contexts=waiting_copy(500, 0.0))


def test_tokencake_offloads_a_call_longer_than_its_round_trip_under_pressure() -> None:
    # T_fc = 10 s > 2 x 0.5 s; window 9 s at 0.1 s/token: 90 tokens >= 60 waiting
    policy, v = tokencake_view(20.0)
    assert policy.decide(v).evict == ("A/1/a.0.1",)
    assert policy.decide(v).evict == ()  # decided once, at the call's start
    policy, v = tokencake_view(1.5)  # T_fc 0.75 s: shorter than the round trip
    assert policy.decide(v).evict == ()
    policy, v = tokencake_view(20.0, running_tokens=0)  # 50% use, below 60%
    assert policy.decide(v).evict == ()


def test_tokencake_schedules_the_upload_at_the_predicted_return_minus_t_up() -> None:
    """T_fc = 10 s, T_up = T_swap(500) = 0.5 s: the conversation offloaded at
    its call's start (0) is due back at 9.5 s, a scheduling point the policy
    asks for. Then, on the host, it is loaded back if the room allows beside
    the engine's state and displaces no admission; its holder ready first
    (waiting), the upload is dropped: the admission loads it."""
    policy, v = tokencake_view(20.0)
    d = policy.decide(v)
    assert d.evict == ("A/1/a.0.1",) and d.wake_at == pytest.approx(9.5)
    host = {k: replace(c, location=Location.HOST) for k, c in v.contexts.items()}
    early = replace(v, t=9.0, contexts=host)
    assert policy.decide(early).load == () and policy.decide(early).wake_at == pytest.approx(9.5)
    due = replace(early, t=9.5)
    for budget, load in ((1000, ("A/1/a.0.1",)), (600, ())):
        # 1000: 100 running + 500 uploading + 60 admitted fit; 600: the
        # upload would leave no room for the waiting request's 60 tokens
        policy, _ = tokencake_view(20.0)
        policy.decide(v)
        got = policy.decide(replace(due, budget_tokens=budget))
        assert got.load == load and got.admit == (5,)
        assert got.wake_at is None and bool(policy.uploads) is not bool(load)
    policy, _ = tokencake_view(20.0)
    policy.decide(v)
    holder = replace(request(6, 1, ONE, "a"), shared=(Segment("A/1/a.0.1", 500),))
    ready = replace(due, waiting=(*due.waiting, holder))
    assert policy.decide(ready).load == () and not policy.uploads


def first_upload(sink) -> tuple[EngineEvent, list[EngineEvent]]:
    """The first copy loaded back ahead of its holder, and the events of its task."""
    up = next(e for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_START
              and e.request_id is None)
    task_id = int(up.note.split("/")[1])
    return up, [e for e in sink.events if e.task_id == task_id or e.note.startswith(
        f"A/{task_id}/")]


def test_tokencake_uploads_a_conversation_before_its_tool_call_ends() -> None:
    """Six ReAct tasks on 1,000 tokens (KV use passes 60%): a round ends at t0
    and its conversation (140 + 60 + 60 tokens) goes to the host; every call
    took 2 s, so T_fc = 0.5 x 2 + 0.5 x 2 = 2 s and T_up = 260 x 16,384 B /
    1 GB/s. A scheduling point comes at t0 + 2 - T_up (asked for, no engine
    event) and the copies go back over the link then, each after the one
    before: the last is back at t0 + 2, when the call ends. The next round
    finds them all ready: admitted and started at t0 + 2, loading nothing."""
    _, sink, backend = run_react("tokencake", True, budget=1000)
    up, events = first_upload(sink)
    t0 = next(e.t for e in events if e.kind is EventKind.CONTEXT_OFFLOAD)
    offloaded = [e for e in events if e.kind is EventKind.CONTEXT_OFFLOAD and e.t == t0]
    assert [e.tokens for e in offloaded] == [140, 60, 60]
    t_up = get_profile("small").t_swap(260)
    assert up.t == pytest.approx(t0 + 2.0 - t_up)
    assert up.t in {d.wake_at for d in sink.decisions if d.t < up.t}
    assert {e.kind for e in sink.events if e.t == up.t} <= {EventKind.CONTEXT_LOAD_START}
    ends = [e.t for e in events if e.kind is EventKind.CONTEXT_LOAD_END]
    assert ends[-1] == pytest.approx(t0 + 2.0)
    call_end = next(e for e in events if e.kind is EventKind.TOOL_CALL_END and e.t > t0)
    at_end = [e.kind for e in events if e.t == call_end.t and e.request_id == call_end.request_id]
    assert at_end[-2:] == [EventKind.REQUEST_ADMIT, EventKind.REQUEST_START]
    assert at_end.count(EventKind.CONTEXT_HIT) == 3
    assert EventKind.CONTEXT_LOAD_START not in at_end
    kinds = [e.kind for e in sink.events]  # each offloaded copy is loaded back once
    assert kinds.count(EventKind.CONTEXT_OFFLOAD) == backend.stats.context_loads > 0


def test_tokencake_loads_a_conversation_whose_call_ends_early_at_its_admission() -> None:
    """Observed calls of 20 s make T_fc 11 s for a call that takes 2 s: the
    holder is ready long before the upload is due, and its admission loads
    the conversation back (its request waiting for the transfer)."""
    policy = TokencakePolicy()
    policy.observe(EngineEvent(0.0, EventKind.TOOL_CALL_END, agent="A", stage="r",
                               value=20.0))
    _, sink, _ = run_react(policy, True, budget=1000)
    loads = [e for e in sink.events if e.kind is EventKind.CONTEXT_LOAD_START]
    first = loads[0]
    assert first.request_id is not None  # with its holder
    start = next(e for e in sink.events if e.kind is EventKind.REQUEST_START
                 and e.request_id == first.request_id)
    assert start.t >= first.t + first.value - 1e-9
    offload = next(e for e in sink.events if e.kind is EventKind.CONTEXT_OFFLOAD)
    assert first.t == pytest.approx(offload.t + 2.0)  # the call's true end


def test_astraea_oracle_reads_the_true_length_where_astraea_reads_history() -> None:
    """After rounds of this stage averaged 100 s, astraea expects 100 s of the
    next (HRRN (10 + 100) / 100); the oracle variant its profiled true length
    (5 s at 0.1 s/token: (10 + 5) / 5). The oracle is not in `--policy all`."""
    r = replace(request(1, 1, ONE, "a", output_tokens=50), queued_at=0.0)
    v = view(ONE, [task(1, ONE, a="active")], [], [r], t=10.0)
    done = EngineEvent(0.0, EventKind.REQUEST_FINISH, 7, 2, "A", "a", value=100.0)
    plain, oracle = make_policy("astraea"), make_policy("astraea-oracle")
    for p in (plain, oracle):
        p.observe(done)
    assert isinstance(plain, AstraeaPolicy) and isinstance(oracle, AstraeaPolicy)
    assert plain.ratio(v, r) == pytest.approx(1.1) and oracle.ratio(v, r) == pytest.approx(3.0)
    assert "astraea-oracle" not in POLICY_NAMES and "astraea-oracle" in ALL_POLICY_NAMES
