"""OpenAI-compatible calls an application drives itself: how a call is counted,
which workflow, stage and task it belongs to, and the book that resolves each
call's future when its request finishes (the `RequestOwner` of such requests).

Each call is one request; its task and stage come from its metadata, or, for a
plain client, a one-stage task of an agent keyed by its system prompt. Token
counts: `count_tokens(text) = ceil(len(text) / 4)` (characters / 4, the usual
rule of thumb; deterministic, no tokenizer).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from topasd.daemon.errors import Conflict, Invalid, Unavailable, Withdrawn
from topasd.daemon.workflows import SYNTHESIZED, WorkflowRegistry
from topasd.model import Request, Workflow
from workflows.driver import DriverStep

log = logging.getLogger("topasd")

KEEP_CLOSED_KEYS = 100_000  # ended client task ids remembered for a late call's message


def count_tokens(text: str) -> int:
    """Simulated token count of a text: ceil(characters / 4)."""
    return math.ceil(len(text) / 4)


def agent_key(system_prompt: str) -> str:
    """The agent a plain client's call belongs to: its system prompt's hash."""
    if not system_prompt:
        return "default"
    return "sys-" + hashlib.sha256(system_prompt.encode()).hexdigest()[:10]


_WORDS = ("the", "job", "ran", "one", "new", "run", "for", "you", "and", "all")


def filler_text(tokens: int) -> str:
    """A simulated reply of `tokens` tokens under `count_tokens` (4 chars each)."""
    if tokens <= 0:
        return ""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(tokens)) + " "


def remember(kept: dict[Any, Any], key: Any, value: Any, keep: int) -> None:
    """`kept[key] = value`; past `keep` entries the older half is forgotten."""
    kept[key] = value
    if len(kept) > keep:
        for old in list(kept)[:keep // 2]:
            del kept[old]


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One OpenAI-compatible call, counted: the API builds it from a request body."""

    system_tokens: int  # the system prompt's tokens (prefix of a synthesized agent)
    system_key: str  # `agent_key` of the system prompt
    input_tokens: int
    output_tokens: int
    task_key: str | None = None  # metadata.task_id
    workflow: str | None = None
    stage: str | None = None
    agent: str | None = None
    last_in_stage: bool = True
    last_in_task: bool = False


@dataclass(frozen=True, slots=True)
class CallResult:
    """A finished call: what the reply reports."""

    request_id: int
    task_id: int
    workflow: str
    stage: str
    agent: str
    round: int
    prompt_tokens: int  # prefix + input
    completion_tokens: int
    t_ready: float
    t_finish: float
    task_done: bool
    task_key: str | None

    def meta(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "client_task_id": self.task_key,
            "request_id": self.request_id, "workflow": self.workflow, "stage": self.stage,
            "agent": self.agent, "round": self.round, "t_ready": self.t_ready,
            "t_finish": self.t_finish, "latency_s": self.t_finish - self.t_ready,
            "task_done": self.task_done,
        }


@dataclass(slots=True)
class OpenTask:
    """A task an application drives itself through OpenAI-compatible calls."""

    id: int
    workflow: Workflow
    key: tuple[str, str] | None
    rounds: dict[str, int] = field(default_factory=dict)  # rounds handed out per stage
    free_rounds: dict[str, list[int]] = field(default_factory=dict)  # of withdrawn calls
    done: set[str] = field(default_factory=set)
    in_flight: int = 0
    closing: bool = False
    last_wall: float = field(default_factory=time.monotonic)  # last call or reply

    def take_round(self, stage: str) -> int:
        """The round of a new call of `stage`: a withdrawn call's first, else the next."""
        free = self.free_rounds.get(stage)
        if free:
            return heapq.heappop(free)
        k = self.rounds.get(stage, 0)
        self.rounds[stage] = k + 1
        return k

    def give_back_round(self, stage: str, k: int) -> None:
        """Round `k` of `stage` was not used (its call withdrawn or refused)."""
        heapq.heappush(self.free_rounds.setdefault(stage, []), k)

    def ended(self) -> bool:
        """Nothing of the task in flight, and its stages done or its end announced."""
        return self.in_flight == 0 and (self.closing
                                        or len(self.done) == len(self.workflow.stages))


class Progress:
    """A streamed call as the engine loop sees it: accepted (it reached the
    engine: its `request_id`), admitted, tokens generated so far. The loop
    thread updates it and calls `wake` (set by the API side: thread-safe)."""

    def __init__(self) -> None:
        self.request_id: int | None = None
        self.admitted = False
        self.tokens = 0
        self.wake: Callable[[], None] = lambda: None

    def update(self, admitted: bool, tokens: int) -> None:
        """The engine's word: wakes the reader when something is new."""
        tokens = max(tokens, self.tokens)  # a preempted request keeps what it sent
        if (admitted and not self.admitted) or tokens > self.tokens:
            self.admitted = self.admitted or admitted
            self.tokens = tokens
            self.wake()


@dataclass(slots=True)
class Call:
    task: OpenTask
    request: Request
    spec: CallSpec
    future: Future[CallResult]
    progress: Progress | None = None  # a streamed call's


class CallBook:
    """The `RequestOwner` of OpenAI-compatible calls: resolves each call's
    future at its REQUEST_FINISH and says when its stage and task are done."""

    def __init__(self, orphaned: Callable[[OpenTask, str], None]) -> None:
        self.open: dict[tuple[str, str], OpenTask] = {}
        self.by_request: dict[int, Call] = {}
        self.streamed: dict[int, Progress] = {}  # the streamed calls in the engine
        self.closed: dict[tuple[str, str], str] = {}  # recently ended keys: how they ended
        self.orphaned = orphaned  # a task no call can reach any more: the service drops it

    def close(self, task: OpenTask, how: str) -> None:
        """`task` ended (`how`: for the message of a late call with its key)."""
        if task.key is None:
            return
        self.open.pop(task.key, None)
        self.closed.pop(task.key, None)
        remember(self.closed, task.key, how, KEEP_CLOSED_KEYS)

    def on_finish(self, request_id: int, t: float) -> DriverStep:
        call = self._leave(request_id)
        task, req, spec = call.task, call.request, call.spec
        step = DriverStep()
        if spec.last_in_stage and req.stage not in task.done:
            task.done.add(req.stage)
            step.stages_done.append(req.stage)
        if spec.last_in_task:
            task.closing = True
        step.task_done = self._end_if_done(task, t)
        result = CallResult(req.id, req.task_id, req.workflow, req.stage, req.agent, req.round,
                            req.prefix_tokens + req.input_tokens, req.output_tokens,
                            req.ready_at, t, step.task_done, spec.task_key)
        if not call.future.done():
            call.future.set_result(result)
        return step

    def on_withdraw(self, request_id: int, t: float, why: str) -> DriverStep:
        """The engine took a call back: a retry gets its round; the task ends now
        if this was all it waited for (its last call finished first)."""
        call = self._leave(request_id)
        task, req = call.task, call.request
        task.give_back_round(req.stage, req.round)
        log.info("request %d (task %d, stage %s, round %d) withdrawn: %s", req.id,
                 req.task_id, req.stage, req.round, why)
        if not call.future.done():
            call.future.set_exception(Withdrawn(f"request {request_id} was withdrawn at "
                                                f"t={t:.3f}s: {why}"))
        step = DriverStep(task_done=self._end_if_done(task, t))
        if not step.task_done and task.key is None and not task.in_flight:
            self.orphaned(task, f"its only call was withdrawn ({why})")  # no id: no retry
        return step

    def _leave(self, request_id: int) -> Call:
        """A call's request is done with the engine (finished or withdrawn)."""
        call = self.by_request.pop(request_id)
        self.streamed.pop(request_id, None)
        call.task.in_flight -= 1
        call.task.last_wall = time.monotonic()
        return call

    def _end_if_done(self, task: OpenTask, t: float) -> bool:
        """True, closing `task`, when it has ended (see `OpenTask.ended`)."""
        if not task.ended():
            return False
        self.close(task, f"finished at t={t:.3f}s")
        return True

    def find(self, future: Future[CallResult]) -> Call | None:
        """The call in flight that `future` belongs to, if any."""
        return next((c for c in self.by_request.values() if c.future is future), None)

    def idle_since(self, deadline: float) -> list[OpenTask]:
        """Open tasks with no call in flight and no activity after `deadline`."""
        return [t for t in self.open.values() if not t.in_flight and t.last_wall < deadline]

    def fail_all(self, exc: BaseException) -> None:
        for call in self.by_request.values():
            if not call.future.done():
                call.future.set_exception(exc)

    # ------------------------------------------------------------- routing

    def route(self, spec: CallSpec, workflows: WorkflowRegistry, draining: bool
              ) -> tuple[Workflow, str, OpenTask | None]:
        """The workflow (as active), stage and open task (None: a new one) a call
        belongs to; Invalid or Conflict naming what to fix."""
        if spec.task_key is None and not spec.last_in_stage:
            raise Invalid("topasd.last_in_stage=false needs topasd.task_id: without an id no "
                          "later call can continue (or end) this stage; send a task_id")
        if spec.workflow is None or spec.workflow.startswith(SYNTHESIZED):
            wf = workflows.synthesized(spec.agent or spec.system_key, spec)
            stage = wf.topo_order[0]
            return wf, stage, self.continued(wf.name, stage, spec, draining)
        wf, stage = _stage_of(spec, workflows)
        task = self.continued(wf.name, stage, spec, draining)
        waiting_on = [p for p in wf.stages[stage].after if task is None or p not in task.done]
        ended = None if task is not None or spec.task_key is None else self.closed.get(
            (wf.name, spec.task_key))
        if waiting_on and ended is not None:
            raise Conflict(f"task {spec.task_key!r} of {wf.name!r} already ended (it {ended}); "
                           f"a call for stage {stage!r} would open a new task, which starts "
                           f"at {list(wf.entry_stages)}: use a new task_id")
        if waiting_on:
            raise Conflict(f"stage {stage!r} of {wf.name!r} runs after {waiting_on}, which "
                           f"task {spec.task_key!r} has not finished: end them first (their "
                           "last call with last_in_stage=true), or end the task with "
                           "last_in_task=true if they are not taken")
        return workflows.activate(wf.name), stage, task

    def continued(self, workflow: str, stage: str, spec: CallSpec,
                  draining: bool) -> OpenTask | None:
        """The open task `spec.task_key` names in `workflow` (None: a new task),
        refusing a stage it already finished or a task that is closing."""
        task = None if spec.task_key is None else self.open.get((workflow, spec.task_key))
        if task is None:
            if draining:
                raise Unavailable("the daemon is shutting down: not admitting new tasks")
            return None
        if stage in task.done:
            raise Conflict(f"task {spec.task_key!r} already finished stage {stage!r} (a call "
                           "with last_in_stage=true ended it); send earlier rounds with "
                           "last_in_stage=false, or use a new task_id")
        if task.closing:
            raise Conflict(f"task {spec.task_key!r} is closing (a call with last_in_task=true "
                           "ended it); use a new task_id")
        return task


def _stage_of(spec: CallSpec, workflows: WorkflowRegistry) -> tuple[Workflow, str]:
    """The registered workflow and the stage a call with a workflow names."""
    assert spec.workflow is not None
    if spec.workflow not in workflows.known:
        raise Invalid(f"topasd.workflow: unknown workflow {spec.workflow!r}; registered: "
                      f"{', '.join(sorted(workflows.known))} (add spec files with "
                      "--workflow), or leave workflow out for a one-stage call")
    wf = workflows.known[spec.workflow]
    stage = spec.stage
    if stage is None:
        if len(wf.stages) > 1:
            raise Invalid(f"topasd.stage is required: workflow {wf.name!r} has stages "
                          f"{list(wf.topo_order)}")
        stage = wf.topo_order[0]
    if stage not in wf.stages:
        raise Invalid(f"topasd.stage: workflow {wf.name!r} has no stage {stage!r}; its "
                      f"stages are {list(wf.topo_order)}")
    runs_it = {wf.stages[stage].agent, workflows.active.get(wf.name, wf).stages[stage].agent}
    if spec.agent is not None and spec.agent not in runs_it:
        raise Invalid(f"topasd.agent: stage {stage!r} of {wf.name!r} is run by agent "
                      f"{wf.stages[stage].agent!r}, not {spec.agent!r}; drop agent or fix it")
    if spec.task_key is None and len(wf.stages) > 1:
        raise Invalid(f"topasd.task_id is required with workflow {wf.name!r} (it has "
                      f"{len(wf.stages)} stages): one id ties a task's calls together")
    return wf, stage
