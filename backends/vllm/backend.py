"""`VllmBackend`: the Backend protocol over an in-process vLLM v1 engine.

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
the backend reaches its scheduler (`PolicyScheduler`) between steps. A request
is added to vLLM when it becomes ready (synthetic token ids, `ignore_eos`,
`min_tokens = max_tokens = output_tokens`, workflow metadata in
`SamplingParams.extra_args["topasd"]`); the policy's decision is handed to the
scheduler, which carries it out inside the next `schedule()`.

Clock (`clock=`): `"steps"` (default) is virtual time made of measured engine
steps: each `LLMEngine.step()` advances it by its wall duration, and idle time
jumps to the next arrival, as in the simulator; policy time is not charged
(the runner reports it per decision). `"cpu"` is the same with each step's CPU
time in the engine thread instead of its wall time (vLLM runs the CPU model in
the calling thread), leaving out time the OS gave other processes. `"wall"` is
seconds since the first `run_until`, sleeping through idle gaps. `"profile"`
advances each step by the profile's modelled time for the step's shape
(prefill tokens, attention pairs, decode batch, KV read): vLLM still runs
every step, but the run is deterministic and matches the simulator's.

KV accounting: the pool is `budget_tokens` rounded up to whole blocks. The
view gives each agent prefix its full blocks (`prefix // B * B` tokens, the
part vLLM's prefix cache shares) and each request the blocks it really holds
(its partial prefix block, fresh input and output, rounded up to blocks,
shown as input tokens), with `new_token_ratio = 1`: a request reserves its
whole output. A policy that keeps Eq. 2 therefore never makes vLLM run out of
blocks. See docs/vllm.md for every mapping and what vLLM cannot express.
"""

from __future__ import annotations

import heapq
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from backends.base import (
    ContextCopies,
    EngineLimits,
    InfeasibleDecision,
    decision_problems,
    kept_to_drop,
    new_wake,
    prefix_work,
)
from backends.vllm.sizing import (
    context_fix,
    context_tokens,
    cpu_profile,
    kv_bytes_per_token,
    kv_footprint,
    shared_prefix_tokens,
    shared_segments,
)
from backends.vllm.tiny import read_model_config
from backends.vllm.tokens import SyntheticTokens
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
    Segment,
    TaskView,
    TopasError,
    Workflow,
    shared_kv,
)
from topasd.profiles import HardwareProfile

ClockKind = Literal["steps", "cpu", "wall", "profile"]


class EngineMismatch(TopasError):
    """vLLM did something other than what the backend asked of it."""


@dataclass
class VllmStats:
    """Counters of one run (the replay table reads the simulator's names)."""

    steps: int = 0
    decode_steps: int = 0  # steps that decoded at least one request
    prefill_steps: int = 0
    batch_token_steps: int = 0
    peak_batch: int = 0
    prefix_loads: int = 0  # host loads: none (recomputed on this platform)
    prefix_load_bytes: float = 0.0
    prefix_computes: int = 0
    preemptions: int = 0
    retractions: int = 0  # vLLM's own preemptions (out of blocks)
    recomputed_tokens: int = 0
    context_hits: int = 0  # shared context copies an admitted request found cached
    context_hit_tokens: int = 0
    context_computes: int = 0  # ... and those it computed
    withdrawn: int = 0  # requests whose caller went away (the daemon's API)
    busy_s: float = 0.0  # sum of measured step times
    sched_s: float = 0.0  # scheduler time inside the steps (schedule + update)
    policy_io_s: float = 0.0  # building views and validating/handing over decisions

    @property
    def mean_batch(self) -> float:
        return self.batch_token_steps / self.decode_steps if self.decode_steps else 0.0


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step: its shape and wall time (for profile fitting)."""

    prefill_tokens: int
    attn_pairs: float
    decode_batch: int
    context_tokens: int
    step_s: float  # wall time
    sched_s: float
    cpu_s: float = 0.0  # CPU time of the engine thread (the `cpu` clock)


@dataclass(frozen=True, slots=True)
class AuditRow:
    """Engine truth after one step, for checking that decisions were carried out.

    `pinned`: agents whose every prefix block is cached and held by our pin;
    `cached`: agents with any cached prefix block; `preempted`: request ids
    the scheduler preempted for the policy in this step (topasd ids).
    """

    t: float
    decisions: tuple[int, ...]
    preempted: tuple[int, ...]
    engine_preempted: tuple[int, ...]
    pinned: frozenset[str]
    cached: frozenset[str]
    book_ready: frozenset[str]  # the backend's view: on GPU and ready
    book_gpu: frozenset[str]  # the backend's view: on GPU (ready or computing)
    book_kept: frozenset[str]  # the backend's view: evicted, blocks still pinned


class _Prefix:
    __slots__ = ("agent", "kept", "last_used", "location", "ready", "ready_at", "tokens")

    def __init__(self, agent: str, tokens: int) -> None:
        self.agent = agent
        self.tokens = tokens
        self.location = Location.NONE
        self.kept = False  # evicted by the policy, its blocks still pinned
        self.ready = False
        self.last_used = 0.0
        self.ready_at: float | None = None


class _Copy(_Prefix):
    """A shared task context copy: its whole blocks (pinned as a prefix's once
    cached), its holders, and the request computing it (`computer`)."""

    __slots__ = ("computer", "holders", "owner", "task_id")

    def __init__(self, key: str, tokens: int, owner: str, task_id: int) -> None:
        super().__init__(key, tokens)
        self.owner, self.task_id = owner, task_id
        self.holders = 0
        self.computer: int | None = None


@dataclass(slots=True)
class _Live:
    req: Request  # as submitted (true token counts)
    admitted_at: float
    started_at: float | None = None
    generated: int = 0
    prefilled: bool = False  # its first new token came (PREFILL_END emitted)


@dataclass
class _Pending:
    seq: int
    preempt: list[int] = field(default_factory=list)


class VllmBackend(ContextCopies):
    """topasd's Backend over vLLM v1 with `PolicyScheduler` (or, `native=True`,
    vLLM's default scheduler deciding alone: no SCHEDULE events)."""

    name = "vllm"

    def __init__(self, model: str, *, budget_tokens: int = 4096, block_size: int = 32,
                 chunk_tokens: int = 512, max_num_seqs: int = 64,
                 profile: HardwareProfile | None = None, clock: ClockKind = "steps",
                 native: bool = False, seed: int = 0, audit: bool = False,
                 record: bool = False, max_model_len: int | None = None) -> None:
        cfg = read_model_config(model)
        if clock not in ("steps", "cpu", "wall", "profile"):
            raise TopasError(f"clock must be 'steps', 'cpu', 'wall' or 'profile', got {clock!r}")
        if block_size % 32:
            raise TopasError(f"block_size must be a multiple of 32 (vLLM's CPU attention), "
                             f"got {block_size}")
        if budget_tokens < 2 * block_size:
            raise TopasError(f"the KV budget must hold at least two blocks "
                             f"({2 * block_size} tokens), got {budget_tokens}")
        self.model, self.block_size, self.chunk_tokens = str(model), block_size, chunk_tokens
        self.clock, self.native = clock, native
        self.audit_enabled = audit
        # keep every step's sample and every finished request's output length
        # (benchmarks, tests); a long-running daemon keeps neither
        self.record = record
        self.tokens = SyntheticTokens(int(cfg["vocab_size"]), seed)
        blocks = math.ceil(budget_tokens / block_size)
        self.max_model_len = max_model_len or context_tokens(cfg, budget_tokens, block_size)
        self.engine, self.sched = _make_engine(
            self.model, blocks=blocks + 1, block_size=block_size, chunk_tokens=chunk_tokens,
            max_num_seqs=max_num_seqs, max_model_len=self.max_model_len, native=native,
            seed=seed, kv_bytes_per_token=kv_bytes_per_token(cfg))
        self.budget_tokens = self.sched.kv_cache_manager.block_pool.get_num_free_blocks() \
            * block_size
        # whatever profile gives the costs, this engine has no host tier and keeps an
        # evicted prefix's blocks while there is room (the simulator's `keep_evicted`)
        self.profile = replace(profile or cpu_profile(self.budget_tokens, chunk_tokens, cfg),
                               host_cache=False, keep_evicted=True)
        self._costs = self.profile.cost_hints()
        self.stats = VllmStats()
        self.samples: list[StepSample] = []
        self.audit: list[AuditRow] = []
        self.finished_tokens: dict[int, int] = {}  # topasd id -> output length vLLM returned
        self.cached_tokens: dict[int, int] = {}  # topasd id -> vLLM's prefix-cache hit
        self._t = 0.0
        self._wall0: float | None = None
        self._timed: list[tuple[float, int, Request | None]] = []  # None: a wake-up
        self._wakes: set[float] = set()  # scheduling points decisions asked for
        self._tseq = 0
        self._waiting: dict[int, Request] = {}
        self._running: dict[int, _Live] = {}
        self._prefixes: dict[str, _Prefix] = {}
        self._copies: dict[str, _Copy] = {}  # shared task context by key
        self._kept: dict[str, None] = {}  # kept prefixes and unheld copies, oldest first
        self._vid: dict[int, str] = {}
        self._tid: dict[str, int] = {}
        self._events: list[EngineEvent] = []
        self._need_schedule = False
        self._retry = False
        self.batch_is_full = False
        self._seq = 0
        self._pending: list[_Pending] = []
        self._touched: dict[int, str] = {}  # request -> the last decision that moved it
        self._await_prefix: dict[str, list[int]] = {}  # agent -> requests computing it

    # ------------------------------------------------------------------ API

    @property
    def t(self) -> float:
        return self._t

    def submit(self, request: Request) -> None:
        self._check_fits(request)
        if request.agent not in self._prefixes:
            self._prefixes[request.agent] = _Prefix(request.agent, self._shared(request))
        if request.ready_at > self._t:
            self._tseq += 1
            heapq.heappush(self._timed, (request.ready_at, self._tseq, request))
        else:
            self._enqueue(request, max(request.ready_at, 0.0))

    def follow(self, request_id: int) -> None:
        """Nothing to do: `state` shows every running request's tokens so far."""

    def withdraw(self, request_id: int, why: str) -> bool:
        """Any unfinished request: out of the plan queued for vLLM's next step,
        then aborted in vLLM (its blocks freed, wherever it stood)."""
        lv = self._running.pop(request_id, None)
        if lv is not None:
            req, generated = lv.req, lv.generated
            computing = self._await_prefix.get(req.agent, [])
            if request_id in computing:  # not its prefix computer any more (see below)
                computing.remove(request_id)
            self._release(req, self._plan_now)
        elif request_id in self._waiting:
            req = self._waiting.pop(request_id)
            generated = req.generated
        else:
            return False
        for pending in self._pending:  # a preemption not carried out yet: never will be
            if request_id in pending.preempt:
                pending.preempt.remove(request_id)
        vid = self._vid.pop(request_id)
        del self._tid[vid]
        self._touched.pop(request_id, None)
        if not self.native:
            self.sched.forget(vid)
        self.engine.abort_request([vid], internal=True)
        self.stats.withdrawn += 1
        self.batch_is_full = False
        self._emit(self._t, EventKind.REQUEST_WITHDRAW, req, tokens=generated, note=why)
        if lv is not None and not self.native:
            self._drop_orphan_prefix(req.agent)
        self._need_schedule = self._need_schedule or bool(self._waiting)
        return True

    def _drop_orphan_prefix(self, agent: str) -> None:
        """A prefix being computed whose last admitted request was withdrawn:
        nothing would compute it, so it is evicted (the next load recomputes it)."""
        from backends.vllm.scheduler import Plan

        p = self._prefixes[agent]
        if (p.location is not Location.GPU or p.ready
                or any(lv.req.agent == agent for lv in self._running.values())):
            return
        p.location, p.ready, p.ready_at = Location.NONE, False, None
        self._await_prefix.pop(agent, None)
        self.sched.plan(Plan(residency=[("evict", agent)]))
        self._emit(self._t, EventKind.PREFIX_EVICT, agent=agent, tokens=p.tokens,
                   note="its computing request was withdrawn")

    def idle(self) -> bool:
        return not (self._running or self._timed or (self.native and self._waiting))

    def run_until(self, t_stop: float | None, *,
                  more_at_stop: bool = False) -> Iterator[EngineEvent]:
        stop = math.inf if t_stop is None else t_stop
        if self._wall0 is None:
            self._wall0 = time.perf_counter() - self._t
        while True:
            self._fire_timed()
            if self._events:
                yield from self._drain()
            if self._need_schedule and not self.native and not (
                    more_at_stop and self._t >= stop):
                self._need_schedule = False
                yield EngineEvent(self._t, EventKind.SCHEDULE)
                if self._events:
                    yield from self._drain()
                continue
            if self._t >= stop:
                return
            if self._running or self._pending or (self.native and self._waiting):
                self._step()
                continue
            target = min(self._timed[0][0] if self._timed else math.inf, stop)
            if math.isinf(target):
                return  # idle, nothing scheduled
            self._wait(target)

    def view(self, tasks: Mapping[int, TaskView],
             workflows: Mapping[str, Workflow]) -> EngineView:
        w0 = time.perf_counter()
        self._seq += 1
        view = self.state(tasks, workflows)
        self.stats.policy_io_s += time.perf_counter() - w0
        return view

    def state(self, tasks: Mapping[int, TaskView],
              workflows: Mapping[str, Workflow]) -> EngineView:
        return EngineView(
            t=self._t,
            budget_tokens=self.budget_tokens,
            new_token_ratio=1.0,
            new_request_ratio=1.0,
            prefixes={a: PrefixState(a, p.tokens, p.location, p.ready, p.kept, p.last_used,
                                     p.ready_at) for a, p in self._prefixes.items()},
            running=tuple(self._snapshot(lv) for lv in self._running.values()),
            waiting=tuple(self._as_view(r) for r in self._waiting.values()),
            tasks=tasks,
            workflows=workflows,
            costs=self._costs,
            batch_is_full=self.batch_is_full,
            chunk_tokens=self.chunk_tokens,
            max_prefill_tokens=self.chunk_tokens,
            seq=self._seq,
            contexts={k: ContextState(k, c.owner, c.task_id, c.tokens, c.location, c.ready,
                                      c.holders, c.last_used) for k, c in self._copies.items()},
        )

    def limits(self) -> EngineLimits:
        """The pool is --budget rounded up to whole blocks; a request's context
        is at most max_model_len."""
        return EngineLimits(pool_tokens=self.budget_tokens, pool_from_budget=True,
                            context_tokens=self.max_model_len)

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "clock": self.clock, "native": self.native,
                "block_size": self.block_size, "chunk_tokens": self.chunk_tokens,
                "budget_tokens": self.budget_tokens}

    def apply(self, decision: Decision) -> None:
        w0 = time.perf_counter()
        try:
            self._apply(decision)
        finally:
            self.stats.policy_io_s += time.perf_counter() - w0

    def _apply(self, decision: Decision) -> None:
        from backends.vllm.scheduler import Plan

        if self.native:
            raise InfeasibleDecision("this vLLM backend runs vLLM's own scheduler "
                                     "(native=True); it takes no decisions")
        self._validate(decision)
        t = self._t
        plan = Plan()
        for rid in decision.preempt:
            lv = self._running.pop(rid)
            self._requeue(lv, t)
            self._release(lv.req, plan.residency.append)
            plan.preempt.append(self._vid[rid])
            self._touched[rid] = f"preempted by decision {decision.seq} at t={t:.3f}"
            self.stats.preemptions += 1
            self._emit(t, EventKind.PREEMPT, lv.req, tokens=lv.generated, note="policy")
        for agent in decision.evict:
            if agent in self._copies:  # a kept copy the policy drops (no host tier here)
                self._drop_copy(self._copies[agent])
                plan.residency.append(("evict", agent))
            else:
                self._evict(agent, plan)
        for agent in decision.load:
            p = self._prefixes[agent]
            if p.kept:  # its blocks are still pinned: resident at once
                self._take_back(agent)
                continue
            p.location, p.ready = Location.GPU, False
            plan.residency.append(("keep", agent))
            self.stats.prefix_computes += prefix_work(p.tokens)
            self._emit(t, EventKind.PREFIX_COMPUTE_START, agent=agent, tokens=p.tokens)
        for rid in decision.admit:
            req = self._waiting.pop(rid)
            lv = _Live(req, t, generated=req.generated)
            self._running[rid] = lv
            plan.admit.append(self._vid[rid])
            self._touched[rid] = f"admitted by decision {decision.seq} at t={t:.3f}"
            self._prefixes[req.agent].last_used = t
            self._emit(t, EventKind.REQUEST_ADMIT, req, tokens=req.input_tokens + req.generated)
            for seg in shared_segments(req, self.block_size):
                self._hold(seg, req, plan)
        if self._kept:
            self._drop_kept(plan)
        self.batch_is_full = decision.blocked
        self._retry = decision.retry
        wake = new_wake(decision, t, self._wakes)
        if wake is not None:
            self._tseq += 1
            heapq.heappush(self._timed, (wake, self._tseq, None))
        self.sched.plan(plan)
        if plan.preempt or plan.admit or any(op == "evict" for op, _ in plan.residency):
            self._pending.append(_Pending(decision.seq, list(decision.preempt)))

    def _evict(self, agent: str, plan: Any) -> None:
        """A policy eviction: a computed prefix keeps its pinned blocks as a kept
        copy (location HOST, as the simulator's `keep_evicted`); one still being
        computed is dropped."""
        p = self._prefixes[agent]
        p.kept = p.ready and self.profile.keep_evicted
        p.location = Location.HOST if p.kept else Location.NONE
        p.ready, p.ready_at = False, None
        if p.kept:
            self._kept[agent] = None
            self._emit(self._t, EventKind.PREFIX_OFFLOAD_END, agent=agent, tokens=p.tokens,
                       note=KEPT_NOTE)
        else:
            plan.residency.append(("evict", agent))
        self._emit(self._t, EventKind.PREFIX_EVICT, agent=agent, tokens=p.tokens, note="policy")

    def _take_back(self, agent: str) -> None:
        p = self._prefixes[agent]
        del self._kept[agent]
        p.kept, p.location, p.ready, p.ready_at = False, Location.GPU, True, self._t
        self.stats.prefix_loads += prefix_work(p.tokens)
        self._emit(self._t, EventKind.PREFIX_LOAD_START, agent=agent, tokens=p.tokens,
                   note=KEPT_NOTE)
        self._emit(self._t, EventKind.PREFIX_LOAD_END, agent=agent, tokens=p.tokens)

    def _drop_kept(self, plan: Any) -> None:
        """Kept prefixes and unheld copies unpin their blocks, oldest first, until
        they fit beside what the decision holds (vLLM then reuses the blocks)."""
        gpu = [a for a, p in self._prefixes.items() if p.location is Location.GPU]
        used = (sum(self._prefixes[a].tokens for a in gpu)
                + sum(c.tokens for c in self._copies.values() if c.holders)
                + sum(self._footprint(lv.req) for lv in self._running.values()))
        room = self.budget_tokens - used
        for name in kept_to_drop(self._kept, lambda a: self._piece(a).tokens, room):
            p = self._piece(name)
            plan.residency.append(("evict", name))
            if isinstance(p, _Copy):
                self._drop_copy(p)
                continue
            del self._kept[name]
            p.kept, p.location = False, Location.NONE
            self._emit(self._t, EventKind.PREFIX_DROP, agent=name, tokens=p.tokens,
                       note="its room was needed")

    def _piece(self, name: str) -> _Prefix:
        """The agent prefix or shared context copy `name` names."""
        return self._copies.get(name) or self._prefixes[name]

    def _plan_now(self, op: tuple[str, str]) -> None:
        """A residency change outside a decision, queued for the next step."""
        from backends.vllm.scheduler import Plan

        self.sched.plan(Plan(residency=[op]))

    def _hold(self, seg: Segment, req: Request, plan: Any) -> None:
        """An admitted request holds a shared copy: a hit, or it computes the
        copy in its prefill (the scheduler pins the blocks once cached)."""
        c = self._copies.get(seg.key)
        if c is None:
            c = self._copies[seg.key] = _Copy(seg.key, seg.tokens, req.agent, req.task_id)

        def compute() -> None:
            c.computer = req.id
            plan.residency.append(("keep", seg.key))

        self._hold_copy(c, req, compute)

    def _release(self, req: Request, evict: Callable[[tuple[str, str]], None]) -> None:
        """A request leaves the batch (as the simulator's `_release`): a copy it
        was the last holder of stays pinned as a kept copy; one it was
        computing passes to the next holder (the scheduler lets that one run),
        or with none left is dropped (`evict`)."""
        for seg in req.shared:
            c = self._copies[seg.key]
            if not self._let_go(c, req):
                continue
            heir = next((lv for rid, lv in self._running.items() if rid != req.id
                         and any(s.key == seg.key for s in lv.req.shared)), None)
            if heir is not None:
                c.computer = heir.req.id
            else:
                evict(("evict", seg.key))
                self._drop_uncomputed(c)

    # ----------------------------------------------------------- validation

    def _validate(self, d: Decision) -> None:
        """Refuse a decision that breaks a rule, before changing anything (KV in
        whole blocks, as vLLM allocates it)."""
        resident = {a for a, p in self._prefixes.items() if p.location is Location.GPU}

        def demand(after: set[str], kept: list[int], admitted: list[Request]) -> float:
            held = [self._running[r].req for r in kept] + admitted
            return (sum(self._prefixes[a].tokens for a in after)
                    + sum(self._footprint(r) for r in held)
                    + sum(shared_kv(self._as_view(r) for r in held).values()))

        problems = decision_problems(
            d, running={rid: lv.req.agent for rid, lv in self._running.items()},
            waiting=self._waiting, resident=resident, known=self._prefixes, demand=demand,
            budget=self.budget_tokens, unit="KV tokens in whole blocks",
            droppable=[k for k in self._kept if k in self._copies])
        if problems:
            raise InfeasibleDecision(f"{d.policy} decision at t={self._t:.3f}s refused: "
                                     + "; ".join(problems))

    # -------------------------------------------------------- KV accounting

    def _shared(self, req: Request) -> int:
        return shared_prefix_tokens(req.prefix_tokens, self.block_size)

    def _footprint(self, req: Request) -> int:
        return kv_footprint(req, self.block_size)

    def _check_fits(self, req: Request) -> None:
        need = req.prefix_tokens + max(1, req.input_tokens) + req.output_tokens
        if need > self.max_model_len:
            raise TopasError(f"request {req.id} (task {req.task_id}, stage {req.stage!r}) needs "
                             f"{need} tokens but vLLM's max_model_len is {self.max_model_len} "
                             f"({context_fix(self.max_model_len, self.budget_tokens)})")
        need = self._shared(req) + self._footprint(req) + sum(
            s.tokens for s in shared_segments(req, self.block_size))
        if need > self.budget_tokens:
            raise TopasError(f"request {req.id} needs {need} KV tokens in whole blocks but the "
                             f"pool holds {self.budget_tokens}; give a larger --budget")

    def _as_view(self, req: Request) -> Request:
        """The request as the policy sees it: block-rounded KV (module docstring);
        its shared segments as the whole blocks vLLM shares."""
        shared = shared_segments(req, self.block_size) if req.shared else ()
        return replace(req, prefix_tokens=self._shared(req), shared=shared,
                       input_tokens=self._footprint(req) - req.output_tokens
                       + sum(s.tokens for s in shared))

    def _snapshot(self, lv: _Live) -> Request:
        return replace(self._as_view(lv.req), generated=lv.generated,
                       state=RequestState.RUNNING, admitted_at=lv.admitted_at,
                       started_at=lv.started_at)

    # ------------------------------------------------------- state changes

    def _enqueue(self, req: Request, t: float) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=req.output_tokens, min_tokens=req.output_tokens, ignore_eos=True,
            temperature=0.0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args={"topasd": {"request_id": req.id, "task_id": req.task_id,
                                   "workflow": req.workflow, "stage": req.stage,
                                   "agent": req.agent, "round": req.round,
                                   "task_arrival": req.task_arrival,
                                   "shared": [s.key for s in req.shared]}})
        prompt = self.engine.renderer.render_cmpl(
            [{"prompt_token_ids": self.tokens.prompt(req)}])[0]
        vid = self.engine.add_request(str(req.id), prompt, params)
        self._vid[req.id] = vid
        self._tid[vid] = req.id
        if not self.native:
            vreq = self.sched.requests[vid]
            self.sched.register_prefix(req.agent, vreq, req.prefix_tokens)
            end = req.prefix_tokens
            for seg in req.shared:  # each copy's whole blocks (`shared_segments`)
                self.sched.register_span(seg.key, vreq, end, end + seg.tokens)
                end += seg.tokens
        self._waiting[req.id] = replace(req, queued_at=t, state=RequestState.WAITING)
        self._emit(t, EventKind.REQUEST_READY, req, tokens=req.input_tokens)
        self._need_schedule = True

    def _requeue(self, lv: _Live, t: float) -> None:
        """Back to waiting with its output kept (vLLM recomputes it on resume)."""
        self.stats.recomputed_tokens += lv.req.input_tokens + lv.generated
        waiting_for = self._await_prefix.get(lv.req.agent, [])
        if lv.req.id in waiting_for:  # it no longer computes the prefix
            waiting_for.remove(lv.req.id)
        self._waiting[lv.req.id] = replace(lv.req, generated=lv.generated, queued_at=t,
                                           preemptions=lv.req.preemptions + 1,
                                           state=RequestState.WAITING)

    # ------------------------------------------------------------- stepping

    def _fire_timed(self) -> None:
        while self._timed and self._timed[0][0] <= self._t:
            t_ev, _, req = heapq.heappop(self._timed)
            if req is None:  # a decision's wake-up: a scheduling point now
                self._wakes.discard(t_ev)
                self._need_schedule = True
            else:
                self._enqueue(req, t_ev)

    def _wait(self, target: float) -> None:
        """Nothing runs: jump (steps clock) or sleep (wall clock) to `target`."""
        if self.clock == "wall" and math.isfinite(target):
            assert self._wall0 is not None
            time.sleep(max(0.0, target - (time.perf_counter() - self._wall0)))
            self._t = max(self._t, time.perf_counter() - self._wall0)
        else:
            self._t = max(self._t, target)

    def _step(self) -> None:
        t0 = self._t
        calls = self.sched.steps
        w0, c0 = time.perf_counter(), time.thread_time()
        outputs = self.engine.step()
        dt, cpu = time.perf_counter() - w0, time.thread_time() - c0
        # vLLM skips schedule() when it holds no request: carry the plan out here
        rec = self.sched.last if self.sched.steps > calls else self.sched.flush()
        if self.clock == "wall":
            assert self._wall0 is not None
            self._t = time.perf_counter() - self._wall0
        elif self.clock == "profile":
            self._t = t0 + self.profile.step_time(rec.prefill_tokens, rec.attn_pairs,
                                                  rec.decode_batch, rec.context_tokens)
        elif self.clock == "cpu":
            self._t = t0 + cpu
        else:
            self._t = t0 + dt
        pending, self._pending = self._pending, []
        self._count(rec, dt, cpu)
        self._started(rec.admitted, t0)
        if self.record:  # vLLM's prefix-cache hit of each request's first admission
            for vid, hit in rec.cached.items():
                self.cached_tokens.setdefault(self._tid[vid], hit)
        self._carried_out(rec, pending)
        for vid in rec.engine_preempted:
            self._retracted(vid, t0)
        for agent in rec.pinned:
            if agent in self._copies:
                self._copy_ready(self._copies[agent])
                continue
            p = self._prefixes[agent]
            p.ready, p.ready_at = True, self._t
            self._emit(self._t, EventKind.PREFIX_COMPUTE_END, agent=agent, tokens=p.tokens)
            for rid in self._await_prefix.pop(agent, ()):
                if rid in self._running:  # its own prefill starts now (as in the simulator)
                    self._running[rid].started_at = self._t
                    self._emit(self._t, EventKind.REQUEST_START, self._running[rid].req)
        for lv in self._running.values():
            vreq = self.sched.requests.get(self._vid[lv.req.id])
            if vreq is not None:
                if vreq.num_output_tokens > lv.generated and not lv.prefilled:
                    lv.prefilled = True  # its prefill made its first token
                    self._emit(self._t, EventKind.PREFILL_END, lv.req)
                lv.generated = vreq.num_output_tokens
        for out in outputs:
            if out.finished:
                self._finished(int(out.request_id), len(out.outputs[0].token_ids))
        if self._retry:
            self._retry = False
            self._need_schedule = self._need_schedule or bool(self._waiting)
        if self.audit_enabled and not self.native:
            self._audit(rec, pending)
        if not self._running and not self.native and self.sched.pending_admissions():
            raise EngineMismatch(f"vLLM holds admitted requests it never started: "
                                 f"{self.sched.pending_admissions()[:5]}")

    def _copy_ready(self, c: _Copy) -> None:
        c.ready, c.ready_at, c.computer = True, self._t, None
        self._emit(self._t, EventKind.CONTEXT_COMPUTE_END, agent=c.owner, tokens=c.tokens,
                   note=c.agent)

    def _count(self, rec: Any, dt: float, cpu: float) -> None:
        s = self.stats
        s.steps += 1
        s.busy_s += dt
        s.sched_s += rec.sched_s
        if rec.decode_batch:
            s.decode_steps += 1
            s.batch_token_steps += rec.decode_batch
            s.peak_batch = max(s.peak_batch, rec.decode_batch)
        if rec.prefill_tokens:
            s.prefill_steps += 1
        if self.record:
            self.samples.append(StepSample(rec.prefill_tokens, rec.attn_pairs,
                                           rec.decode_batch, rec.context_tokens, dt,
                                           rec.sched_s, cpu))

    def _started(self, vids: list[str], t: float) -> None:
        for vid in vids:
            rid = self._tid[vid]
            lv = self._running.get(rid)
            if lv is None:
                if not self.native:
                    raise EngineMismatch(f"vLLM started request {rid}, which the policy did "
                                         f"not admit ({self._whereabouts(rid, vid)})")
                req = self._waiting.pop(rid)
                lv = self._running[rid] = _Live(req, t, generated=req.generated)
                self._emit(t, EventKind.REQUEST_ADMIT, req,
                           tokens=req.input_tokens + req.generated)
            p = self._prefixes[lv.req.agent]
            if not self.native and p.location is Location.GPU and not p.ready:
                # this request computes the agent's prefix first: its service (and
                # REQUEST_START) begins once the prefix blocks are cached
                self._await_prefix.setdefault(lv.req.agent, []).append(rid)
                continue
            lv.started_at = t
            self._emit(t, EventKind.REQUEST_START, lv.req)

    def _carried_out(self, rec: Any, pending: list[_Pending]) -> None:
        """The decisions applied before this step: their preemptions happened."""
        asked = [rid for p in pending for rid in p.preempt]
        done = sorted(self._tid[v] for v in rec.preempted)
        if sorted(asked) != done:
            raise EngineMismatch(f"the policy preempted {sorted(asked)} but vLLM's scheduler "
                                 f"preempted {done}")

    def _whereabouts(self, rid: int, vid: str) -> str:
        """Where a request stands on both sides, for an EngineMismatch report."""
        vreq = self.sched.requests.get(vid)
        side = "waiting" if rid in self._waiting else "unknown"
        return (f"topasd: {side}, {self._touched.get(rid, 'never admitted')}; vLLM: "
                f"{vreq.status.name if vreq is not None else 'gone'}, admission gate "
                f"{'holds' if vid in self.sched.pending_admissions() else 'lacks'} it; "
                f"engine step {self.stats.steps}")

    def _retracted(self, vid: str, t: float) -> None:
        """vLLM preempted a request on its own (out of KV blocks)."""
        rid = self._tid[vid]
        lv = self._running.pop(rid, None)
        if lv is None:
            if self.native:
                return
            raise EngineMismatch(f"vLLM preempted request {rid}, which was not running")
        self._requeue(lv, t)
        self._release(lv.req, self._plan_now)
        self.stats.retractions += 1
        self._emit(t, EventKind.RETRACT, lv.req, tokens=lv.generated, note="vllm")
        self._need_schedule = True

    def _finished(self, rid: int, n_tokens: int) -> None:
        lv = self._running.pop(rid)
        if self.record:
            self.finished_tokens[rid] = n_tokens
        self.batch_is_full = False
        self._prefixes[lv.req.agent].last_used = self._t
        self._release(lv.req, self._plan_now)
        started = lv.started_at if lv.started_at is not None else lv.admitted_at
        self._emit(self._t, EventKind.REQUEST_FINISH, lv.req, tokens=n_tokens,
                   value=self._t - started)
        del self._tid[self._vid.pop(rid)]
        self._touched.pop(rid, None)
        self._need_schedule = True

    def _audit(self, rec: Any, pending: list[_Pending]) -> None:
        pinned = frozenset(a for a, blocks in self.sched.pins.items() if a in self._prefixes
                           and self.sched.prefix_blocks(a) == blocks
                           and all(b.ref_cnt >= 1 for b in blocks))
        cached = frozenset(a for a in self._prefixes if self.sched.prefix_blocks_any(a))
        gpu = {a for a, p in self._prefixes.items() if p.location is Location.GPU}
        self.audit.append(AuditRow(
            t=self._t, decisions=tuple(p.seq for p in pending),
            preempted=tuple(sorted(self._tid.get(v, -1) for v in rec.preempted)),
            engine_preempted=tuple(sorted(self._tid.get(v, -1) for v in rec.engine_preempted)),
            pinned=pinned, cached=cached,
            book_ready=frozenset(a for a in gpu if self._prefixes[a].ready),
            book_gpu=frozenset(gpu), book_kept=frozenset(a for a in self._kept
                                                         if a in self._prefixes)))

    # ---------------------------------------------------------------- misc

    def close(self) -> None:
        """Shut the engine down (its worker and memory)."""
        core = getattr(self.engine, "engine_core", None)
        if core is not None:
            core.shutdown()


def _startup_cause(exc: BaseException) -> str:
    """The lines of a vLLM start-up error that say why (a validation error's
    first line is only its title), and the flag that fixes a memory refusal."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = "; ".join(lines[:3])[:400] or type(exc).__name__
    if "kv-cache-memory-bytes" in text or "VLLM_CPU_KVCACHE_SPACE" in text:
        text += " (topasd sizes that memory from --budget: lower --budget)"
    return text


def _make_engine(model: str, *, blocks: int, block_size: int, chunk_tokens: int,
                 max_num_seqs: int, max_model_len: int, native: bool, seed: int,
                 kv_bytes_per_token: int) -> Any:
    """An in-process vLLM engine on this machine's CPU with our scheduler."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler must be reachable
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: tables, JSON
    try:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor
    except ImportError as exc:
        raise TopasError(f"the vLLM backend needs vLLM: pip install -e '.[vllm]' ({exc})"
                         ) from None
    from backends.vllm.scheduler import PolicyScheduler, TimedScheduler

    args = EngineArgs(
        model=model, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
        enable_prefix_caching=True, enable_chunked_prefill=True, block_size=block_size,
        num_gpu_blocks_override=blocks,
        kv_cache_memory_bytes=max(16 << 20, 2 * blocks * block_size * kv_bytes_per_token),
        gpu_memory_utilization=0.05, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=chunk_tokens, enforce_eager=True, disable_log_stats=True,
        async_scheduling=False, seed=seed,
        scheduler_cls=TimedScheduler if native else PolicyScheduler)
    try:
        config = args.create_engine_config()
        engine = LLMEngine(config, Executor.get_class(config), log_stats=False,
                           multiprocess_mode=False)
    except Exception as exc:  # vLLM's config errors are of many types; name the cause
        raise TopasError(f"vLLM could not start on {model}: {_startup_cause(exc)}") from None
    return engine, engine.engine_core.engine_core.scheduler
