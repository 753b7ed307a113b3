"""TOPAS's defaults beyond section IV, each pinned on a small hand-computed case:
idle prefixes kept while there is room, the task weight (linear aging and the
remaining-path factor), the exchange test and the swap-only rule for
preemptions, and the overdue guard (docs/topas.md, "Extensions")."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.topas_views import CHAIN, FORK, request, task, view, workflow
from topasd.model import EngineEvent, EngineView, EventKind, Request, TopasError, Workflow
from topasd.scheduler import make_policy
from topasd.scheduler.params import PAPER, TopasParams, check_variant
from topasd.scheduler.topas import LOAD_WINDOW_S, TopasPolicy, _Search, averaged_load

BIG = workflow("big", {"a": (), "b": ("a",), "c": ("b",)}, prefix=2000)
PRIOR = 0.1 * 256  # a stage's profiled service: 256 output tokens at 0.1 s (COSTS)


def policy(**params: object) -> TopasPolicy:
    """Section IV as the paper gives it, plus the extension under test."""
    return TopasPolicy(TopasParams(**{"reservation": "full", **PAPER, **params}))


def test_the_defaults_and_topas_paper() -> None:
    """`topas` runs every extension below by default; `topas-paper` none."""
    assert TopasPolicy().params == TopasParams(
        start_gate=True, preempt_margin=1.0, pack_order="arrival", age_curve="linear",
        srpt=1.0, keep_idle=True, preempt_exchange=True, swap_only=True, overdue=2.0,
        fresh_hol=1.0)
    paper = make_policy("topas-paper").params  # type: ignore[attr-defined]
    assert (paper.age_curve, paper.srpt, paper.keep_idle, paper.preempt_exchange,
            paper.swap_only, paper.overdue, paper.fresh_hol, paper.started_hol) == (
                "log", 0.0, False, False, False, None, None, None)
    with pytest.raises(TopasError, match="topas-paper runs with keep_idle=False"):
        check_variant("topas-paper", {"keep_idle": True})
    with pytest.raises(TopasError, match="age_curve must be 'log' or 'linear'"):
        TopasParams(age_curve="cubic")


# ---------------------------------------------------------------- keep_idle


def _idle_a_view(budget: int, last_used: dict[str, float] | None = None):  # type: ignore[no-untyped-def]
    """Task 2 waits at stage b (20 KV tokens); A and C sit idle on the GPU."""
    rb = request(2, 2, CHAIN, "b")
    v = view(CHAIN, [task(2, CHAIN, a="done", b="active")], [], [rb], budget=budget,
             gpu=("A", "C"))
    used = last_used or {}
    return replace(v, prefixes={a: replace(p, last_used=used.get(a, 0.0))
                                for a, p in v.prefixes.items()})


@pytest.mark.parametrize(("budget", "evicted"), [(1000, ()), (300, ("A",)), (200, ("A", "C"))])
def test_keep_idle_evicts_only_the_idle_prefixes_the_room_needs(
        budget: int, evicted: tuple[str, ...]) -> None:
    """Loading B (100) for its request (20) leaves room for both idle prefixes
    (100 each, 64 tokens kept free), for one (C, used more recently), or for
    none; the paper evicts every idle prefix."""
    v = _idle_a_view(budget, {"A": 1.0, "C": 5.0})
    d = policy(keep_idle=True).decide(v)
    assert (d.admit, d.load, d.evict) == ((2,), ("B",), evicted)
    assert policy().decide(v).evict == ("A", "C")


def test_keep_idle_charges_no_move_for_an_idle_prefix_that_stays() -> None:
    """Eq. 8 charges R_out and R_in; an idle prefix kept on the GPU moves
    nowhere, so only B's load (100 tokens x 0.001 s) is charged."""
    v = _idle_a_view(1000)
    kept = policy(keep_idle=True).decide(v).chosen_candidate
    paper = policy().decide(v).chosen_candidate
    assert kept is not None and paper is not None
    assert kept.terms.j_move == pytest.approx(0.1)
    assert paper.terms.j_move == pytest.approx(0.1 + 2 * 0.1)  # A and C leave too


# ----------------------------------------------------------------- weights


def test_linear_aging_and_the_remaining_path_factor() -> None:
    """g_i = (1 + rho age / S) (H_age / L_hat_i): S = 3 stage priors, the
    expected path of a fresh task. Task 1 (stage a, age S) has its whole path
    ahead; task 2 (stage c, age S/2) one stage."""
    s_path = 3 * PRIOR
    t = s_path
    r1 = request(1, 1, CHAIN, "a")
    r2 = request(2, 2, CHAIN, "c", arrival=t / 2)
    tasks = [task(1, CHAIN, a="active"),
             task(2, CHAIN, arrival=t / 2, a="done", b="done", c="active")]
    v = view(CHAIN, tasks, [], [r1, r2], t=t)
    g = _Search(policy(age_curve="linear", srpt=1.0, h_age=10.0, rho=1.0), v).g
    assert g[1] == pytest.approx((1 + 1.0) * 10 / s_path)
    assert g[2] == pytest.approx((1 + 0.5) * 10 / PRIOR)
    log = _Search(policy(h_age=10.0, rho=1.0), v).g  # the paper: Eq. 12 only
    assert log[1] == pytest.approx(1 + math.log1p(t / 10))
    assert log[2] == pytest.approx(1 + math.log1p(t / 2 / 10))


def test_the_remaining_path_factor_applies_without_aging() -> None:
    """topas-noaging keeps the remaining-path factor: only Eq. 12 is off."""
    r = request(2, 2, CHAIN, "c")
    v = view(CHAIN, [task(2, CHAIN, a="done", b="done", c="active")], [], [r], t=50.0)
    assert _Search(policy(aging=False, srpt=1.0, h_age=10.0), v).g[2] == pytest.approx(
        10 / PRIOR)


# -------------------------------------------------------------- preemption


def _swap_case(running_output: int, waiting_output: int = 20):  # type: ignore[no-untyped-def]
    """Task 9's c round (10 tokens generated, started 1 s ago) holds C; task
    1's a round needs A, and the two prefixes do not fit together."""
    running = request(9, 9, CHAIN, "c", running=True, generated=10, started_at=99.0,
                      output_tokens=running_output)
    waiting = request(1, 1, CHAIN, "a", output_tokens=waiting_output)
    tasks = [task(9, CHAIN, a="done", b="done", c="active"), task(1, CHAIN, a="active")]
    budget = 100 + 10 + running_output + 100  # not the 30 more A's request needs too
    return view(CHAIN, tasks, [running], [waiting], t=100.0, budget=budget, gpu=("C",))


@pytest.mark.parametrize(("running_output", "swaps"), [(20, False), (2000, True)])
def test_the_exchange_test_preempts_only_for_more_time_than_it_costs(
        running_output: int, swaps: bool) -> None:
    """The admitted round (D_hat 2 s, all on its task's path) would start
    rho_P earlier: the running round's remaining service, 1 s of 2 s or 199 s
    of 200 s. The preempted round loses its 1 s of service and waits about the
    admitted round's 2 s (prefill is free here: nothing redone delays others).
    1 < 3: wait; 199 > 3: preempt. Eq. 13 alone preempts in both."""
    v = _swap_case(running_output)
    assert policy().decide(v).preempt == (9,)
    d = policy(preempt_exchange=True).decide(v)
    assert (d.preempt, d.admit) == (((9,), (1,)) if swaps else ((), ()))


@pytest.mark.parametrize(("prefix", "swaps"), [(100, True), (1000, False)])
def test_the_exchange_test_counts_the_preempted_prefix_coming_back(
        prefix: int, swaps: bool) -> None:
    """The running c round has 3.5 s of its 4.5 s left (rho_P = 3.5); it loses
    1 s of service and waits the admitted round's 2 s, and since the swap
    moves C out, also C's way back in: 0.1 s for 100 tokens, 1 s for 1,000
    (at 0.001 s a token). 3.1 < 3.5: preempt; 4 > 3.5: wait (Eq. 13 alone
    preempts in both)."""
    wf = workflow(f"chain{prefix}", {"a": (), "b": ("a",), "c": ("b",)}, prefix=prefix)
    running = request(9, 9, wf, "c", running=True, generated=10, started_at=99.0,
                      output_tokens=45)
    tasks = [task(9, wf, a="done", b="done", c="active"), task(1, wf, a="active")]
    v = view(wf, tasks, [running], [request(1, 1, wf, "a", output_tokens=20)], t=100.0,
             budget=2 * prefix + 10 + 45, gpu=("C",))
    assert policy().decide(v).preempt == (9,)
    d = policy(preempt_exchange=True).decide(v)
    assert (d.preempt, d.admit) == (((9,), (1,)) if swaps else ((), ()))


def test_swap_only_refuses_a_preemption_for_kv_and_keeps_a_prefix_swap() -> None:
    """Preempting a round that holds more KV than its prefix (2,010 > 100
    tokens) takes running work's room: refused. Under 2,000-token prefixes a
    round of 20 is a prefix swap: allowed, as the paper does."""
    assert policy(swap_only=True).decide(_swap_case(2000)).preempt == ()
    running = request(9, 9, BIG, "c", running=True, generated=1, started_at=99.0)
    waiting = request(1, 1, BIG, "a", output_tokens=500)
    tasks = [task(9, BIG, a="done", b="done", c="active"), task(1, BIG, a="active")]
    v = view(BIG, tasks, [running], [waiting], t=100.0, budget=3010, gpu=("C",))
    assert policy(swap_only=True).decide(v).preempt == (9,)


# ----------------------------------------------------------------- overdue


def _overdue_view(t: float):  # type: ignore[no-untyped-def]
    """Task 1 (arrived at 0) waits at stage a; three tasks that arrived 1 s ago
    wait at stage b. Only one prefix fits: B's three rounds score more."""
    old = request(1, 1, CHAIN, "a", output_tokens=20)
    new = [request(i, i, CHAIN, "b", output_tokens=20, arrival=t - 1) for i in (2, 3, 4)]
    tasks = [task(1, CHAIN, a="active"),
             *(task(i, CHAIN, arrival=t - 1, a="done", b="active") for i in (2, 3, 4))]
    return view(CHAIN, tasks, [], [old, *new], t=t, budget=200)


def test_an_overdue_task_is_served_next() -> None:
    """Before any task finished, a task's age is measured against its
    workflow's fresh path (76.8 s): task 1 (25 s) is not overdue and B wins.
    Once three tasks finished in 10 s each, 25 s is 2.5 times that: every
    candidate covers A, and task 1 is admitted."""
    pol = policy(overdue=2.0)
    assert pol.decide(_overdue_view(25.0)).admit == (2, 3, 4)
    done = (7, 8, 9)
    for i in done:  # three tasks of the same workflow arrive and finish
        pol.observe(EngineEvent(0.0, EventKind.TASK_ARRIVE, task_id=i, note=CHAIN.name))
        pol.observe(EngineEvent(10.0, EventKind.TASK_FINISH, task_id=i, value=10.0))
    d = pol.decide(_overdue_view(25.0))
    assert d.admit == (1,)
    assert all("A" in c.resident for c in d.candidates if c.resident)


def test_the_oldest_overdue_task_is_served_first() -> None:
    """Task 1 (Chain-like, fresh path 76.8 s) has waited 160 s, 2.1 times its
    path; task 2 (one stage, 25.6 s) 100 s, 3.9 times. Both are overdue, and
    the older is served (FIFO bounds the largest time in the system), though
    the younger's multiple is larger. One prefix fits."""
    short = workflow("short", {"s": ()})
    old = request(1, 1, CHAIN, "a")
    young = request(2, 2, short, "s", arrival=60.0)
    v = view([CHAIN, short], [task(1, CHAIN, a="active"), task(2, short, arrival=60.0,
                                                                s="active")],
             [], [old, young], t=160.0, budget=200)
    assert policy(overdue=2.0).decide(v).admit == (1,)
    # with only the young task overdue (the old one at 1.3 times its path), it is served
    v = view([CHAIN, short], [task(1, CHAIN, arrival=60.0, a="active"),
                              task(2, short, arrival=60.0, s="active")],
             [], [replace(old, task_arrival=60.0), young], t=160.0, budget=200)
    assert policy(overdue=2.0).decide(v).admit == (2,)


# ---------------------------------------------------------------- started_hol

def _running_a_round(t: float) -> Request:
    """Started task 8's a round, running since t - 1: room that will free."""
    return request(80, 8, CHAIN, "a", running=True, generated=1, started_at=t - 1)


def _late_started_view(t: float):  # type: ignore[no-untyped-def]
    """Started task 9 waits with a b round (1,000 input tokens, ready at 0)
    that does not fit in the 400-token pool, B's prefix on the host; new task
    2 (arrived 5 s ago) waits with a 20-token a round, A's prefix on the GPU,
    where started task 8's a round runs."""
    late = request(91, 9, CHAIN, "b", input_tokens=1000)
    young = request(2, 2, CHAIN, "a", arrival=t - 5)
    tasks = [task(8, CHAIN, a="active"), task(9, CHAIN, a="done", b="active"),
             task(2, CHAIN, arrival=t - 5, a="active")]
    return view(CHAIN, tasks, [_running_a_round(t)], [late, young], t=t, budget=400,
                gpu=("A",))


@pytest.mark.parametrize(("started_hol", "t", "starts"),
                         [(None, 200.0, True), (1.0, 10.0, True), (1.0, 200.0, False)])
def test_started_hol_starts_no_new_task_while_a_started_request_waits_late(
        started_hol: float | None, t: float, starts: bool) -> None:
    """The fresh path of the chain is 76.8 s. Task 9's b round fits in no
    candidate, so every candidate leaves B out and no fill sees it. After 10 s
    it has waited less than that path and task 2 starts (backfilling); after
    200 s it has waited more, and no new task starts until it runs. Without
    `started_hol` task 2 always starts."""
    pol = policy(start_gate=True, pack_order="arrival", started_hol=started_hol)
    assert pol.decide(_late_started_view(t)).admit == ((2,) if starts else ())


def test_started_hol_does_not_close_an_engine_with_nothing_running() -> None:
    """The gate waits for running requests to free room for the late one;
    with none running and a late round the empty pool cannot hold (1,010
    tokens and its prefix in 400), closing it would leave the engine idle
    for good: new task 2 starts."""
    v = _late_started_view(200.0)
    pol = policy(start_gate=True, pack_order="arrival", started_hol=1.0)
    assert pol.decide(replace(v, running=())).admit == (2,)


def _idle_late_view(budget: int):  # type: ignore[no-untyped-def]
    """Nothing runs; started task 9's b round (1,010 tokens with its decode,
    B's 100-token prefix on the host) has waited 200 s; new tasks 2-4 wait
    with 20-token a rounds, A's prefix on the GPU."""
    t = 200.0
    young = [request(i, i, CHAIN, "a", arrival=t - 5) for i in (2, 3, 4)]
    tasks = [task(9, CHAIN, a="done", b="active"),
             *(task(i, CHAIN, arrival=t - 5, a="active") for i in (2, 3, 4))]
    late = request(91, 9, CHAIN, "b", input_tokens=1000)
    return view(CHAIN, tasks, [], [late, *young], t=t, budget=budget, gpu=("A",))


def test_started_hol_holds_an_idle_engine_for_a_late_request_that_fits_it() -> None:
    """With nothing running, the late round fits the empty 1,150-token pool
    (1,110 with its prefix) but not beside A's prefix and a new task's round.
    Gating idles nothing here: the late round takes the pool, where without
    `started_hol` the three new tasks score more and take it."""
    v = _idle_late_view(1150)
    assert policy(start_gate=True, pack_order="arrival", started_hol=None).decide(
        v).admit == (2, 3, 4)
    assert policy(start_gate=True, pack_order="arrival", started_hol=1.0).decide(
        v).admit == (91,)


def test_started_hol_lifts_a_gate_under_which_an_idle_engine_would_stay_idle() -> None:
    """Nothing runs. Late started task 9's b round fits the empty 1,110-token
    pool only alone, and `hol_age=0` keeps room at B for the oldest task's
    round, new task 2's, which the gate holds back: no candidate admits
    anything under the gate, so the search runs without it and task 2's
    round starts (before, the engine stayed idle for good)."""
    solo_b = workflow("solo_b", {"b": ()})
    late = replace(request(91, 9, CHAIN, "b", input_tokens=1000), task_arrival=10.0)
    new = request(2, 2, solo_b, "b")
    tasks = [task(9, CHAIN, arrival=10.0, a="done", b="active"), task(2, solo_b, b="active")]
    v = view([CHAIN, solo_b], tasks, [], [late, new], t=200.0, budget=1110)
    pol = policy(start_gate=True, pack_order="arrival", started_hol=1.0, hol_age=0.0)
    assert pol.decide(v).admit == (2,)


def test_started_hol_lets_new_tasks_into_the_room_a_late_request_leaves() -> None:
    """In a 1,500-token pool the late round fits beside the running one, and
    so does new task 2's: a candidate that admits every late request may
    start new tasks in the room left; one that leaves it waiting may not."""
    v = replace(_late_started_view(200.0), budget_tokens=1500)
    d = policy(start_gate=True, pack_order="arrival", started_hol=1.0).decide(v)
    assert d.admit == (91, 2)
    assert all(91 in c.admit for c in d.candidates if 2 in c.admit)


def test_started_hol_counts_the_wait_since_the_request_last_entered_the_queue() -> None:
    """A round ready at 0 that ran and was preempted 10 s ago has waited 10 s,
    less than the chain's fresh path: new task 2 starts."""
    v = _late_started_view(200.0)
    requeued = replace(v.waiting[0], queued_at=190.0, preemptions=1)
    pol = policy(start_gate=True, pack_order="arrival", started_hol=1.0)
    assert pol.decide(replace(v, waiting=(requeued, v.waiting[1]))).admit == (2,)


def test_started_hol_needs_the_start_gate() -> None:
    """`started_hol` closes the start gate: without the gate it changes nothing."""
    pol = policy(start_gate=False, pack_order="arrival", started_hol=1.0)
    assert pol.decide(_late_started_view(200.0)).admit == (2,)


def test_started_hol_sees_the_whole_queue_past_the_candidate_window() -> None:
    """70 requests wait, past the window of 64 that the candidates weigh. B's
    first task in fill order, started task 8 (its round ready 1 s ago), fills
    the window's reach of B, so late task 9's round (ready at 0) is left out
    of the window; the gate still sees it and no new task starts."""
    t = 200.0
    young = [request(100 + i, 100 + i, CHAIN, "a", arrival=t - 5) for i in range(67)]
    recent = replace(request(81, 8, CHAIN, "b", input_tokens=400, arrival=-10.0),
                     ready_at=t - 1, queued_at=t - 1)
    late = request(91, 9, CHAIN, "b", input_tokens=1000)
    tasks = [task(8, CHAIN, arrival=-10.0, a="done", b="active"),
             task(9, CHAIN, a="done", b="active"), task(7, CHAIN, a="active"),
             *[task(r.task_id, CHAIN, arrival=t - 5, a="active") for r in young]]
    running = replace(_running_a_round(t), id=70, task_id=7)
    v = view(CHAIN, tasks, [running], [recent, late, *young], t=t, budget=700, gpu=("A",))
    window = {"start_gate": True, "pack_order": "arrival", "window": 1.0, "window_cap": 64}
    new_tasks = {r.id for r in young}
    pol = policy(**window)
    assert late not in _Search(pol, v).view.waiting  # the window left it out
    assert set(pol.decide(v).admit) & new_tasks
    gated = policy(**window, started_hol=1.0)
    assert not set(gated.decide(v).admit) & new_tasks


# ---------------------------------------------------------------- fresh_hol

def _new_tasks_view(wf: Workflow, t: float, started: list[Request], budget: int,
                    old_input: int = 140):  # type: ignore[no-untyped-def]
    """New task 1 (arrived at 0) waits with an a round (old_input + 10
    tokens) that does not fit; new task 2 (arrived 5 s ago) with a 20-token
    one that does. A round of started task 9 runs (110 tokens); `started`
    are its waiting rounds."""
    running = request(90, 9, wf, "c" if started else "a", running=True, generated=1,
                      started_at=0.0, output_tokens=100)
    old = request(1, 1, wf, "a", input_tokens=old_input)
    young = request(2, 2, wf, "a", arrival=t - 5)
    stages = {"a": "done", "b": "active", "c": "active"} if started else {"a": "active"}
    tasks = [task(9, wf, **stages), task(1, wf, a="active"), task(2, wf, arrival=t - 5, a="active")]
    return view(wf, tasks, [running], [*started, old, young], t=t, budget=budget,
                gpu=tuple(a for a in wf.agents if a != "D"))


@pytest.mark.parametrize(("fresh_hol", "t", "passes"),
                         [(None, 200.0, True), (1.0, 10.0, True), (1.0, 200.0, False)])
def test_fresh_hol_lets_no_new_task_pass_one_that_waited_its_expected_path(
        fresh_hol: float | None, t: float, passes: bool) -> None:
    """The fresh path of the chain is 76.8 s. Task 1 does not fit; task 2
    does. After 10 s task 1 has waited less than its path and task 2 starts
    past it (backfilling); after 200 s it has waited more, and task 2 waits
    behind it. Without `fresh_hol` task 2 always passes."""
    pol = policy(start_gate=True, pack_order="arrival", fresh_hol=fresh_hol)
    v = _new_tasks_view(CHAIN, t, [], budget=340)
    assert pol.decide(v).admit == ((2,) if passes else ())


@pytest.mark.parametrize(("fresh_hol", "passes"), [(None, True), (1.0, False)])
def test_fresh_hol_holds_in_the_general_fill(fresh_hol: float | None, passes: bool) -> None:
    """The same on a fork whose started task has a waiting b round beside its
    running c round (no solo agent: the general fill). Its b round goes
    first; then task 1's round (250 tokens) does not fit, not even in the
    room B's prefix would free, and, as task 1 waited 200 s, task 2 waits
    behind it."""
    pol = policy(start_gate=True, pack_order="arrival", fresh_hol=fresh_hol)
    b_round = request(91, 9, FORK, "b")
    v = _new_tasks_view(FORK, 200.0, [b_round], budget=510, old_input=240)
    assert "B" not in _Search(pol, v).solo_agents
    assert sorted(pol.decide(v).admit) == ([2, 91] if passes else [91])


def _final_scene(extra_waiting: int = 0) -> EngineView:
    """Task 1's last request (stage c, 856 KV tokens with its 100-token prefix
    off the GPU, more than the 950 free now) waits while three requests run
    on A; task 9's request on A would fit now but runs past the first of
    them to end (t*, 19.6 s), when the last request's room frees."""
    old = task(1, CHAIN, a="done", b="done", c="active")
    last = request(10, 1, CHAIN, "c", input_tokens=600, output_tokens=256)
    running = [request(20 + i, 2 + i, CHAIN, "a", running=True, input_tokens=100,
                       output_tokens=50, started_at=0.0, arrival=1.0) for i in range(3)]
    tasks = [old, *(task(2 + i, CHAIN, a="active", arrival=1.0) for i in range(3))]
    young = [task(9 + i, CHAIN, arrival=5.0, a="active") for i in range(1 + extra_waiting)]
    late = [request(30 + i, 9 + i, CHAIN, "a", input_tokens=100, output_tokens=300, arrival=5.0)
            for i in range(1 + extra_waiting)]
    return view(CHAIN, [*tasks, *young], running, [last, *late], t=6.0, budget=1500,
                gpu=("A",))


def test_final_reserve_keeps_a_last_requests_room_in_every_candidate() -> None:
    """`final_reserve`: no candidate leaves the oldest started task's last
    request out and gives its room to a lighter task's request that would
    run past t*; off (the default), the younger request is admitted."""
    assert TopasPolicy().decide(_final_scene()).admit == (30,)
    pol = TopasPolicy(TopasParams(final_reserve=1.0))
    decision = pol.decide(_final_scene())
    assert pol.has_slack() and pol.load == (2.0, 3.0, 6.0)
    assert decision.admit == () and decision.load == ()


def test_final_reserve_holds_only_while_the_engine_has_slack() -> None:
    """With as many requests waiting as running (no slack), the room is not
    kept: the younger requests are admitted as with the rule off."""
    pol = TopasPolicy(TopasParams(final_reserve=1.0))
    decision = pol.decide(_final_scene(extra_waiting=1))
    assert not pol.has_slack()
    assert decision.admit == TopasPolicy().decide(_final_scene(extra_waiting=1)).admit != ()


def test_averaged_load_moves_toward_the_latest_counts() -> None:
    """|W_t| and |Q_t| move toward the latest counts by 1 - exp(-dt /
    LOAD_WINDOW_S)."""
    first = averaged_load((0.0, 0.0, -1.0), _final_scene())
    assert first == (2.0, 3.0, 6.0)
    later = replace(_final_scene(extra_waiting=2), t=6.0 + LOAD_WINDOW_S)
    waiting, running, t = averaged_load(first, later)
    keep = math.exp(-1.0)
    assert t == 6.0 + LOAD_WINDOW_S
    assert waiting == pytest.approx(keep * 2.0 + (1 - keep) * 4.0)
    assert running == pytest.approx(3.0)
