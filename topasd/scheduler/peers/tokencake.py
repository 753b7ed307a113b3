"""Tokencake-style: KV-centric scheduling for multi-agent applications
(Tokencake, arXiv 2510.18586 v2 sec. 4 Alg. 1 and sec. 5 Alg. 2; defaults of
its later version where v2 gives none).

- Space (Alg. 2): the KV budget is a shared pool plus a reserve of ratio
  rho (0.05 at first; +0.05 above 75% use, -0.05 below 40%, within
  [0.05, 0.30], each decision). The top 75% of active agents by score are
  critical; critical agent a reserves R ((use_a / B) + (score_a / sum of
  critical scores)) / 2 of R = rho B. A request of a critical agent uses its
  agent's reserve first and then the shared pool; any other only the shared
  pool. A request its partition cannot hold is passed over (when nothing
  runs and no request fits its partition, the engine's admission decides).
- Order: score = static (depth + 1)(out-degree + 1) of its stage plus its
  wait in seconds, highest first.
- Time (Alg. 1): when a conversation enters a tool wait, it is offloaded iff
  KV use is at least 60% of the budget, the predicted call T_fc (0.5 x the
  trace mean + 0.5 x an EWMA, alpha 0.5, of observed calls) exceeds the
  round trip 2 T_swap(N), and a waiting request needs at most
  min(N, (T_fc - 2 T_swap(N)) / T_decode) tokens. It is loaded back ahead of
  its holder at start + T_fc - T_up (T_up = T_swap(N), the upload's
  transfer), the policy asking the engine for a scheduling point then
  (`Decision.wake_at`), if the engine's KV has room beside what it holds
  (else at a later decision with room); a holder ready first loads it back
  at its admission.
Never preempts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from topasd.model import (
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    Request,
    Reservation,
    held_demand,
)
from topasd.scheduler.baselines import admit_in_order, committed
from topasd.scheduler.peers.estimates import (
    Conversation,
    Estimates,
    allocated,
    conversation_origin,
    conversations,
    kv_in_use,
    tool_prior,
)

RATIO_START, RATIO_STEP, RATIO_MIN = 0.05, 0.05, 0.05
RATIO_MAX = 0.10  # [ours: the later version clamps at 0.30; bench/peer_sweeps.py]
HIGH_USE, LOW_USE = 0.75, 0.40
CRITICAL_SHARE = 0.75
OFFLOAD_USE = 0.60
AGING = 1.0  # score per second waited [ours]
HINT_WEIGHT = 0.5  # beta: hint against history
EWMA_ALPHA = 0.5

Conv = tuple[int, str, float]  # a conversation in a tool wait: (task, agent, wait start)


def next_ratio(ratio: float, use: float, most: float = RATIO_MAX) -> float:
    """Alg. 2's reserve ratio after one period at KV use `use` (a share of B)."""
    if use > HIGH_USE:
        ratio += RATIO_STEP
    elif use < LOW_USE:
        ratio -= RATIO_STEP
    return min(most, max(RATIO_MIN, ratio))


def reserves(scores: Mapping[str, float], use: Mapping[str, float], reserve: float,
             budget: int, share: float = CRITICAL_SHARE) -> dict[str, float]:
    """Each critical agent's reserve: R ((use_a / B) + (score_a / sum)) / 2,
    the critical agents being the top 75% by score (at least one; ties by name)."""
    ranked = sorted(scores, key=lambda a: (-scores[a], a))
    critical = ranked[:max(1, math.floor(share * len(ranked)))] if ranked else []
    total = sum(scores[a] for a in critical) or 1.0
    return {a: reserve * (use.get(a, 0.0) / budget + scores[a] / total) / 2 for a in critical}


def shared_use(use: Mapping[str, float], reserved: Mapping[str, float]) -> float:
    """KV the shared pool holds: every agent's use beyond its reserve."""
    return sum(max(0.0, u - reserved.get(a, 0.0)) for a, u in use.items())


@dataclass(frozen=True, slots=True)
class Upload:
    """An offloaded conversation's predictive upload (Alg. 1): its copies,
    loaded back from `due` = start + T_fc - T_up on."""

    due: float
    keys: tuple[str, ...]


def uploaded(view: EngineView, keys: Sequence[str]) -> EngineView:
    """The view as the engine shows it once the copies `keys` start loading
    back ahead of their holders (their room taken: `ContextState.uploading`)."""
    contexts = dict(view.contexts)
    for k in keys:
        contexts[k] = replace(contexts[k], location=Location.GPU, ready=False)
    return replace(view, contexts=contexts)


class TokencakePolicy:
    """Tokencake-style memory partitions and tool-wait offload (module docstring)."""

    def __init__(self, name: str = "tokencake", critical_share: float = CRITICAL_SHARE,
                 ratio_max: float = RATIO_MAX, offload_use: float = OFFLOAD_USE,
                 aging: float = AGING) -> None:
        self.name = name
        self.critical_share, self.ratio_max = critical_share, ratio_max
        self.offload_use, self.aging = offload_use, aging
        self.ratio = RATIO_START
        self.est = Estimates()
        self.origins = self.est.origins
        self.history: dict[tuple[str, str], float] = {}  # (agent, stage) -> EWMA of calls
        self.offloaded: dict[Conv, bool] = {}  # conversation -> decided
        self.uploads: dict[Conv, Upload] = {}  # offloaded, not loaded back yet

    def observe(self, event: EngineEvent) -> None:
        self.est.observe(event)
        if event.kind is EventKind.TOOL_CALL_END and event.agent and event.stage:
            pair = (event.agent, event.stage)
            old = self.history.get(pair)
            self.history[pair] = event.value if old is None else (
                EWMA_ALPHA * event.value + (1 - EWMA_ALPHA) * old)
        elif event.kind in (EventKind.TASK_FINISH, EventKind.TASK_ABANDON):
            self.offloaded = {k: v for k, v in self.offloaded.items() if k[0] != event.task_id}
            self.uploads = {k: v for k, v in self.uploads.items() if k[0] != event.task_id}

    def static(self, view: EngineView, r: Request) -> float:
        wf = view.workflows[r.workflow]
        return float((wf.depth[r.stage] + 1) * (len(wf.succs[r.stage]) + 1))

    def order(self, view: EngineView) -> list[Request]:
        score = {r.id: self.static(view, r) + self.aging * max(0.0, view.t - r.queued_at)
                 for r in view.waiting}
        return sorted(view.waiting, key=lambda r: (-score[r.id], r.task_arrival, r.task_id, r.id))

    def partition(self, view: EngineView, order: Sequence[Request]) -> list[Request]:
        """The requests of `order` their partitions hold, in order."""
        use = allocated(view)
        scores: dict[str, float] = {}
        for r in (*view.waiting, *view.running):
            scores[r.agent] = max(scores.get(r.agent, 0.0), self.static(view, r))
        reserved = reserves(scores, use, self.ratio * view.budget_tokens, view.budget_tokens,
                            self.critical_share)
        pool = view.budget_tokens * (1 - self.ratio)
        held = set(committed(view)[1])
        locked = {r.agent for r in view.running}  # agents whose prefix is counted in `use`
        out: list[Request] = []
        for r in order:
            need = held_demand(r, held, Reservation.OPTIMISTIC, view.new_request_ratio)
            need += 0 if r.agent in locked else r.prefix_tokens
            after = {**use, r.agent: use.get(r.agent, 0.0) + need}
            if shared_use(after, reserved) <= pool:
                use = after
                held |= {s.key for s in r.shared}
                locked.add(r.agent)
                out.append(r)
        if not out and not view.running:  # the engine idles otherwise: the pools give way
            return list(order)
        return out

    def decide(self, view: EngineView) -> Decision:
        self.origins.learn(view)
        self.ratio = next_ratio(self.ratio, kv_in_use(view) / view.budget_tokens,
                                self.ratio_max)
        d = self.admit(view)
        load: tuple[str, ...] = ()
        for conv, keys in self.uploads_due(view) if self.uploads else ():
            room = uploaded(view, load + keys)
            if committed(room)[0] <= view.budget_tokens:
                beside = self.admit(room)
                if beside.admit == d.admit:  # it displaces no admission
                    d, load = beside, load + keys
                    del self.uploads[conv]
        offload = self.offloads(view)
        if offload:
            d = replace(d, evict=d.evict + offload)
        if self.uploads or load:
            d = replace(d, load=d.load + load, wake_at=self.next_wake(view))
        return d

    def admit(self, view: EngineView) -> Decision:
        """The engine's admission in score order, within the partitions."""
        order = self.partition(view, self.order(view)) if view.waiting else []
        return admit_in_order(view, order, self.name)

    def predicted_call(self, conv: Conversation, view: EngineView) -> float:
        """T_fc: the hint (trace mean) blended with the observed EWMA."""
        origin = conversation_origin(conv, self.origins)
        hint = tool_prior(view, origin)
        seen = self.history.get((origin.agent, origin.stage)) if origin else None
        return hint if seen is None else HINT_WEIGHT * hint + (1 - HINT_WEIGHT) * seen

    def offloads(self, view: EngineView) -> tuple[str, ...]:
        """Copies of conversations just entering a tool wait that Alg. 1
        offloads, each with its upload due at start + T_fc - T_up."""
        use = kv_in_use(view) / view.budget_tokens
        out: list[str] = []
        for conv in conversations(view):
            key = (conv.task_id, conv.agent, conv.since)
            if key not in self.offloaded:
                call = self.predicted_call(conv, view)
                self.offloaded[key] = use >= self.offload_use and self.worth(conv, view, call)
                if self.offloaded[key]:
                    out.extend(conv.keys)
                    due = conv.since + call - view.costs.t_swap(conv.tokens)
                    self.uploads[key] = Upload(due, conv.keys)
        return tuple(out)

    def uploads_due(self, view: EngineView) -> list[tuple[Conv, tuple[str, ...]]]:
        """Each upload due by now, in due order: its conversation and its
        copies on the host. An upload whose copies all left the host, or whose
        holder is ready (its admission loads them), is done with."""
        wanted = {s.key for r in view.waiting for s in r.shared}
        out: list[tuple[Conv, tuple[str, ...]]] = []
        for conv, up in sorted(self.uploads.items(), key=lambda kv: (kv[1].due, kv[0])):
            keys = tuple(k for k in up.keys if k in view.contexts
                         and view.contexts[k].location is Location.HOST)
            if not keys or wanted.intersection(up.keys):
                del self.uploads[conv]
            elif up.due <= view.t:
                out.append((conv, keys))
        return out

    def next_wake(self, view: EngineView) -> float | None:
        """The earliest upload due after now: a scheduling point the policy asks for."""
        return min((up.due for up in self.uploads.values() if up.due > view.t), default=None)

    def worth(self, conv: Conversation, view: EngineView, call: float) -> bool:
        """T_fc (`call`) > the round trip, and a waiting request fits the
        window's capacity."""
        trip = 2 * view.costs.t_swap(conv.tokens)
        window = call - trip
        if window <= 0:
            return False
        cap = min(conv.tokens, window / max(view.costs.t_decode_s, 1e-9))
        return any(r.admit_demand(Reservation.OPTIMISTIC, view.new_request_ratio) <= cap
                   for r in view.waiting)
