"""TOPAS's candidate window (topasd/scheduler/window.py, docs/topas.md): past
`window_cap` waiting requests a decision weighs each agent's first tasks that
a fill into the free KV reaches, at most `window_cap` requests of them, oldest
tasks first; hand-computed cases, and the decision it leaves unchanged."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.topas_views import CHAIN, request, task, view
from topasd.model import EngineView, Request, Reservation, StageProgress, StageStatus, TaskView
from topasd.scheduler import make_policy
from topasd.scheduler.params import TopasParams
from topasd.scheduler.topas import TopasPolicy
from topasd.scheduler.window import QueueIndex, admission_room, candidate_window, queue_change


def _params(**changes: object) -> TopasParams:
    return TopasParams(reservation="full", **changes)  # type: ignore[arg-type]


def _queue(budget: int = 100) -> tuple[EngineView, dict[int, Request]]:
    """A's tasks 1-4 (arrivals 0, 1, 2, 2.5) wait at stage a with d_r 150
    (never fits 100), 40, 40, 40; B's tasks 7-10 (arrivals 3-6) wait at
    stage b, d_r 30 each; nothing runs, so the room is the budget."""
    sizes = {1: 150, 2: 40, 3: 40, 4: 40, 7: 30, 8: 30, 9: 30, 10: 30}
    arrival = {1: 0.0, 2: 1.0, 3: 2.0, 4: 2.5, 7: 3.0, 8: 4.0, 9: 5.0, 10: 6.0}
    reqs = {tid: request(tid, tid, CHAIN, "a" if tid < 5 else "b", input_tokens=d // 2,
                         output_tokens=d - d // 2, arrival=arrival[tid])
            for tid, d in sizes.items()}
    tasks = [task(tid, CHAIN, arrival[tid], a="active") if tid < 5
             else task(tid, CHAIN, arrival[tid], a="done", b="active") for tid in sizes]
    return view(CHAIN, tasks, [], list(reqs.values()), budget=budget), reqs


def _tasks(v: EngineView) -> list[int]:
    return sorted(r.task_id for r in v.waiting)


def test_the_window_is_off_while_few_requests_wait_and_in_topas_paper() -> None:
    v, _ = _queue()
    assert candidate_window(v, _params(window_cap=8)) is v  # 8 wait: within the cap
    assert candidate_window(v, _params(window=None, window_cap=1)) is v
    assert TopasPolicy(TopasParams()).params.window == 1.0
    assert make_policy("topas-paper").params.window is None  # type: ignore[attr-defined]


def test_each_agent_keeps_what_a_fill_into_the_room_reaches() -> None:
    """A: task 1 (150) does not fit 100 and is skipped, 2 and 3 take 80, the
    20 left fit no request of A (least 40): tasks 1-3. B: 30 + 30 + 30 leave
    10 < 30: tasks 7-9. Tasks 4 and 10 wait for later decisions."""
    v, _ = _queue()
    assert _tasks(candidate_window(v, _params(window_cap=0))) == [1, 2, 3, 7, 8, 9]
    # twice the room: task 1 fits now and 2 leaves 10 for A; B's 120 all fit
    assert _tasks(candidate_window(v, _params(window=2.0, window_cap=0))) == [1, 2, 7, 8, 9,
                                                                          10]


@pytest.mark.parametrize(("cap", "kept"), [(2, [1, 7]), (4, [1, 2, 3, 7]),
                                           (5, [1, 2, 3, 7, 8]), (7, [1, 2, 3, 7, 8, 9])])
def test_the_cap_takes_the_oldest_tasks_after_each_agents_first(cap: int,
                                                                 kept: list[int]) -> None:
    """Each agent's first task (1, 7) always; then the reached tasks by
    arrival (2, 3, 8, 9) while the cap allows."""
    v, _ = _queue()
    assert _tasks(candidate_window(v, _params(window_cap=cap, start_gate=False))) == kept


def test_a_forced_request_is_always_in_the_window() -> None:
    """The overdue request (or head of line) every candidate must cover."""
    v, reqs = _queue()
    assert _tasks(candidate_window(v, _params(window_cap=2), (reqs[10],))) == [1, 7, 10]


def test_started_tasks_come_first_with_the_start_gate() -> None:
    """A's task 4 has finished a round: GreedyPack fills it before A's new
    tasks, so A reaches 4 (40), skips 1 (150) and takes 2 (40), leaving 20.
    B's tasks (stage a done) are started already: 7-9 either way."""
    v, _ = _queue()
    t4 = v.tasks[4]
    stages = {**t4.stages, "a": replace(t4.stages["a"], rounds_done=1)}
    v = replace(v, tasks={**v.tasks, 4: replace(t4, stages=stages)})
    assert _tasks(candidate_window(v, _params(window_cap=0))) == [1, 2, 4, 7, 8, 9]
    assert _tasks(candidate_window(v, _params(window_cap=0, start_gate=False))) == [
        1, 2, 3, 7, 8, 9]


def test_the_room_counts_what_a_preemption_may_free() -> None:
    """Budget 1000; B runs one request. KV 20 under its prefix 100: with
    `swap_only` B may leave, freeing both (room 1000); without preemption the
    room is 1000 - 120. KV 300 over its prefix: B leaves only beside agents
    whose prefixes cover it, so at most 2 x 100 is freed (room 800)."""
    small = request(20, 20, CHAIN, "b", running=True)
    big = request(21, 21, CHAIN, "b", running=True, input_tokens=150, output_tokens=150)
    tasks = [task(20, CHAIN, a="done", b="active"), task(21, CHAIN, a="done", b="active")]
    v = view(CHAIN, tasks, [small], [], budget=1000, gpu=("B",))
    assert admission_room(v, preempt=True, swap_only=True) == 1000
    assert admission_room(v, preempt=False, swap_only=True) == 880
    v = view(CHAIN, tasks, [big], [], budget=1000, gpu=("B",))
    assert admission_room(v, preempt=True, swap_only=True) == 800
    assert admission_room(v, preempt=True, swap_only=False) == 1000


def test_a_window_that_holds_every_fill_leaves_the_decision_unchanged() -> None:
    """100 requests of agent A (d_r 20 each, tasks by arrival) and a budget of
    1000: any fill takes the first 45 (100 for A's prefix). The window holds
    the first 50 (its room is an upper bound: the whole budget, as nothing
    runs) and TOPAS admits the same requests as with every request weighed."""
    reqs = [request(i, i, CHAIN, "a", arrival=float(i)) for i in range(1, 101)]
    tasks = [task(i, CHAIN, float(i), a="active") for i in range(1, 101)]
    v = view(CHAIN, tasks, [], reqs, budget=1000)
    assert _tasks(candidate_window(v, _params())) == list(range(1, 51))
    windowed = TopasPolicy(_params()).decide(v)
    every = TopasPolicy(_params(window=None)).decide(v)
    assert windowed.admit == every.admit == tuple(range(1, 46))
    assert windowed.load == every.load == ("A",)


# ------------------------------------------------------------ search_budget


def _wide_view() -> EngineView:
    """Ten agents (stages a-j of a fork), two tasks waiting at every one."""
    from tests.topas_views import workflow
    wide = workflow("wide", {"s": (), **{v: ("s",) for v in "abcdefghij"}})
    tasks = [task(i, wide, float(i), s="done", **{v: "active" for v in "abcdefghij"})
             for i in range(1, 3)]
    reqs = [request(10 * i + k, i, wide, v, arrival=float(i))
            for i in range(1, 3) for k, v in enumerate("abcdefghij")]
    return view(wide, tasks, [], reqs, budget=10_000)


def test_the_search_budget_bounds_the_fills_and_the_enumeration() -> None:
    """M=16 would enumerate 2^10 prefix sets; the default budget (256 fills)
    sends the search to the greedy additions instead. The greedy additions
    fill many sets; a budget of 3 fills stops them after three (128 samples:
    each fill counts 2, so two), keeping the best state found so far: the
    budget stops a search only once it found a state that admits."""
    import topasd.scheduler.topas as topas
    v = _wide_view()
    enumerated: list[int] = []
    steps: list[float] = []
    run, evaluate = topas._Search.run, topas._Search._evaluate

    def counted(self: topas._Search) -> list[topas._State]:  # type: ignore[name-defined]
        out = run(self)
        steps.append(self.steps)
        return out

    def listed(self: topas._Search, sets: list[frozenset[str]], *args: object) -> None:  # type: ignore[name-defined]
        enumerated.append(len(sets))
        evaluate(self, sets, *args)  # type: ignore[arg-type]

    topas._Search.run, topas._Search._evaluate = counted, listed  # type: ignore[method-assign]
    try:
        TopasPolicy(_params(m=16, search_budget=0)).decide(v)
        assert max(enumerated) == 2 ** 10
        enumerated.clear()
        TopasPolicy(_params(m=16)).decide(v)
        assert max(enumerated, default=0) < 2 ** 10  # greedy: repairs only
        greedy = TopasPolicy(_params(search_budget=0)).decide(v)
        tight = TopasPolicy(_params(search_budget=3)).decide(v)
        per_sample = TopasPolicy(_params(search_budget=3, samples=128)).decide(v)
    finally:
        topas._Search.run, topas._Search._evaluate = run, evaluate  # type: ignore[method-assign]
    assert steps[-3] > 3 and steps[-2] == 3 and steps[-1] == 4
    assert greedy.admit and tight.admit and per_sample.admit  # the best found, never none


def test_a_task_view_knows_whether_it_progressed() -> None:
    """`TaskView.progressed` (read by `start_gate` and the window) follows its
    stages: a finished round or a done stage, and nothing else."""
    def with_a(a: StageProgress) -> TaskView:
        return TaskView(1, "w", 0.0, {"a": a, "b": StageProgress()})

    assert not with_a(StageProgress()).progressed
    assert not with_a(StageProgress(StageStatus.ACTIVE)).progressed
    assert with_a(StageProgress(rounds_done=1)).progressed
    assert with_a(StageProgress(StageStatus.DONE)).progressed
    started = with_a(StageProgress(rounds_done=1))
    assert not replace(started, stages={"a": StageProgress()}).progressed


def _indexed(queue: list[Request]) -> QueueIndex:
    index = QueueIndex()
    index.update(tuple(queue), Reservation.FULL, 1.0)
    return index


def test_each_workflow_oldest_request_is_the_lowest_arrival_then_id() -> None:
    """`QueueIndex.oldest` (the `overdue` candidates): per workflow, the least
    (task arrival, id), whatever the queue's order; then the next once it left."""
    at = {5: 3.0, 9: 1.0, 2: 1.0, 4: 2.0}
    reqs = [replace(request(rid, rid, CHAIN, "a", arrival=at[rid]), workflow=wf)
            for rid, wf in ((5, "w"), (9, "w"), (2, "w"), (4, "v"))]
    for queue in (reqs, reqs[::-1]):
        index = _indexed(queue)
        assert {wf: r.id for wf, r in index.oldest().items()} == {"w": 2, "v": 4}
        index.update(tuple(r for r in queue if r.id not in (2, 4)), Reservation.FULL, 1.0)
        assert {wf: r.id for wf, r in index.oldest().items()} == {"w": 9}


def _state(index: QueueIndex) -> tuple[object, ...]:
    pairs = [(a, tid) for a, tasks in index.by_agent.items() for tid in tasks]
    return ({a: dict(tasks) for a, tasks in index.by_agent.items()}, index.least, index.arrival,
            index.ordered, index.pairs, {wf: r.id for wf, r in index.oldest().items()},
            [r.id for r in index.requests(pairs)])


@pytest.mark.parametrize("seed", range(6))
def test_a_kept_index_is_the_index_of_the_queue_built_afresh(seed: int) -> None:
    """Requests leave anywhere, come at the end or anywhere, come back as new
    objects under their ids, or the queue is shuffled: the index kept over
    100 such queues holds what one built from the last queue holds (each
    task's d_r in queue order, each agent's least d_r, the queue order)."""
    rng = random.Random(seed)
    made = iter(range(10_000))

    def new() -> Request:
        rid = next(made)
        return request(rid, rid % 23, CHAIN, rng.choice("ab"), arrival=float(rid % 23 % 7),
                       input_tokens=rng.randint(1, 30), output_tokens=rng.randint(1, 30))

    queue = [new() for _ in range(40)]
    kept = _indexed(queue)
    for _ in range(100):
        move = rng.random()
        queue = [r for r in queue if rng.random() > 0.2]
        if move < 0.5:
            queue += [new() for _ in range(rng.randint(0, 6))]
        elif move < 0.7 and queue:
            queue.insert(rng.randrange(len(queue)), new())
        elif move < 0.85 and queue:
            r = queue.pop(rng.randrange(len(queue)))  # back later, a new object
            queue.append(replace(r, input_tokens=r.input_tokens + 1))
        else:
            rng.shuffle(queue)
        kept.update(tuple(queue), Reservation.FULL, 1.0)
        assert _state(kept) == _state(_indexed(queue))
        assert [kept.demand(r) for r in queue] == [
            r.admit_demand(Reservation.FULL, 1.0) for r in queue]


def test_an_indexed_demand_is_of_the_indexed_object_and_mode() -> None:
    """`QueueIndex.demand`: d_r under the mode and ratio of the last update,
    for the request object indexed only (another object under its id, or a
    request that left, has none)."""
    r = request(1, 1, CHAIN, "a", input_tokens=10, output_tokens=100, generated=0)
    index = _indexed([r])
    assert index.demand(r) == r.admit_demand(Reservation.FULL, 1.0) == 110.0
    assert index.demand(replace(r, input_tokens=11)) is None
    index.update((r,), Reservation.OPTIMISTIC, 0.5)
    assert index.demand(r) == r.admit_demand(Reservation.OPTIMISTIC, 0.5) == 60.0
    index.update((), Reservation.OPTIMISTIC, 0.5)
    assert index.demand(r) is None


def test_a_queue_change_is_what_left_then_what_came() -> None:
    """`queue_change`: the new queue is the old one's survivors, in order,
    then the requests that came; short when requests only left or came last."""
    a, b, c, d = (request(i, i, CHAIN, "a") for i in range(4))
    assert queue_change((a, b, c), (a, c, d)) == ([b], [d])
    assert queue_change((a, b, c), (b, a)) == ([a, c], [a])
    assert queue_change((a, b), ()) == ([a, b], [])
    assert queue_change((), (a,)) == ([], [a])
