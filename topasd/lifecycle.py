"""How engine events change a request's, a prefix's and a stage's state: the
one fold of the event stream.

The daemon's metrics and dashboard state, the task book (`tasks.TaskBook`),
the store's replay of a recorded run (`store.queries.RunReplay`) and its
Gantt spans (`store.queries.request_segments`, `prefix_spans`) all apply
these functions to the events in the order the backend reported them. Event
kinds are looked up by value, so a decision log's plain strings work as
well as `EventKind`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from topasd.model import KEPT_NOTE, EventKind, Location, StageProgress, StageStatus

K = EventKind

# ------------------------------------------------------------------ requests

WAITING, RUNNING = "waiting", "running"
# a request's phase after an event of its own (None: it left the engine)
REQUEST_PHASE: Mapping[str, str | None] = {
    K.REQUEST_READY: WAITING,
    K.REQUEST_ADMIT: RUNNING,
    K.PREEMPT: WAITING,  # by the policy
    K.RETRACT: WAITING,  # by the engine: out of KV
    K.REQUEST_FINISH: None,
    K.REQUEST_WITHDRAW: None,  # its caller went away
}


def request_phase(old: str | None, kind: str) -> str | None:
    """The phase of a request in phase `old` (None: not in the engine) after an
    event of `kind`: only REQUEST_READY brings one in; other kinds leave it."""
    if kind not in REQUEST_PHASE or (old is None and kind != K.REQUEST_READY):
        return old
    return REQUEST_PHASE[kind]


def episode_ends(old: str | None, new: str | None) -> bool:
    """An admission episode (admitted .. finished, preempted, retracted or
    withdrawn) ends with this change of phase."""
    return old == RUNNING and new != RUNNING


# ------------------------------------------------------------------ prefixes


@dataclass(frozen=True, slots=True)
class PrefixPhase:
    """An agent prefix: where its KV lives, whether it is ready on the GPU,
    whether a host copy exists, and the move under way (`load` host -> GPU,
    `offload` GPU -> host backup, `compute` recomputed by prefill) since when
    and, for a host transfer, until when (planned)."""

    tokens: int
    location: Location = Location.NONE
    ready: bool = False
    host_copy: bool = False
    transfer: str | None = None
    since: float | None = None
    until: float | None = None

    def moving(self, transfer: str, t: float, until: float | None) -> PrefixPhase:
        return replace(self, transfer=transfer, since=t, until=until)

    def still(self, transfer: str) -> PrefixPhase:
        """`transfer` ended (another move under way goes on)."""
        if self.transfer != transfer:
            return self
        return replace(self, transfer=None, since=None, until=None)


def prefix_after(p: PrefixPhase | None, t: float, kind: str, tokens: int = 0,
                 value: float = 0.0, note: str | None = None) -> PrefixPhase:
    """The prefix after an event of its own (`value`: a host transfer's
    duration, waiting for the link included). A load or a recompute puts it
    on the GPU (not ready until its end); an eviction moves it to its host
    copy (or a backup under way), or drops it; a backup outlives an eviction;
    a kept copy (`keep_evicted`) loaded back is resident again, and one that
    gives up its room (PREFIX_DROP) is gone."""
    p = PrefixPhase(tokens) if p is None else p
    if tokens and tokens != p.tokens:
        p = replace(p, tokens=tokens)
    if kind == K.PREFIX_LOAD_START:
        p = replace(p, location=Location.GPU, ready=False,
                    host_copy=p.host_copy and note != KEPT_NOTE)
        return p.moving("load", t, t + (value or 0.0))
    if kind == K.PREFIX_COMPUTE_START:
        return replace(p, location=Location.GPU, ready=False).moving("compute", t, None)
    if kind == K.PREFIX_LOAD_END:
        return replace(p, ready=True).still("load")
    if kind == K.PREFIX_COMPUTE_END:
        return replace(p, ready=True).still("compute")
    if kind == K.PREFIX_OFFLOAD_START:
        return p.moving("offload", t, t + (value or 0.0))
    if kind == K.PREFIX_OFFLOAD_END:
        return replace(p, host_copy=True).still("offload")
    if kind == K.PREFIX_EVICT:
        backing_up = p.transfer == "offload"
        p = replace(p, ready=False, location=Location.HOST if p.host_copy or backing_up
                    else Location.NONE)
        return p if backing_up or p.transfer is None else p.still(p.transfer)
    if kind == K.PREFIX_DROP:
        return replace(p, location=Location.NONE, host_copy=False)
    return p


# ------------------------------------------------------------- stages, tasks

SYNTHESIZED = "agent:"  # name prefix of the one-stage workflows of calls without one
CALLS = "agent:*"  # those workflows as one: every call without a workflow


def workflow_label(workflow: str) -> str:
    """A workflow as metrics and lateness group it: registered ones by name; the
    one-stage workflows synthesized per agent for plain calls as one (CALLS)."""
    return CALLS if workflow.startswith(SYNTHESIZED) else workflow


TASK_ENDS: frozenset[EventKind] = frozenset({K.TASK_FINISH, K.TASK_ABANDON})  # out of flight


def stage_after(s: StageProgress, kind: str, t: float, value: float = 0.0) -> StageProgress:
    """A stage's history e_{i,v} after an event of one of its requests (ready:
    the stage is active from its first; finished: its service `value` adds up)
    or its own STAGE_FINISH."""
    if kind == K.REQUEST_READY:
        return replace(s, status=StageStatus.ACTIVE,
                       started_at=s.started_at if s.started_at is not None else t)
    if kind == K.REQUEST_FINISH:
        return replace(s, service_s=s.service_s + value, rounds_done=s.rounds_done + 1)
    if kind == K.STAGE_FINISH:
        return replace(s, status=StageStatus.DONE, finished_at=t)
    return s


# ------------------------------------------------------------- request trails

TRAIL_STATE: Mapping[str, str] = {K.REQUEST_ADMIT: "running", K.PREEMPT: "waiting",
                                  K.RETRACT: "waiting", K.REQUEST_FINISH: "finished",
                                  K.REQUEST_WITHDRAW: "withdrawn"}


@dataclass(slots=True)
class Trail:
    """One request of a task as an operator follows it: its state, times, how
    often it was preempted (by the policy) or retracted (by the engine), and
    the decisions that admitted or preempted it, and how many left it out of
    W_t (the daemon's task ledger and the store's replay build it with
    `after` and `on_decision`)."""

    id: int
    stage: str
    agent: str
    ready: float
    state: str = "waiting"  # waiting | running | finished | withdrawn
    admitted: float | None = None
    finished: float | None = None
    preemptions: int = 0
    retractions: int = 0
    decisions: list[tuple[int, str]] = field(default_factory=list)  # (seq, admit|preempt)
    held: int = 0  # decisions that left it out of W_t (`Decision.held`)
    last_held: int | None = None  # the latest of them

    def after(self, kind: str, t: float) -> None:
        """The trail after an event of its request (other than its REQUEST_READY)."""
        state = TRAIL_STATE.get(kind)
        if state is None:
            return
        self.state = state
        if kind == K.REQUEST_ADMIT and self.admitted is None:
            self.admitted = t
        elif kind == K.PREEMPT:
            self.preemptions += 1
        elif kind == K.RETRACT:
            self.retractions += 1
        elif state in ("finished", "withdrawn"):
            self.finished = t

    def on_decision(self, seq: int, action: str) -> None:
        """Decision `seq` admitted, preempted or held (`hold`) this request."""
        if action == "hold":
            self.held += 1
            self.last_held = seq
        else:
            self.decisions.append((seq, action))

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "stage": self.stage, "agent": self.agent, "state": self.state,
                "ready": self.ready, "admitted": self.admitted, "finished": self.finished,
                "preemptions": self.preemptions, "retractions": self.retractions,
                "decisions": [{"seq": seq, "action": a} for seq, a in self.decisions],
                "held": self.held, "last_held": self.last_held}
