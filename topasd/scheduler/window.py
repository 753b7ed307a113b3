"""TOPAS's candidate window: a decision's cost bounded by the KV budget, not
by the length of the waiting queue (docs/topas.md, "Candidate window").

GreedyPack (`pack_order="arrival"`, with `start_gate` started tasks first)
fills every candidate prefix set from its agents' waiting requests in task
order, and can admit at most the room the running requests leave. So each
agent's requests beyond the point where a fill of that agent alone into
`window` times that room could admit nothing more are reached by a fill of
several agents only when they share the room differently (first fit); they
stay queued, in order, for the next decisions. The room counts what a
preempting candidate could free. The window keeps each agent's first task
even when there is no room (the prefix-set search still sees every agent
with waiting work), and every request the search must cover (`overdue`,
the head of line).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from topasd.model import EngineView, Request, Reservation, TaskView
from topasd.scheduler.params import TopasParams


def admission_room(view: EngineView, preempt: bool, swap_only: bool) -> float:
    """An upper bound on the KV any candidate can admit into: the budget less
    what the running requests (d_r, Eq. 2) and their prefixes hold, plus what
    a candidate may free by preempting (with `swap_only`, agents whose
    running KV is at most their prefixes', `grabs_kv`)."""
    if preempt and not swap_only:
        return float(view.budget_tokens)
    ratio = view.new_token_ratio
    kv = sum((r.demand(ratio) for r in view.running), 0.0)
    agents = sorted({r.agent for r in view.running})
    prefixes = sum((view.prefixes[a].tokens for a in agents if a in view.prefixes), 0.0)
    # the agents leaving hold at most as much KV as their prefixes (`grabs_kv`)
    freed = min(kv + prefixes, 2.0 * prefixes) if preempt else 0.0
    room = view.budget_tokens - kv - prefixes + freed
    return max(0.0, room)


def is_fresh(task: TaskView | None, running_tasks: frozenset[int]) -> bool:
    """A task that has not started: none of its requests runs, no round has
    finished and no stage is done (`start_gate` fills such tasks last)."""
    return task is not None and not task.progressed and task.id not in running_tasks


@dataclasses.dataclass(slots=True)
class _Queue:
    """The waiting queue by agent and task: each request's d_r, each agent's
    least d_r, each task's arrival."""

    by_agent: dict[str, dict[int, list[float]]] = dataclasses.field(default_factory=dict)
    least: dict[str, float] = dataclasses.field(default_factory=dict)
    arrival: dict[int, float] = dataclasses.field(default_factory=dict)

    def add(self, r: Request, d: float) -> None:
        tid, tasks = r.task_id, self.by_agent.get(r.agent)
        if tasks is None:
            self.by_agent[r.agent], self.least[r.agent] = {tid: [d]}, d
        else:
            ds = tasks.get(tid)
            if ds is None:
                tasks[tid] = [d]
            else:
                ds.append(d)
            if d < self.least[r.agent]:
                self.least[r.agent] = d
        self.arrival[tid] = r.task_arrival


class DemandMemo:
    """Each waiting request's d_r (`Request.admit_demand`) kept from one
    decision to the next: a request is frozen, so while the same object
    waits under the same reservation mode and ratio its d_r is the same
    float. Holds only the requests of the last queue it priced."""

    def __init__(self) -> None:
        self._mode: tuple[Reservation, float] | None = None
        self._held: dict[int, tuple[Request, float]] = {}

    def demands(self, waiting: Iterable[Request], reservation: Reservation,
                ratio: float) -> list[float]:
        """d_r of each of `waiting`, in order."""
        old: dict[int, tuple[Request, float]] = {}
        if self._mode == (reservation, ratio):
            old = self._held
        held: dict[int, tuple[Request, float]] = {}
        out: list[float] = []
        for r in waiting:
            hit = old.get(r.id)
            d = hit[1] if hit is not None and hit[0] is r else r.admit_demand(reservation, ratio)
            held[r.id] = (r, d)
            out.append(d)
        self._mode, self._held = (reservation, ratio), held
        return out


def oldest_by_workflow(waiting: Iterable[Request]) -> dict[str, Request]:
    """Each workflow's waiting request of its oldest task (then lowest id)."""
    oldest: dict[str, Request] = {}
    for r in waiting:
        o = oldest.get(r.workflow)
        if o is None or r.task_arrival < o.task_arrival or (
                r.task_arrival == o.task_arrival and r.id < o.id):
            oldest[r.workflow] = r
    return oldest


def candidate_window(view: EngineView, params: TopasParams,
                     forced: Iterable[Request | None] = (),
                     memo: DemandMemo | None = None) -> EngineView:
    """`view` itself while at most `window_cap` (> 0) requests wait; else only
    the waiting requests of each agent's first tasks (by arrival; started
    tasks first with `start_gate`) that a fill into `window` times
    `admission_room` reaches (`_reach`), at most `window_cap` requests of
    them in that order across agents (each agent's first task and the tasks
    of `forced` requests are always in). `memo` keeps d_r between calls."""
    cap = params.window_cap or math.inf
    if params.window is None or not view.waiting or len(view.waiting) <= params.window_cap:
        return view
    limit = params.window * admission_room(view, params.preempt, params.swap_only)
    reservation, ratio, queue = Reservation(params.reservation), view.new_request_ratio, _Queue()
    memo = memo or DemandMemo()
    for r, d in zip(view.waiting, memo.demands(view.waiting, reservation, ratio), strict=True):
        queue.add(r, d)
    by_agent = queue.by_agent
    order = _task_order(view, queue.arrival, params.start_gate)
    reached = {agent: _reach(tasks, order, limit, queue.least[agent])
               for agent, tasks in by_agent.items()}
    keep = {(r.agent, r.task_id) for r in forced if r is not None}
    keep.update((agent, tids[0]) for agent, tids in reached.items())
    rest = sorted(((order[tid], agent, len(by_agent[agent][tid]))
                   for agent, tids in reached.items() for tid in tids[1:]))
    slots = cap - sum(len(by_agent[a][tid]) for a, tid in keep)  # requests the cap leaves
    for (_, _, tid), agent, n in rest:
        if (agent, tid) in keep:
            continue
        if slots < n:
            break
        keep.add((agent, tid))
        slots -= n
    if len(keep) == sum(len(tasks) for tasks in by_agent.values()):
        return view
    kept: dict[str, set[int]] = defaultdict(set)
    for agent, tid in keep:
        kept[agent].add(tid)
    return dataclasses.replace(
        view, waiting=tuple(r for r in view.waiting if r.task_id in kept[r.agent]))


def _reach(tasks: Mapping[int, list[float]], order: Mapping[int, tuple[bool, float, int]],
           limit: float, least: float) -> list[int]:
    """One agent's tasks (their requests' d_r), in fill order, up to the first
    after which a fill of this agent alone into `limit` KV tokens admits
    nothing more (what is left is below `least`, its smallest d_r): each
    request that fits what is left takes its d_r; one that does not is
    skipped (its task stays, as the fill would refuse it)."""
    left, reached = limit, []
    heap = [order[tid] for tid in tasks]  # (started, arrival, id): popped in order
    heapq.heapify(heap)
    while heap:
        tid = heapq.heappop(heap)[2]
        reached.append(tid)
        for d in tasks[tid]:
            if d <= left:
                left -= d
        if left < least:
            break
    return reached


def _task_order(view: EngineView, arrival: Mapping[int, float],
                started_first: bool) -> Mapping[int, tuple[bool, float, int]]:
    """GreedyPack's task order: (not started, arrival, id) with `started_first`."""
    running_tasks = frozenset(r.task_id for r in view.running)
    if not started_first:
        return {tid: (False, at, tid) for tid, at in arrival.items()}
    return {tid: (is_fresh(view.tasks.get(tid), running_tasks), at, tid)
            for tid, at in arrival.items()}
