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

import bisect
import dataclasses
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

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


class QueueIndex:
    """The waiting queue by agent and task (each request's d_r, each agent's
    least d_r, each task's arrival), kept from one decision to the next. A
    request is frozen, so while the same object waits under the same
    reservation mode and ratio its d_r is the same float; a backend's queue
    keeps the requests that stay in order and adds new ones at its end, so
    an update touches only the requests that left or came (`queue_change`).
    Each task's d_r are in queue order, as a fresh index would hold them."""

    _last: tuple[Request, ...]
    _place: dict[int, tuple[Request, int, float]]  # id -> (request, place in the queue, d_r)
    _next: int  # the place of the next request to come
    by_agent: dict[str, dict[int, list[float]]]
    _members: dict[str, dict[int, list[Request]]]  # the requests, parallel to `by_agent`
    least: dict[str, float]
    arrival: dict[int, float]
    ordered: dict[str, list[tuple[float, int]]]  # each agent's (arrival, task), ascending
    _agents_of: dict[int, int]  # how many agents' queues hold each task
    pairs: int  # (agent, task) pairs
    # each workflow's (task arrival, id, place) of its requests, a heap that keeps
    # those that left until they reach its top; and how many of them wait
    _by_age: dict[str, list[tuple[float, int, int]]]
    _live: dict[str, int]

    def __init__(self) -> None:
        self._mode: tuple[Reservation, float] | None = None
        self._clear()

    def _clear(self) -> None:
        self._last, self._place, self._next = (), {}, 0
        self.by_agent, self._members, self.least = {}, {}, {}
        self.arrival, self.ordered, self._agents_of, self.pairs = {}, {}, {}, 0
        self._by_age, self._live = {}, {}

    def update(self, waiting: tuple[Request, ...], reservation: Reservation,
               ratio: float) -> None:
        """Index `waiting`, d_r (`Request.admit_demand`) under `reservation` and `ratio`."""
        if self._mode != (reservation, ratio):
            self._clear()
            self._mode = (reservation, ratio)
        elif waiting is self._last:
            return
        left, came = queue_change(self._last, waiting)
        emptied: set[str] = set()
        for r in left:
            self._drop(r, emptied)
        for r in came:
            self._add(r, r.admit_demand(reservation, ratio))
        for agent in emptied:
            tasks = self.by_agent.get(agent)
            if tasks is not None:  # its least d_r left: the least of what is left
                self.least[agent] = min(min(ds) for ds in tasks.values())
        self._last = waiting

    def _add(self, r: Request, d: float) -> None:
        place = self._next
        self._place[r.id] = (r, place, d)
        self._next += 1
        agent, tid, wf = r.agent, r.task_id, r.workflow
        heapq.heappush(self._by_age.setdefault(wf, []), (r.task_arrival, r.id, place))
        self._live[wf] = self._live.get(wf, 0) + 1
        tasks = self.by_agent.get(agent)
        if tasks is None:
            tasks = self.by_agent[agent] = {}
            self._members[agent], self.ordered[agent] = {}, []
            self.least[agent] = d
        ds = tasks.get(tid)
        if ds is None:
            ds = tasks[tid] = []
            self._members[agent][tid] = []
            bisect.insort(self.ordered[agent], (r.task_arrival, tid))
            self._agents_of[tid] = self._agents_of.get(tid, 0) + 1
            self.pairs += 1
        ds.append(d)
        self._members[agent][tid].append(r)
        if d < self.least[agent]:
            self.least[agent] = d
        self.arrival[tid] = r.task_arrival

    def _drop(self, r: Request, emptied: set[str]) -> None:
        """Take r out; `emptied` gets its agent if r held the agent's least d_r."""
        del self._place[r.id]
        agent, tid, wf = r.agent, r.task_id, r.workflow
        self._live[wf] -= 1
        if not self._live[wf]:
            del self._live[wf], self._by_age[wf]
        members, ds = self._members[agent][tid], self.by_agent[agent][tid]
        k = 0
        while members[k] is not r:
            k += 1
        members.pop(k)
        if ds.pop(k) <= self.least[agent]:
            emptied.add(agent)
        if members:
            return
        del self._members[agent][tid], self.by_agent[agent][tid]
        ordered = self.ordered[agent]
        del ordered[bisect.bisect_left(ordered, (self.arrival[tid], tid))]
        self.pairs -= 1
        self._agents_of[tid] -= 1
        if not self._agents_of[tid]:
            del self._agents_of[tid], self.arrival[tid]
        if not self.by_agent[agent]:
            del self._members[agent], self.by_agent[agent], self.least[agent]
            del self.ordered[agent]

    def oldest(self) -> dict[str, Request]:
        """Each workflow's waiting request of its oldest task (then lowest id)."""
        out: dict[str, Request] = {}
        for wf, heap in self._by_age.items():
            if len(heap) > 2 * self._live[wf] + 64:  # mostly requests that left
                heap[:] = [e for e in heap if self._waits(e)]
                heapq.heapify(heap)
            while not self._waits(heap[0]):
                heapq.heappop(heap)
            out[wf] = self._place[heap[0][1]][0]
        return out

    def demand(self, r: Request) -> float | None:
        """d_r as indexed (`Request.admit_demand` under the index's reservation
        mode and ratio), if r is the request object the index holds."""
        hit = self._place.get(r.id)
        return hit[2] if hit is not None and hit[0] is r else None

    def _waits(self, entry: tuple[float, int, int]) -> bool:
        hit = self._place.get(entry[1])
        return hit is not None and hit[1] == entry[2]

    def requests(self, pairs: Iterable[tuple[str, int]]) -> tuple[Request, ...]:
        """The waiting requests of the (agent, task) `pairs`, in queue order."""
        picked = [r for agent, tid in pairs for r in self._members[agent][tid]]
        picked.sort(key=lambda r: self._place[r.id][1])
        return tuple(picked)


def queue_change(last: Sequence[Request], now: Sequence[Request]) -> tuple[
        list[Request], list[Request]]:
    """(left, came) such that `now` is `last` without `left` (the same
    objects, in order), then `came`: exact for any two queues, and short
    when `now` only lost requests and gained some at its end."""
    i, n = 0, len(last)
    left: list[Request] = []
    for j, r in enumerate(now):
        while i < n and last[i] is not r:
            left.append(last[i])
            i += 1
        if i == n:
            return left, list(now[j:])
        i += 1
    left.extend(last[i:])
    return left, []


def indexed(view: EngineView, params: TopasParams, index: QueueIndex) -> QueueIndex:
    """`index` updated to `view`'s waiting queue (d_r as `params` reserve)."""
    index.update(view.waiting, reservation(params.reservation), view.new_request_ratio)
    return index


_RESERVATIONS: dict[str, Reservation] = {}


def reservation(mode: str) -> Reservation:
    """`Reservation(mode)`, looked up once per mode (an enum call is slow)."""
    hit = _RESERVATIONS.get(mode)
    if hit is None:
        hit = _RESERVATIONS[mode] = Reservation(mode)
    return hit


def candidate_window(view: EngineView, params: TopasParams,
                     forced: Iterable[Request | None] = (),
                     index: QueueIndex | None = None) -> EngineView:
    """`view` itself while at most `window_cap` (> 0) requests wait; else only
    the waiting requests of each agent's first tasks (by arrival; started
    tasks first with `start_gate`) that a fill into `window` times
    `admission_room` reaches (`_reach`), at most `window_cap` requests of
    them in that order across agents (each agent's first task and the tasks
    of `forced` requests are always in). `index` is kept between calls."""
    cap = params.window_cap or math.inf
    if params.window is None or not view.waiting or len(view.waiting) <= params.window_cap:
        return view
    limit = params.window * admission_room(view, params.preempt, params.swap_only)
    queue = indexed(view, params, index or QueueIndex())
    by_agent, arrival = queue.by_agent, queue.arrival
    started = _started(view, arrival) if params.start_gate else None
    reached = {agent: _reach(tasks, queue.ordered[agent], started, limit, queue.least[agent])
               for agent, tasks in by_agent.items()}
    keep = {(r.agent, r.task_id) for r in forced if r is not None}
    keep.update((agent, tids[0]) for agent, tids in reached.items())
    # each agent's reached tasks are in fill order: merged, they are in order across agents
    rest = heapq.merge(*[_keyed(agent, tids, started, arrival)
                         for agent, tids in sorted(reached.items())])
    slots = cap - sum(len(by_agent[a][tid]) for a, tid in keep)  # requests the cap leaves
    for _, _, tid, agent in rest:
        if (agent, tid) in keep:
            continue
        n = len(by_agent[agent][tid])
        if slots < n:
            break
        keep.add((agent, tid))
        slots -= n
    if len(keep) == queue.pairs:
        return view
    return dataclasses.replace(view, waiting=queue.requests(keep))


def _reach(tasks: Mapping[int, list[float]], ordered: list[tuple[float, int]],
           started: set[int] | None, limit: float, least: float) -> list[int]:
    """One agent's tasks (their requests' d_r), in fill order (by arrival, the
    `started` ones first), up to the first after which a fill of this agent
    alone into `limit` KV tokens admits nothing more (what is left is below
    `least`, its smallest d_r): each request that fits what is left takes
    its d_r; one that does not is skipped (its task stays, as the fill
    would refuse it)."""
    left, reached = limit, []
    for tid in _fill_order(ordered, started):
        reached.append(tid)
        for d in tasks[tid]:
            if d <= left:
                left -= d
        if left < least:
            return reached
    return reached


def _keyed(agent: str, tids: list[int], started: set[int] | None,
           arrival: Mapping[int, float]) -> Iterator[tuple[bool, float, int, str]]:
    """An agent's reached tasks after its first, keyed in their fill order:
    (new, task arrival, task, agent), each built when read."""
    for tid in tids[1:]:
        yield started is not None and tid not in started, arrival[tid], tid, agent


def _fill_order(ordered: list[tuple[float, int]], started: set[int] | None) -> Iterator[int]:
    """The tasks of `ordered` (by arrival), the `started` ones first, in one walk."""
    later: list[int] = []
    for _, tid in ordered:
        if started is not None and tid not in started:
            later.append(tid)
        else:
            yield tid
    yield from later


def _started(view: EngineView, tasks: Iterable[int]) -> set[int]:
    """Those of `tasks` that are not fresh (`is_fresh`): GreedyPack fills
    them before the others with `start_gate`."""
    running_tasks = frozenset(r.task_id for r in view.running)
    return {tid for tid in tasks if not is_fresh(view.tasks.get(tid), running_tasks)}
