"""What every peer policy estimates, written once: tool-call durations (trace
means, then observed history), where a conversation copy came from, the
conversations waiting out a tool call, the KV a view holds, a stage's
expected latency; and the engine's admission beside pinned conversations.

Each peer sees the same estimators TOPAS does: a request's service is
`ServiceModel.request_estimate` (the pair's mean observed round service, the
profile before any) and a tool call's duration the mean observed wait of its
(agent, stage), the stage profile's `tool_wait_s` mean before any. No peer
reads `ContextState.next_use` (the true end of a wait in the simulator).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from topasd.model import (
    ContextState,
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    Request,
    Workflow,
    shared_kv,
)
from topasd.scheduler.baselines import admit_in_order
from topasd.scheduler.residual import ServiceModel, stage_prior

Pair = tuple[str, str]  # (agent, stage)
QUEUE_WINDOW = 64  # queueing waits in the sliding mean [ours]


class ToolWaits:
    """Observed tool-call durations per (agent, stage), fed by TOOL_CALL_END
    events (`value`: the wait), each list sorted (an empirical CDF)."""

    def __init__(self) -> None:
        self.by_pair: dict[Pair, list[float]] = defaultdict(list)
        self.pooled: list[float] = []

    def observe(self, event: EngineEvent) -> None:
        if event.kind is EventKind.TOOL_CALL_END and event.agent and event.stage:
            bisect.insort(self.by_pair[(event.agent, event.stage)], event.value)
            bisect.insort(self.pooled, event.value)

    def samples(self, pair: Pair | None) -> Sequence[float]:
        return self.by_pair.get(pair, ()) if pair else ()

    def mean(self, pair: Pair | None, prior: float) -> float:
        """The pair's mean observed wait; `prior` (the trace mean) before any."""
        seen = self.samples(pair)
        return sum(seen) / len(seen) if seen else prior


@dataclass(frozen=True, slots=True)
class Origin:
    """The round a conversation copy was kept from: its task, agent, stage."""

    task_id: int
    agent: str
    stage: str
    workflow: str


class Origins:
    """Copy key -> the round whose finished sequence it is (`Request.keeps`),
    learned from the requests every view shows (each is waiting in some view
    before it is admitted)."""

    def __init__(self) -> None:
        self._of: dict[str, Origin] = {}
        self._keys: dict[int, list[str]] = defaultdict(list)

    def learn(self, view: EngineView) -> None:
        for r in (*view.waiting, *view.running):
            if r.keeps is not None and r.keeps.key not in self._of:
                self._of[r.keeps.key] = Origin(r.task_id, r.agent, r.stage, r.workflow)
                self._keys[r.task_id].append(r.keeps.key)

    def get(self, key: str) -> Origin | None:
        return self._of.get(key)

    def forget(self, task_id: int) -> None:
        for key in self._keys.pop(task_id, ()):
            del self._of[key]


class Estimates:
    """The estimators every peer reads, fed by the same events: the service
    model (rounds and stages finished), tool-call durations, copy origins,
    and queueing: the last `QUEUE_WINDOW` waits from ready (or preempted) to
    admitted, and each unfinished task's total."""

    def __init__(self) -> None:
        self.model = ServiceModel()
        self.waits = ToolWaits()
        self.origins = Origins()
        self.queue_waits: deque[float] = deque(maxlen=QUEUE_WINDOW)
        self.task_waited: dict[int, float] = defaultdict(float)
        self._queued: dict[int, float] = {}

    def observe(self, event: EngineEvent) -> None:
        self.waits.observe(event)
        kind, rid, pair = event.kind, event.request_id, (event.agent, event.stage)
        if kind in (EventKind.REQUEST_READY, EventKind.PREEMPT, EventKind.RETRACT):
            self._queued[rid] = event.t  # type: ignore[index]
        elif kind is EventKind.REQUEST_ADMIT and rid in self._queued:
            wait = event.t - self._queued.pop(rid)
            self.queue_waits.append(wait)
            self.task_waited[event.task_id] += wait  # type: ignore[index]
        elif kind is EventKind.REQUEST_WITHDRAW:
            self._queued.pop(rid, None)  # type: ignore[arg-type]
        elif kind is EventKind.REQUEST_FINISH:
            self.model.observe_request(pair, event.value)  # type: ignore[arg-type]
        elif kind is EventKind.STAGE_FINISH:
            self.model.observe_stage(pair, event.value)  # type: ignore[arg-type]
        elif kind in (EventKind.TASK_FINISH, EventKind.TASK_ABANDON):
            self.origins.forget(event.task_id)  # type: ignore[arg-type]
            self.task_waited.pop(event.task_id, None)  # type: ignore[arg-type]

    def mean_queue_wait(self) -> float:
        return sum(self.queue_waits) / len(self.queue_waits) if self.queue_waits else 0.0


def tool_prior(view: EngineView, origin: Origin | None) -> float:
    """The trace mean of the tool wait after a round of `origin`'s stage."""
    if origin is None or origin.workflow not in view.workflows:
        return 0.0
    return view.workflows[origin.workflow].stages[origin.stage].profile.tool_wait_s.mean()


@dataclass(frozen=True, slots=True)
class Conversation:
    """A task's conversation waiting out a tool call: its copies on the GPU
    (no holder) since `since` (the call's start), `tokens` in all."""

    task_id: int
    agent: str
    since: float
    keys: tuple[str, ...]
    tokens: int


def conversations(view: EngineView) -> list[Conversation]:
    """The conversations in a tool wait: GPU copies nobody holds (ready, or
    loading back ahead of their holder) whose next holder is not ready yet,
    grouped by (task, agent, wait start), in that order."""
    groups: dict[tuple[int, str, float], list[tuple[str, ContextState]]] = defaultdict(list)
    for key, c in view.contexts.items():
        if c.location is Location.GPU and not c.holders and c.next_use is not None:
            groups[(c.task_id, c.agent, c.last_used)].append((key, c))
    return [Conversation(tid, agent, since, tuple(sorted(k for k, _ in copies)),
                         sum(c.tokens for _, c in copies))
            for (tid, agent, since), copies in sorted(groups.items())]


def conversation_origin(conv: Conversation, origins: Origins) -> Origin | None:
    """The round the conversation's newest copy was kept from (its stage)."""
    found = [o for o in map(origins.get, conv.keys) if o is not None]
    return found[-1] if found else None


def expected_wait(conv: Conversation, view: EngineView, origins: Origins,
                  waits: ToolWaits) -> float:
    """E[duration] of the conversation's tool call (observed mean, trace prior)."""
    origin = conversation_origin(conv, origins)
    pair = (origin.agent, origin.stage) if origin else None
    return waits.mean(pair, tool_prior(view, origin))


def allocated(view: EngineView) -> dict[str, float]:
    """KV each agent holds allocated: its prefix while a request of it runs,
    its running requests and the shared copies they hold, and its
    conversations waiting out a tool call. An idle prefix or cached copy is
    the engine's cache, free to evict: nobody's use (vLLM counts the cached
    blocks of no running request as free)."""
    use: dict[str, float] = defaultdict(float)
    for a in {r.agent for r in view.running}:
        if view.prefixes[a].on_gpu:
            use[a] += view.prefixes[a].tokens
    for r in view.running:
        use[r.agent] += r.demand(view.new_token_ratio)
    for key, tokens in shared_kv(view.running).items():
        if key in view.contexts:
            use[view.contexts[key].agent] += tokens
    for conv in conversations(view):
        use[conv.agent] += conv.tokens
    return dict(use)


def kv_in_use(view: EngineView) -> float:
    """KV the view holds allocated (`allocated`, every agent's)."""
    return sum(allocated(view).values())


def stage_service(wf: Workflow, stage: str, view: EngineView, model: ServiceModel) -> float:
    """Expected LLM service of a stage: the observed mean, profiled before any."""
    dist = model.dist((wf.stages[stage].agent, stage))
    return dist.mean if dist is not None else stage_prior(wf, stage, view.costs)


def stage_latency(wf: Workflow, stage: str, view: EngineView, model: ServiceModel,
                  waits: ToolWaits) -> float:
    """Expected latency of a stage: its LLM service plus (E[rounds] - 1)
    expected tool waits."""
    v = wf.stages[stage]
    calls = max(0.0, v.profile.rounds.mean() - 1.0)
    return stage_service(wf, stage, view, model) + calls * waits.mean(
        (v.agent, stage), v.profile.tool_wait_s.mean())


def remaining_latency(wf: Workflow, weight: Mapping[str, float]) -> dict[str, float]:
    """Per stage: the longest path over the stages strictly after it."""
    after: dict[str, float] = {}
    for v in reversed(wf.topo_order):
        after[v] = max((weight[s] + after[s] for s in wf.succs[v]), default=0.0)
    return after


def admit_beside(view: EngineView, order: Sequence[Request], policy: str,
                 pinned: Sequence[Conversation]) -> tuple[Decision, list[Conversation]]:
    """The engine's admission in `order` with the `pinned` conversations'
    room taken out of the budget (a pin binds admission), and the pins kept.
    When that admits nothing while nothing runs (no event would come to
    decide again), whole programs are unpinned, the latest arrived first,
    until something is (Continuum's deadlock guard)."""
    pins = sorted(pinned, key=lambda c: (_arrival(view, c.task_id), c.task_id))
    while True:
        held = sum(c.tokens for c in pins)
        room = replace(view, budget_tokens=view.budget_tokens - held) if held else view
        d = admit_in_order(room, order, policy)
        if d.admit or not pins or view.running or not order or view.batch_is_full:
            return d, pins
        last = pins[-1].task_id
        pins = [c for c in pins if c.task_id != last]


def _arrival(view: EngineView, task_id: int) -> float:
    task = view.tasks.get(task_id)
    return task.arrival if task is not None else math.inf
