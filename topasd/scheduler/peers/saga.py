"""SAGA-style: the workflow as the unit of scheduling (SAGA, arXiv 2605.00528;
the rules as its code and a reproduction citing its equations give them,
the paper body unread): Agent Fair Share order, a tool-call TTL, and
workflow-aware LRU eviction of cached context.

- Agent Fair Share (Eqs. 8-9), one tenant per task: urgency = (expected
  work W - attained service S) / (deadline - t), deadline = arrival + 1.5
  E[TCT]; the most urgent first (the engine's admission in that order).
- Tool-call TTL (Alg. 1, Eq. 6): a conversation entering a tool wait is
  protected for min(base (1 - 0.5 m), 300 s), base the 95th percentile of
  its tool's observed durations, m = clamp((KV use / budget - 0.7) / 0.2,
  0, 1); its room is not admission's to give.
- WA-LRU (Eqs. 1-5): when the cached copies nobody holds do not fit beside
  the decision's state, the unprotected ones go by P_evict = 0.3 R + 0.5
  (1 - P_reuse) + 0.2 S descending (R idle time over the longest idle, S
  size over the largest, P_reuse = cached / (cached + E[new tokens]) for a
  copy whose next holder is pending, else 0).
Never preempts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from topasd.model import (
    ContextState,
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    Request,
    TaskView,
    shared_kv,
)
from topasd.scheduler.peers.estimates import (
    Conversation,
    Estimates,
    admit_beside,
    conversation_origin,
    conversations,
    kv_in_use,
    remaining_latency,
    stage_latency,
    stage_service,
    tool_prior,
)

ALPHA, BETA, GAMMA = 0.3, 0.5, 0.2  # WA-LRU weights (SAGA's)
TTL_CAP_S = 300.0
PRESSURE_FROM, PRESSURE_SPAN = 0.7, 0.2
DEADLINE_SLACK = 1.5  # deadline = arrival + 1.5 E[TCT] (SAGA's code)
PRIOR_P95 = math.log(20.0)  # p95 / mean of an exponential: the prior before samples [ours]


def percentile95(samples: Sequence[float]) -> float:
    """The 95th percentile of sorted `samples` (nearest rank)."""
    return samples[max(0, math.ceil(0.95 * len(samples)) - 1)]


def tool_ttl(base: float, usage: float, cap_s: float = TTL_CAP_S) -> float:
    """Eq. 6: min(base (1 - 0.5 m), 300 s), m the memory pressure."""
    m = min(1.0, max(0.0, (usage - PRESSURE_FROM) / PRESSURE_SPAN))
    return min(base * (1.0 - 0.5 * m), cap_s)


def urgency(task: TaskView, work: float, tct: float, t: float,
            slack: float = DEADLINE_SLACK) -> float:
    """AFS urgency (Eq. 8): (W - S) / (deadline - t), deadline = arrival +
    1.5 E[TCT]; a deadline passed counts as 1 ms away."""
    left = max(0.0, work - task.service_s)
    return left / max(task.arrival + slack * tct - t, 1e-3)


def evict_score(idle: float, idle_max: float, reuse: float, tokens: int, largest: int) -> float:
    """WA-LRU's P_evict = alpha R + beta (1 - P_reuse) + gamma S."""
    r = min(1.0, idle / idle_max) if idle_max > 0 else 0.0
    return ALPHA * r + BETA * (1.0 - reuse) + GAMMA * (tokens / largest if largest else 0.0)


class SagaPolicy:
    """SAGA-style Agent Fair Share, tool-call TTL and WA-LRU (module docstring)."""

    def __init__(self, name: str = "saga", deadline_slack: float = DEADLINE_SLACK,
                 ttl_cap_s: float = TTL_CAP_S, prior_p95: float = PRIOR_P95) -> None:
        self.name = name
        self.slack, self.ttl_cap_s, self.prior_p95 = deadline_slack, ttl_cap_s, prior_p95
        self.est = Estimates()
        self.model, self.waits, self.origins = self.est.model, self.est.waits, self.est.origins
        self.protect: dict[tuple[int, str, float], float] = {}  # conversation -> until

    def observe(self, event: EngineEvent) -> None:
        self.est.observe(event)
        if event.kind in (EventKind.TASK_FINISH, EventKind.TASK_ABANDON):
            self.protect = {k: v for k, v in self.protect.items() if k[0] != event.task_id}

    def work_and_tct(self, view: EngineView, name: str) -> tuple[float, float]:
        """A task of workflow `name`: its expected total LLM service, and its
        expected completion time (the longest path of stage latencies)."""
        wf = view.workflows[name]
        latency = {v: stage_latency(wf, v, view, self.model, self.waits) for v in wf.stages}
        after = remaining_latency(wf, latency)
        tct = max(latency[v] + after[v] for v in wf.entry_stages)
        return sum(stage_service(wf, v, view, self.model) for v in wf.stages), tct

    def order(self, view: EngineView) -> list[Request]:
        """Agent Fair Share: the most urgent task first, then task arrival."""
        expected = {name: self.work_and_tct(view, name)
                    for name in sorted({r.workflow for r in view.waiting})}
        urgent = {r.task_id: urgency(view.tasks[r.task_id], *expected[r.workflow], view.t,
                                       self.slack)
                  for r in view.waiting if r.task_id in view.tasks}
        return sorted(view.waiting, key=lambda r: (
            -urgent.get(r.task_id, 0.0), r.task_arrival, r.task_id, r.ready_at, r.id))

    def protected(self, view: EngineView) -> list[Conversation]:
        """Conversations in a tool wait inside their TTL (fixed at first sight)."""
        usage = kv_in_use(view) / view.budget_tokens
        out = []
        for conv in conversations(view):
            key = (conv.task_id, conv.agent, conv.since)
            if key not in self.protect:
                self.protect[key] = conv.since + tool_ttl(self.base(conv, view), usage,
                                                          self.ttl_cap_s)
            if view.t <= self.protect[key]:
                out.append(conv)
        return out

    def base(self, conv: Conversation, view: EngineView) -> float:
        """The 95th percentile of the tool's observed durations (before any:
        that of an exponential with the trace mean)."""
        origin = conversation_origin(conv, self.origins)
        seen = self.waits.samples((origin.agent, origin.stage) if origin else None)
        return percentile95(seen) if seen else self.prior_p95 * tool_prior(view, origin)

    def decide(self, view: EngineView) -> Decision:
        self.origins.learn(view)
        protected = self.protected(view)
        order = self.order(view) if view.waiting else []
        d, protected = admit_beside(view, order, self.name, protected)
        evict = self.wa_lru(view, d, {k for c in protected for k in c.keys})
        return replace(d, evict=d.evict + evict) if evict else d

    def wa_lru(self, view: EngineView, d: Decision, protected: set[str]) -> tuple[str, ...]:
        """Unprotected cached copies the decision's state leaves no room for,
        highest P_evict first (where the engine would give up the oldest)."""
        admitted = [r for r in view.waiting if r.id in set(d.admit)]
        taken = {s.key for r in admitted for s in r.shared}
        cached = {k: c for k, c in view.contexts.items() if c.location is Location.GPU
                  and c.ready and not c.holders and k not in taken}
        if not cached:
            return ()
        used = float(sum(p.tokens for a, p in view.prefixes.items()
                         if (p.on_gpu and a not in d.evict) or a in d.load))
        used += sum(r.demand(view.new_token_ratio) for r in view.running)
        used += sum(r.admit_demand(d.reservation, view.new_request_ratio) for r in admitted)
        used += sum(shared_kv([*view.running, *admitted]).values())
        room = view.budget_tokens - used - sum(cached[k].tokens for k in protected if k in cached)
        free = {k: c for k, c in cached.items() if k not in protected}
        held = sum(c.tokens for c in free.values())
        if held <= room or not free:
            return ()
        out: list[str] = []
        for key in self._by_evict_score(view, free):
            if held <= room:
                break
            held -= free[key].tokens
            out.append(key)
        return tuple(out)

    def _by_evict_score(self, view: EngineView, copies: dict[str, ContextState]) -> list[str]:
        idle_max = max(view.t - c.last_used for c in copies.values())
        largest = max(c.tokens for c in copies.values())
        score = {k: evict_score(view.t - c.last_used, idle_max, self.reuse(view, k, c),
                                c.tokens, largest) for k, c in copies.items()}
        return sorted(copies, key=lambda k: (-score[k], k))

    def reuse(self, view: EngineView, key: str, c: ContextState) -> float:
        """P_reuse: the copy's share of its next holder's input, if one is pending."""
        if c.next_use is None:
            return 0.0
        origin = self.origins.get(key)
        new = 0.0
        if origin is not None and origin.workflow in view.workflows:
            new = view.workflows[origin.workflow].stages[origin.stage].profile \
                .observation_tokens.mean()
        return c.tokens / (c.tokens + new) if c.tokens + new > 0 else 0.0
