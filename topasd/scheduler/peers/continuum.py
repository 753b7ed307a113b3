"""Continuum-style: a conversation's KV kept through a tool call for a
time-to-live (Continuum / CacheTTL, arXiv 2511.02230, Eq. 2 and Alg. 1).

When a round ends in a tool call, its conversation is pinned for

    tau* = argmax_tau  P_f(tau) (T eta + Reload) - tau,   tau in {0} u observed,

P_f the empirical CDF of the tool's durations (its (agent, stage); pooled
across tools below `min_samples` of it; below `min_samples` overall an
exponential prior with the trace mean m, whose argmax is m ln(B/m) when
B = T eta + Reload > m, else 0), T the mean recent queueing delay, eta = 1,
Reload the profiled prefill of the conversation. A pinned conversation's
room is not admission's to give; unpinned, it is the engine's cache again.
Waiting order: preempted requests, then those of a program holding a live
pin, then the rest; program (task) arrival order inside each. When nothing
can be admitted and nothing runs, whole programs are unpinned, the latest
arrived first (`admit_beside`). Never preempts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from topasd.model import Decision, EngineEvent, EngineView, EventKind, Location, Request
from topasd.scheduler.peers.estimates import (
    Conversation,
    Estimates,
    admit_beside,
    conversation_origin,
    conversations,
    tool_prior,
)

MIN_SAMPLES = 100  # Continuum v6: own CDF above 100 samples of a tool, pooled above 100 overall
ETA = 1.0  # the paper's cold-start eta [ours: kept throughout]


def ttl(samples: Sequence[float], benefit: float, prior_mean: float) -> float:
    """tau* of Eq. 2 over {0} and the sorted `samples`; with none, the argmax
    under an exponential with mean `prior_mean`. Ties: the shorter pin."""
    if not samples:
        if prior_mean <= 0 or benefit <= prior_mean:
            return 0.0
        return prior_mean * math.log(benefit / prior_mean)
    n = len(samples)
    best, best_gain = 0.0, 0.0
    for tau in samples:
        gain = bisect.bisect_right(samples, tau) / n * benefit - tau
        if gain > best_gain:
            best, best_gain = tau, gain
    return best


class ContinuumPolicy:
    """Continuum-style TTL pins over the engine's admission (module docstring)."""

    def __init__(self, name: str = "continuum", min_samples: int = MIN_SAMPLES,
                 eta: float = ETA) -> None:
        self.name = name
        self.min_samples, self.eta = min_samples, eta
        self.est = Estimates()
        self.waits, self.origins = self.est.waits, self.est.origins
        self.pins: dict[tuple[int, str, float], float] = {}  # conversation -> pinned until

    def observe(self, event: EngineEvent) -> None:
        self.est.observe(event)
        if event.kind in (EventKind.TASK_FINISH, EventKind.TASK_ABANDON):
            self.pins = {k: v for k, v in self.pins.items() if k[0] != event.task_id}

    def tool_samples(self, conv: Conversation, view: EngineView) -> tuple[Sequence[float], float]:
        """The CDF Eq. 2 reads for this conversation's tool, and the trace mean."""
        origin = conversation_origin(conv, self.origins)
        own = self.waits.samples((origin.agent, origin.stage) if origin else None)
        prior = tool_prior(view, origin)
        if len(own) > self.min_samples:
            return own, prior
        if len(self.waits.pooled) > self.min_samples:
            return self.waits.pooled, prior
        return (), prior

    def pin_until(self, conv: Conversation, view: EngineView) -> float:
        """The conversation's pin deadline, fixed when it is first seen waiting."""
        key = (conv.task_id, conv.agent, conv.since)
        if key not in self.pins:
            samples, prior = self.tool_samples(conv, view)
            benefit = self.est.mean_queue_wait() * self.eta + view.costs.t_prefill(conv.tokens)
            self.pins[key] = conv.since + ttl(samples, benefit, prior)
        return self.pins[key]

    def pinned(self, view: EngineView) -> list[Conversation]:
        """Conversations in a tool wait whose pin is live."""
        return [c for c in conversations(view) if view.t <= self.pin_until(c, view)]

    def order(self, view: EngineView, live: set[int]) -> list[Request]:
        """Preempted first, then programs with a live pin, program FCFS inside."""
        def key(r: Request) -> tuple[int, float, int, float, int]:
            group = 0 if r.preemptions else 1 if r.task_id in live or self._returned(
                view, r) else 2
            return (group, r.task_arrival, r.task_id, r.ready_at, r.id)

        return sorted(view.waiting, key=key)

    def _returned(self, view: EngineView, r: Request) -> bool:
        """`r` starts with a cached copy whose pin was live when `r` became ready."""
        for s in r.shared:
            c = view.contexts.get(s.key)
            if c is not None and c.location is Location.GPU and not c.holders:
                until = self.pins.get((c.task_id, c.agent, c.last_used))
                if until is not None and r.ready_at <= until:
                    return True
        return False

    def decide(self, view: EngineView) -> Decision:
        self.origins.learn(view)
        pinned = self.pinned(view)
        order = self.order(view, {c.task_id for c in pinned})
        return admit_beside(view, order, self.name, pinned)[0]
