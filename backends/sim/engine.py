"""The discrete-event simulator: an SGLang-like engine at iteration granularity.

Each step is either a prefill step (chunked, up to `chunk_tokens` new tokens;
with `mixed_chunk` it also decodes) or a decode step producing one token for
every running request. Step times follow the profile's roofline model. Between
two events every decode step looks alike, so runs of decode steps are advanced
in closed form; `closed_form=False` steps one by one (the tests compare both).

KV accounting (tokens): a prefix on GPU (ready or loading/computing) holds
`prefix_tokens`; a running request holds its input and generated tokens. A
decode step needs one free token per decoding request; when none is left the
engine evicts idle prefixes (LRU) and then retracts requests, as SGLang does.
With `keep_evicted` (no host tier), a ready prefix the policy evicts keeps its
KV in free memory (location HOST, loaded back at once) until the state after a
decision (counted as `_validate` counts it), or a prefill or decode step's new
tokens, need the room: then the oldest go (`PREFIX_DROP`).

Shared task context (`Request.shared`): each copy is held once while a
running request holds it, computed in its first holder's prefill (the others
wait for it), and with no holder stays cached in free KV like a kept prefix
(given up, oldest first, when the room is needed: `CONTEXT_DROP`). A finished
ReAct round's own input and output stay as the copy its next round starts
with (`Request.keeps`, `CONTEXT_KEEP`); a policy's eviction of a cached copy
offloads it to the host (with `host_cache`; loaded back over the link by its
next holder) or drops it. A decision's `load` naming a copy on the host loads
it back ahead of any holder: its room is held while it loads, and loaded
with no holder yet it is cached in free KV again, as before its offload.
A decision's `wake_at` is a timed event: a scheduling point at that time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from backends.base import (
    ContextCopies,
    EngineLimits,
    InfeasibleDecision,
    decision_problems,
    kept_to_drop,
    new_wake,
    prefix_work,
)
from topasd.model import (
    KEPT_NOTE,
    ContextState,
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    PrefixState,
    Request,
    RequestState,
    Reservation,
    Segment,
    TaskView,
    Workflow,
    shared_kv,
)
from topasd.profiles import HardwareProfile

NEW_REQUEST_RATIO = 1.0  # SGLang 0.5.3 charges a new request its whole max_new

_READY, _LOAD_END, _BACKUP_END, _WAKE = 0, 1, 2, 3


class _Prefix:
    __slots__ = ("agent", "backup_pending", "cancelled", "compute_left", "host_copy",
                 "kept", "last_used", "location", "ready", "ready_at", "tokens")

    def __init__(self, agent: str, tokens: int, location: Location) -> None:
        self.agent = agent
        self.tokens = tokens
        self.location = location
        self.ready = False
        self.host_copy = location is Location.HOST
        self.backup_pending = False
        self.last_used = 0.0
        self.ready_at: float | None = None
        self.compute_left = 0
        self.cancelled = 0  # generation counter: stale transfer ends are ignored
        self.kept = False  # evicted, its KV kept in free memory (`keep_evicted`)


class _Context(_Prefix):
    """A copy of shared task context: a prefix-like piece of KV (GPU or none, no
    host tier) locked by its `holders`, cached in free KV (`kept`) without.
    One holder computes it in its own prefill (`computer`; done once that
    prefill passes `end`), as a radix or prefix cache fills it; the others
    wait for it, and share it from the next step."""

    __slots__ = ("computer", "end", "holders", "owner", "task_id")

    def __init__(self, key: str, tokens: int, owner: str, task_id: int) -> None:
        super().__init__(key, tokens, Location.NONE)
        self.owner = owner
        self.task_id = task_id
        self.holders = 0
        self.computer: int | None = None
        self.end = 0


class _Live:
    """A running request's mutable progress. Its prefill covers its own input
    (and recomputed output); its shared segments are computed once, by their
    copies (`_Context`), and read as context."""

    __slots__ = ("admitted_at", "computes", "generated", "prefill_left", "prefilled", "req",
                 "reservation", "started_at")

    def __init__(self, req: Request, t: float, reservation: Reservation) -> None:
        self.req = req
        self.computes: list[_Context] = []  # shared copies its prefill computes first
        self.generated = req.generated
        self.prefill_left = req.own_input + req.generated
        self.prefilled = 0
        self.admitted_at = t
        self.started_at: float | None = None
        self.reservation = reservation

    @property
    def kv(self) -> int:
        """Its context beyond the agent prefix: whole input and generated tokens."""
        return self.req.input_tokens + self.generated

    @property
    def held(self) -> int:
        """KV it holds alone: `kv` without its shared segments."""
        return self.req.own_input + self.generated

    @property
    def in_prefill(self) -> bool:
        """In the prefill FIFO: tokens left to prefill, or none at all (an empty
        dynamic input) but its prefill step, which starts it, still to come."""
        return bool(self.prefill_left) or self.started_at is None


@dataclass(frozen=True, slots=True)
class _RunAnchor:
    """A closed-form decode run that a stop alone cut short (no event, call or
    decision since): its continuation sums from the run's start, so cutting a
    run (the daemon's paced slices) never changes its float times."""

    ids: tuple[int, ...]  # the decoding requests
    t0: float
    ratio0: float
    busy0: float
    first: float  # the first step's duration, a + b * K_0
    steps: int  # steps taken since t0
    t_end: float
    ratio_end: float


@dataclass
class SimStats:
    """Counters the replay table reports."""

    steps: int = 0
    decode_steps: int = 0
    prefill_steps: int = 0
    batch_token_steps: int = 0  # sum over decode steps of the batch size
    peak_batch: int = 0
    prefix_loads: int = 0
    prefix_load_bytes: float = 0.0
    prefix_computes: int = 0
    preemptions: int = 0
    retractions: int = 0
    recomputed_tokens: int = 0
    context_hits: int = 0  # shared segments an admitted request found on the GPU
    context_hit_tokens: int = 0
    context_computes: int = 0  # ... and those it had to compute
    context_loads: int = 0  # ... or load back from the host
    withdrawn: int = 0  # requests whose caller went away (the daemon's API)
    busy_s: float = 0.0

    @property
    def mean_batch(self) -> float:
        return self.batch_token_steps / self.decode_steps if self.decode_steps else 0.0


class SimBackend(ContextCopies):
    """The simulator backend (virtual time)."""

    name = "sim"

    def __init__(self, profile: HardwareProfile, *, closed_form: bool = True,
                 warm_host: bool = False) -> None:
        self.profile = profile
        self.closed_form = closed_form
        self.warm_host = warm_host  # agents start with a host copy of their prefix
        self.stats = SimStats()
        self._t = 0.0
        self.ratio = profile.init_new_token_ratio
        self.batch_is_full = False
        self._prefixes: dict[str, _Prefix] = {}
        self._contexts: dict[str, _Context] = {}  # shared task context by key
        self._next_use: dict[str, float] = {}  # copy -> when a submitted holder is ready
        self._kept: dict[str, None] = {}  # kept prefixes and unheld contexts, oldest first
        self._uploads: dict[str, None] = {}  # copies loading back with no holder yet
        self._wakes: set[float] = set()  # scheduling points decisions asked for
        self._waiting: dict[int, Request] = {}
        self._running: dict[int, _Live] = {}
        self._timed: list[tuple[float, int, int, Any]] = []  # payload: by kind
        self._seq = 0
        self._link_free_at = 0.0
        self._prefill: deque[int | str] = deque()  # request ids and prefix-compute agents
        self._events: list[EngineEvent] = []
        self._need_schedule = False
        self._retry = False
        self._retry_on_event = False  # a retry that found no step: decide at the next event
        self._prefix_view: dict[str, PrefixState] | None = None
        self._costs = profile.cost_hints()
        self._anchor: _RunAnchor | None = None

    # ------------------------------------------------------------------ API

    @property
    def t(self) -> float:
        return self._t

    def submit(self, request: Request) -> None:
        self._anchor = None
        self._answer_retry()
        self._ensure_prefix(request.agent, request.prefix_tokens)
        if request.ready_at > self._t:
            self._push(request.ready_at, _READY, request)
            for seg in request.shared:  # a tool wait (or a wait before a stage) ends then
                self._next_use[seg.key] = min(self._next_use.get(seg.key, math.inf),
                                              request.ready_at)
        else:
            self._enqueue(request, max(request.ready_at, 0.0))

    def follow(self, request_id: int) -> None:
        """Nothing to do: `state` shows every running request's tokens so far."""

    def withdraw(self, request_id: int, why: str) -> bool:
        """Any unfinished request: a waiting one leaves the queue, a running one
        the batch (its KV is freed; `tokens`: what it had generated)."""
        live = self._running.pop(request_id, None)
        if live is not None:
            if live.in_prefill:
                self._prefill.remove(request_id)
            req, generated = live.req, live.generated
            self._release(req)
        elif request_id in self._waiting:
            req = self._waiting.pop(request_id)
            generated = req.generated
        else:
            return False
        self.stats.withdrawn += 1
        self.batch_is_full = False  # room came back (a baseline waits for this)
        self._answer_retry()
        self._prefix_view = None
        self._emit(self._t, EventKind.REQUEST_WITHDRAW, req, tokens=generated, note=why)
        self._need_schedule |= bool(self._waiting)  # what it held back may now fit
        return True

    def idle(self) -> bool:
        return not (self._running or self._timed or self._prefill)

    def run_until(self, t_stop: float | None, *,
                  more_at_stop: bool = False) -> Iterator[EngineEvent]:
        stop = math.inf if t_stop is None else t_stop
        while True:
            self._fire_timed()
            if self._events:
                yield from self._drain()
            if self._need_schedule and not (more_at_stop and self._t >= stop):
                self._need_schedule = False
                yield EngineEvent(self._t, EventKind.SCHEDULE)
                if self._events:
                    yield from self._drain()
                continue
            if self._t >= stop or not self._advance(stop):
                return

    def view(self, tasks: Mapping[int, TaskView],
             workflows: Mapping[str, Workflow]) -> EngineView:
        self._seq += 1
        return self.state(tasks, workflows)

    def state(self, tasks: Mapping[int, TaskView],
              workflows: Mapping[str, Workflow]) -> EngineView:
        return EngineView(
            t=self._t,
            budget_tokens=self.profile.budget_tokens,
            new_token_ratio=self.ratio,
            new_request_ratio=NEW_REQUEST_RATIO,
            prefixes=self._prefix_states(),
            running=tuple(self._snapshot(live) for live in self._running.values()),
            waiting=tuple(self._waiting.values()),
            tasks=tasks,
            workflows=workflows,
            costs=self._costs,
            batch_is_full=self.batch_is_full,
            chunk_tokens=self.profile.chunk_tokens,
            max_prefill_tokens=self.profile.max_prefill_tokens,
            seq=self._seq,
            contexts=self._context_states(),
        )

    def limits(self) -> EngineLimits:
        return EngineLimits()  # the profile's budget; no context limit

    def describe(self) -> dict[str, Any]:
        return {"warm_host": self.warm_host, "closed_form": self.closed_form}

    def close(self) -> None:
        """Nothing to stop: the simulator holds no engine."""

    def apply(self, decision: Decision) -> None:
        self._anchor = None
        self._retry_on_event = False  # this decision supersedes the pending retry
        self._validate(decision)
        t = self._t
        for rid in decision.preempt:
            self._preempt(rid, EventKind.PREEMPT)
        for agent in decision.evict:
            if agent in self._contexts:  # a cached copy the policy moves out (a tool wait's)
                c = self._contexts[agent]
                if self.profile.host_cache:
                    self._offload_copy(c)
                else:
                    self._drop_copy(c)
            else:
                self._evict(agent, "policy")
        for agent in decision.load:
            if agent in self._contexts:
                self._upload(self._contexts[agent])
            else:
                self._load(agent)
        for rid in decision.admit:
            self._admit(self._waiting.pop(rid), decision.reservation)
        if self._kept:  # the room the decision's state holds, counted as `_validate` does
            admitted = set(decision.admit)
            self._drop_kept(self.profile.budget_tokens - self._demand(
                {a for a, p in self._prefixes.items() if p.location is Location.GPU},
                [lv for rid, lv in self._running.items() if rid not in admitted],
                [self._running[rid].req for rid in decision.admit], decision.reservation))
        if decision.admit or decision.preempt or decision.load or decision.evict:
            self._prefix_view = None
        self.batch_is_full = decision.blocked
        self._retry = decision.retry
        for agent in {self._running[r].req.agent for r in decision.admit}:
            self._prefixes[agent].last_used = t
        wake = new_wake(decision, t, self._wakes)
        if wake is not None:
            self._push(wake, _WAKE, None)

    def _answer_retry(self) -> None:
        """Something happened (or nothing will): decide again on a pending retry."""
        self._need_schedule |= self._retry_on_event
        self._retry_on_event = False

    def _emit(self, t: float, kind: EventKind, req: Request | None = None, *,
              agent: str | None = None, tokens: int = 0, value: float = 0.0,
              note: str = "") -> None:
        self._anchor = None  # something happened: a later run starts afresh
        super()._emit(t, kind, req, agent=agent, tokens=tokens, value=value, note=note)

    # ----------------------------------------------------------- validation

    def _validate(self, d: Decision) -> None:
        """Refuse a decision that breaks a rule, before changing anything."""
        gpu = {a for a, p in self._prefixes.items() if p.location is Location.GPU}
        uploads = self._host_copies(d.load)
        problems = decision_problems(
            d, running={rid: lv.req.agent for rid, lv in self._running.items()},
            waiting=self._waiting, resident=gpu, known=self._prefixes,
            demand=lambda after, kept, admitted: self._demand(
                after, [self._running[r] for r in kept], admitted, d.reservation, uploads),
            budget=self.profile.budget_tokens,
            droppable=[k for k in self._kept if k in self._contexts], uploadable=uploads)
        if problems:
            raise InfeasibleDecision(f"{d.policy} decision at t={self._t:.3f}s refused: "
                                     + "; ".join(problems))

    def _demand(self, gpu: set[str], kept: list[_Live], admitted: list[Request],
                reservation: Reservation, uploads: Collection[str] = ()) -> float:
        """KV the state holds: prefixes `gpu`, the `kept` running and the
        `admitted` requests' reservations, the copies they hold, and the
        copies loading back with no holder (`_uploads`, and `uploads` to start)."""
        clip = self.profile.clip_max_new_tokens
        total = float(sum(self._prefixes[a].tokens for a in gpu))
        for lv in kept:
            rem = lv.req.output_tokens - lv.generated
            if lv.reservation is Reservation.FULL:
                total += lv.req.own_input + lv.req.output_tokens
            else:
                total += lv.held + self.ratio * min(rem, clip)
        total += sum(r.admit_demand(reservation, NEW_REQUEST_RATIO, clip) for r in admitted)
        if self._contexts:  # each held copy once
            held = shared_kv([*(lv.req for lv in kept), *admitted])
            total += sum(held.values())
            if self._uploads or uploads:
                total += sum(self._contexts[k].tokens for k in {*self._uploads, *uploads}
                             if k not in held)
        return total

    def _host_copies(self, keys: Iterable[str]) -> list[str]:
        """The copies among `keys` that are on the host (a `load` uploads them)."""
        return [k for k in keys if k in self._contexts
                and self._contexts[k].location is Location.HOST]

    # ------------------------------------------------------- state changes

    def _ensure_prefix(self, agent: str, tokens: int) -> None:
        if agent not in self._prefixes:
            loc = Location.HOST if self.warm_host and self.profile.host_cache else Location.NONE
            self._prefixes[agent] = _Prefix(agent, tokens, loc)
            self._prefix_view = None

    def _enqueue(self, req: Request, t: float) -> None:
        for seg in req.shared:
            if self._next_use.get(seg.key, math.inf) <= t:
                del self._next_use[seg.key]
        self._waiting[req.id] = replace(req, queued_at=t, state=RequestState.WAITING)
        self._emit(t, EventKind.REQUEST_READY, req, tokens=req.input_tokens)
        self._need_schedule = True

    def _admit(self, req: Request, reservation: Reservation) -> None:
        live = _Live(req, self._t, reservation)
        self._running[req.id] = live
        for seg in req.shared:
            self._hold(seg, live)
        self._prefill.append(req.id)
        self._emit(self._t, EventKind.REQUEST_ADMIT, req, tokens=live.prefill_left)

    def _preempt(self, rid: int, kind: EventKind) -> None:
        live = self._running.pop(rid)
        req = replace(live.req, generated=live.generated, preemptions=live.req.preemptions + 1,
                      state=RequestState.WAITING, queued_at=self._t)
        self._waiting[rid] = req
        if live.in_prefill:
            self._prefill.remove(rid)
        self._release(req)
        self.stats.preemptions += 1
        self.stats.recomputed_tokens += live.prefilled
        self._emit(self._t, kind, req, tokens=live.generated)
        self._prefix_view = None

    def _evict(self, agent: str, why: str, *, keep: bool = True) -> None:
        """Off the GPU: to its host copy, kept in free KV (`keep_evicted`, unless
        the engine evicts it for room: `keep=False`), or dropped."""
        p = self._prefixes[agent]
        if not p.ready:
            p.cancelled += 1
            if p.compute_left:
                self._prefill.remove(agent)
                p.compute_left = 0
        keep_copy = self.profile.host_cache and (p.host_copy or p.backup_pending)
        p.kept = keep and self.profile.keep_evicted and p.ready and not keep_copy
        p.location = Location.HOST if keep_copy or p.kept else Location.NONE
        p.ready = False
        p.ready_at = None
        self._prefix_view = None
        if p.kept:
            self._kept[agent] = None
            self._emit(self._t, EventKind.PREFIX_OFFLOAD_END, agent=agent, tokens=p.tokens,
                       note=KEPT_NOTE)
        self._emit(self._t, EventKind.PREFIX_EVICT, agent=agent, tokens=p.tokens, note=why)

    def _piece(self, key: str) -> _Prefix:
        """The agent prefix or shared context copy `key` names."""
        return self._contexts.get(key) or self._prefixes[key]

    def _room_beside(self, tokens: int) -> float:
        """Free KV, kept copies counted free, once `tokens` more are taken."""
        kept = sum(self._piece(a).tokens for a in self._kept)
        return self.profile.budget_tokens - self._used_tokens() + kept - tokens

    def _drop_kept(self, room: float) -> None:
        """Kept prefixes and unheld context copies give up their KV, oldest
        first, until the rest fit `room`."""
        for key in kept_to_drop(self._kept, lambda a: self._piece(a).tokens, room):
            p = self._piece(key)
            del self._kept[key]
            if isinstance(p, _Context):
                self._drop_copy(p)
            else:
                p.kept, p.location = False, Location.NONE
                self._prefix_view = None
                self._emit(self._t, EventKind.PREFIX_DROP, agent=key, tokens=p.tokens,
                           note="its room was needed")

    def _keep_sequence(self, req: Request, seg: Segment) -> None:
        """A finished round's own input and output stay as the copy `seg` its
        next round starts with: cached in free KV through the tool wait."""
        c = self._contexts.get(seg.key)
        if c is None:
            c = self._contexts[seg.key] = _Context(seg.key, seg.tokens, req.agent, req.task_id)
        if c.location is Location.GPU:
            return
        c.location, c.ready, c.ready_at, c.last_used = Location.GPU, True, self._t, self._t
        c.kept = True
        self._kept[seg.key] = None
        self._emit(self._t, EventKind.CONTEXT_KEEP, req, tokens=c.tokens, note=seg.key)

    def _hold(self, seg: Segment, live: _Live) -> None:
        """An admitted request holds a shared segment: a hit on its copy, or
        it computes the copy in its prefill."""
        req = live.req
        c = self._contexts.get(seg.key)
        if c is None:
            c = self._contexts[seg.key] = _Context(seg.key, seg.tokens, req.agent, req.task_id)
        self._hold_copy(c, req, lambda: self._compute_by(c, live), lambda: self._load_copy(c, req))
        self._uploads.pop(seg.key, None)  # loading back: its holder waits for it

    def _offload_copy(self, c: _Context) -> None:
        """A policy's eviction of an unheld copy where there is a host tier: it
        goes to the host over the link (its GPU room free at once)."""
        self._kept.pop(c.agent, None)
        c.kept, c.location, c.ready = False, Location.HOST, False
        start = max(self._t, self._link_free_at)
        self._link_free_at = start + self.profile.t_swap(c.tokens)
        self._emit(self._t, EventKind.CONTEXT_OFFLOAD, agent=c.owner, tokens=c.tokens,
                   value=self._link_free_at - self._t, note=c.agent)

    def _load_copy(self, c: _Context, req: Request | None) -> None:
        """A copy on the host is loaded back over the link (after whatever is
        on it): its holder `req` is admitted and waits, or (None) a decision
        loads it ahead of any holder."""
        c.location, c.ready = Location.GPU, False
        start = max(self._t, self._link_free_at)
        self._link_free_at = c.ready_at = start + self.profile.t_swap(c.tokens)
        self._push(c.ready_at, _LOAD_END, (c.agent, c.cancelled))
        self.stats.context_loads += 1
        self._emit(self._t, EventKind.CONTEXT_LOAD_START, req, agent=c.owner, tokens=c.tokens,
                   value=c.ready_at - self._t, note=c.agent)

    def _stop_uploads(self, tokens: int) -> None:
        """Copies loading back ahead of their holders give their room up, the
        latest first, until `tokens` are free: each stays on the host (its
        holder loads it back), as a load no holder waits for does."""
        for key in reversed(list(self._uploads)):
            if self.profile.budget_tokens - self._used_tokens() >= tokens:
                return
            c = self._contexts[key]
            del self._uploads[key]
            c.cancelled += 1
            c.location, c.ready_at = Location.HOST, None
            self._emit(self._t, EventKind.CONTEXT_OFFLOAD, agent=c.owner, tokens=c.tokens,
                       note=key)

    def _upload(self, c: _Context) -> None:
        """A decision loads a copy back ahead of its holder: its room is held
        from now (`_uploads`) until a holder takes it or the load ends."""
        if c.location is Location.HOST:  # (named twice: loaded once)
            self._uploads[c.agent] = None
            self._load_copy(c, None)

    def _compute_by(self, c: _Context, live: _Live) -> None:
        """`live` computes copy `c` in its prefill, after the copies it already
        computes and before its own input."""
        c.computer = live.req.id
        c.end = live.prefilled + sum(x.tokens for x in live.computes if not x.ready) + c.tokens
        live.computes.append(c)
        live.prefill_left += c.tokens

    def _release(self, req: Request) -> None:
        """A request leaves the batch: a copy it was the last holder of stays
        cached in free KV; one it was computing passes to the next holder in
        the prefill FIFO (none left: the copy is dropped)."""
        for seg in req.shared:
            c = self._contexts[seg.key]
            if not self._let_go(c, req):
                if not (c.ready or c.holders or c.computer is not None):
                    c.cancelled += 1  # a load back no holder waits for: it stays on host
                    c.location = Location.HOST
                continue
            heir = next((self._running[i] for i in self._prefill if isinstance(i, int)
                         and any(s.key == seg.key for s in self._running[i].req.shared)), None)
            if heir is not None:
                self._compute_by(c, heir)
            else:
                self._drop_uncomputed(c)

    def _load(self, agent: str) -> None:
        p = self._prefixes[agent]
        p.ready = False
        if p.kept:  # its KV is still there: resident at once
            del self._kept[agent]
            p.kept, p.location = False, Location.GPU
            self.stats.prefix_loads += prefix_work(p.tokens)
            self._emit(self._t, EventKind.PREFIX_LOAD_START, agent=agent, tokens=p.tokens,
                       note=KEPT_NOTE)
            self._prefix_ready(p, EventKind.PREFIX_LOAD_END)
            return
        if p.location is Location.HOST:
            start = max(self._t, self._link_free_at)
            self._link_free_at = p.ready_at = start + self.profile.t_swap(p.tokens)
            self.stats.prefix_loads += prefix_work(p.tokens)
            self.stats.prefix_load_bytes += p.tokens * self.profile.kv_bytes_per_token
            self._push(p.ready_at, _LOAD_END, (agent, p.cancelled))
            self._emit_transfer(EventKind.PREFIX_LOAD_START, p, start)
        else:
            p.compute_left = p.tokens
            self._prefill.appendleft(agent)
            self.stats.prefix_computes += prefix_work(p.tokens)
            self._emit(self._t, EventKind.PREFIX_COMPUTE_START, agent=agent, tokens=p.tokens)
        p.location = Location.GPU

    def _prefix_ready(self, p: _Prefix, kind: EventKind) -> None:
        p.ready = True
        p.ready_at = self._t
        self._prefix_view = None
        if isinstance(p, _Context):  # computed or loaded: no backup to host
            loaded = kind is EventKind.PREFIX_LOAD_END
            self._emit(self._t, EventKind.CONTEXT_LOAD_END if loaded else
                       EventKind.CONTEXT_COMPUTE_END, agent=p.owner, tokens=p.tokens,
                       note=p.agent)
            return
        self._emit(self._t, kind, agent=p.agent, tokens=p.tokens)
        if self.profile.host_cache and not p.host_copy and not p.backup_pending:
            p.backup_pending = True  # HiCache write-through: back the prefix up to host
            start = max(self._t, self._link_free_at)
            self._link_free_at = start + self.profile.t_swap(p.tokens)
            self._push(self._link_free_at, _BACKUP_END, p.agent)
            self._emit_transfer(EventKind.PREFIX_OFFLOAD_START, p, start)

    def _emit_transfer(self, kind: EventKind, p: _Prefix, start: float) -> None:
        """A host-link transfer, logged when it is decided (a load holds its GPU
        room from then) and lasting until it ends (`value`), waiting first for
        the transfers ahead of it on the serial link (`note`)."""
        wait = start - self._t
        self._emit(self._t, kind, agent=p.agent, tokens=p.tokens,
                   value=self._link_free_at - self._t,
                   note=f"waited {wait * 1e3:.3g} ms for the host link" if wait > 0 else "")

    def _finish(self, live: _Live) -> None:
        req = live.req
        del self._running[req.id]
        self.batch_is_full = False
        started = live.started_at if live.started_at is not None else live.admitted_at
        self._prefixes[req.agent].last_used = self._t
        self._release(req)
        if req.keeps is not None:
            self._keep_sequence(req, req.keeps)
        self._emit(self._t, EventKind.REQUEST_FINISH, req, tokens=live.generated,
                   value=self._t - started)
        self._need_schedule = True

    # ------------------------------------------------------------- timing

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._timed, (t, self._seq, kind, payload))

    def _fire_timed(self) -> None:
        while self._timed and self._timed[0][0] <= self._t:
            self._answer_retry()
            self._anchor = None  # an uncut run ends at every timed event, even a silent one
            t_ev, _, kind, payload = heapq.heappop(self._timed)
            if kind == _READY:
                self._enqueue(payload, t_ev)
            elif kind == _LOAD_END:
                agent, gen = payload
                p = self._piece(agent)
                if gen == p.cancelled and p.location is Location.GPU:
                    self._prefix_ready(p, EventKind.PREFIX_LOAD_END)
                    if agent in self._uploads:  # loaded with no holder yet: cached,
                        del self._uploads[agent]  # its room free to take again
                        p.kept = True
                        self._kept[agent] = None
                        self.batch_is_full = False
                    self._need_schedule = True
            elif kind == _WAKE:
                self._wakes.discard(t_ev)
                self._need_schedule = True
            else:
                p = self._prefixes[payload]
                p.backup_pending = False
                p.host_copy = True
                self._emit(t_ev, EventKind.PREFIX_OFFLOAD_END, agent=payload, tokens=p.tokens)

    def _advance(self, stop: float) -> bool:
        """Run one step or a closed-form run of decode steps; False when idle."""
        if self._retry:
            self._retry = False
            if self._prefill_runnable():
                self._need_schedule = bool(self._waiting)
                self._prefill_step()
                return True
            decoding = self._decoding()
            if decoding:
                self._need_schedule = bool(self._waiting)
                self._decode_run(decoding, stop, max_steps=1)
                return True
            # no step to run: decide again when something happens (a timed event or
            # a submit), not wherever the caller happens to stop the engine
            self._retry_on_event = bool(self._waiting)
        if self._prefill_runnable():
            self._prefill_step()
            return True
        decoding = self._decoding()
        if decoding:
            self._decode_run(decoding, stop)
            return True
        self.ratio = self.profile.init_new_token_ratio  # SGLang: reset while idle
        nxt = _next_timed(self._timed)
        target = min(nxt, stop)
        if math.isinf(target):
            self._answer_retry()  # nothing will happen: now
            return False
        self._t = max(self._t, target)
        return True

    def _decoding(self) -> list[_Live]:
        return [lv for lv in self._running.values()
                if not lv.in_prefill and self._resident(lv.req)]

    def _resident(self, req: Request) -> bool:
        """Its agent prefix is ready, and every shared copy it holds is ready or
        computed by its own prefill."""
        if not self._prefixes[req.agent].ready:
            return False
        return all(c.ready or c.computer == req.id for c in map(
            self._contexts.__getitem__, (s.key for s in req.shared))) if req.shared else True

    # ----------------------------------------------------------- prefill

    def _prefill_runnable(self) -> bool:
        for item in self._prefill:
            if isinstance(item, str) or self._resident(self._running[item].req):
                return True
        return False

    def _prefill_step(self) -> None:
        """One chunked-prefill step over the FIFO (mixed: plus one decode token each)."""
        decoding = self._mixed_decoders() if self.profile.mixed_chunk else []
        if self._kept:  # first tokens and decode tokens come before kept copies
            self._drop_kept(self._room_beside(self._first_tokens_due() + len(decoding)))
        if self._uploads:  # ... and first tokens before uploads
            self._stop_uploads(self._first_tokens_due())
        if decoding and (self.profile.budget_tokens - self._used_tokens()
                         - self._first_tokens_due() < len(decoding)):
            decoding = []  # no KV for the decode tokens: prefill alone this step
        n_total, pairs, ctx, done, computed = self._prefill_pieces()
        k_ctx = sum(p_tokens + lv.kv for lv, p_tokens in decoding)
        dt = self.profile.step_time(n_total, pairs, len(decoding), ctx + k_ctx)
        self._t += dt
        self.stats.steps += 1
        self.stats.prefill_steps += 1
        self.stats.busy_s += dt
        for p in computed:
            p.ready = False
            self._prefix_ready(p, EventKind.PREFIX_COMPUTE_END)
            if isinstance(p, _Context):
                p.computer = None
        if decoding:
            self._count_decode(len(decoding), 1)
        for live in done:  # its prefill made its first token
            self._emit(self._t, EventKind.PREFILL_END, live.req)
        for live in [lv for lv, _ in decoding] + done:
            live.generated += 1
            if live.generated >= live.req.output_tokens:
                self._finish(live)

    def _prefill_pieces(self) -> tuple[int, float, int, list[_Live], list[_Prefix]]:
        """Take up to `chunk_tokens` from the prefill FIFO: prefix recomputes and
        requests whose prefix is ready. Returns (tokens, attention pairs n*c +
        n^2/2, context read, requests whose prefill completed, prefixes computed)."""
        budget = self.profile.chunk_tokens
        n_total, pairs, ctx = 0, 0.0, 0
        done: list[_Live] = []
        computed: list[_Prefix] = []
        for item in list(self._prefill):
            if budget <= 0:
                break
            if isinstance(item, str):
                p = self._prefixes[item]
                n = min(p.compute_left, budget)
                c = p.tokens - p.compute_left
                p.compute_left -= n
                if not p.compute_left:
                    self._prefill.remove(item)
                    p.ready = True  # later pieces of this step may use it
                    computed.append(p)
            else:
                live = self._running[item]
                if not self._resident(live.req):
                    continue
                n, c = self._request_piece(live, budget, computed)
                if not live.prefill_left:
                    self._prefill.remove(item)
                    done.append(live)
            budget -= n
            n_total += n
            pairs += n * c + n * n / 2.0
            ctx += c + n
        return n_total, pairs, ctx, done, computed

    def _request_piece(self, live: _Live, budget: int,
                       computed: list[_Prefix]) -> tuple[int, int]:
        """A request's prefill piece of at most `budget` tokens: (tokens, context
        before them: its prefix, the shared copies it reads and its prefill so
        far). Copies it computes that the piece completes join `computed`."""
        n = min(live.prefill_left, budget)
        c = self._prefixes[live.req.agent].tokens + live.prefilled
        if live.req.shared:
            c += sum(s.tokens for s in live.req.shared) - sum(x.tokens for x in live.computes)
        if live.started_at is None:
            live.started_at = self._t
            self._emit(self._t, EventKind.REQUEST_START, live.req)
        live.prefilled += n
        live.prefill_left -= n
        computed += [x for x in live.computes
                     if not x.ready and x.computer == live.req.id and live.prefilled >= x.end]
        return n, c

    def _mixed_decoders(self) -> list[tuple[_Live, int]]:
        return [(lv, self._prefixes[lv.req.agent].tokens) for lv in self._running.values()
                if not lv.prefill_left and lv.started_at is not None
                and self._resident(lv.req)]

    # ------------------------------------------------------------ decode

    def _decode_run(self, decoding: list[_Live], stop: float, max_steps: int = 0) -> None:
        """Advance n identical decode steps in closed form (Sum of a + b*K_j),
        continuing a run that only a stop cut short from its start."""
        batch = len(decoding)
        due = self._first_tokens_due()  # kept free for requests still in prefill
        free = self.profile.budget_tokens - self._used_tokens() - due
        if free < batch and not self._make_room(batch + due):
            return
        free = self.profile.budget_tokens - self._used_tokens() - due
        decoding = [lv for lv in decoding if lv.req.id in self._running]
        batch = len(decoding)
        b = self.profile.t_kv_read_per_token_s
        run = self._continued(decoding)
        n = min(lv.req.output_tokens - lv.generated for lv in decoding)
        n = min(n, free // batch)
        timed = _next_timed(self._timed)
        nxt = min(timed, stop)
        if not math.isinf(nxt):
            n = min(n, _steps_to_reach(nxt - run.t0, run.first, b * batch) - run.steps)
        if not self.closed_form or max_steps == 1:
            n = 1
        n = max(1, n)
        # only a cut by `stop` alone is continued (the daemon's slices); a replay's
        # cuts are followed by an arrival, timed events fire: both start afresh
        cut_by_stop = max_steps != 1 and self.closed_form and stop < timed
        steps = run.steps + n
        dt = steps * run.first + b * batch * steps * (steps - 1) / 2.0
        self._t = run.t0 + dt
        self.stats.busy_s = run.busy0 + dt
        self._count_decode(batch, n)
        self.ratio = max(run.ratio0 - steps * self.profile.new_token_ratio_decay,
                         self.profile.min_new_token_ratio)
        if cut_by_stop and self._t >= stop:
            self._anchor = replace(run, steps=steps, t_end=self._t, ratio_end=self.ratio)
        for lv in decoding:
            lv.generated += n
        for lv in decoding:
            if lv.generated >= lv.req.output_tokens:
                self._finish(lv)

    def _continued(self, decoding: list[_Live]) -> _RunAnchor:
        """The run these steps continue: the anchor if nothing happened since
        it stopped, else a fresh run from now."""
        ids = tuple(lv.req.id for lv in decoding)
        run = self._anchor
        if (run is not None and run.ids == ids and run.t_end == self._t
                and run.ratio_end == self.ratio):
            return run
        k0 = sum(self._prefixes[lv.req.agent].tokens + lv.kv for lv in decoding)
        first = (self.profile.t_lin(len(decoding)) + self.profile.t_overhead_s
                 + self.profile.t_kv_read_per_token_s * k0)
        return _RunAnchor(ids, self._t, self.ratio, self.stats.busy_s, first, 0,
                          self._t, self.ratio)

    def _count_decode(self, batch: int, n: int) -> None:
        s = self.stats
        s.steps += n
        s.decode_steps += n
        s.batch_token_steps += batch * n
        s.peak_batch = max(s.peak_batch, batch)

    def _first_tokens_due(self) -> int:
        """KV tokens that running requests still in prefill take when it ends."""
        return sum(1 for lv in self._running.values() if lv.in_prefill)

    def _used_tokens(self) -> int:
        used = sum(p.tokens for p in self._prefixes.values()
                   if p.location is Location.GPU or p.kept)
        if self._contexts:
            used += sum(c.tokens for c in self._contexts.values() if c.location is Location.GPU)
        return used + sum(lv.held for lv in self._running.values())

    def _make_room(self, batch: int) -> bool:
        """Decode is out of KV: drop kept copies, stop uploads, evict idle
        prefixes (LRU), then retract (SGLang)."""
        budget = self.profile.budget_tokens
        self._drop_kept(self._room_beside(batch))
        if self._uploads:
            self._stop_uploads(batch)
        busy = {lv.req.agent for lv in self._running.values()}
        idle = sorted((p.last_used, p.agent) for p in self._prefixes.values()
                      if p.location is Location.GPU and p.ready and p.agent not in busy)
        for _, agent in idle:
            if budget - self._used_tokens() >= batch:
                break
            self._evict(agent, "engine", keep=False)  # its room is what is needed
        if budget - self._used_tokens() >= batch:
            return True
        self._retract()
        return False

    def _retract(self) -> None:
        """SGLang's retract_decode: fewest generated first (longest input on ties),
        at least one, never the last, until one more decode step fits."""
        order = sorted(self._running.values(),
                       key=lambda lv: (lv.generated, -lv.req.input_tokens), reverse=True)
        first = True
        while len(order) > 1 and (first or self._room_beside(len(order)) < 0):
            first = False
            live = order.pop()
            self.stats.retractions += 1
            self._preempt(live.req.id, EventKind.RETRACT)
            self.stats.preemptions -= 1
        gen = sum(lv.generated for lv in order)
        max_new = sum(lv.req.output_tokens for lv in order)
        steps = self.profile.retract_decode_steps
        self.ratio = min(1.0, (gen + steps * len(order)) / max(1, max_new))
        self.batch_is_full = False
        self._need_schedule = True

    # ------------------------------------------------------------- views

    def _snapshot(self, live: _Live) -> Request:
        r = live.req  # the constructor is several times cheaper than dataclasses.replace
        return Request(r.id, r.task_id, r.workflow, r.stage, r.agent, r.round, r.input_tokens,
                       r.output_tokens, r.ready_at, r.task_arrival, r.prefix_tokens, r.queued_at,
                       live.generated, RequestState.RUNNING, live.admitted_at, live.started_at,
                       live.reservation, r.preemptions, r.shared)

    def _prefix_states(self) -> dict[str, PrefixState]:
        if self._prefix_view is None:
            self._prefix_view = {
                a: PrefixState(a, p.tokens, p.location, p.ready, p.host_copy or p.kept,
                               p.last_used, p.ready_at)
                for a, p in self._prefixes.items()
            }
        return self._prefix_view

    def _context_states(self) -> dict[str, ContextState]:
        return {k: ContextState(k, c.owner, c.task_id, c.tokens, c.location, c.ready,
                                c.holders, c.last_used, self._next_use.get(k))
                for k, c in self._contexts.items()}


def _next_timed(timed: list[tuple[float, int, int, object]]) -> float:
    """When the next timed event fires (inf: none)."""
    return timed[0][0] if timed else math.inf


def _steps_to_reach(delta: float, first: float, growth: float) -> int:
    """Smallest n >= 1 with n*first + growth*n*(n-1)/2 >= delta (decode steps
    whose durations grow linearly with the context)."""
    if delta <= first:
        return 1
    if growth <= 0:
        n = max(1, math.ceil(delta / first - 1e-12))
        while n * first < delta:  # the division rounded below: as the sum has it
            n += 1
        return n
    # growth/2 n^2 + (first - growth/2) n - delta = 0
    half = growth / 2.0
    lin = first - half
    n = math.ceil((-lin + math.sqrt(lin * lin + 4 * half * delta)) / (2 * half) - 1e-9)
    n = max(1, n)
    while n > 1 and (n - 1) * first + half * (n - 1) * (n - 2) >= delta:
        n -= 1
    while n * first + half * n * (n - 1) < delta:
        n += 1
    return n
