"""TOPAS's equations pinned on small hand-computed cases (paper section IV)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.topas_views import (
    CHAIN,
    COSTS,
    FORK,
    exhaustive_search,
    request,
    task,
    view,
    workflow,
)
from topasd.model import EngineEvent, EventKind, Location, Request, TaskView, TopasError, Workflow
from topasd.scheduler import make_policy
from topasd.scheduler.params import PAPER, TopasParams, check_variant
from topasd.scheduler.topas import TopasPolicy, _best, _Search


def policy(**params: object) -> TopasPolicy:
    """Section IV as the paper gives it (the hand-computed cases below)."""
    return TopasPolicy(TopasParams(**{"reservation": "full", **PAPER, **params}))


def observe(pol: TopasPolicy, agent: str, stage: str, stage_services: list[float],
            request_service: float | None = None) -> None:
    for s in stage_services:
        pol.model.observe_stage((agent, stage), s)
    if request_service is not None:
        pol.model.observe_request((agent, stage), request_service)


def running_map(reqs: list[Request]) -> dict[str, Request]:
    return {r.stage: r for r in reqs}


def _fork_branches_waiting() -> tuple[TopasPolicy, Request, Request, TaskView]:
    """A fork-join task past `a` whose branches b (0 or 10 s) and c (5 s)
    wait, d (2 s) after them; D_hat is 5 s on both branches."""
    pol = policy()
    observe(pol, "A", "a", [1])
    observe(pol, "B", "b", [0, 10], request_service=5)
    observe(pol, "C", "c", [5], request_service=5)
    observe(pol, "D", "d", [2])
    rb, rc = request(1, 1, FORK, "b"), request(2, 1, FORK, "c")
    return pol, rb, rc, task(1, FORK, a="done", b="active", c="active")


# ----------------------------------------------------------------- Eqs. 4-7


def test_chain_is_the_exact_sum_of_expected_residuals() -> None:
    pol = policy()
    observe(pol, "A", "a", [10, 20])
    observe(pol, "B", "b", [5, 15], request_service=10)
    observe(pol, "C", "c", [30])
    # Task 1: stage a has run 4 s (started at t=0, now t=4); b, c unstarted.
    ra = request(1, 1, CHAIN, "a", running=True, started_at=0.0)
    t1 = task(1, CHAIN, a="active")
    # Task 2: a done, its b request waits.
    rb = request(2, 2, CHAIN, "b")
    t2 = task(2, CHAIN, a="done", b="active")
    s = _Search(pol, view(CHAIN, [t1, t2], [ra], [rb], t=4.0))
    # Eq. 4: Z_a = X_a - 4 | X_a > 4 -> {6, 16}, mean 11; then E[X_b] + E[X_c] = 10 + 30.
    assert s.paths.lhat(t1, running_map([ra])) == pytest.approx(11 + 10 + 30)
    assert s.paths.lhat(t2, {}) == pytest.approx(10 + 30)
    # Eq. 6: D_hat_b = 10, so Z_b -> [X_b - 10]_+ in {0, 5}: 40 - (2.5 + 30) = 7.5.
    assert s.delta(rb, {}) == pytest.approx(7.5)


def test_fork_join_takes_the_expectation_outside_the_longest_path() -> None:
    pol, rb, rc, t1 = _fork_branches_waiting()
    s = _Search(pol, view(FORK, [t1], [], [rb, rc]))
    # The critical branch flips: B (0 or 10) vs C (5): E[max] = 7.5, not max(E) = 5.
    assert s.paths.lhat(t1, {}) == pytest.approx(7.5 + 2)
    # Eq. 6 alone: completing C leaves E[max(B, 0)] = 5; completing B leaves
    # max([B-5]_+, 5) = 5: each reduces the path by 2.5.
    assert s.delta(rc, {}) == pytest.approx(2.5)
    assert s.delta(rb, {}) == pytest.approx(2.5)
    # Eq. 7: after B, C's conditional progress is E[max([B-5]_+,5)] - E[[B-5]_+] = 2.5,
    # and the sequential terms add up to the joint reduction 9.5 - 4.5 = 5.
    b_idx = FORK.topo_order.index("b")
    after_b = {b_idx: 5.0}
    assert s.delta(rc, after_b) == pytest.approx(2.5)
    assert s.delta(rb, {}) + s.delta(rc, after_b) == pytest.approx(9.5 - 4.5)


def test_unobserved_pairs_fall_back_to_the_profiled_estimate() -> None:
    pol = policy()
    r = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=30)
    s = _Search(pol, view(CHAIN, [task(1, CHAIN, a="active")], [], [r]))
    # T_prefill(|input|) + T_decode * max_new = 0 + 0.1 * 30
    assert pol.model.request_estimate(r, COSTS) == pytest.approx(3.0)
    # The stage prior (256-token defaults of StageProfile) is a point mass.
    assert s.paths.lhat(s.view.tasks[1], {}) == pytest.approx(3 * 0.1 * 256)


def test_a_waiting_round_past_every_observation_is_worth_one_more_round() -> None:
    """Eq. 4 conditions on X > e, which has probability zero once a stage's
    service exceeds every observation. A round of the stage still waits, so
    the residual is one more round at the pair's mean round service: the
    round keeps its value instead of dropping to nothing (and starving)."""
    pol = policy()
    observe(pol, "A", "a", [10, 20], request_service=8)
    observe(pol, "B", "b", [5])
    observe(pol, "C", "c", [7])
    t1 = task(1, CHAIN, a="active")
    t1 = replace(t1, stages={**t1.stages, "a": replace(t1.stages["a"], service_s=25.0)})
    r = request(1, 1, CHAIN, "a")
    s = _Search(pol, view(CHAIN, [t1], [], [r]))
    assert s.paths.lhat(t1, {}) == pytest.approx(8 + 5 + 7)
    assert s.delta(r, {}) == pytest.approx(8)  # E[min(Z, D_hat)] with Z = D_hat = 8
    # Before any round finished, the profile prices the round (256-token defaults).
    fresh = policy()
    observe(fresh, "A", "a", [10, 20])
    s = _Search(fresh, view(CHAIN, [t1], [], [r]))
    assert s.paths.residuals(t1, {})[0].mean == pytest.approx(0.1 * 256)


def test_a_running_round_past_every_observation_keeps_one_percent_of_its_estimate() -> None:
    """Eq. 4's floor with a request running: stage a has 25 s of finished
    rounds (beyond both observations) and its request has run 50 s of a 10 s
    estimate. The residual is what the request still needs, at least 1% of
    D_hat: 0.1 s, not negative and not nothing."""
    pol = policy()
    observe(pol, "A", "a", [10, 20], request_service=10)
    t1 = task(1, CHAIN, a="active")
    t1 = replace(t1, stages={**t1.stages, "a": replace(t1.stages["a"], service_s=25.0)})
    r = request(1, 1, CHAIN, "a", running=True, started_at=0.0)
    s = _Search(pol, view(CHAIN, [t1], [r], [], t=50.0))
    assert s.paths.residuals(t1, running_map([r]))[0].mean == pytest.approx(0.1)


def test_the_longest_path_starts_at_the_longest_entry_stage() -> None:
    """Eq. 5 on a DAG with two entry stages: L = max(Z_a, Z_b) + Z_c."""
    join = workflow("join", {"a": (), "b": (), "c": ("a", "b")})
    pol = policy()
    observe(pol, "A", "a", [10])
    observe(pol, "B", "b", [2])
    observe(pol, "C", "c", [5])
    t1 = task(1, join, a="active", b="active")
    s = _Search(pol, view(join, [t1], [], [request(1, 1, join, "a"), request(2, 1, join, "b")]))
    assert s.paths.lhat(t1, {}) == pytest.approx(10 + 5)


def test_the_service_model_keeps_the_last_window_of_observations() -> None:
    """F_{a,v} is the empirical distribution of the last WINDOW stage services."""
    from topasd.scheduler.residual import WINDOW, ServiceModel

    model = ServiceModel()
    pair = ("A", "a")
    model.observe_stage(pair, 1000.0)
    for _ in range(WINDOW - 1):
        model.observe_stage(pair, 1.0)
    assert len(model.stage_values(pair)) == WINDOW and max(model.stage_values(pair)) == 1000.0
    model.observe_stage(pair, 1.0)
    assert model.stage_values(pair) == [1.0] * WINDOW
    dist = model.dist(pair)
    assert dist is not None and dist.mean == 1.0


# ------------------------------------------------------------ Eqs. 8-10


def test_preemption_revokes_the_credit_stored_at_admission() -> None:
    pol = policy()
    observe(pol, "A", "a", [10], request_service=10)
    observe(pol, "B", "b", [10], request_service=10)
    r1 = request(1, 1, CHAIN, "a")
    v1 = view(CHAIN, [task(1, CHAIN, a="active")], [], [r1])
    d1 = pol.decide(v1)
    assert d1.admit == (1,)
    credit = pol.credits[1]
    assert credit == pytest.approx(d1.chosen_candidate.terms.j_admit)
    assert credit > 0
    # Later r1 runs (3 tokens generated); an older task's b request competes and
    # the budget holds one prefix only: preempting r1 costs its credit (Eq. 10)
    # plus T_decode * y_r = 0.1 * 3 (Eq. 9).
    running = request(1, 1, CHAIN, "a", running=True, generated=3, started_at=0.0)
    rb = request(2, 2, CHAIN, "b")
    v2 = view(CHAIN, [task(1, CHAIN, a="active"), task(2, CHAIN, a="done", b="active")],
              [running], [rb], t=1.0, budget=130, gpu=("A",))
    with exhaustive_search():  # the swap loses: without pruning it is still logged
        d2 = pol.decide(v2)
    swap = [c for c in d2.candidates if c.preempt == (1,)]
    assert swap, "a candidate preempting r1 must be generated"
    for c in swap:
        assert c.terms.j_revoke == pytest.approx(credit)
        assert c.terms.j_redo == pytest.approx(0.1 * 3)
        # Eq. 13 subtracts J_revoke: the swap's ~10 s of progress would pay for
        # the move and the redo (~0.5), not for the revoked credit as well.
        assert c.terms.total < 0 < c.terms.total + c.terms.j_revoke
    assert (d2.preempt, d2.admit, d2.load) == ((), (), ())
    pol.observe(EngineEvent(2.0, EventKind.PREEMPT, request_id=1, task_id=1, agent="A",
                            stage="a"))
    assert 1 not in pol.credits


def test_running_requests_are_summed_per_agent_in_queue_order() -> None:
    """Q_t's per-agent terms (Eqs. 2, 9, 10) and each prefix set's sorted
    order, as the search reads them: whatever the queue interleaves."""
    pol = policy()
    ra1 = request(1, 1, FORK, "b", running=True, generated=3, started_at=0.0)
    rc = request(2, 1, FORK, "c", running=True, generated=1, started_at=0.0)
    ra2 = request(3, 2, FORK, "b", running=True, generated=5, output_tokens=20, started_at=0.0)
    pol.credits[3] = 2.5
    tasks = [task(1, FORK, a="done", b="active", c="active"),
             task(2, FORK, a="done", b="active")]
    s = _Search(pol, view(FORK, tasks, [ra1, rc, ra2], [], t=1.0))
    assert s.run_ids == {"B": [1, 3], "C": [2]}
    assert s.run_kv["B"] == ra1.demand(1.0) + ra2.demand(1.0)
    assert s.run_growth["B"] == [(7, 13), (15, 15)]
    assert s.run_revoke == {"B": 2.5, "C": 0.0}
    assert s.run_tasks == {"B": {1, 2}, "C": {1}}
    assert s.run_redo["B"] == pytest.approx(0.1 * (3 + 5))  # prefill is free in COSTS
    assert dict(s.running_stage) == {1: {"b": ra1, "c": rc}, 2: {"b": ra2}}
    both = frozenset({"C", "B", "A"})
    assert s.ordered(both) == ["A", "B", "C"]
    assert s.ordered(frozenset(["A", "B", "C"])) is s.ordered(both)  # once per set


@pytest.mark.parametrize(("drops_input", "redo"), [(True, 0.1 * 3 + 0.01 * 10), (False, 0.1 * 3)])
def test_preemption_redoes_the_prompt_prefill_when_the_engine_drops_it(
        drops_input: bool, redo: float) -> None:
    """Eq. 9 with a priced prefill (0.01 s per token): a preempted request
    decodes its 3 generated tokens again, and prefills its 10-token prompt
    again when the engine drops the prompt's KV on preemption."""
    pol = policy()
    costs = replace(COSTS, prefill_s_per_token=0.01, preempt_drops_input=drops_input)
    running = request(1, 1, CHAIN, "a", running=True, generated=3, started_at=0.0)
    rb = request(2, 2, CHAIN, "b")
    v = view(CHAIN, [task(1, CHAIN, a="active"), task(2, CHAIN, a="done", b="active")],
             [running], [rb], t=1.0, budget=130, gpu=("A",))
    s = _Search(pol, replace(v, costs=costs))
    states = s.pack(frozenset({"B"}))
    assert states and all(st.preempt == (1,) for st in states)
    for st in states:
        assert st.terms().j_redo == pytest.approx(redo)
        assert st.terms().j_revoke == 0.0  # r1 holds no credit here
        assert st.total == pytest.approx(st.terms().total)


def test_move_cost_is_charged_once_per_admitted_task_waiting_for_a_prefix() -> None:
    pol = policy(beta=0.0)
    # Two tasks each with b and c waiting; B and C are on host, A is resident and idle.
    reqs = [request(1, 1, FORK, "b"), request(2, 1, FORK, "c"),
            request(3, 2, FORK, "b"), request(4, 2, FORK, "c")]
    tasks = [task(i, FORK, a="done", b="active", c="active") for i in (1, 2)]
    d = pol.decide(view(FORK, tasks, [], reqs, gpu=("A",)))
    # Eq. 8: T_move = mu/B_swap (l_A out + l_B in + l_C in) = 0.001 * 300.
    t_move = 0.001 * 300
    by_state = {(c.resident, frozenset(c.admit)): c.terms for c in d.candidates}
    one_task = by_state[(("B", "C"), frozenset({1, 2}))]
    two_tasks = by_state[(("B", "C"), frozenset({1, 2, 3, 4}))]
    assert one_task.j_move == pytest.approx(t_move * 1)
    assert two_tasks.j_move == pytest.approx(t_move * 2)


@pytest.mark.parametrize(("location", "t_move"), [
    (Location.HOST, 0.001 * 100),  # mu l_A / B_swap
    (Location.NONE, 0.2 + 0.01 * 100),  # no host copy: T_prefill(l_A), recomputed
])
def test_a_prefix_with_no_host_copy_is_priced_as_its_prefill(
        location: Location, t_move: float) -> None:
    """Eq. 8 with a priced prefill (0.2 s + 0.01 s per token): loading A's
    100-token prefix costs its swap-in from the host, or its prefill when the
    host holds no copy."""
    pol = policy()
    v = view(CHAIN, [task(1, CHAIN, a="active")], [], [request(1, 1, CHAIN, "a")])
    prefix = replace(v.prefixes["A"], location=location, host_copy=location is Location.HOST)
    v = replace(v, prefixes={**v.prefixes, "A": prefix},
                costs=replace(COSTS, prefill_s_per_token=0.01, prefill_base_s=0.2))
    d = pol.decide(v)
    assert (d.admit, d.load) == ((1,), ("A",))
    assert d.chosen_candidate.terms.j_move == pytest.approx(t_move)


def test_greedypack_admits_a_fork_sibling_at_its_conditional_progress() -> None:
    """Eq. 7 inside GreedyPack: two parallel branches b and c of equal, certain
    length (10 s). Alone neither shortens the path, since the other is as long:
    Delta(b | {}) = Delta(c | {}) = 0. After b, c is worth its whole service:
    Delta(c | {b}) = 10. Packing through the zero-gain first choice, the state
    that admits both scores J_admit = L({}) - L({b, c}) = 10, and the credits
    stored at admission are 0 and 10."""
    pol = policy(aging=False, beta=0.0)
    observe(pol, "B", "b", [10.0], request_service=10.0)
    observe(pol, "C", "c", [10.0], request_service=10.0)
    reqs = [request(1, 1, FORK, "b"), request(2, 1, FORK, "c")]
    tk = task(1, FORK, a="done", b="active", c="active")
    d = pol.decide(view(FORK, [tk], [], reqs, gpu=("B", "C")))
    both = [c for c in d.candidates if set(c.admit) == {1, 2}]
    assert len(both) == 1 and both[0].terms.j_admit == pytest.approx(10.0)
    assert set(d.admit) == {1, 2}
    assert sorted(pol.credits.values()) == pytest.approx([0.0, 10.0])


# ----------------------------------------------------------------- Eq. 11


def test_reuse_counts_fork_children_each_and_a_join_once_its_siblings_finished() -> None:
    pol = policy(beta=2.0)
    # Task 1: a running -> b and c (fork children) are about to become ready.
    # Task 2: b running, c done -> the join d counts.
    # Task 3: b and c running -> the join d does not count yet.
    run = [request(1, 1, FORK, "a", running=True, started_at=0.0),
           request(2, 2, FORK, "b", running=True, started_at=0.0),
           request(3, 3, FORK, "b", running=True, started_at=0.0),
           request(4, 3, FORK, "c", running=True, started_at=0.0)]
    tasks = [task(1, FORK, a="active"), task(2, FORK, a="done", b="active", c="done"),
             task(3, FORK, a="done", b="active", c="active")]
    s = _Search(pol, view(FORK, tasks, run, [], gpu=("A", "B", "C")))
    # n_a(t) by the running predecessor's agent: B and C behind task 1's a, D behind task 2's b
    assert dict(s._reuse_counts()) == {("A", "B"): 1, ("A", "C"): 1, ("B", "D"): 1}
    # V_reuse = beta * sum_{a in R'} n_a mu l_a / B_swap over the resident set,
    # counting a stage only while its running predecessor's agent stays in R'.
    state = s.pack(frozenset({"A", "B", "C"}))[0]
    assert state.terms().v_reuse == pytest.approx(2.0 * (1 + 1) * 0.001 * 100)
    # a state that preempts the running predecessor gets no reuse for its
    # successors: without A, task 1's b and c are not about to become ready.
    without_a = s.pack(frozenset({"B", "C"}))[0]
    assert without_a.preempt == (1,)
    assert without_a.terms().v_reuse == 0.0
    assert s.pack(frozenset({"A", "B"}))[0].terms().v_reuse == pytest.approx(
        2.0 * 1 * 0.001 * 100)


def test_reuse_counts_kept_between_decisions_follow_each_task_and_its_running_stages() -> None:
    """The policy keeps each running task's reuse pairs while its view, its
    workflow and its running stages are the same objects: a task that runs
    other stages, or whose stage finished (a new view), is counted again,
    as a policy without the kept pairs counts it."""
    two = workflow("two", {"a": (), "b": (), "c": ("a",), "d": ("b",)})  # a -> c, b -> d
    run_a, run_b = (request(i, 1, two, v, running=True, started_at=0.0)
                    for i, v in ((1, "a"), (2, "b")))
    both = task(1, two, a="active", b="active")
    c_ready = task(1, two, a="active", b="active", c="done")
    pol = policy()
    steps = [(both, [run_a], {("A", "C"): 1}), (both, [run_b], {("B", "D"): 1}),
             (both, [run_a, run_b], {("A", "C"): 1, ("B", "D"): 1}), (c_ready, [run_a], {}),
             (c_ready, [run_a], {}), (both, [run_a], {("A", "C"): 1})]
    for t, run, want in steps:
        kept = _Search(pol, view(two, [t], run, [], gpu=("A", "B")))._reuse_counts()
        fresh = _Search(policy(), view(two, [t], run, [], gpu=("A", "B")))._reuse_counts()
        assert dict(kept) == dict(fresh) == want
    assert list(pol.reuse_memo) == [1]


def test_reuse_value_can_decide_which_prefix_is_loaded() -> None:
    """Eq. 13 adds V_reuse: task 1's a runs, so its b (agent B) is about to
    become ready. The budget holds A and one more prefix with one request.
    Task 3's c request (6 s) is worth more than task 2's b request (5 s), but
    loading B also keeps B's prefix for task 1's next stage: V_reuse = beta x
    mu l_B / B_swap = 20 x 0.1 = 2, so {A, B} scores 5 - 0.1 + 2 = 6.9 against
    {A, C}'s 6 - 0.1 = 5.9."""
    pol = policy(aging=False, beta=20.0, preempt=False)
    observe(pol, "B", "b", [5.0], request_service=5.0)
    observe(pol, "C", "c", [6.0], request_service=6.0)
    run = [request(1, 1, CHAIN, "a", running=True, started_at=0.0)]
    wait = [request(2, 2, CHAIN, "b"), request(3, 3, CHAIN, "c")]
    tasks = [task(1, CHAIN, a="active"), task(2, CHAIN, a="done", b="active"),
             task(3, CHAIN, a="done", b="done", c="active")]
    v = view(CHAIN, tasks, run, wait, t=1.0, budget=240, gpu=("A",))
    d = pol.decide(v)
    assert (d.admit, d.load) == ((2,), ("B",))
    terms = d.chosen_candidate.terms
    assert terms.v_reuse == pytest.approx(20.0 * 0.001 * 100)
    assert terms.total == pytest.approx(5.0 - 0.1 + 2.0)
    with exhaustive_search():
        d = pol.decide(v)
    by_resident = {c.resident: c.terms for c in d.candidates if c.admit}
    assert by_resident[("A", "C")].total == pytest.approx(6.0 - 0.1)
    assert (d.admit, d.load) == ((2,), ("B",))


# ----------------------------------------------------------------- Eq. 12


@pytest.mark.parametrize("rho", [1.0, 2.0])
@pytest.mark.parametrize(("aging", "winner"), [(True, 1), (False, 2)])
def test_aging_lets_an_old_task_overtake_a_new_one(aging: bool, winner: int, rho: float) -> None:
    pol = policy(rho=rho, h_age=50.0, aging=aging)
    observe(pol, "C", "c", [10], request_service=10)
    observe(pol, "A", "a", [12], request_service=12)
    old = request(1, 1, CHAIN, "c", arrival=0.0)
    new = request(2, 2, CHAIN, "a", arrival=100.0)
    tasks = [task(1, CHAIN, arrival=0.0, a="done", b="done", c="active"),
             task(2, CHAIN, arrival=100.0, a="active")]
    # Room for one prefix (100) and one request (20) only.
    d = pol.decide(view(CHAIN, tasks, [], [old, new], t=100.0, budget=120))
    assert d.admit == (winner,)
    if aging:
        g_old = 1 + rho * math.log1p(100 / 50)  # g_i(t) = 1 + rho log(1 + age / H_age)
        assert d.chosen_candidate.terms.j_admit == pytest.approx(g_old * 10)
    else:
        assert d.chosen_candidate.terms.j_admit == pytest.approx(12)


def test_observed_h_age_is_the_mean_service_of_the_last_finished_tasks() -> None:
    """H_age (Eq. 12) without a given value: the mean total LLM service of the
    last AGE_WINDOW finished tasks; an abandoned task gives no sample and
    leaves nothing behind (a long-running daemon keeps bounded state)."""
    from topasd.scheduler.topas import AGE_WINDOW

    pol = policy()

    def finish(tid: int, service: float) -> None:
        pol.observe(EngineEvent(0.0, EventKind.STAGE_FINISH, task_id=tid, agent="A",
                                stage="a", value=service))
        pol.observe(EngineEvent(0.0, EventKind.TASK_FINISH, task_id=tid))

    def h_age() -> float:
        return pol.age_scale(view(CHAIN, [], [], []), None)["chain"]  # type: ignore[arg-type]

    finish(1, 10.0)
    finish(2, 20.0)
    finish(3, 60.0)
    assert h_age() == 30.0  # the mean (the median would be 20)
    pol.observe(EngineEvent(0.0, EventKind.STAGE_FINISH, task_id=4, agent="A", stage="a",
                            value=1000.0))
    pol.observe(EngineEvent(0.0, EventKind.TASK_ABANDON, task_id=4, note="no call"))
    assert h_age() == 30.0 and 4 not in pol._task_service
    for tid in range(10, 10 + 3 * AGE_WINDOW):
        finish(tid, 5.0 if tid < 10 + 2 * AGE_WINDOW else 7.0)
    assert h_age() == 7.0 and len(pol._age_obs) == AGE_WINDOW
    assert not pol._task_service


# ----------------------------------------------------------------- Eq. 14


def test_equal_scores_go_to_the_smallest_prefix_set() -> None:
    """Two tasks with one stage left each (agents A and B), each request worth
    10 s, and room for one prefix: both states score 10 - 0.1 (loading the
    prefix). The documented tie-break picks the lexicographically smallest
    prefix set."""
    pair = workflow("pair", {"a": (), "b": ()})
    pol = policy(aging=False, beta=0.0)
    observe(pol, "A", "a", [10.0], request_service=10.0)
    observe(pol, "B", "b", [10.0], request_service=10.0)
    reqs = [request(1, 1, pair, "a"), request(2, 2, pair, "b")]
    tasks = [task(1, pair, a="active", b="done"), task(2, pair, a="done", b="active")]
    with exhaustive_search():
        d = pol.decide(view(pair, tasks, [], reqs, budget=120))
    totals = {c.resident: c.terms.total for c in d.candidates if c.admit}
    assert totals[("A",)] == totals[("B",)] == pytest.approx(9.9)
    assert (d.admit, d.load) == ((1,), ("A",))


def _free_preemption(margin: float = 0.0):
    """Task 2's a runs (nothing generated, no credit, prefill free: preempting
    it costs J_redo + J_revoke = 0). Task 1's b waits, B idle on the GPU, room
    for b only once A leaves; b's sibling c (tool wait) is as long as b, so
    admitting b progresses nothing. The swap scores exactly 0, as does S_t."""
    pol = policy(preempt_margin=margin)
    observe(pol, "B", "b", [10.0], request_service=10.0)
    observe(pol, "C", "c", [10.0], request_service=10.0)
    running = request(9, 2, FORK, "a", running=True, started_at=0.0, output_tokens=1000)
    tasks = [task(1, FORK, a="done", b="active", c="active"), task(2, FORK, a="active")]
    v = view(FORK, tasks, [running], [request(1, 1, FORK, "b")], t=1.0, budget=1220,
             gpu=("A", "B"))
    return pol.decide(v)


def test_equal_scores_go_to_the_state_with_fewer_preemptions() -> None:
    """Eq. 14's tie-break: fewer preemptions before more admissions."""
    d = _free_preemption()
    swap = [c for c in d.candidates if c.preempt]
    assert [(c.resident, c.admit, c.preempt) for c in swap] == [(("B",), (1,), (9,))]
    assert swap[0].terms.total == 0.0 == d.chosen_candidate.terms.total
    assert (d.preempt, d.admit, d.chosen_candidate.resident) == ((), (), ("A",))


def test_preempt_margin_keeps_a_preemption_that_scores_exactly_its_floor() -> None:
    """`preempt_margin` drops a preempting state only below m x (J_redo +
    J_revoke): a free swap scoring 0 meets the floor 0 and stays a candidate."""
    d = _free_preemption(margin=1.0)
    assert [(c.admit, c.preempt, c.terms.total) for c in d.candidates if c.preempt] == [
        ((1,), (9,), 0.0)]


@pytest.mark.parametrize(("k", "swaps"), [(0, True), (3, True), (2, False)])
def test_k_caps_the_preemptions_of_a_state(k: int, swaps: bool) -> None:
    """Three low-value requests of agent C block a valuable one of A, which
    fits only once all three leave: the swap preempts three requests, more
    than K = 2 allows (K = 0 is no cap)."""
    pol = policy(k=k)
    running = [request(9 + i, 9 + i, CHAIN, "c", running=True, generated=1, started_at=99.0,
                       output_tokens=1000) for i in range(3)]
    waiting = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=10)
    tasks = [*(task(9 + i, CHAIN, a="done", b="done", c="active") for i in range(3)),
             task(1, CHAIN, a="active")]
    d = pol.decide(view(CHAIN, tasks, running, [waiting], t=100.0, budget=3200))
    assert (d.preempt, d.admit) == (((9, 10, 11), (1,)) if swaps else ((), ()))
    if k:
        assert all(len(c.preempt) <= k for c in d.candidates)


# ------------------------------------------------------------ parameters


def test_parameters_are_validated_and_changeable_between_decisions() -> None:
    pol = policy()
    with pytest.raises(TopasError, match="beta"):
        pol.set_params(beta=-1)
    with pytest.raises(TopasError, match="unknown"):
        pol.set_params(gamma=1)
    pol.set_params(beta=3.5, k=2)
    assert (pol.params.beta, pol.params.k) == (3.5, 2)
    with pytest.raises(TopasError,
                       match=r"k=2\.5 must be a whole number: use an integer in \[0, 100000\]"):
        pol.set_params(k=2.5)


def test_integral_floats_are_taken_as_integers() -> None:
    """k=2.0 or seed=1.0 (JSON numbers, config files) work like 2 and 1."""
    pol = TopasPolicy(TopasParams(k=2.0, seed=1.0, m=3.0, samples=8.0))  # type: ignore[arg-type]
    assert all(type(getattr(pol.params, n)) is int for n in ("k", "seed", "m", "samples"))
    reqs = [request(i, i, CHAIN, "a") for i in (1, 2, 3)]
    tasks = [task(i, CHAIN, a="active") for i in (1, 2, 3)]
    d = pol.decide(view(CHAIN, tasks, [], reqs))
    assert len(d.admit) == 2  # the cap K = 2


def test_the_empty_incumbent_is_removed_when_a_nonempty_state_exists() -> None:
    pol = policy()
    r = request(1, 1, CHAIN, "a")
    d = pol.decide(view(CHAIN, [task(1, CHAIN, a="active")], [], [r]))
    assert all(c.resident for c in d.candidates)
    assert d.admit == (1,) and d.load == ("A",)
    assert d.chosen_candidate.resident == ("A",)


# ------------------------------------------------------------ extensions


@pytest.mark.parametrize(("hol_age", "admitted"), [(None, (2, 3)), (50.0, ()), (150.0, (2, 3))])
def test_head_of_line_reservation_keeps_room_for_the_oldest_request(
        hol_age: float | None, admitted: tuple[int, ...]) -> None:
    """An old task's big request (30 KV tokens) does not fit beside the running
    one; two young small requests (10 each) would. With `hol_age` at most the
    old task's age (100 s) they may not take the room it waits for."""
    pol = policy(hol_age=hol_age)
    running = request(9, 9, CHAIN, "a", running=True, generated=1, started_at=99.0,
                      arrival=100.0)
    big = request(1, 1, CHAIN, "a", input_tokens=20, output_tokens=10, arrival=0.0)
    small = [request(i, i, CHAIN, "a", input_tokens=5, output_tokens=5, arrival=100.0)
             for i in (2, 3)]
    tasks = [task(1, CHAIN, arrival=0.0, a="active"), task(9, CHAIN, arrival=100.0, a="active"),
             *(task(i, CHAIN, arrival=100.0, a="active") for i in (2, 3))]
    # prefix 100 + running 20 + room 25: the big request (30) never fits now.
    d = pol.decide(view(CHAIN, tasks, [running], [big, *small], t=100.0, budget=145))
    assert tuple(sorted(d.admit)) == admitted


@pytest.mark.parametrize(("head_reserve", "admitted"), [(False, (2, 3)), (True, (2,))])
def test_head_reserve_backfills_only_what_leaves_the_head_its_room(
        head_reserve: bool, admitted: tuple[int, ...]) -> None:
    """EASY backfilling. The old task's request (150 KV tokens) does not fit
    in the 130 free; the running one (110) is expected to end in 9 s (100
    output tokens at 0.1 s, 1 s done), which leaves t* = 9 s and a spare of
    130 + 110 - 150 = 90. A short request (20 tokens, 1 s) ends before t*
    and is backfilled; a long one (100 tokens, 9.9 s) would still hold more
    than the spare at t*, so with `head_reserve` it waits."""
    pol = policy(pack_order="arrival", head_reserve=head_reserve)
    running = request(9, 9, CHAIN, "a", running=True, generated=1, started_at=99.0,
                      input_tokens=10, output_tokens=100, arrival=100.0)
    head = request(1, 1, CHAIN, "a", input_tokens=140, output_tokens=10, arrival=0.0)
    short = request(2, 2, CHAIN, "a", input_tokens=10, output_tokens=10, arrival=100.0)
    long = request(3, 3, CHAIN, "a", input_tokens=1, output_tokens=99, arrival=100.0)
    tasks = [task(i, CHAIN, arrival=0.0 if i == 1 else 100.0, a="active") for i in (1, 2, 3, 9)]
    d = pol.decide(view(CHAIN, tasks, [running], [head, short, long], t=100.0, budget=340,
                        gpu=("A",)))
    assert tuple(sorted(d.admit)) == admitted


LONG = workflow("long", {"a": (), "b": ("a",), "c": ("b",), "d": ("c",), "e": ("d",),
                         "f": ("e",)})


@pytest.mark.parametrize(("head_workflow", "admitted"), [(CHAIN, (2,)), (LONG, (2, 3))])
def test_head_reserve_lets_pass_only_a_task_weighing_more_than_the_head(
        head_workflow: Workflow, admitted: tuple[int, ...]) -> None:
    """The case above with every task started and TOPAS's defaults, the long
    request's task (arrived at 50 s) weighing g = 2.48. Behind a head of
    CHAIN's (arrived at 0 s, g = 3.45) it waits for t*; behind a head of a
    six-stage workflow (g = 1.98: more path left, the srpt factor) it is the
    more urgent work, and the reservation does not hold it back."""
    pol = make_policy("topas", pack_order="arrival", head_reserve=True)
    running = request(9, 9, CHAIN, "b", running=True, generated=1, started_at=99.0,
                      input_tokens=10, output_tokens=100, arrival=100.0)
    head = request(1, 1, head_workflow, "b", input_tokens=140, output_tokens=10, arrival=0.0)
    short = request(2, 2, CHAIN, "b", input_tokens=10, output_tokens=10, arrival=100.0)
    long = request(3, 3, CHAIN, "b", input_tokens=1, output_tokens=99, arrival=50.0)
    tasks = [task(1, head_workflow, arrival=0.0, a="done", b="active"),
             *(task(i, CHAIN, arrival=at, a="done", b="active")
               for i, at in ((2, 100.0), (3, 50.0), (9, 100.0)))]
    v = view([CHAIN, LONG], tasks, [running], [head, short, long], t=100.0, budget=340,
             gpu=("B",))
    weights = _Search(pol, v).g  # type: ignore[arg-type]
    assert (weights[3] > weights[1]) == (head_workflow is LONG)
    assert tuple(sorted(pol.decide(v).admit)) == admitted


@pytest.mark.parametrize(("start_gate", "admitted"), [(True, (2, 3)), (False, (2,))])
def test_head_reserve_keeps_room_only_for_a_started_tasks_request(
        start_gate: bool, admitted: tuple[int, ...]) -> None:
    """Three new tasks' first requests behind a running one, as above. With
    the start gate a new task's request is no head (`fresh_hol` governs new
    tasks: here off), so the long request is admitted; without the gate no
    task counts as new and the old task's request is the head."""
    pol = make_policy("topas", pack_order="arrival", head_reserve=True, fresh_hol=None,
                      start_gate=start_gate)
    running = request(9, 9, CHAIN, "a", running=True, generated=1, started_at=99.0,
                      input_tokens=10, output_tokens=100, arrival=100.0)
    head = request(1, 1, CHAIN, "a", input_tokens=140, output_tokens=10, arrival=0.0)
    short = request(2, 2, CHAIN, "a", input_tokens=10, output_tokens=10, arrival=100.0)
    long = request(3, 3, CHAIN, "a", input_tokens=1, output_tokens=99, arrival=100.0)
    tasks = [task(1, CHAIN, arrival=0.0), task(2, CHAIN, arrival=100.0),
             task(3, CHAIN, arrival=100.0), task(9, CHAIN, arrival=100.0, a="active")]
    d = pol.decide(view(CHAIN, tasks, [running], [head, short, long], t=100.0, budget=340,
                        gpu=("A",)))
    assert tuple(sorted(d.admit)) == admitted


def test_without_preemption_every_candidate_keeps_the_running_requests() -> None:
    """A long-running low-value request blocks a valuable one of another agent;
    TOPAS preempts it unless `preempt` is off."""
    for preempt, expect in ((True, (1,)), (False, ())):
        pol = policy(preempt=preempt)
        running = request(9, 9, CHAIN, "c", running=True, generated=1, started_at=99.0,
                          output_tokens=1000)
        waiting = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=10)
        tasks = [task(9, CHAIN, a="done", b="done", c="active"), task(1, CHAIN, a="active")]
        d = pol.decide(view(CHAIN, tasks, [running], [waiting], t=100.0, budget=1120))
        assert d.preempt == ((9,) if expect else ())
        assert d.admit == expect
        if not preempt:
            assert all(not c.preempt for c in d.candidates)


def test_preempt_margin_keeps_a_preemption_only_when_it_earns_its_cost_back() -> None:
    """The case above: the paper swaps (score 1.63 against J_redo + J_revoke =
    0.1). With `preempt_margin` m, a preempting candidate needs a score of at
    least m times its cost: just under the ratio it still preempts, just over
    it TOPAS waits, and no logged candidate preempts below its floor."""
    running = request(9, 9, CHAIN, "c", running=True, generated=1, started_at=99.0,
                      output_tokens=1000)
    waiting = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=10)
    tasks = [task(9, CHAIN, a="done", b="done", c="active"), task(1, CHAIN, a="active")]
    v = view(CHAIN, tasks, [running], [waiting], t=100.0, budget=1120)
    paper = policy().decide(v)
    terms = paper.chosen_candidate.terms
    cost = terms.j_redo + terms.j_revoke
    ratio = terms.total / cost
    assert paper.preempt == (9,) and cost > 0 and ratio > 1
    for margin, swaps in ((0.99 * ratio, True), (1.01 * ratio, False)):
        d = policy(preempt_margin=margin).decide(v)
        assert (d.preempt, d.admit) == (((9,), (1,)) if swaps else ((), ()))
        for c in d.candidates:
            if c.preempt:
                t = c.terms
                assert t.total >= margin * (t.j_redo + t.j_revoke)


@pytest.mark.parametrize(("pack_order", "admitted"), [("ratio", 2), ("arrival", 1)])
def test_pack_order_arrival_serves_the_older_task_first(pack_order: str, admitted: int) -> None:
    """One request fits. The paper's order packs the young task's small
    request (10 s of progress for 10 KV tokens) and then has no room for the
    old task's big one (30 tokens), although that state would score more
    (aging: (1 + ln 3) x 10 s). `pack_order="arrival"` packs the old one."""
    pol = policy(pack_order=pack_order, rho=1.0, h_age=50.0)
    observe(pol, "A", "a", [10], request_service=10)
    big = request(1, 1, CHAIN, "a", input_tokens=20, output_tokens=10, arrival=0.0)
    small = request(2, 2, CHAIN, "a", input_tokens=5, output_tokens=5, arrival=100.0)
    tasks = [task(1, CHAIN, arrival=0.0, a="active"), task(2, CHAIN, arrival=100.0, a="active")]
    d = pol.decide(view(CHAIN, tasks, [], [big, small], t=100.0, budget=130, gpu=("A",)))
    assert d.admit == (admitted,)
    g = {1: 1 + math.log1p(100 / 50), 2: 1.0}[admitted]
    assert d.chosen_candidate.terms.j_admit == pytest.approx(g * 10)
    with pytest.raises(TopasError, match="pack_order"):
        pol.set_params(pack_order="fifo")


@pytest.mark.parametrize(("longest_first", "admitted"), [(False, 1), (True, 2)])
def test_longest_first_packs_a_tasks_longest_request_first(longest_first: bool,
                                                           admitted: int) -> None:
    """Two branches of one task's stage a wait; room for one. Both have the
    pair's observed service as D_hat, so Eq. 6 values them alike and the
    paper's ratio packs the one with fewer KV tokens (request 1, a 10-token
    output); the stage ends only when the 50-token branch does, which
    `longest_first` packs first (LPT)."""
    pol = policy(pack_order="arrival", longest_first=longest_first)
    observe(pol, "A", "a", [20, 40], request_service=20)
    short = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=10)
    long_ = request(2, 1, CHAIN, "a", input_tokens=10, output_tokens=50)
    tasks = [task(1, CHAIN, a="active")]
    d = pol.decide(view(CHAIN, tasks, [], [short, long_], t=10.0, budget=170, gpu=("A",)))
    assert d.admit == (admitted,)
    assert d.chosen_candidate.terms.j_admit > 0  # Eq. 6 values either branch


# ------------------------------------------------ start gate (a default beyond the paper)


@pytest.mark.parametrize(("budget", "paper", "gated"), [(450, (2,), ()), (1000, (2, 1), (1, 2))])
def test_start_gate_starts_no_new_task_while_a_started_ones_request_does_not_fit(
        budget: int, paper: tuple[int, ...], gated: tuple[int, ...]) -> None:
    """A and B are resident; task 3's b round runs. Task 1 (a done) waits with
    a 510-token b round, new task 2 with a 20-token a round (dropping B would
    preempt more KV than B's prefix: no swap starts it). With room for the
    small one only, the paper packs task 2; the start gate packs started
    tasks first and, once task 1's round does not fit, starts no new task.
    With room for both, it admits both, started task first."""
    running = request(3, 3, CHAIN, "b", running=True, started_at=0.0, output_tokens=200)
    big = request(1, 1, CHAIN, "b", input_tokens=500)
    new = request(2, 2, CHAIN, "a")
    tasks = [task(3, CHAIN, a="done", b="active"), task(1, CHAIN, a="done", b="active"),
             task(2, CHAIN, a="active")]
    v = view(CHAIN, tasks, [running], [big, new], t=10.0, budget=budget, gpu=("A", "B"))
    assert policy().decide(v).admit == paper
    d = policy(start_gate=True).decide(v)
    assert d.admit == gated and d.preempt == ()


@pytest.mark.parametrize(("stages", "swaps"), [({"a": "active"}, False),
                                               ({"a": "done", "b": "active"}, True)])
def test_start_gate_admits_no_new_task_in_a_candidate_that_preempts(
        stages: dict[str, str], swaps: bool) -> None:
    """The swap of the preemption tests above: the paper preempts task 9's c
    round to bring in task 1's round. When task 1 is new (its a round), the
    start gate keeps task 9 running; when task 1 has started (its b round),
    the swap stands."""
    stage = "b" if "b" in stages else "a"
    running = request(9, 9, CHAIN, "c", running=True, generated=1, started_at=99.0,
                      output_tokens=1000)
    waiting = request(1, 1, CHAIN, stage, input_tokens=10, output_tokens=10)
    tasks = [task(9, CHAIN, a="done", b="done", c="active"), task(1, CHAIN, **stages)]
    v = view(CHAIN, tasks, [running], [waiting], t=100.0, budget=1120)
    paper = policy().decide(v)
    assert (paper.preempt, paper.admit) == ((9,), (1,))
    d = policy(start_gate=True).decide(v)
    assert (d.preempt, d.admit) == (((9,), (1,)) if swaps else ((), ()))
    if not swaps:
        assert all(not c.admit for c in d.candidates if c.preempt)


BIG = workflow("big", {"a": (), "b": ("a",), "c": ("b",)}, prefix=2000)


@pytest.mark.parametrize(("output", "swaps"), [(10, True), (3000, False)])
def test_start_gate_lets_a_prefix_swap_start_new_tasks(output: int, swaps: bool) -> None:
    """Task 9's c round runs under a 2,000-token prefix; new task 1's a round
    needs A's 2,000-token prefix, and both prefixes do not fit. Preempting a
    round that holds less KV than the prefix leaving with it is a prefix swap:
    the gate lets it start the new task, as the paper does. Preempting a
    round that holds more (3,000 output tokens reserved) frees room that
    started work holds: the gate keeps it running."""
    running = request(9, 9, BIG, "c", running=True, generated=1, started_at=99.0,
                      output_tokens=output)
    waiting = request(1, 1, BIG, "a", output_tokens=500)  # 50 s of progress
    tasks = [task(9, BIG, a="done", b="done", c="active"), task(1, BIG, a="active")]
    v = view(BIG, tasks, [running], [waiting], t=100.0, budget=3000 + output, gpu=("C",))
    paper = policy().decide(v)
    assert (paper.preempt, paper.admit) == ((9,), (1,))
    d = policy(start_gate=True).decide(v)
    assert (d.preempt, d.admit) == (((9,), (1,)) if swaps else ((), ()))


def test_topas_paper_is_section_iv_and_the_variants_keep_the_extensions() -> None:
    """`topas-paper` is section IV as given (and refuses to become `topas`);
    the ablation variants keep `topas`'s extensions (the defaults themselves:
    tests/test_topas_extensions.py)."""
    assert make_policy("topas-paper").params == TopasParams(**PAPER)  # type: ignore[attr-defined]
    with pytest.raises(TopasError, match="topas-paper runs with start_gate=False"):
        check_variant("topas-paper", {"start_gate": True})
    base = make_policy("topas-base").params  # type: ignore[attr-defined]
    assert base.start_gate and not base.reuse and not base.aging


def test_start_gate_orders_started_tasks_first_when_a_task_has_sibling_requests() -> None:
    """The general (heap) fill: task 1's fork branches b (20 tokens) and c (310)
    wait, new task 2's a round (20) waits, task 3's c round runs. The paper
    packs both small rounds; the gate takes task 1's first, and c's does not
    fit, so task 2 does not start."""
    running = request(3, 3, FORK, "c", running=True, started_at=0.0, output_tokens=200)
    rb = request(1, 1, FORK, "b")
    rc = request(2, 1, FORK, "c", input_tokens=300)
    ra = request(4, 2, FORK, "a")
    tasks = [task(3, FORK, a="done", b="done", c="active"),
             task(1, FORK, a="done", b="active", c="active"), task(2, FORK, a="active")]
    v = view(FORK, tasks, [running], [rb, rc, ra], t=10.0, budget=560, gpu=("A", "B", "C"))
    assert sorted(policy().decide(v).admit) == [1, 4]
    d = policy(start_gate=True).decide(v)
    assert (d.admit, d.preempt) == ((1,), ())


def test_start_gate_never_closes_an_idle_engine() -> None:
    """Nothing runs and one request fits. `hol_age=0` holds the room for new
    task 1 (the oldest), so started task 2's round of the same agent does not
    fit beside it. The gate closes a fill only when a kept running request
    will free room: here closing it would admit nothing, at every decision."""
    new = request(1, 1, CHAIN, "a", arrival=0.0)
    started = request(2, 2, CHAIN, "a", arrival=5.0)
    t2 = task(2, CHAIN, arrival=5.0, a="active")
    t2 = replace(t2, stages={**t2.stages, "a": replace(t2.stages["a"], rounds_done=1)})
    v = view(CHAIN, [task(1, CHAIN, arrival=0.0, a="active"), t2], [], [new, started],
             t=10.0, budget=120, gpu=("A",))
    assert policy(start_gate=True).decide(v).admit == (2,)  # started first
    assert policy(start_gate=True, hol_age=0.0).decide(v).admit == (1,)


@pytest.mark.parametrize(("b_input", "admits_b"), [(150, True), (250, False)])
def test_start_gate_keeps_a_started_tasks_room_from_new_tasks_in_every_candidate(
        b_input: int, admits_b: bool) -> None:
    """Task 1's stage-b request (d_r = b_input + 10) waits for agent B, whose
    prefix (100) is on the host; six new tasks' stage-a requests (40 each)
    wait for the resident A. With 300 KV free beside A, b fits now with its
    prefix when b_input is 150 (260): a candidate that leaves B out still
    leaves its new tasks that room, so no candidate gives the room to new
    tasks, and b is admitted. When b cannot fit now (360), the new tasks
    take the free room."""
    pol = make_policy("topas")
    started = request(1, 1, CHAIN, "b", input_tokens=b_input, output_tokens=10)
    new = [request(i, i, CHAIN, "a", input_tokens=30, output_tokens=10, arrival=50.0)
           for i in range(2, 8)]
    tasks = [task(1, CHAIN, a="done", b="active"),
             *(task(i, CHAIN, arrival=50.0) for i in range(2, 8))]
    v = view(CHAIN, tasks, [], [started, *new], t=60.0, budget=400, gpu=("A",))
    d = pol.decide(v)
    assert (1 in d.admit) == admits_b

    def free_after(admit: tuple[int, ...]) -> int:
        return 300 - sum(r.input_tokens + r.output_tokens for r in new if r.id in admit)

    if not admits_b:
        assert free_after(d.admit) < 260  # no room held back for a request that cannot fit
        return
    assert "B" in d.load
    for c in d.candidates:  # every candidate that leaves B out leaves b its room
        if "B" not in c.resident:
            assert free_after(c.admit) >= 260


def test_remaining_paths_price_a_task_with_nothing_waiting_by_eq5_alone() -> None:
    """Eq. 5 for every task in the view: a DAG task whose only stage runs
    (nothing waits) and one whose two branches wait get their L_hat."""
    pol, rb, rc, t1 = _fork_branches_waiting()
    ra = request(3, 2, FORK, "a", running=True, started_at=0.0)
    t2 = task(2, FORK, a="active")
    s = _Search(pol, view(FORK, [t1, t2], [ra], [rb, rc]))
    paths = s.remaining_paths({1: t1, 2: t2})
    assert paths[1] == pytest.approx(7.5 + 2)  # as the fork-join case above
    assert paths[2] == pytest.approx(s.paths.lhat(t2, running_map([ra])))


def test_a_decision_taken_from_a_search_is_the_one_decide_makes() -> None:
    """`TopasPolicy.decision` on a search's best state (Eq. 14) gives decide's
    Decision, candidates and credits (Eq. 10) included."""
    ra = request(1, 1, CHAIN, "a", running=True, started_at=0.0)
    rb = [request(i, i, CHAIN, "b") for i in (2, 3)]
    v = view(CHAIN, [task(1, CHAIN, a="active"),
                     *(task(i, CHAIN, a="done", b="active") for i in (2, 3))],
             [ra], rb, t=4.0, budget=400)
    own, split = TopasPolicy(), TopasPolicy()
    decided = own.decide(v)
    search = _Search(split, v)
    states = search.run()
    taken = split.decision(v, search, states, _best(states))
    assert taken == decided and taken.admit
    assert split.credits == own.credits and split.credits
