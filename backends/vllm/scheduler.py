"""TOPAS inside vLLM v1: a `scheduler_cls` that carries out topasd decisions.

`PolicyScheduler` subclasses vLLM's own `Scheduler` and overrides two things:

- admission: `schedule()` hides every waiting request except those the
  policy admitted (in the policy's order) from vLLM's waiting loop, so vLLM
  admits exactly those, as far as its step token budget reaches this step
  (the rest stay pending and are admitted on the next steps);
- preemption: the policy's preemptions go through vLLM's own
  `_preempt_request` (blocks freed, request re-queued with its output kept,
  recomputed on resume) at the start of `schedule()`.

Prefix residency is block pinning: once an agent's prefix blocks are cached,
the scheduler takes one reference on each (`BlockPool.touch`), so vLLM's LRU
never evicts them while TOPAS keeps the agent resident; an eviction drops that
reference and removes the blocks' hashes from the prefix cache, so the next
use recomputes the prefix. Everything else (chunked prefill, block
allocation, running-batch scheduling, output handling) is vLLM's.

`TimedScheduler` is vLLM's default scheduler with a stopwatch: the baseline
of `bench/vllm_overhead.py`, and the base of `PolicyScheduler`.

The backend (`backends.vllm.backend`) talks to the scheduler only between
engine steps: it queues a `Plan`, steps the engine, then reads `last`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus


@dataclass
class StepRecord:
    """What one engine step did, as the scheduler saw it (vLLM request ids)."""

    admitted: list[str] = field(default_factory=list)  # WAITING/PREEMPTED -> RUNNING: the
    # first prefill chunk of this (re-)admission ran in this step
    cached: dict[str, int] = field(default_factory=dict)  # admitted: prefix-cache hit tokens
    preempted: list[str] = field(default_factory=list)  # by the plan (the policy)
    engine_preempted: list[str] = field(default_factory=list)  # by vLLM: out of blocks
    evicted: list[str] = field(default_factory=list)  # agents unpinned and dropped
    pinned: list[str] = field(default_factory=list)  # agents whose blocks got pinned
    scheduled_tokens: int = 0
    num_reqs: int = 0
    # the step's shape, as HardwareProfile.step_time takes it
    prefill_tokens: int = 0
    attn_pairs: float = 0.0  # sum over prefill pieces of n*c + n^2/2
    decode_batch: int = 0
    context_tokens: int = 0  # KV read: every piece's context plus its new tokens
    sched_s: float = 0.0  # wall time of schedule() + update_from_output()


@dataclass
class Plan:
    """A decision in vLLM's terms, carried out at the next `schedule()`."""

    preempt: list[str] = field(default_factory=list)
    admit: list[str] = field(default_factory=list)
    # prefix residency in decision order: ("evict" | "keep", agent); an evict then
    # a keep of one agent before a step must leave it pinned, the reverse evicted
    residency: list[tuple[str, str]] = field(default_factory=list)


class TimedScheduler(Scheduler):
    """vLLM's default scheduler, timed: `last` describes the last step and
    `sched_s` accumulates scheduler wall time (schedule + update_from_output)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last = StepRecord()
        self.sched_s = 0.0
        self.steps = 0  # schedule() calls
        self._t0 = 0.0

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._t0 = time.perf_counter()
        self.steps += 1
        self.last = StepRecord()
        before = {r.request_id for r in self.running}
        out = self._schedule(throttle_prefills)
        rec = self.last
        rec.admitted = [rid for rid in out.num_scheduled_tokens if rid not in before]
        rec.cached = {rid: self.requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]
                      for rid in rec.admitted}
        mine = set(rec.preempted)
        rec.engine_preempted = sorted(set(out.preempted_req_ids) - mine)
        rec.scheduled_tokens = out.total_num_scheduled_tokens
        rec.num_reqs = len(out.num_scheduled_tokens)
        self._shape(out, rec)
        rec.sched_s += time.perf_counter() - self._t0
        return out

    def _schedule(self, throttle_prefills: bool) -> SchedulerOutput:
        return super().schedule(throttle_prefills)

    def _shape(self, out: SchedulerOutput, rec: StepRecord) -> None:
        """Prefill tokens, attention pairs, decode batch and KV read of the step
        (num_computed_tokens already counts this step's tokens here)."""
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            c = req.num_computed_tokens - n
            if n == 1 and c == req.num_tokens - 1:
                rec.decode_batch += 1
            else:
                rec.prefill_tokens += n
                rec.attn_pairs += n * c + n * n / 2.0
            rec.context_tokens += c + n

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> Any:
        t0 = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self._after_step()
        dt = time.perf_counter() - t0
        self.last.sched_s += dt
        self.sched_s += self.last.sched_s
        return outputs

    def _after_step(self) -> None:
        """Hook run after each step's outputs are processed."""

    def flush(self) -> StepRecord:
        """Outside a step: nothing to carry out for vLLM's own scheduler."""
        self.last = StepRecord()
        return self.last


class PolicyScheduler(TimedScheduler):
    """vLLM's scheduler with admission, preemption and prefix residency
    decided by a topasd policy (see the module docstring)."""

    waiting: Any  # vLLM's RequestQueue, swapped for a gate during `_schedule`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plan = Plan()
        self._admit: list[str] = []  # admitted by the policy, not yet running in vLLM
        self._hashes: dict[str, tuple[BlockHash, ...]] = {}  # agent -> prefix block hashes
        self._want: set[str] = set()  # resident agents whose blocks are not pinned yet
        self.pins: dict[str, list[KVCacheBlock]] = {}  # agent -> blocks we hold a ref on
        self._groups = list(range(len(self.kv_cache_config.kv_cache_groups)))

    # ------------------------------------------------------ backend side

    def plan(self, plan: Plan) -> None:
        """Queue a decision; it is carried out at the start of the next step.
        Decisions between two steps apply in order: a preemption withdraws an
        admission an earlier decision queued (`_schedule` preempts before it
        admits, so the admission would otherwise outlive the preemption)."""
        if plan.preempt:
            self._plan.admit = [r for r in self._plan.admit if r not in plan.preempt]
        self._plan.preempt += plan.preempt
        self._plan.residency += plan.residency
        self._plan.admit += plan.admit

    def forget(self, request_id: str) -> None:
        """A request about to be aborted: out of the queued plan and the admitted
        list (both look it up in `requests`, which the abort empties)."""
        self._plan.admit = [r for r in self._plan.admit if r != request_id]
        self._plan.preempt = [r for r in self._plan.preempt if r != request_id]
        if request_id in self._admit:
            self._admit.remove(request_id)

    def register_prefix(self, agent: str, request: Request, prefix_tokens: int) -> None:
        """Learn an agent's prefix block hashes from one of its requests."""
        self.register_span(agent, request, 0, prefix_tokens)

    def register_span(self, name: str, request: Request, start: int, end: int) -> None:
        """Learn the block hashes of a prompt span a name stands for (an agent's
        prefix, or a shared context copy's whole blocks) from one request."""
        if name not in self._hashes:
            b = self.hash_block_size
            self._hashes[name] = tuple(request.block_hashes[start // b:end // b])

    def keep_resident(self, name: str) -> None:
        """Pin a shared context copy's blocks once they are cached (as a prefix's)."""
        self._keep_resident(name)

    def _keep_resident(self, agent: str) -> None:
        """Pin the agent's prefix blocks as soon as they are cached."""
        if agent not in self.pins:
            self._want.add(agent)

    def _residency(self, ops: Sequence[tuple[str, str]]) -> None:
        """The queued evictions and keeps, in the order the decisions made them."""
        for op, agent in ops:
            if op == "evict":
                self._evict((agent,))
            else:
                self._keep_resident(agent)

    def flush(self) -> StepRecord:
        """Carry out the queued preemptions and evictions now, outside a step
        (vLLM skips `schedule()` when it holds no request at all)."""
        self.last = StepRecord()
        plan, self._plan = self._plan, Plan(admit=self._plan.admit)
        self._preempt(plan.preempt)
        self._residency(plan.residency)
        return self.last

    def pending_admissions(self) -> list[str]:
        return list(self._admit)

    def prefix_blocks(self, agent: str) -> list[KVCacheBlock] | None:
        """The agent's cached prefix blocks (every group), None unless all are cached."""
        blocks: list[KVCacheBlock] = []
        for h in self._hashes.get(agent, ()):
            found = self.kv_cache_manager.block_pool.get_cached_block(h, self._groups)
            if found is None:
                return None
            blocks.extend(found)
        return blocks

    def prefix_block_count(self, agent: str) -> int:
        return len(self._hashes.get(agent, ())) * len(self._groups)

    def free_block_count(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()

    # ---------------------------------------------------------- schedule

    def _schedule(self, throttle_prefills: bool) -> SchedulerOutput:
        plan, self._plan = self._plan, Plan()
        self._preempt(plan.preempt)
        self._residency(plan.residency)
        self._admit += [rid for rid in plan.admit if rid not in self._admit]
        allowed = self._allowed()
        held = self.waiting
        if allowed:
            held.remove_requests(allowed)
        gate = create_request_queue(self.policy)
        for req in allowed:
            gate.add_request(req)
        self.waiting = gate
        try:
            out = super()._schedule(throttle_prefills)
        finally:
            self.waiting = held
            for req in gate:  # admitted later, or preempted by vLLM in this step
                held.add_request(req)
        self._admit = [rid for rid in self._admit
                       if self.requests[rid].status is not RequestStatus.RUNNING]
        return out

    def _allowed(self) -> list[Request]:
        """Admitted requests vLLM may start now, in the policy's order. While an
        agent's prefix (or a shared context copy) is being computed, only one
        of its requests runs (it computes it); the others start once the blocks
        are cached and pinned, so they share them instead of computing copies."""
        computing = {n for r in self.running for n in names_of(r)} & self._want
        allowed = []
        for rid in self._admit:
            req = self.requests[rid]
            if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                continue
            wanted = [n for n in names_of(req) if n in self._want]
            if any(n in computing for n in wanted):
                continue
            computing.update(wanted)
            allowed.append(req)
        return allowed

    def _preempt(self, request_ids: Sequence[str]) -> None:
        """The policy's preemptions, through vLLM's own preemption path."""
        now = time.monotonic()
        for rid in request_ids:
            req = self.requests[rid]
            if rid in self._admit:  # admitted but never started: just withdraw it
                self._admit.remove(rid)
            if req.status is RequestStatus.RUNNING:
                self.running.remove(req)
                self._preempt_request(req, now)
            self.last.preempted.append(rid)

    def _evict(self, agents: Iterable[str]) -> None:
        """Drop our reference on each agent's prefix blocks and their hashes."""
        pool = self.kv_cache_manager.block_pool
        for agent in agents:
            self._want.discard(agent)
            held = self.pins.pop(agent, None)
            if held:
                pool.free_blocks(held)
            cached = self.prefix_blocks_any(agent)
            idle = {b.block_id for b in cached if b.ref_cnt == 0}
            if idle:
                self.kv_cache_manager.evict_blocks(idle)
            self.last.evicted.append(agent)

    def prefix_blocks_any(self, agent: str) -> list[KVCacheBlock]:
        """Every cached block of the agent's prefix (a partial prefix too)."""
        out: list[KVCacheBlock] = []
        for h in self._hashes.get(agent, ()):
            found = self.kv_cache_manager.block_pool.get_cached_block(h, self._groups)
            if found is not None:
                out.extend(found)
        return out

    def _after_step(self) -> None:
        """Pin the prefixes that became cached during this step."""
        for agent in sorted(self._want):
            blocks = self.prefix_blocks(agent)
            if blocks is None:
                continue
            self.kv_cache_manager.block_pool.touch(blocks)
            self.pins[agent] = blocks
            self._want.discard(agent)
            self.last.pinned.append(agent)


def names_of(req: Request) -> list[str]:
    """The pinned spans a request reads: its agent's prefix and the keys of its
    shared context copies (`extra_args["topasd"]`)."""
    meta = _meta(req)
    if not meta:
        return []
    return [meta["agent"], *meta.get("shared", ())]


def _meta(req: Request) -> dict[str, Any] | None:
    extra = req.sampling_params.extra_args if req.sampling_params else None
    meta = extra.get("topasd") if extra else None
    return meta if isinstance(meta, dict) else None
