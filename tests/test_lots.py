"""`lot_size` (topasd/scheduler/lots.py): an agent's waiting requests wait
as one lot until their summed wait pays the room their prefix takes from a
backlog, and never when the lot cannot grow or the task is late."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.sim.engine import SimBackend
from tests.topas_views import request, task, view, workflow
from topasd.model import (
    Decision,
    EngineView,
    Location,
    Request,
    StageStatus,
    TaskView,
    TopasError,
    Workflow,
)
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.lots import (
    lot_can_grow,
    never_held,
    path_agents,
    phase_holds,
    tandem_holds,
    tasks_waiting_on_others,
    unripe_lots,
)
from topasd.scheduler.params import TopasParams
from topasd.scheduler.topas import TopasPolicy
from workflows.generator import case_trace, draw_workload

# three agents of 300 prefix tokens each in a 1,000-token pool; one decode
# step is the profile's 0.1 s floor (the hand-built costs have no batch model)
CHAIN = workflow("chain", {"a": (), "b": ("a",), "c": ("b",)}, prefix=300)
SOLO = workflow("solo", {"a": ()}, prefix=300)
LAST = 107  # the id of task 7's waiting request of agent C


def _backlog(t: float, *, first_tasks: int = 5,
             others: tuple[Workflow, ...] = (CHAIN,) * 6) -> EngineView:
    """Task 1's request of A runs; tasks 2.. wait on A (310 tokens each, the
    first `first_tasks` of them); task 7 waits on C (its last stage) since 0.
    Tasks 1-6 are of the workflows `others`."""
    running = [request(100, 1, others[0], "a", running=True, started_at=0.0)]
    waiting = [request(100 + i, i, wf, "a", input_tokens=300)
               for i, wf in zip(range(2, 2 + first_tasks), others[1:], strict=False)]
    waiting.append(request(LAST, 7, CHAIN, "c"))
    tasks = [task(1, others[0], a="active"), task(7, CHAIN, a="done", b="done", c="active")]
    tasks += [task(i, wf, a="active") for i, wf in zip(range(2, 2 + first_tasks), others[1:],
                                                        strict=False)]
    return view([CHAIN, SOLO], tasks, running, waiting, t=t, budget=1000, gpu=("A",))


def test_a_lot_waits_until_its_summed_wait_pays_its_setup() -> None:
    # setup: 5 tasks wait on A, C's prefix is 0.3 of the pool, for 1 s of service
    # (10 tokens x 0.1 s) past C's running requests (none): 5 x 0.3 x 1 = 1.5 s
    assert unripe_lots(_backlog(t=1.0), 1.0) == {LAST}
    assert unripe_lots(_backlog(t=1.6), 1.0) == frozenset()
    assert unripe_lots(_backlog(t=1.6), 2.0) == {LAST}  # twice the setup: 3 s
    assert unripe_lots(_backlog(t=1.0), 0.0) == frozenset()


def test_n_counts_each_task_waiting_on_another_agent_once() -> None:
    # task 1 waits on A alone, task 2 on A and B (a fork), task 3 on B twice, task 4 on C
    fork = workflow("fork", {"a": (), "b": (), "c": ()}, prefix=300)
    waiting = [request(1, 1, fork, "a"), request(2, 2, fork, "a"), request(3, 2, fork, "b"),
               request(4, 3, fork, "b"), request(5, 3, fork, "b"), request(6, 4, fork, "c")]
    brute = {r.agent: len({q.task_id for q in waiting if q.agent != r.agent}) for r in waiting}
    assert tasks_waiting_on_others(waiting) == brute == {"A": 3, "B": 3, "C": 3}


def test_without_a_backlog_no_lot_waits() -> None:
    # three requests of 310 tokens wait on A: less than the 1,000-token pool
    assert unripe_lots(_backlog(t=1.0, first_tasks=3), 1.0) == frozenset()


def test_a_lot_no_other_task_can_join_does_not_wait() -> None:
    # tasks 1-6 are of a workflow without agent C: task 7's request is C's last
    only_a = _backlog(t=1.0, others=(SOLO,) * 6)
    assert not lot_can_grow(only_a, "C", {7})
    assert unripe_lots(only_a, 1.0) == frozenset()
    assert lot_can_grow(_backlog(t=1.0), "C", {7})


def test_a_running_agent_pays_only_the_service_past_its_running_requests() -> None:
    base = _backlog(t=1.0)
    c_running = request(200, 8, CHAIN, "c", running=True, started_at=0.0)
    # C's running request has 10 tokens (1 s) left: the lot extends its residency by 0
    with_c = replace(base, running=(*base.running, c_running))
    assert unripe_lots(with_c, 1.0) == frozenset()
    shorter = replace(with_c, running=(base.running[0], replace(c_running, generated=5)))
    # 0.5 s left: 0.5 s past it, 5 x 0.3 x 0.5 = 0.75 s of setup against 1 s waited
    assert unripe_lots(shorter, 1.0) == frozenset()
    assert unripe_lots(shorter, 2.0) == {LAST}


def test_late_and_overdue_requests_are_never_held() -> None:
    v = _backlog(t=1.0)
    # waited its patience (1 s here) since it entered the queue
    assert LAST in never_held(v, None, {}, {LAST: 1.0})
    assert LAST not in never_held(v, None, {}, {LAST: 5.0})
    # older than twice its workflow's mean recent JCT (0.4 s)
    assert LAST in never_held(v, 2.0, {"chain": 0.4}, {LAST: 5.0})
    assert LAST not in never_held(v, None, {"chain": 0.4}, {LAST: 5.0})


def _admitted(params: TopasParams, v: EngineView) -> set[int]:
    return set(TopasPolicy(params).decide(v).admit)


def test_topas_with_lot_size_leaves_an_unripe_lot_out_of_the_decision() -> None:
    v = _backlog(t=1.0)
    # the last stage's request is what TOPAS serves first (nearest its task's end)
    assert LAST in _admitted(TopasParams(), v)
    held = _admitted(TopasParams(lot_size=1.0), v)
    assert LAST not in held and held  # the room goes to the backlog instead
    assert TopasPolicy(TopasParams(lot_size=1.0)).unripe(v) == {LAST}


def _started_task(task: TaskView) -> TaskView:
    """`task` with its active stage one round in (the task has started)."""
    return replace(task, stages={
        name: replace(st, rounds_done=1) if st.status is StageStatus.ACTIVE else st
        for name, st in task.stages.items()})


def _started(v: EngineView) -> EngineView:
    """`v` with every task's active stage one round in (each task has started)."""
    return replace(v, tasks={tid: _started_task(task) for tid, task in v.tasks.items()})


def test_a_phase_holds_the_other_agents_while_the_resident_ones_fill_the_pool() -> None:
    # A's prefix (300) leaves 700 tokens; five started tasks wait on A: 1,550 tokens
    v = _started(_backlog(t=1.0))
    assert phase_holds(v, 1.0) == {LAST}
    assert phase_holds(v, 2.0) == {LAST}  # 1,550 > 1,400
    assert phase_holds(v, 3.0) == frozenset()  # 1,550 <= 2,100
    # two requests (620 tokens) no longer fill the room: C's prefix comes in
    assert phase_holds(_started(_backlog(t=1.0, first_tasks=2)), 1.0) == frozenset()
    assert phase_holds(replace(v, running=()), 1.0) == frozenset()  # nothing runs


def test_new_tasks_work_keeps_no_phase_going() -> None:
    # the same backlog of A, but none of those five tasks has started
    assert phase_holds(_backlog(t=1.0), 1.0) == frozenset()


def _phase_end(budget: int, *, started_on_a: bool = False) -> EngineView:
    """Agent A (300 tokens) is resident; task 1's A round runs (its b stage
    follows), task 0 waits on B and task 2, which has not started, on A
    (20 tokens of work each). With `started_on_a` task 3, started, waits on A."""
    running = [request(10, 1, CHAIN, "a", running=True, started_at=0.0)]
    waiting = [request(20, 0, CHAIN, "b"), request(30, 2, CHAIN, "a")]
    tasks = [task(0, CHAIN, a="done", b="active"), task(1, CHAIN, a="active"),
             task(2, CHAIN, a="active")]
    if started_on_a:
        waiting.append(request(40, 3, CHAIN, "a"))
        tasks.append(_started_task(task(3, CHAIN, a="active")))
    return view([CHAIN], tasks, running, waiting, t=1.0, budget=budget, gpu=("A",))


@pytest.mark.parametrize(("budget", "held"), [
    (340, {30}),  # B's next phase has 40 tokens of room: task 0's and task 1's b fill it
    (400, set()),  # 100 tokens of room: task 2's b would ride in B's next phase too
    (700, set()),  # B's prefix fits beside A's once task 1's round ends
])
def test_a_new_task_does_not_keep_a_phase_going_past_its_started_work(
        budget: int, held: set[int]) -> None:
    assert phase_holds(_phase_end(budget), 1.0) == held
    # a started task's request still waits on A: the phase is not over
    assert phase_holds(_phase_end(budget, started_on_a=True), 1.0) == frozenset()


def test_a_phase_end_reads_an_agent_without_a_prefix_as_0_tokens() -> None:
    # B has no prefix state: task 0's b round (20 tokens) fits in A's 40 spare
    v = _phase_end(340)
    v = replace(v, prefixes={a: p for a, p in v.prefixes.items() if a != "B"})
    assert phase_holds(v, 1.0) == frozenset()


def test_topas_with_phases_serves_the_resident_agent_and_keeps_the_exemptions() -> None:
    v = _started(_backlog(t=1.0))
    admitted = _admitted(TopasParams(phases=1.0), v)
    assert LAST not in admitted and admitted  # the room goes to A's backlog
    assert TopasPolicy(TopasParams(phases=1.0)).unripe(v) == {LAST}
    # task 7's request has waited longer than its workflow's expected fresh path
    late = _started(_backlog(t=1e6))
    assert TopasPolicy(TopasParams(phases=1.0)).unripe(late) == frozenset()
    assert LAST in _admitted(TopasParams(phases=1.0), late)


def test_a_hold_lasts_at_most_its_tasks_remaining_path() -> None:
    policy = TopasPolicy(TopasParams(phases=1.0))
    v = _started(_backlog(t=1.0))
    paths = policy.task_paths(v)
    patience = policy.patience(v, paths, frozenset({LAST}))[LAST]
    # task 7 is at its last stage: what it still has to do is less than a fresh chain
    assert 0 < patience < policy.fresh_paths(v, paths)["chain"]
    assert policy.unripe(_started(_backlog(t=0.9 * patience))) == {LAST}
    assert policy.unripe(_started(_backlog(t=1.1 * patience))) == frozenset()


@pytest.mark.parametrize("name", ["lot_size", "phases"])
def test_lot_size_and_phases_are_checked(name: str) -> None:
    assert getattr(TopasParams(**{name: None}), name) is None
    with pytest.raises(TopasError, match=name):
        TopasParams(**{name: -1.0})


class RecordingTopas(TopasPolicy):
    """TOPAS that records, per decision, the lots it held and what it admitted."""

    def __init__(self, params: TopasParams) -> None:
        super().__init__(params)
        self.log: list[tuple[frozenset[int], tuple[int, ...]]] = []

    def decide(self, view: EngineView) -> Decision:
        held = self.unripe(view)
        decision = super().decide(view)
        self.log.append((held, decision.admit))
        return decision


def _burst_run(lot_size: float | None, phases: float | None = None,
               ) -> tuple[RecordingTopas, dict[int, float]]:
    trace = case_trace(draw_workload("chain", 6), "burst", 100, 0.05, 6)
    policy = RecordingTopas(TopasParams(lot_size=lot_size, phases=phases))
    result = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE))).execute()
    assert set(result.finishes) == {t.id for t in trace.tasks}  # every task finishes
    return policy, result.finishes


@pytest.mark.parametrize(("lot_size", "phases"), [(1.0, None), (None, 1.0)])
def test_in_a_burst_held_requests_are_never_admitted_and_every_task_finishes(
        lot_size: float | None, phases: float | None) -> None:
    policy, finishes = _burst_run(lot_size, phases)
    held_decisions = [(held, admit) for held, admit in policy.log if held]
    assert held_decisions, "the burst's backlog holds some lot"
    assert all(held.isdisjoint(admit) for held, admit in held_decisions)
    assert _burst_run(lot_size, phases)[1] == finishes  # the same trace and seed: same
    assert _burst_run(None)[1] != finishes  # and the rule changes the run


# a chain of 100-token prefixes (a 0.1 s setup each): a pool of 125 tokens holds one
# prefix and one request, so B comes in only once A leaves
SMALL = workflow("small", {"a": (), "b": ("a",), "c": ("b",)}, prefix=100)
LEADER = 20  # task 0's waiting b round


def _tandem(new_tasks: int, *, budget: int = 125, running_output: int = 0) -> EngineView:
    """A resident; task 0, started, waits on B; `new_tasks` tasks wait on A
    (ids 1..n, request ids 30..); with `running_output`, task 99's A round
    runs with that many tokens left."""
    waiting = [request(LEADER, 0, SMALL, "b")]
    waiting += [request(30 + i, i, SMALL, "a") for i in range(1, new_tasks + 1)]
    tasks = [task(0, SMALL, a="done", b="active")]
    tasks += [task(i, SMALL, a="active") for i in range(1, new_tasks + 1)]
    running = []
    if running_output:
        running = [request(10, 99, SMALL, "a", running=True, started_at=0.0,
                           output_tokens=running_output)]
        tasks.append(task(99, SMALL, a="active"))
    return view([SMALL], tasks, running, waiting, t=1.0, budget=budget, gpu=("A",))


def _one_second(r: Request) -> float:
    return 1.0


@pytest.mark.parametrize(("new_tasks", "held"), [
    # an A round first saves its task 3 setups (0.3 s) for each of the n tasks it and
    # those behind make; it delays task 0 by 1 s at each of b and c (2 s): 0.3 n > 2
    (7, {LEADER}),
    (6, set()),
])
def test_a_request_one_stage_behind_goes_first_when_its_saved_setups_pay(
        new_tasks: int, held: set[int]) -> None:
    assert tandem_holds(_tandem(new_tasks), _one_second) == held


def test_no_tandem_when_the_leaders_prefix_fits_beside_the_resident_one() -> None:
    assert tandem_holds(_tandem(7, budget=10_000), _one_second) == frozenset()


def test_no_tandem_when_the_leaders_prefix_fits_beside_the_followers_once_others_leave(
) -> None:
    # A and an idle C are resident (200 of 225 tokens): B needs 120 and does not fit
    # beside both, but it does beside A alone, so A's rounds need not go first
    v = replace(_tandem(7, budget=225), prefixes={
        a: replace(p, location=Location.GPU, ready=True) if a == "C" else p
        for a, p in _tandem(7, budget=225).prefixes.items()})
    assert sorted(v.gpu_prefixes()) == ["A", "C"]
    assert tandem_holds(v, _one_second) == frozenset()
    assert tandem_holds(_tandem(7, budget=125), _one_second) == {LEADER}


def test_a_round_that_ends_before_the_resident_agents_running_ones_delays_no_one() -> None:
    # A's running round has 20 tokens (2 s) left: task 1's 1 s round costs task 0 nothing
    assert tandem_holds(_tandem(1, running_output=20), _one_second) == {LEADER}
    assert tandem_holds(_tandem(1), _one_second) == frozenset()


def test_a_request_that_rides_in_the_leaders_batch_goes_first_for_its_service_saved(
) -> None:
    # 140 tokens hold B, task 0's b round and task 1's (20 each) but never A beside B:
    # task 1's A round first saves its task 3 setups (0.3 s) and its 1 s service at
    # each of b and c (it runs in task 0's batch there), and delays task 0 once by
    # 1 s: 2.3 > 1, where without the room to ride 0.3 < 2
    assert tandem_holds(_tandem(1, budget=140), _one_second) == {LEADER}
    assert tandem_holds(_tandem(1, budget=139), _one_second) == frozenset()


def test_a_request_of_another_workflow_does_not_join_the_leaders() -> None:
    other = workflow("other", {"a": (), "b": ("a",), "c": ("b",)}, prefix=100)
    v = _tandem(7)
    v = replace(v, workflows={**v.workflows, "other": other},
                waiting=tuple(replace(r, workflow="other") if r.id != LEADER else r
                              for r in v.waiting))
    assert tandem_holds(v, _one_second) == frozenset()


def test_a_request_whose_end_does_not_ready_the_leaders_stage_does_not_join_them() -> None:
    # fork a -> b, c -> d: task 0 waits on D; task 1's B round is one stage behind it,
    # but its C round has not run, so b's end does not ready d and task 1 cannot follow
    fork = workflow("fork", {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}, prefix=100)

    def fork_view(c_status: str) -> EngineView:
        waiting = [request(LEADER, 0, fork, "d"), request(31, 1, fork, "b")]
        tasks = [task(0, fork, a="done", b="done", c="done", d="active"),
                 task(1, fork, a="done", b="active", c=c_status)]
        return view([fork], tasks, [], waiting, t=1.0, budget=140, gpu=("B",))

    assert tandem_holds(fork_view("done"), _one_second) == {LEADER}
    assert tandem_holds(fork_view("active"), _one_second) == frozenset()


def test_the_path_left_follows_the_longest_chain_to_an_exit() -> None:
    fork = workflow("fork", {"a": (), "b": ("a",), "c": ("a",), "d": ("c",), "e": ("b", "d")})
    assert path_agents(fork, "a") == ("A", "C", "D", "E")
    assert path_agents(SMALL, "b") == ("B", "C")


def test_topas_with_tandem_runs_the_resident_agents_request_before_swapping() -> None:
    v = _tandem(7)
    assert TopasPolicy(TopasParams(tandem=False)).decide(v).admit == (LEADER,)
    with_tandem = TopasPolicy(TopasParams()).decide(v)
    assert LEADER not in with_tandem.admit and LEADER in with_tandem.held
    assert len(with_tandem.admit) == 1 and 31 <= with_tandem.admit[0] <= 37


def test_a_tandem_hold_never_idles_the_engine() -> None:
    # the A rounds (input 100) do not fit beside A's prefix in 125 tokens: with the
    # leader held nothing could run, so the decision holds none and B comes in
    v = _tandem(7)
    v = replace(v, waiting=tuple(r if r.id == LEADER else replace(r, input_tokens=100)
                                 for r in v.waiting))
    assert tandem_holds(v, _one_second) == {LEADER}
    decision = TopasPolicy(TopasParams()).decide(v)
    assert decision.admit == (LEADER,) and decision.held == ()
