"""The Backend protocol: an engine that runs requests and reports events."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from topasd.model import (
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    Request,
    TaskView,
    TopasError,
    Workflow,
)
from topasd.profiles import HardwareProfile


class InfeasibleDecision(TopasError):
    """A backend refused a Decision; the message says which rule it breaks."""


class EventBuffer:
    """Events a backend emits while it runs, handed out by `_drain` (mixin)."""

    _events: list[EngineEvent]

    def _emit(self, t: float, kind: EventKind, req: Request | None = None, *,
              agent: str | None = None, tokens: int = 0, value: float = 0.0,
              note: str = "") -> None:
        if req is not None:
            self._events.append(EngineEvent(t, kind, req.id, req.task_id, req.agent, req.stage,
                                            tokens, value, note))
        else:
            self._events.append(EngineEvent(t, kind, agent=agent, tokens=tokens, value=value,
                                            note=note))

    def _drain(self) -> Iterator[EngineEvent]:
        events, self._events = self._events, []
        yield from events


class ContextCopies(EventBuffer):
    """The rules of shared task context copies both engines keep (mixin): a
    copy (`agent`: its key) is held by running requests, computed by one of
    them (`computer`), cached in free KV (`kept`, in `_kept`) with no holder."""

    _kept: dict[str, None]
    _t: float
    stats: Any

    def _hold_copy(self, c: Any, req: Request, compute: Callable[[], None],
                   load: Callable[[], None] | None = None) -> None:
        """`req` is admitted holding copy `c`: a hit, a load back from the host
        (`load`), or (gone) `compute` makes `req` compute it in its prefill."""
        if c.location is Location.NONE:
            c.location, c.ready = Location.GPU, False
            compute()
            self.stats.context_computes += 1
            self._emit(self._t, EventKind.CONTEXT_COMPUTE_START, req, tokens=c.tokens,
                       note=c.agent)
        elif c.location is Location.HOST and load is not None:
            load()
        else:
            if c.kept:
                del self._kept[c.agent]
                c.kept = False
            self.stats.context_hits += 1
            self.stats.context_hit_tokens += c.tokens
            self._emit(self._t, EventKind.CONTEXT_HIT, req, tokens=c.tokens, note=c.agent)
        c.holders += 1

    def _let_go(self, c: Any, req: Request) -> bool:
        """`req` leaves the batch holding `c`: a computed copy it was the last
        holder of stays cached in free KV. True when `c`, not computed yet,
        lost its computer (the caller hands it on or `_drop_uncomputed`s it)."""
        c.holders -= 1
        c.last_used = self._t
        if c.ready:
            if not c.holders:
                c.kept = True
                self._kept[c.agent] = None
            return False
        return bool(c.computer == req.id)

    def _drop_copy(self, c: Any) -> None:
        """An unheld copy gives up its KV (its next holder computes it again)."""
        self._kept.pop(c.agent, None)
        c.kept, c.location, c.ready = False, Location.NONE, False
        self._emit(self._t, EventKind.CONTEXT_DROP, agent=c.owner, tokens=c.tokens,
                   note=c.agent)

    def _drop_uncomputed(self, c: Any) -> None:
        c.computer, c.location = None, Location.NONE
        self._emit(self._t, EventKind.CONTEXT_DROP, agent=c.owner, tokens=c.tokens,
                   note=c.agent)


def kept_to_drop(kept: Iterable[str], tokens: Callable[[str], float],
                 room: float) -> list[str]:
    """Kept prefixes (`keep_evicted`, oldest eviction first) that give up their KV
    so that the rest fit `room`: the oldest go first."""
    order = list(kept)
    held = sum(tokens(a) for a in order)
    out: list[str] = []
    for agent in order:
        if held <= room:
            break
        held -= tokens(agent)
        out.append(agent)
    return out


def new_wake(d: Decision, t: float, pending: set[float]) -> float | None:
    """The scheduling point `d` asks for (`wake_at`), if it is after `t` and
    not already `pending` (then added to it): the time to put on the timer."""
    wake = d.wake_at
    if wake is None or wake <= t or wake in pending:
        return None
    pending.add(wake)
    return wake


def decision_problems(d: Decision, *, running: Mapping[int, str], waiting: Mapping[int, Request],
                      resident: Collection[str], known: Collection[str],
                      demand: Callable[[set[str], list[int], list[Request]], float],
                      budget: float, unit: str = "KV tokens",
                      droppable: Collection[str] = (),
                      uploadable: Collection[str] = ()) -> list[str]:
    """The rules every backend checks before carrying out a decision: ids exist
    and appear once, evicted prefixes are resident and idle after preemptions,
    loaded ones known and not resident, admitted requests' prefixes resident
    afterwards, the state within the budget (Eq. 2), and a wake-up a finite
    time. `running` maps running request ids to agents;
    `demand(resident_after, kept_ids, admitted)` prices the target state in
    the backend's own accounting (copies `load` names included). `evict` may
    also name a shared context copy in `droppable` (cached, no holder): it is
    dropped; `load` one in `uploadable` (on the host): it is loaded back."""
    problems = []
    if d.wake_at is not None and not math.isfinite(d.wake_at):
        problems.append(f"wake_at must be a finite engine time, got {d.wake_at}")
    pre, adm = set(d.preempt), set(d.admit)
    if len(pre) != len(d.preempt) or len(adm) != len(d.admit):
        problems.append("a request id is listed twice")
    if bad := sorted(r for r in pre if r not in running):
        problems.append(f"preempt names requests that are not running: {bad[:5]}")
    if bad := sorted(r for r in adm if r not in waiting):
        problems.append(f"admit names requests that are not waiting: {bad[:5]}")
    after = set(resident)
    kept = [rid for rid in running if rid not in pre]
    for agent in d.evict:
        if agent in droppable:
            continue
        if agent not in resident:
            problems.append(f"evict {agent!r}: its prefix is not resident")
        elif any(running[rid] == agent for rid in kept):
            problems.append(f"evict {agent!r}: requests of this agent keep running")
        after.discard(agent)
    for agent in d.load:
        if agent in uploadable:
            continue
        if agent not in known or agent in resident:
            problems.append(f"load {agent!r}: unknown agent or already resident")
        after.add(agent)
    if problems:
        return problems
    admitted = [waiting[r] for r in d.admit]
    if missing := sorted({r.agent for r in admitted} - after):
        problems.append(f"admit needs prefixes {missing} resident; load them")
    total = demand(after, kept, admitted)
    if (admitted or d.load) and total > budget + 1e-6:
        problems.append(f"the state needs {total:.0f} {unit} but the budget is "
                        f"{budget:.0f} (Eq. 2)")
    return problems


def prefix_work(tokens: int) -> int:
    """What loading or computing a prefix of `tokens` KV tokens adds to the
    `prefix_loads` or `prefix_computes` counter: 1, or 0 for an empty prefix
    (an agent with `prefix_tokens: 0` has no KV to load or compute)."""
    return 1 if tokens > 0 else 0


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What bounds the requests an engine takes, as the engine reports it.

    `pool_tokens`: its KV pool in tokens (None: the profile's budget holds);
    `pool_from_budget`: the pool is the asked budget rounded up (all of it
    usable), not a pool the engine sized itself (which a smaller budget caps);
    `context_tokens`: the longest request (prefix + input + output) its
    context takes (None: only the pool bounds a request)."""

    pool_tokens: int | None = None
    pool_from_budget: bool = False
    context_tokens: int | None = None


class BackendStats(Protocol):
    """The counters a run's summary reads (the replay table's columns)."""

    @property
    def mean_batch(self) -> float: ...

    @property
    def peak_batch(self) -> int: ...

    @property
    def prefix_loads(self) -> int: ...

    @property
    def prefix_load_bytes(self) -> float: ...

    @property
    def prefix_computes(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def retractions(self) -> int: ...

    @property
    def recomputed_tokens(self) -> int: ...


class Backend(Protocol):
    """An engine behind topasd. Times are seconds on the backend's clock."""

    name: str

    @property
    def t(self) -> float: ...

    @property
    def profile(self) -> HardwareProfile:
        """The cost profile a policy's hints come from (recorded with each run)."""

    @property
    def stats(self) -> BackendStats:
        """Counters of the run so far."""

    def submit(self, request: Request) -> None:
        """Queue a request; it becomes waiting at `request.ready_at`."""

    def follow(self, request_id: int) -> None:
        """A streamed call's request, before its `submit`: `state` shows its
        `generated` tokens as the engine makes them, not only at its finish."""

    def withdraw(self, request_id: int, why: str) -> bool:
        """Take back an unfinished request (its caller went away): it leaves the
        engine and a REQUEST_WITHDRAW event (`note`: `why`; `tokens`: tokens it
        had generated) follows, wherever the request stood: waiting, admitted,
        running or preempted. False, changing nothing, for a finished or an
        unknown request (or one whose withdrawal is already under way)."""

    def run_until(self, t_stop: float | None, *,
                  more_at_stop: bool = False) -> Iterator[EngineEvent]:
        """Advance to `t_stop` (None: until idle), yielding events. A SCHEDULE
        event asks the caller to `apply` a decision before iterating on.
        `more_at_stop`: the caller submits more at `t_stop` itself (tasks
        arriving then), so a decision due at or past `t_stop` (a step that
        ends there or straddles it) waits for the next call and sees them.
        SGLang, which decides inside its own scheduler, ignores it."""

    def view(self, tasks: Mapping[int, TaskView],
             workflows: Mapping[str, Workflow]) -> EngineView:
        """The state a policy decides on, with the caller's task book. Only while
        a decision is due (after a SCHEDULE event) on engines that decide inside
        their own scheduler (SGLang)."""

    def state(self, tasks: Mapping[int, TaskView],
              workflows: Mapping[str, Workflow]) -> EngineView:
        """The state a dashboard shows, at any time: as `view` where the engine
        holds it here, else the engine's last report. Changes nothing."""

    def apply(self, decision: Decision) -> None:
        """Carry out a decision or raise InfeasibleDecision without changing state."""

    def idle(self) -> bool:
        """Nothing running, loading or scheduled in the future."""

    def limits(self) -> EngineLimits:
        """The KV pool and context the engine reports."""

    def describe(self) -> dict[str, Any]:
        """The backend's settings, recorded with each run (`RunInfo.params`)."""

    def close(self) -> None:
        """Stop the engine (a no-op for the simulator)."""
