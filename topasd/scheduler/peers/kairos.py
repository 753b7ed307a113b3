"""Kairos-style: workflow-aware priority and memory-aware admission (Kairos,
arXiv 2508.06948; the rules as its released code and third-party summaries
give them, the paper body unread).

Priority: a request's expected remaining workflow latency after its stage,
the longest path over the stages after it, each weighted by its expected
LLM service (observed mean, profiled before any) plus its expected tool
waits (E[rounds] - 1 times the mean wait); the least first, task arrival
breaking ties. Admission is head-of-line in that order: the head is admitted
only if a projection of KV over time slots of `slot_s` seconds stays within
the budget in every slot, each request (running, and the head) holding its
input plus its output grown linearly until its predicted end; otherwise
nothing more is admitted this step. Never preempts; prefixes and cached
copies are the engine's (LRU).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from topasd.model import (
    Decision,
    EngineEvent,
    EngineView,
    Request,
    missing_shared,
    shared_kv,
)
from topasd.scheduler.baselines import admit_in_order
from topasd.scheduler.peers.estimates import Estimates, remaining_latency, stage_latency

SLOT_S = 0.5  # the released code's time slot
MAX_SLOTS = 512  # projection horizon, in slots [ours]


def peak_kv(base: float, held: np.ndarray, grow: np.ndarray, cap: np.ndarray,
            end: np.ndarray, slot_s: float, max_slots: int = MAX_SLOTS) -> float:
    """The largest projected KV over the slots: `base` plus, for each request
    until its predicted `end`, min(cap, held + grow * elapsed)."""
    horizon = min(max_slots, int(np.ceil(float(end.max(initial=0.0)) / slot_s)) + 1)
    s = np.arange(horizon) * slot_s
    kv = np.minimum(cap[:, None], held[:, None] + grow[:, None] * s[None, :])
    kv = np.where(s[None, :] < end[:, None], kv, 0.0)
    return base + float(kv.sum(axis=0).max(initial=0.0))


class KairosPolicy:
    """Kairos-style workflow priority over a time-slot KV admission gate."""

    def __init__(self, name: str = "kairos", slot_s: float = SLOT_S,
                 max_slots: int = MAX_SLOTS) -> None:
        self.name = name
        self.slot_s, self.max_slots = slot_s, max_slots
        self.est = Estimates()
        self.model, self.waits = self.est.model, self.est.waits

    def observe(self, event: EngineEvent) -> None:
        self.est.observe(event)

    def order(self, view: EngineView) -> list[Request]:
        after: dict[str, dict[str, float]] = {}
        for name in sorted({r.workflow for r in view.waiting}):
            wf = view.workflows[name]
            weight = {v: stage_latency(wf, v, view, self.model, self.waits) for v in wf.stages}
            after[name] = remaining_latency(wf, weight)
        return sorted(view.waiting, key=lambda r: (
            after[r.workflow][r.stage], r.task_arrival, r.task_id, r.ready_at, r.id))

    def projection(self, view: EngineView, reqs: Sequence[Request], admitted: int) -> tuple[
            np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(held, growth per second, cap, predicted end) of each request; the
        first `admitted` of `reqs` are new (not started)."""
        held, grow, cap, end = [], [], [], []
        for i, r in enumerate(reqs):
            service = max(self.model.request_estimate(r, view.costs), 1e-9)
            elapsed = 0.0 if i < admitted or r.started_at is None else view.t - r.started_at
            left = max(service - elapsed, self.slot_s)
            held.append(float(r.own_input + r.generated))
            grow.append(r.remaining / left)
            cap.append(float(r.own_input + r.output_tokens))
            end.append(left)
        return tuple(np.asarray(x, dtype=float) for x in (held, grow, cap, end))  # type: ignore[return-value]

    def gate(self, view: EngineView, order: Sequence[Request]) -> list[Request]:
        """The head-of-line run of `order` whose projected KV fits every slot."""
        agents = {r.agent for r in view.running}
        held = shared_kv(view.running)
        base = float(sum(view.prefixes[a].tokens for a in agents) + sum(held.values()))
        out: list[Request] = []
        for r in order:
            extra = 0 if r.agent in agents else view.prefixes[r.agent].tokens
            extra += missing_shared(r, held)
            reqs = [*out, r, *view.running]
            if peak_kv(base + extra, *self.projection(view, reqs, len(out) + 1),
                       self.slot_s, self.max_slots) > view.budget_tokens:
                break
            out.append(r)
            agents.add(r.agent)
            held.update(shared_kv((r,)))
            base += extra
        return out

    def decide(self, view: EngineView) -> Decision:
        if view.batch_is_full or not view.waiting:
            return admit_in_order(view, (), self.name)
        return admit_in_order(view, self.gate(view, self.order(view)), self.name)
