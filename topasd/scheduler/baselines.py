"""The paper's baselines: small pure orderings over one shared admission helper.

The helper emulates the engine's default behaviour (SGLang 0.5.3's
PrefillAdder): walk the waiting queue in the policy's priority order and admit
while `input + max_new` fits beside the running requests' optimistic
reservations; prefixes become resident on demand; unlocked prefixes are
evicted LRU when an admitted request needs their room (never for a request
that would not fit even without them); the walk stops at the first request that does
not fit (head-of-line blocking), and no new attempt is made until a running
request finishes (`batch_is_full`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from topasd.model import (
    Decision,
    EngineEvent,
    EngineView,
    Request,
    Reservation,
    held_demand,
    missing_shared,
    shared_kv,
)

LPM_FCFS_FALLBACK = 128  # SGLang: LPM falls back to FCFS above this many waiting
LAS_BASE_S = 2.0  # Autellix PLAS: first queue holds tasks with < 2 s attained service
LAS_GROWTH = 2.0  # each next queue's upper bound doubles
LAS_LEVELS = 8


def admit_in_order(view: EngineView, order: Sequence[Request], policy: str) -> Decision:
    """Admit in `order` while the budget allows (the engine's default admission)."""
    if view.batch_is_full or not order:
        return Decision(view.t, policy, reservation=Reservation.OPTIMISTIC,
                        blocked=view.batch_is_full)
    gpu = set(view.gpu_prefixes())
    locked = {r.agent for r in view.running}
    used, held = committed(view)
    cached = set(view.cached_contexts())  # copies on the GPU: not prefilled again
    idle = [a for _, a in sorted((view.prefixes[a].last_used, a) for a in gpu - locked)]
    admit: list[int] = []
    load: list[str] = []
    evict: list[str] = []
    blocked = retry = False
    chunk_left, input_left = view.chunk_tokens, view.max_prefill_tokens
    for req in order:
        extend = req.own_input + req.generated + (0 if req.agent in gpu else req.prefix_tokens)
        if req.shared:
            extend += missing_shared(req, cached)
        if admit and (chunk_left <= 0 or extend >= input_left):
            retry = True  # SGLang: this round's prefill is full; try again next step
            break
        need = held_demand(req, held, Reservation.OPTIMISTIC, view.new_request_ratio)
        need += 0 if req.agent in gpu else req.prefix_tokens
        if req.agent in idle:
            idle.remove(req.agent)
        if used - sum(view.prefixes[a].tokens for a in idle) + need > view.budget_tokens:
            blocked = True  # no room even with every idle prefix gone: evict nothing
            break  # (SGLang counts evictable cache as room and evicts on allocation)
        while used + need > view.budget_tokens:
            victim = idle.pop(0)
            evict.append(victim)
            gpu.discard(victim)
            used -= view.prefixes[victim].tokens
        if req.agent not in gpu:
            gpu.add(req.agent)
            if req.agent in evict:  # still on the GPU: keep it rather than reload
                evict.remove(req.agent)
            else:
                load.append(req.agent)
        used += need
        if req.shared:
            held |= shared_kv((req,))
            cached.update(held)
        admit.append(req.id)
        chunk_left -= extend
        input_left -= extend
    return Decision(view.t, policy, admit=tuple(admit), load=tuple(load), evict=tuple(evict),
                    reservation=Reservation.OPTIMISTIC, blocked=blocked, retry=retry)


def committed(view: EngineView) -> tuple[float, dict[str, int]]:
    """KV the engine's admission counts taken (Eq. 2): prefixes on the GPU,
    running requests' reservations, and the copies held (by running requests,
    each once, or loading back ahead of any holder); and those copies (key ->
    tokens), which an admitted request holding one adds nothing for."""
    used: float = sum(view.prefix_tokens(a) for a in view.gpu_prefixes())
    used += sum(r.demand(view.new_token_ratio) for r in view.running)
    held = shared_kv(view.running)  # shared segments locked: each copy counted once
    for key, c in view.contexts.items():
        if c.uploading:
            held[key] = c.tokens
    if held:
        used += sum(held.values())
    return used, held


# ----------------------------------------------------------------- orders


def fcfs_order(view: EngineView) -> Sequence[Request]:
    """Waiting-queue order: arrival, with preempted requests re-queued at the back."""
    return view.waiting


def lpm_order(view: EngineView) -> Sequence[Request]:
    """Longest resident prefix first (SGLang LPM); of several requests sharing a
    prefix that is not cached, only the first keeps its place (in-batch prefix
    caching); FCFS when more than 128 requests wait."""
    if len(view.waiting) > LPM_FCFS_FALLBACK:
        return view.waiting
    seen: set[str] = set()

    def key(item: tuple[int, Request]) -> tuple[float, int]:
        idx, r = item
        if view.prefixes[r.agent].on_gpu:
            return (-r.prefix_tokens, idx)
        if r.agent in seen:
            return (math.inf, idx)
        seen.add(r.agent)
        return (0.0, idx)

    keyed = [(key(item), item[1]) for item in enumerate(view.waiting)]
    return [r for _, r in sorted(keyed, key=lambda kr: kr[0])]


def parrot_order(view: EngineView) -> Sequence[Request]:
    """Task arrival order, request arrival as the tie-breaker (Parrot-FCFS)."""
    return sorted(view.waiting, key=lambda r: (r.task_arrival, r.task_id, r.ready_at, r.id))


def las_level(service_s: float) -> int:
    """Autellix PLAS queue index of a task with `service_s` attained service."""
    level, bound = 0, LAS_BASE_S
    while service_s >= bound and level < LAS_LEVELS - 1:
        level += 1
        bound *= LAS_GROWTH
    return level


def las_order(view: EngineView) -> Sequence[Request]:
    """Least attained service per task, in discretized levels, FIFO inside one."""
    def level(r: Request) -> int:
        task = view.tasks.get(r.task_id)
        return las_level(task.service_s) if task else 0

    return [r for _, _, r in sorted((level(r), i, r) for i, r in enumerate(view.waiting))]


def spf_order(view: EngineView) -> Sequence[Request]:
    """Deepest workflow stage first, FCFS within a depth (SRPT on Chain-3)."""
    def depth(r: Request) -> int:
        return view.workflows[r.workflow].depth[r.stage]

    return [r for _, _, r in sorted((-depth(r), i, r) for i, r in enumerate(view.waiting))]


class OrderPolicy:
    """A baseline: an ordering over the shared admission helper."""

    def __init__(self, name: str, order: Callable[[EngineView], Sequence[Request]]) -> None:
        self.name = name
        self._order = order

    def decide(self, view: EngineView) -> Decision:
        if view.batch_is_full or not view.waiting:
            return admit_in_order(view, (), self.name)
        return admit_in_order(view, self._order(view), self.name)

    def observe(self, event: EngineEvent) -> None:
        return None


BASELINES: dict[str, Callable[[EngineView], Sequence[Request]]] = {
    "fcfs": fcfs_order,
    "lpm": lpm_order,
    "parrot-fcfs": parrot_order,
    "autellix-las": las_order,
    "spf": spf_order,
}
