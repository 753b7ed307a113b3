"""TOPAS inside SGLang's scheduler: the view from SGLang's state, and the decision
carried out through SGLang's own admission, retraction and radix cache.

This module runs inside SGLang's scheduler process (one per tensor-parallel
rank). It reads and changes these attributes of `sglang.srt.managers.scheduler.
Scheduler` (SGLang 0.5.23; the contract tests in tests/sglang pin them):
`waiting_queue`, `running_batch`, `chunked_req`, `tree_cache`,
`token_to_kv_pool_allocator`, `new_token_ratio_tracker`, `chunked_prefill_size`,
`max_prefill_tokens`, `enable_hierarchical_cache` and `_add_request_to_queue`.

Mappings (docs/sglang.md has the full table):

- view: W_t = `waiting_queue`, Q_t = the prefill pass's `running_batch` argument's
  `reqs` + `chunked_req`, B_t =
  the token pool's size, an agent prefix is GPU when its tokens match on device
  in the radix cache (`match_full_device_prefix`, read-only), HOST when only
  HiCache's host pool holds it, NONE otherwise.
- admit: the waiting queue is narrowed to the decision's admission list, in its
  order, for SGLang's own prefill pass (`PrefillAdder`: prefill budget, chunking,
  KV check); what does not fit this round stays planned for the next rounds.
- preempt: SGLang's retract path (`ScheduleBatch.release_req`, which frees the
  request's KV and calls `Req.reset_for_retract`), then the queue; the generated
  tokens are re-prefilled on re-admission.
- prefixes: a prefix TOPAS keeps resident is pinned with a radix-tree lock
  (`tree_cache.lock`), so SGLang's LRU never evicts it; an evicted one is
  unpinned and reclaimed by SGLang's LRU eviction when room is needed (its
  admission accounting already counts it free); a load is HiCache's load-back
  (host hit) or the prefill's recompute, done when the first admitted request of
  the agent enters a prefill batch.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from backends.sglang.metadata import WorkflowMeta, read_meta
from topasd.model import (
    CostHints,
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Location,
    PrefixState,
    Request,
    RequestState,
    Reservation,
    TaskView,
    Workflow,
)

log = logging.getLogger("topasd.sglang")
TimeSource = Callable[[], float]  # seconds, monotonic
UNCHUNKED = 1 << 30  # chunk_tokens reported when chunked prefill is off
# per-request records (`first_seen`, `admitted_at`, `preemptions`) are kept for
# the requests SGLang holds; finished and aborted ones are forgotten once the
# records outgrow this and twice the requests present (a long-running engine)
FORGET_AT = 4096


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine half of an `EngineView`, built from SGLang's objects.

    The daemon adds its task book, workflows, cost hints and clock (`view`).
    `key` changes when a request arrives, leaves, or is retracted by SGLang.
    """

    budget_tokens: int
    new_token_ratio: float
    prefixes: Mapping[str, PrefixState]
    running: tuple[Request, ...]
    waiting: tuple[Request, ...]
    batch_is_full: bool
    chunk_tokens: int
    max_prefill_tokens: int
    key: tuple[frozenset[int], frozenset[int]]
    seq: int = 0

    def view(self, t: float, tasks: Mapping[int, TaskView], workflows: Mapping[str, Workflow],
             costs: CostHints) -> EngineView:
        return EngineView(
            t=t, budget_tokens=self.budget_tokens, new_token_ratio=self.new_token_ratio,
            prefixes=self.prefixes, running=self.running, waiting=self.waiting, tasks=tasks,
            workflows=workflows, costs=costs, batch_is_full=self.batch_is_full,
            chunk_tokens=self.chunk_tokens, max_prefill_tokens=self.max_prefill_tokens,
            seq=self.seq)


    def rebased(self, shift: float) -> EngineSnapshot:
        """The snapshot on a clock that starts `shift` seconds later (the times
        the scheduler stamped, minus `shift`; ready and arrival times come
        from the daemon's clock already)."""
        def request(r: Request) -> Request:
            return replace(r, queued_at=r.queued_at - shift,
                           admitted_at=None if r.admitted_at is None else r.admitted_at - shift,
                           started_at=None if r.started_at is None else r.started_at - shift)

        return replace(self, running=tuple(map(request, self.running)),
                       waiting=tuple(map(request, self.waiting)),
                       prefixes={a: replace(p, last_used=p.last_used - shift)
                                 for a, p in self.prefixes.items()})


PLACE_RANK = {Location.GPU: 2, Location.HOST: 1, Location.NONE: 0}


def merge_snapshots(snaps: list[EngineSnapshot], budget_tokens: int) -> EngineSnapshot:
    """The engine as a dashboard shows it: the replicas' last snapshots as one
    (their requests together, their pools summed, each prefix at the best place
    any replica holds it). No snapshot yet: an empty pool of `budget_tokens`."""
    if not snaps:
        return EngineSnapshot(budget_tokens, 1.0, {}, (), (), False, UNCHUNKED, 0,
                              (frozenset(), frozenset()))
    if len(snaps) == 1:
        return snaps[0]
    prefixes: dict[str, PrefixState] = {}
    for snap in snaps:
        for agent, p in snap.prefixes.items():
            have = prefixes.get(agent)
            if have is None or PLACE_RANK[p.location] > PLACE_RANK[have.location]:
                prefixes[agent] = p
    return EngineSnapshot(
        budget_tokens=sum(s.budget_tokens for s in snaps),
        new_token_ratio=max(s.new_token_ratio for s in snaps), prefixes=prefixes,
        running=tuple(r for s in snaps for r in s.running),
        waiting=tuple(r for s in snaps for r in s.waiting),
        batch_is_full=all(s.batch_is_full for s in snaps),
        chunk_tokens=snaps[0].chunk_tokens, max_prefill_tokens=snaps[0].max_prefill_tokens,
        key=(frozenset().union(*(s.key[0] for s in snaps)),
             frozenset().union(*(s.key[1] for s in snaps))),
        seq=max(s.seq for s in snaps))


Decider = Callable[[EngineSnapshot], Decision | None]
"""Returns the decision for a snapshot (None: decide nothing this round)."""


@dataclass(slots=True)
class ApplyReport:
    """What `apply` did, and what it had to skip (the state moved on)."""

    preempted: list[int] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class PolicyExecutor:
    """One SGLang scheduler process's executor of a topasd policy (TOPAS or a
    baseline): view, decide (through `decider`), apply.

    Deterministic given the SGLang state, the decisions and the clock: every
    tensor-parallel rank runs one on identical state and, fed the same decision
    (`RankSync`), makes identical changes.
    """

    def __init__(self, decider: Decider, *, clock: TimeSource = time.monotonic,
                 sync: Callable[[Decision | None], Decision | None] | None = None) -> None:
        self.decider = decider
        self.clock = clock
        self.sync = sync
        self.prefix_ids: dict[str, tuple[int, ...]] = {}
        self.plan: list[int] = []  # admitted by the last decision, not yet in a batch
        self.pins: dict[str, Any] = {}  # agent -> SGLang TreeLock on its prefix
        self.want: set[str] = set()  # resident by decision, not yet cached whole to pin
        self.released: set[str] = set()  # evicted by TOPAS, still cached until reclaimed
        self.first_seen: dict[int, float] = {}
        self.admitted_at: dict[int, float] = {}
        self.preemptions: dict[int, int] = {}
        self.last_used: dict[str, float] = {}
        self.events: list[EngineEvent] = []
        self.decisions = 0
        self._key: tuple[frozenset[int], frozenset[int]] | None = None
        self._retry = False
        self._seq = 0
        self._passes = 0  # prefill passes seen (the same on every rank)
        self._refusals = 0  # passes in a row SGLang refused the whole plan, idle
        self._retry_pass = 0  # the pass at which a refused plan is decided again
        # the running batch of the prefill pass under way: SGLang passes it to
        # the hooked method and stores it in `running_batch` only after the pass
        self._batch: Any = None

    def running_batch(self, sched: Any) -> Any:
        """The running batch SGLang's current prefill pass works on."""
        return sched.running_batch if self._batch is None else self._batch

    # ------------------------------------------------------------- the view

    def snapshot(self, sched: Any) -> EngineSnapshot:
        """The engine state from `sched`'s SGLang objects."""
        now = self.clock()
        waiting, running = [], []
        for req in sched.waiting_queue:
            meta = self._learn(req, now)
            if meta is not None:
                self._note_retraction(req, meta, now)
                waiting.append(self._request(req, meta, RequestState.WAITING))
        for req in self._running_reqs(sched):
            meta = self._learn(req, now)
            if meta is not None:
                running.append(self._request(req, meta, RequestState.RUNNING))
        self._seq += 1
        present = [r.id for r in waiting] + [r.id for r in running]
        if len(self.first_seen) > max(FORGET_AT, 2 * len(present)):
            self._forget(frozenset(present))
        chunk = sched.chunked_prefill_size
        return EngineSnapshot(
            budget_tokens=int(sched.token_to_kv_pool_allocator.size),
            new_token_ratio=float(sched.new_token_ratio_tracker.current),
            prefixes=self._prefixes(sched),
            running=tuple(running),
            waiting=tuple(waiting),
            batch_is_full=bool(self.running_batch(sched).batch_is_full),
            chunk_tokens=int(chunk) if chunk and chunk > 0 else UNCHUNKED,
            max_prefill_tokens=int(sched.max_prefill_tokens),
            key=(frozenset(r.id for r in waiting) | frozenset(r.id for r in running),
                 frozenset(r.id for r in running)),
            seq=self._seq,
        )

    def _note_retraction(self, req: Any, meta: WorkflowMeta, now: float) -> None:
        """An admitted request back in the queue was retracted by SGLang itself
        (`retract_decode`, a decode step out of KV): report it (RETRACT)."""
        rid = meta.request_id
        if rid not in self.admitted_at:
            return
        del self.admitted_at[rid]
        self.preemptions[rid] = self.preemptions.get(rid, 0) + 1
        self.events.append(EngineEvent(now, EventKind.RETRACT, rid, meta.task_id, meta.agent,
                                       meta.stage, tokens=len(req.output_ids), note="sglang"))

    def _forget(self, present: frozenset[int]) -> None:
        """Drop the records of requests SGLang no longer holds (finished or
        aborted: the snapshot runs before the prefill pass, when every live
        request is waiting, running or the chunked one)."""
        for records in (self.first_seen, self.admitted_at, self.preemptions):
            for rid in [rid for rid in records if rid not in present]:
                del records[rid]

    def _running_reqs(self, sched: Any) -> list[Any]:
        reqs = list(self.running_batch(sched).reqs)
        chunked = sched.chunked_req
        if chunked is not None and all(r is not chunked for r in reqs):
            reqs.append(chunked)
        return reqs

    def _learn(self, req: Any, now: float) -> WorkflowMeta | None:
        meta = read_meta(req)
        if meta is None:
            return None
        if meta.agent not in self.prefix_ids:
            self.prefix_ids[meta.agent] = tuple(req.origin_input_ids[: meta.prefix_tokens])
        self.first_seen.setdefault(meta.request_id, now)
        return meta

    def _request(self, req: Any, meta: WorkflowMeta, state: RequestState) -> Request:
        rid = meta.request_id
        running = state is RequestState.RUNNING
        return Request(
            id=rid, task_id=meta.task_id, workflow=meta.workflow, stage=meta.stage,
            agent=meta.agent, round=meta.round,
            input_tokens=len(req.origin_input_ids) - meta.prefix_tokens,
            output_tokens=int(req.sampling_params.max_new_tokens),
            ready_at=meta.ready_at, task_arrival=meta.task_arrival,
            prefix_tokens=meta.prefix_tokens, queued_at=self.first_seen[rid],
            generated=len(req.output_ids), state=state,
            admitted_at=self.admitted_at.get(rid) if running else None,
            started_at=self.admitted_at.get(rid) if running else None,
            reservation=Reservation.OPTIMISTIC if running else Reservation.FULL,
            preemptions=self.preemptions.get(rid, 0),
        )

    def _prefixes(self, sched: Any) -> dict[str, PrefixState]:
        out = {}
        for agent, ids in self.prefix_ids.items():
            loc, host_copy = self._locate(sched, ids)
            if loc is Location.GPU and agent in self.released and agent not in self.pins:
                loc = Location.HOST if host_copy else Location.NONE  # evicted by TOPAS
            out[agent] = PrefixState(agent, len(ids), loc, ready=loc is Location.GPU,
                                     host_copy=host_copy, last_used=self.last_used.get(agent, 0.0))
        return out

    @staticmethod
    def _locate(sched: Any, ids: tuple[int, ...]) -> tuple[Location, bool]:
        """Where the radix cache holds a prefix, and whether HiCache has a host copy."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        cache = sched.tree_cache
        if not ids:
            return Location.GPU, False
        key = RadixKey(array("q", ids))
        need = len(key.page_aligned(cache.page_size))
        on_device, node, _ = cache.tree_core.match_full_device_prefix(key)
        if not sched.enable_hierarchical_cache:
            return (Location.GPU if on_device >= need else Location.NONE), False
        if on_device >= need:  # read-only: no LRU touch, no split
            return Location.GPU, bool(cache.is_backuped(node))
        # HiCache, not wholly on device: the full match (touches the LRU order of
        # the matched nodes) tells how much the host pool holds
        match = cache.match_prefix(MatchPrefixParams(key=key))
        host = match.device_prefix_len + match.host_hit_length
        return (Location.HOST, True) if host >= need else (Location.NONE, False)

    # ---------------------------------------------------------- deciding

    def needs_decision(self, snap: EngineSnapshot) -> bool:
        """A request arrived, left or was retracted, the last decision asked
        to decide again once its plan was used up, or SGLang refused the plan
        with nothing running (asked again after 1, 2, 4, ... 64 passes)."""
        return self._needs(snap.key)

    def _needs(self, key: tuple[frozenset[int], frozenset[int]]) -> bool:
        expected = self._key
        return (expected is None or key != expected or (self._retry and not self.plan)
                or (self._refusals > 0 and self._passes >= self._retry_pass))

    def step(self, sched: Any) -> Decision | None:
        """Pin what became cached, decide if something changed, carry it out."""
        for agent in sorted(self.want):  # a prefix computed since: pin it now, even if
            self._pin(sched, agent)  # the request that computed it has finished
        decision: Decision | None = None
        # the key first (ids only): the full view, with the radix-cache walks, only
        # when deciding (every rank computes the same key, so all agree)
        if self._needs(self.snapshot_key(sched)):
            snap = self.snapshot(sched)
            decision = self.decider(snap) if self.sync is None or self._is_leader() else None
            if self.sync is not None:
                decision = self.sync(decision)
            if decision is not None:  # no answer (a timeout): ask again at the next pass
                self.decisions += 1
                report = self.apply(sched, decision)
                for what in report.skipped:  # the state moved on since the view
                    log.warning("topasd: decision %d: skipped %s", decision.seq, what)
                self._key = self.snapshot_key(sched)
        return decision

    def _is_leader(self) -> bool:
        return bool(getattr(self.sync, "is_leader", True))

    def snapshot_key(self, sched: Any, admitted: Iterable[Any] = ()
                     ) -> tuple[frozenset[int], frozenset[int]]:
        """The key the state has now (after an apply, or after a pass whose
        `admitted` batch SGLang merges into the running batch at the next one)."""
        waiting = {m.request_id for m in map(read_meta, sched.waiting_queue) if m is not None}
        running = {m.request_id for m in map(read_meta, [*self._running_reqs(sched), *admitted])
                   if m is not None}
        return frozenset(waiting | running), frozenset(running)

    # ---------------------------------------------------------- applying

    def apply(self, sched: Any, decision: Decision) -> ApplyReport:
        """Carry `decision` out on SGLang's objects (ids the state no longer has
        are skipped and reported)."""
        report = ApplyReport()
        now = self.clock()
        self._preempt(sched, decision.preempt, report, now)
        for agent in decision.evict:
            self._unpin(sched, agent)
            self.want.discard(agent)
            self.released.add(agent)
            report.evicted.append(agent)
            self.events.append(EngineEvent(now, EventKind.PREFIX_EVICT, agent=agent,
                                           tokens=len(self.prefix_ids.get(agent, ())),
                                           note="policy"))
        waiting = {m.request_id: m for m in map(read_meta, sched.waiting_queue)
                   if m is not None}
        self.plan = []
        for rid in decision.admit:
            if rid in waiting:
                self.plan.append(rid)
            else:
                report.skipped.append(f"admit {rid}: not waiting")
        report.planned = list(self.plan)
        for agent in sorted(self._resident_after(sched, decision)):
            self.released.discard(agent)
            self.want.add(agent)
            self._pin(sched, agent)
        for agent in decision.load:
            if agent not in {waiting[r].agent for r in self.plan}:
                report.skipped.append(f"load {agent}: no admitted request of this agent")
        if self.plan:
            self.running_batch(sched).batch_is_full = False
        self._retry = decision.retry
        return report

    def _resident_after(self, sched: Any, decision: Decision) -> Iterable[str]:
        running = {m.agent for m in map(read_meta, self._running_reqs(sched)) if m is not None}
        kept = {a for a in self.pins.keys() | self.want if a not in decision.evict}
        return (running | kept | set(decision.load)) - set(decision.evict)

    def _preempt(self, sched: Any, rids: Iterable[int], report: ApplyReport,
                 now: float) -> None:
        """SGLang's retract path for the chosen running requests."""
        wanted = set(rids)
        if not wanted:
            return
        batch = self.running_batch(sched)
        chunked = sched.chunked_req
        metas = [read_meta(r) for r in batch.reqs]
        ending = _ending(sched, batch)
        skip = {m.request_id for req, m in zip(batch.reqs, metas, strict=True)
                if m is not None and id(req) in ending}
        victims = [i for i, m in enumerate(metas) if m is not None and m.request_id in wanted
                   and m.request_id not in skip]
        found = {metas[i].request_id for i in victims}  # type: ignore[union-attr]
        for rid in sorted(wanted - found):
            why = ("in a chunked prefill (SGLang retracts decoding requests only)"
                   if chunked is not None and (m := read_meta(chunked)) is not None
                   and m.request_id == rid else
                   "finishing, aborted or in a beam group (SGLang's retract path skips it)"
                   if rid in skip else "not running")
            report.skipped.append(f"preempt {rid}: {why}")
        if not victims:
            return
        keep = [i for i in range(len(batch.reqs)) if i not in set(victims)]
        reqs = [batch.reqs[i] for i in victims]
        for idx in victims:  # 0: no extra LRU eviction; no host backup (PD decode only):
            batch.release_req(idx, 0, offload_kv=False)  # re-admission re-prefills it
        batch.filter_batch(keep_indices=keep)
        batch.batch_is_full = False
        for req in reqs:
            meta = read_meta(req)
            assert meta is not None
            rid = meta.request_id
            self.preemptions[rid] = self.preemptions.get(rid, 0) + 1
            self.admitted_at.pop(rid, None)
            sched._add_request_to_queue(req, is_retracted=True)
            report.preempted.append(rid)
            self.events.append(EngineEvent(now, EventKind.PREEMPT, rid, meta.task_id,
                                           meta.agent, meta.stage, tokens=len(req.output_ids)))

    def _pin(self, sched: Any, agent: str) -> None:
        """Lock the radix-tree node that ends exactly at the agent's prefix."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        ids = self.prefix_ids.get(agent)
        if agent in self.pins:
            self.want.discard(agent)
            return
        if not ids:
            return
        cache = sched.tree_cache
        key = RadixKey(array("q", ids))
        matched, node, pinned = cache.tree_core.match_full_device_prefix(key)
        if matched < len(key.page_aligned(cache.page_size)) or matched == 0:
            return
        if pinned > matched:  # the deepest node runs past the prefix (a request's own
            # tokens): a lock on it would pin them too; split it at the prefix's end
            node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
        self.pins[agent] = cache.lock(node)
        self.want.discard(agent)

    def _unpin(self, sched: Any, agent: str) -> None:
        lock = self.pins.pop(agent, None)
        if lock is not None:
            sched.tree_cache.unlock(lock)

    def release_all(self, sched: Any) -> None:
        """Drop every pin (shutdown, or handing scheduling back to SGLang)."""
        self.want.clear()
        for agent in list(self.pins):
            self._unpin(sched, agent)

    def release_for_flush(self, sched: Any) -> None:
        """Before SGLang may reset its radix tree: drop every lock while its
        nodes exist, keep the agents wanted (pinned again once cached whole),
        forget the records of departed requests (SGLang flushes only when no
        request waits or runs; a replay's next run numbers its requests
        afresh) and which prefixes TOPAS evicted, and decide again at the next
        pass."""
        kept = set(self.pins) | self.want
        self.release_all(sched)
        self.want = kept
        self._forget(frozenset())
        self.released.clear()
        self.last_used.clear()
        self._key = None

    # ----------------------------------------------------- admission pass

    def planned_queue(self, queue: list[Any]) -> tuple[list[Any], list[Any]]:
        """(the queue SGLang's prefill pass walks: the plan in decision order,
        then requests topasd did not send; the requests held back)."""
        by_id: dict[int, Any] = {}
        untracked, held = [], []
        for req in queue:
            meta = read_meta(req)
            if meta is None:
                untracked.append(req)
            else:
                by_id[meta.request_id] = req
        planned = [by_id[rid] for rid in self.plan if rid in by_id]
        chosen = {id(r) for r in planned}
        held = [r for r in queue if read_meta(r) is not None and id(r) not in chosen]
        return planned + untracked, held

    def around_prefill(self, original: Callable[..., Any], sched: Any, *args: Any,
                       **kwargs: Any) -> Any:
        """The hook on `Scheduler._get_new_batch_prefill_raw`: decide, then let
        SGLang's prefill pass admit only what TOPAS planned, in its order.
        The pass's running batch is its `running_batch` argument (SGLang 0.5.23
        may have merged the last prefill batch into it, not yet stored in
        `sched.running_batch`)."""
        self._batch = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
        self._passes += 1
        try:
            self.step(sched)
            before = list(sched.waiting_queue)
            planned, held = self.planned_queue(before)
            sched.waiting_queue = planned
            result: Any = None
            try:
                result = original(sched, *args, **kwargs)
                return result
            finally:
                self._after_pass(sched, before, held, result)
        finally:
            self._batch = None

    def _after_pass(self, sched: Any, before: list[Any], held: list[Any], result: Any) -> None:
        """Record the pass's admissions, restore the held requests to the queue,
        and key the state as the next pass will see it."""
        left = sched.waiting_queue
        still = {id(r) for r in left}
        kept = {id(r) for r in held}
        now = self.clock()
        planned = bool(self.plan)
        for req in before:
            meta = read_meta(req)
            if meta is None or id(req) in still or id(req) in kept:
                continue
            rid = meta.request_id
            if rid in self.plan:
                self.plan.remove(rid)
            self.admitted_at[rid] = now
            self.last_used[meta.agent] = now
            self.released.discard(meta.agent)
            self.events.append(EngineEvent(now, EventKind.REQUEST_ADMIT, rid, meta.task_id,
                                           meta.agent, meta.stage,
                                           tokens=len(req.origin_input_ids)))
            self.events.append(EngineEvent(now, EventKind.REQUEST_START, rid, meta.task_id,
                                           meta.agent, meta.stage))
        order = {id(r): i for i, r in enumerate(before)}
        merged = list(left) + [h for h in held if id(h) not in still]  # no duplicates
        merged.sort(key=lambda r: order.get(id(r), len(order)))
        sched.waiting_queue = merged
        # SGLang 0.5.23 returns (the new prefill batch, the running batch) and merges
        # the first into the second only at the next pass: count both as running
        new_batch, running = result if isinstance(result, tuple) else (result, None)
        if running is not None:
            self._batch = running
        admitted = list(new_batch.reqs) if new_batch is not None else []
        self._note_refusal(sched, planned and len(self.plan) > 0 and not admitted, admitted)
        if self._key is not None:
            self._key = self.snapshot_key(sched, admitted)

    def _note_refusal(self, sched: Any, refused: bool, admitted: list[Any]) -> None:
        """SGLang's admission check turned the whole plan down with nothing
        running: nothing will change the state, so decide again after 1, 2,
        4, ... 64 passes; from the third refusal in a row release every pin
        (SGLang's accounting holds less room than the view said)."""
        if not refused or self._running_reqs(sched):
            self._refusals = 0
            return
        self._refusals += 1
        if self._passes >= self._retry_pass:  # decided again at this pass (or the first)
            self._retry_pass = self._passes + min(64, 1 << (self._refusals - 1))
        if self._refusals >= 3 and self.pins:
            cache = sched.tree_cache
            log.warning("topasd: SGLang refused the plan %s %d times with nothing "
                        "running (available %s, evictable %s, protected %s tokens): "
                        "releasing the pinned prefixes %s", self.plan, self._refusals,
                        sched.token_to_kv_pool_allocator.available_size(),
                        cache.evictable_size(), cache.protected_size(), sorted(self.pins))
            for agent in sorted(self.pins):
                self._unpin(sched, agent)
                self.released.add(agent)

    def take_events(self) -> list[EngineEvent]:
        events, self.events = self.events, []
        return events


class LocalDecider:
    """Decide in this process with a topasd policy (tests; a single-process run)."""

    def __init__(self, policy: Any, workflows: Mapping[str, Workflow], costs: CostHints,
                 tasks: Callable[[], Mapping[int, TaskView]], clock: TimeSource) -> None:
        self.policy = policy
        self.workflows = workflows
        self.costs = costs
        self.tasks = tasks
        self.clock = clock
        self.log: list[Decision] = []

    def __call__(self, snap: EngineSnapshot) -> Decision | None:
        view = snap.view(self.clock(), self.tasks(), self.workflows, self.costs)
        decision = replace(self.policy.decide(view), seq=snap.seq)
        self.log.append(decision)
        return decision


class RankSync:
    """Every tensor-parallel rank gets the leader's decision: the leader (first
    rank of the TP group) decides, SGLang's `broadcast_pyobj` sends it over the
    group's CPU (gloo) group, and every rank applies the same decision."""

    def __init__(self, rank: int, ranks: list[int], cpu_group: Any) -> None:
        self.rank = rank
        self.src = ranks[0]
        self.cpu_group = cpu_group
        self.is_leader = rank == self.src

    @classmethod
    def for_scheduler(cls, sched: Any) -> RankSync | None:
        group = getattr(sched, "tp_group", None)
        if group is None or getattr(group, "world_size", 1) <= 1:
            return None
        return cls(group.ranks[group.rank_in_group], list(group.ranks), group.cpu_group)

    def __call__(self, decision: Decision | None) -> Decision | None:
        from sglang.srt.utils.common import broadcast_pyobj

        payload = [_portable(decision)] if self.is_leader else []
        return broadcast_pyobj(payload, self.rank, self.cpu_group, src=self.src)[0]


def _ending(sched: Any, batch: Any) -> set[int]:
    """ids of the running requests SGLang's own retract path never retracts:
    finished or aborted ones (`to_finish`), beam-group members, and those whose
    in-flight result finishes them (overlap scheduling)."""
    out = {id(r) for r in batch.reqs if r.finished() or getattr(r, "to_finish", None)
           is not None or getattr(r, "beam_group", None) is not None}
    inflight = getattr(sched, "_reqs_finishing_inflight", None)
    if callable(inflight):
        out |= {id(r) for r in inflight(batch)}
    return out


def _portable(decision: Decision | None) -> Decision | None:
    """The decision without its candidate log (ranks need only the actions)."""
    return None if decision is None else replace(decision, candidates=(), chosen=None)
