"""Astraea-style: a state-aware multi-level queue with HRRN inside each level,
and keep/discard/swap of a conversation's KV during its tool waits (Astraea,
arXiv 2512.14142, sec. 4.3 Alg. 1 and sec. 4.4).

Every task (request chain) enters level 0 of `levels` strict-priority queues.
A round whose token cost (input + output) exceeds its level's threshold
demotes its task one level; one that calls a tool within its quota promotes
it one level. A task in the last level whose response ratio exceeds `aging`
jumps to level 0. Ready requests are taken by (level, HRRN descending),

    HRRN = (W + T_proc) / T_proc,

W the time the task's requests have waited in the queue (tool waits
excluded), T_proc the request's estimated service (`astraea-oracle`: the
profiled service of its true output length, the paper's segment-level
oracle); admission is the
engine's, in that order, and nothing is preempted. Above the `watermark`
share of KV, a conversation waiting out a tool call is kept, or evicted
(discarded, or swapped where the engine has a host tier), by the least of
InferCept's waste terms: W_pres = T_api C_self, W_disc = T_recomp C_batch,
W_swap = 2 T_swap C_batch (bytes per token cancels).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from topasd.model import Decision, EngineEvent, EngineView, EventKind, Request
from topasd.scheduler.baselines import admit_in_order
from topasd.scheduler.peers.estimates import (
    Conversation,
    Estimates,
    conversations,
    expected_wait,
    kv_in_use,
)

LEVELS = 4  # m [ours]
BASE_TOKENS = 8192  # level q's quota: BASE_TOKENS * 2^q tokens of a round [ours: swept]
AGING = 8.0  # response ratio that lifts a last-level task to level 0 [ours]
WATERMARK = 0.9  # KV share above which tool waits' KV may leave the GPU [ours]


def hrrn(waited: float, service: float) -> float:
    """The response ratio (W + T_proc) / T_proc."""
    service = max(service, 1e-9)
    return (waited + service) / service


def waste(api_s: float, recompute_s: float, swap_s: float, own: int, batch: float) -> str:
    """InferCept's least-waste choice for a paused context: 'preserve',
    'discard' or 'swap' (ties keep it: preserve, then discard)."""
    terms = {"preserve": api_s * own, "discard": recompute_s * batch, "swap": 2 * swap_s * batch}
    return min(terms, key=lambda k: (terms[k], ("preserve", "discard", "swap").index(k)))


class AstraeaPolicy:
    """Astraea-style Stateful-MLFQ with HRRN, and KV waste choices in tool waits."""

    def __init__(self, name: str = "astraea", levels: int = LEVELS,
                 base_tokens: int = BASE_TOKENS, aging: float = AGING,
                 watermark: float = WATERMARK, oracle: bool = False) -> None:
        self.name = name
        self.oracle = oracle
        self.levels, self.base_tokens, self.aging, self.watermark = (
            levels, base_tokens, aging, watermark)
        self.est = Estimates()
        self.model, self.waits, self.origins = self.est.model, self.est.waits, self.est.origins
        self.level: dict[int, int] = defaultdict(int)
        self._cost: dict[int, int] = {}  # request -> its round's token cost
        self._within: dict[int, int] = {}  # task -> its last round, finished within quota

    def quota(self, level: int) -> int:
        return self.base_tokens * 2 ** level

    def observe(self, event: EngineEvent) -> None:
        self.est.observe(event)
        kind, rid, tid = event.kind, event.request_id, event.task_id
        if kind is EventKind.REQUEST_FINISH:
            self._round_end(rid, tid)  # type: ignore[arg-type]
        elif kind is EventKind.TOOL_CALL_START and self._within.get(tid) == rid:  # type: ignore[arg-type]
            self.level[tid] = max(0, self.level[tid] - 1)  # type: ignore[index]  # I/O-bound
        elif kind in (EventKind.TASK_FINISH, EventKind.TASK_ABANDON):
            for book in (self.level, self._within):
                book.pop(tid, None)  # type: ignore[arg-type]
        elif kind is EventKind.REQUEST_WITHDRAW:
            self._cost.pop(rid, None)  # type: ignore[arg-type]

    def _round_end(self, rid: int, tid: int) -> None:
        """A round's cost over its level's quota demotes its task (compute-bound)."""
        cost = self._cost.pop(rid, 0)
        if cost > self.quota(self.level[tid]):
            self.level[tid] = min(self.levels - 1, self.level[tid] + 1)
            self._within.pop(tid, None)
        else:
            self._within[tid] = rid

    def ratio(self, view: EngineView, r: Request) -> float:
        """HRRN of `r`: its task's queue waits so far plus this one's, over
        its estimated service (`oracle`: the profiled service of its true
        length, as the paper's segment-level oracle gives it)."""
        waited = self.est.task_waited.get(r.task_id, 0.0) + max(0.0, view.t - r.queued_at)
        service = view.costs.t_request(r.input_tokens, r.output_tokens) if self.oracle \
            else self.model.request_estimate(r, view.costs)
        return hrrn(waited, service)

    def order(self, view: EngineView) -> list[Request]:
        """Level ascending, HRRN descending, then task and request arrival."""
        ratios = {r.id: self.ratio(view, r) for r in view.waiting}
        for r in view.waiting:  # anti-starvation
            if self.level[r.task_id] == self.levels - 1 and ratios[r.id] > self.aging:
                self.level[r.task_id] = 0
        return sorted(view.waiting, key=lambda r: (
            self.level[r.task_id], -ratios[r.id], r.task_arrival, r.task_id, r.id))

    def decide(self, view: EngineView) -> Decision:
        self.origins.learn(view)
        for r in view.waiting:
            self._cost[r.id] = r.input_tokens + r.output_tokens
        d = admit_in_order(view, self.order(view) if view.waiting else (), self.name)
        evict = self.tool_wait_evictions(view, set(d.admit))
        return replace(d, evict=d.evict + evict) if evict else d

    def tool_wait_evictions(self, view: EngineView, admitted: set[int]) -> tuple[str, ...]:
        """Copies of conversations in a tool wait to move off the GPU: none
        below the watermark; above it, those whose least waste is not to keep."""
        if kv_in_use(view) < self.watermark * view.budget_tokens:
            return ()
        batch = sum(r.admit_demand() for r in view.waiting if r.id not in admitted)
        out: list[str] = []
        for conv in conversations(view):
            if self.choice(conv, view, batch) != "preserve":
                out.extend(conv.keys)
        return tuple(out)

    def choice(self, conv: Conversation, view: EngineView, batch: float) -> str:
        """Preserve, discard or swap the conversation (InferCept's waste terms)."""
        api = max(0.0, conv.since + expected_wait(conv, view, self.origins, self.waits) - view.t)
        costs = view.costs
        return waste(api, costs.t_prefill(conv.tokens), costs.t_swap(conv.tokens),
                     conv.tokens, batch)
