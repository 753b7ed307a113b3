"""The daemon side: an in-process SGLang Engine whose scheduler asks this
backend for TOPAS decisions (Backend protocol of backends/base.py).

The Engine's scheduler subprocesses load topasd's SGLang plugin; its hook
snapshots SGLang's state before each prefill pass and, when something changed,
sends the snapshot here over `channel` and waits for the decision. `run_until`
turns each such request into a SCHEDULE event: the caller's `EventLoop` builds
the view (`view`, with its task book), asks the policy, `apply` answers the
scheduler, and the decision is logged like the simulator's. Completions come
back through the Engine's `async_generate` (REQUEST_FINISH); admission, start,
preemption and prefix events come from the scheduler.

Placement with data parallelism: every request of a task goes to replica
`task_id % dp_size` (SGLang's `routed_dp_rank`), so a workflow's requests share
one replica's radix cache and one TOPAS; each replica's leader asks separately
and its snapshot names its replica.

Tokens: a `Request` carries token counts, so prompts are synthetic token ids: an
agent's prefix is a fixed sequence derived from its name, the dynamic part one
derived from the request id (`prompt_ids`). `submit_tokens` takes real ids.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from backends.base import EngineLimits, InfeasibleDecision, prefix_work
from backends.sglang import SGLangOptions
from backends.sglang.adapter import EngineSnapshot, merge_snapshots
from backends.sglang.channel import (
    ENDPOINT_ENV,
    T0_ENV,
    TIMEOUT_ENV,
    DaemonChannel,
    DecideRequest,
    EventBatch,
)
from backends.sglang.metadata import WorkflowMeta, kv_hints_envelope
from topasd.model import (
    Decision,
    EngineEvent,
    EngineView,
    EventKind,
    Request,
    TaskView,
    TopasError,
    Workflow,
)
from topasd.profiles import HardwareProfile

POLL_S = 0.005
ABORT_WAIT_S = 5.0  # how long an abort waits for SGLang to register its request
FLUSH_RETRY_S = 0.05  # between flushes SGLang refused (a run's last request not yet let go)
TOKEN_LOW, TOKEN_HIGH = 1000, 30000  # synthetic ids stay inside any common vocabulary


@dataclass
class SGLangStats:
    """Counters for the run summary (the simulator's names; what SGLang's
    scheduler does not report to the daemon stays 0)."""

    decisions: int = 0
    preemptions: int = 0
    prefix_loads: int = 0
    prefix_evictions: int = 0
    requests_finished: int = 0
    peak_batch: int = 0
    prefix_load_bytes: float = 0.0
    prefix_computes: int = 0
    retractions: int = 0
    recomputed_tokens: int = 0

    @property
    def mean_batch(self) -> float:
        return 0.0  # the batch stays inside SGLang's scheduler


def prompt_ids(request: Request, vocab: int | None = None) -> list[int]:
    """Synthetic prompt: the agent's prefix ids, the ids of each shared task
    context copy it names (the same for every holder, so SGLang's radix cache
    shares them), then the request's own ids, all below `vocab` (the model's
    vocabulary size; None: any common one)."""
    ids = _ids(f"agent:{request.agent}", request.prefix_tokens, vocab)
    for seg in request.shared:
        ids += _ids(f"segment:{seg.key}", seg.tokens, vocab)
    return ids + _ids(f"request:{request.id}", request.own_input, vocab)


def _ids(seed: str, n: int, vocab: int | None) -> list[int]:
    high = TOKEN_HIGH if vocab is None else min(TOKEN_HIGH, vocab)
    low = min(TOKEN_LOW, high // 2)  # clear of the special ids at the bottom
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = hashlib.blake2b(f"{seed}:{counter}".encode(), digest_size=64).digest()
        out.extend(low + int.from_bytes(digest[i:i + 2], "little") % (high - low)
                   for i in range(0, 64, 2))
        counter += 1
    return out[:n]


def vocab_size(engine: Any) -> int | None:
    """The model's vocabulary size as SGLang's tokenizer manager read it (None
    when the engine does not say: a stand-in)."""
    config = getattr(getattr(engine, "tokenizer_manager", None), "model_config", None)
    value = getattr(config, "vocab_size", None)
    return value if isinstance(value, int) and value > 2 else None


def meta_of(request: Request) -> WorkflowMeta:
    return WorkflowMeta(request_id=request.id, task_id=request.task_id,
                        workflow=request.workflow, stage=request.stage, agent=request.agent,
                        round=request.round, prefix_tokens=request.prefix_tokens,
                        task_arrival=request.task_arrival, ready_at=request.ready_at)


def start_engine(options: SGLangOptions) -> Any:
    """`sglang.Engine` with the options (the plugin reads the endpoint from env)."""
    import sglang

    return sglang.Engine(**options.server_args())


def pool_tokens(engine: Any) -> int | None:
    """The KV pool of one SGLang replica in tokens: `max_total_num_tokens` of
    the scheduler's start-up report, which `Engine.get_server_info()` merges in
    too. Read from the record the Engine keeps, not through that call: it runs
    the Engine's own event loop, and the tokenizer's reply handler would then
    live on a loop that never runs again, so no `async_generate` on ours would
    ever finish. None when the engine does not say."""
    infos = getattr(getattr(engine, "_scheduler_init_result", None), "scheduler_infos", None)
    try:
        value = infos[0]["max_total_num_tokens"] if infos else None
    except (KeyError, TypeError, IndexError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class SGLangBackend:
    """TOPAS-in-SGLang behind the Backend protocol (wall-clock seconds)."""

    name = "sglang"

    def __init__(self, options: SGLangOptions, profile: HardwareProfile, *,
                 endpoint: str | None = None,
                 engine_factory: Callable[[SGLangOptions], Any] = start_engine,
                 require_plugin: bool = True, record: bool = False) -> None:
        """`require_plugin`: a request SGLang finishes before its replica's
        scheduler ever spoke to the daemon means the topasd plugin is not
        loaded there, and SGLang schedules without TOPAS: stop with the fix
        (off only for stand-in engines that have no scheduler). `record`:
        keep the `meta_info` SGLang returns for each request of the run
        (`replies`: cached tokens, retractions, finish reason; for audits)."""
        self.options = options
        self.record = record
        self.replies: dict[int, dict[str, Any]] = {}  # request id -> meta_info (record)
        self.require_plugin = require_plugin
        self._spoke: set[int] = set()  # replicas whose scheduler has reached the daemon
        self.profile = profile
        self.costs = profile.cost_hints()
        self.stats = SGLangStats()
        # the schedulers stamp times from `_epoch` (passed in T0_ENV when they
        # start); the run's clock starts at `_t0` (`restart_clock`), and what they
        # report is moved onto it (`_rebased`)
        self._epoch = self._t0 = time.monotonic()
        self.endpoint = endpoint or (
            f"ipc://{tempfile.gettempdir()}/topasd-sglang-{os.getpid()}.sock")
        self.channel = DaemonChannel(self.endpoint)
        os.environ[ENDPOINT_ENV] = self.endpoint  # inherited by SGLang's subprocesses
        os.environ[T0_ENV] = repr(self._epoch)
        # (request id, finish time, error note, completion tokens SGLang reported)
        self._done: queue.Queue[tuple[int, float, str | None, int | None]] = queue.Queue()
        self._requests: dict[int, Request] = {}
        self._started: dict[int, float] = {}
        self._withdrawing: dict[int, str] = {}  # aborts sent: request id -> why
        # streamed calls (`follow`): request id -> tokens SGLang has streamed so far
        # (written by the engine's thread, read by `state`)
        self._made: dict[int, int] = {}
        self._asks: deque[tuple[bytes, DecideRequest]] = deque()
        self._current: tuple[bytes, DecideRequest] | None = None
        self._last: dict[int, EngineSnapshot] = {}  # replica -> the latest it reported
        self._answered: dict[tuple[int, int], int] = {}  # (replica, ask seq) -> decision seq
        self._events: list[EngineEvent] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="topasd-sglang",
                                        daemon=True)
        self._thread.start()
        self.engine = engine_factory(options)
        # the engine's own pool when it reports one, else the profile's (B_t, Eq. 2)
        self.budget_tokens: int = pool_tokens(self.engine) or int(profile.budget_tokens)
        self.vocab = vocab_size(self.engine)
        self.restart_clock()  # the engine's start-up is not part of the run

    # ------------------------------------------------------------- protocol

    @property
    def t(self) -> float:
        return time.monotonic() - self._t0

    def restart_clock(self) -> None:
        """t = 0 now (after the engine's start-up, and for each reused run)."""
        self._t0 = time.monotonic()

    def reset(self) -> None:
        """Ready the running engine for another run (a replay reuses one engine
        for every policy, as its start-up costs tens of seconds): SGLang's
        radix cache flushed (the plugin's flush hook drops TOPAS's pins and
        request records first), the counters zeroed, t = 0. Only when idle."""
        if self._requests:
            raise TopasError(f"sglang: cannot reset with {len(self._requests)} request(s) "
                             "unfinished; let the run end first")
        self._answer_unapplied()
        self._flush(time.monotonic() + ABORT_WAIT_S * 6)
        self._answer_asks()
        self._events.clear()
        self.replies = {}
        self._started.clear()
        self._last.clear()
        self._answered.clear()
        self.stats = SGLangStats()
        self.restart_clock()

    def _flush(self, deadline: float) -> None:
        """Flush SGLang's cache. The last reply of a run can reach the daemon
        before SGLang's scheduler has let its request go, and SGLang refuses a
        flush while it holds a request: ask again until `deadline`."""
        while True:
            flushed = asyncio.run_coroutine_threadsafe(
                self.engine.tokenizer_manager.flush_cache(), self._loop)
            while not flushed.done() and time.monotonic() < deadline:
                self._answer_asks()  # a leader may ask while the flush waits for it
            reply = flushed.result(timeout=0)
            if getattr(reply, "success", True):
                return
            if time.monotonic() >= deadline:
                raise TopasError(f"sglang: SGLang refused to flush its cache "
                                 f"({getattr(reply, 'message', '')}); the engine is not idle")
            self._collect(FLUSH_RETRY_S)

    def _answer_asks(self) -> None:
        """Let every waiting leader go on without a decision (between runs)."""
        self._collect(POLL_S)
        while self._asks:
            ident, ask = self._asks.popleft()
            self.channel.answer(ident, ask.seq, None)

    def replica(self, task_id: int) -> int:
        """The DP replica serving every request of `task_id`."""
        return task_id % max(1, self.options.dp_size)

    def submit(self, request: Request) -> None:
        self.submit_tokens(request, prompt_ids(request, self.vocab))

    def submit_tokens(self, request: Request, input_ids: Sequence[int]) -> None:
        """Submit with real prompt ids (the first `prefix_tokens` are the agent's prefix)."""
        need = len(input_ids) + request.output_tokens
        if need > self.budget_tokens:
            self._made.pop(request.id, None)
            raise TopasError(
                f"request {request.id} (task {request.task_id}, stage {request.stage!r}) needs "
                f"{need} KV tokens (prompt {len(input_ids)} + output {request.output_tokens}) "
                f"but SGLang's KV pool holds {self.budget_tokens}; raise --mem-fraction or "
                "lower the stage's tokens")
        self._requests[request.id] = request
        self._events.append(EngineEvent(self.t, EventKind.REQUEST_READY, request.id,
                                        request.task_id, request.agent, request.stage,
                                        tokens=request.input_tokens))
        kwargs: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": request.output_tokens,
                                "ignore_eos": True},
            "rid": engine_rid(request.id),
            "kv_hints": kv_hints_envelope(meta_of(request)),
        }
        if self.options.dp_size > 1:
            kwargs["routed_dp_rank"] = self.replica(request.task_id)
        if request.id in self._made:
            kwargs["stream"] = True
        asyncio.run_coroutine_threadsafe(self._generate(request.id, kwargs), self._loop)

    def follow(self, request_id: int) -> None:
        """A streamed call: SGLang streams its output (`async_generate(stream=True)`),
        and `state` shows the tokens made so far."""
        self._made[request_id] = 0

    async def _reply(self, rid: int, kwargs: dict[str, Any]) -> Any:
        """SGLang's reply to one request; a streamed one's chunks counted on the way
        (each carries the completion tokens so far; the last is the whole reply)."""
        if not kwargs.get("stream"):
            return await self.engine.async_generate(**kwargs)
        out: Any = None
        async for out in await self.engine.async_generate(**kwargs):
            made = _completion_tokens(out)
            if made is not None and rid in self._made:
                self._made[rid] = made
        return out

    async def _generate(self, rid: int, kwargs: dict[str, Any]) -> None:
        try:
            out = await self._reply(rid, kwargs)
            if self.record:
                self.replies[rid] = _meta_info(out)
            aborted = _abort_message(out)
            note = None if aborted is None else f"error: SGLang aborted it: {aborted}"
            self._done.put((rid, self.t, note, _completion_tokens(out)))
        except Exception as exc:  # reported as a finish with a note; the run goes on
            self._done.put((rid, self.t, f"error: {exc}", None))

    def run_until(self, t_stop: float | None, *,
                  more_at_stop: bool = False) -> Iterator[EngineEvent]:
        while True:
            self._answer_unapplied()
            self._collect(0.0)
            if self._events:
                events, self._events = self._events, []
                yield from events
            if self._asks:
                self._current = self._asks.popleft()
                yield EngineEvent(self.t, EventKind.SCHEDULE)
                continue
            if t_stop is None and self.idle():
                return
            if t_stop is not None and self.t >= t_stop:
                return
            wait = POLL_S if t_stop is None else max(0.0, min(POLL_S, t_stop - self.t))
            self._collect(wait)

    def view(self, tasks: Mapping[int, TaskView], workflows: Mapping[str, Workflow]) -> EngineView:
        """The state the policy decides on: the snapshot of the replica whose
        scheduler is waiting for this decision (only then: SGLang's queues
        live in its scheduler processes)."""
        if self._current is None:
            raise InfeasibleDecision("sglang: no scheduler is waiting for a decision")
        snap: EngineSnapshot = self._current[1].snapshot
        return snap.view(self.t, tasks, workflows, self.costs)

    def state(self, tasks: Mapping[int, TaskView],
              workflows: Mapping[str, Workflow]) -> EngineView:
        """The state a dashboard shows, at any moment: every replica's last
        snapshot, merged (`merge_snapshots`; an empty pool before the first)."""
        snap = merge_snapshots(list(self._last.values()), self.budget_tokens)
        view = snap.view(self.t, tasks, workflows, self.costs)
        return _with_streamed(view, self._made, self._requests) if self._made else view

    def limits(self) -> EngineLimits:
        """SGLang sizes its pool from GPU memory (a smaller --budget caps it)."""
        return EngineLimits(pool_tokens=self.budget_tokens)

    def describe(self) -> dict[str, Any]:
        return {"budget_tokens": self.budget_tokens}

    def apply(self, decision: Decision) -> None:
        if self._current is None:
            raise InfeasibleDecision("sglang: no scheduler is waiting for a decision")
        ident, ask = self._current
        self._current = None
        self.channel.answer(ident, ask.seq, decision)
        self._answered[(ask.replica, ask.seq)] = decision.seq
        self.stats.decisions += 1
        prefixes = ask.snapshot.prefixes  # a load-back or a prefill recompute, if any KV
        self.stats.prefix_loads += sum(prefix_work(prefixes[a].tokens if a in prefixes else 1)
                                       for a in decision.load)

    def withdraw(self, request_id: int, why: str) -> bool:
        """Abort an unfinished request, waiting or running (SGLang frees its KV).
        The abort travels to SGLang's scheduler, so the REQUEST_WITHDRAW comes
        when `async_generate` returns aborted; a request SGLang finished
        meanwhile gets its REQUEST_FINISH."""
        if request_id not in self._requests or request_id in self._withdrawing:
            return False
        self._withdrawing[request_id] = why
        asyncio.run_coroutine_threadsafe(self._abort(request_id), self._loop)
        return True

    async def _abort(self, rid: int) -> None:
        """Abort once SGLang's tokenizer manager holds the request (an abort
        before that is ignored), unless it ended first."""
        manager, key = self.engine.tokenizer_manager, engine_rid(rid)
        known = getattr(manager, "rid_to_state", None)
        deadline = time.monotonic() + ABORT_WAIT_S
        while (known is not None and key not in known and rid in self._requests
               and time.monotonic() < deadline):
            await asyncio.sleep(POLL_S)
        manager.abort_request(key)

    def idle(self) -> bool:
        return not self._requests and not self._asks and self._current is None

    def close(self) -> None:
        """Shut the engine down and release the socket."""
        try:
            self.engine.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()  # its self-pipe now, not when collected
            self.channel.close()

    # -------------------------------------------------------------- helpers

    def _answer_unapplied(self) -> None:
        """A SCHEDULE the caller did not act on: let the scheduler go on."""
        if self._current is not None:
            ident, ask = self._current
            self._current = None
            self.channel.answer(ident, ask.seq, None)

    def _collect(self, wait_s: float) -> None:
        for ident, msg in self.channel.poll(wait_s):
            self._spoke.add(msg.replica)
            self._dropped(msg.replica, msg.dropped)
            if isinstance(msg, DecideRequest):
                msg = self._rebased(msg)
                self._scheduler_events(msg.events)
                self._asks.append((ident, msg))
                if msg.snapshot is not None:
                    self._last[msg.replica] = msg.snapshot
            elif isinstance(msg, EventBatch):
                self._scheduler_events(msg.events)
        while True:
            try:
                rid, t, note, tokens = self._done.get_nowait()
            except queue.Empty:
                break
            req = self._requests.pop(rid, None)
            self._made.pop(rid, None)
            if req is None:
                continue
            why = self._withdrawing.pop(rid, None)
            if why is not None and (note or (tokens or 0) < req.output_tokens):
                self._started.pop(rid, None)  # aborted: no service to report
                self._events.append(EngineEvent(t, EventKind.REQUEST_WITHDRAW, rid, req.task_id,
                                                req.agent, req.stage, tokens=tokens or 0,
                                                note=why))
                continue
            self._check_plugin(req, note)
            started = self._started.pop(rid, t)
            self.stats.requests_finished += 1
            if tokens is None:  # no count in the reply (an error, or a stand-in engine)
                tokens = req.output_tokens
            elif tokens < req.output_tokens and not note:  # SGLang clips max_new_tokens
                note = (f"SGLang generated {tokens} of {req.output_tokens} tokens "
                        "(max_new_tokens clipped to the KV pool)")
            self._events.append(EngineEvent(t, EventKind.REQUEST_FINISH, rid, req.task_id,
                                            req.agent, req.stage, tokens=tokens,
                                            value=t - started, note=note or ""))

    def _check_plugin(self, req: Request, note: str | None) -> None:
        replica = self.replica(req.task_id)
        if self.require_plugin and note is None and replica not in self._spoke:
            raise TopasError(
                f"SGLang finished request {req.id} (replica {replica}) without its scheduler "
                "ever asking topasd: the topasd plugin is not loaded in SGLang's scheduler, "
                "so SGLang scheduled without TOPAS. Install topasd in the engine's "
                "environment (pip install -e '.[sglang]') and, if SGLANG_PLUGINS is set, "
                "add topasd to it (docs/sglang.md)")

    def _dropped(self, replica: int, seqs: Sequence[int]) -> None:
        """Log the decisions a leader stopped waiting for (never carried out)."""
        for ask_seq in seqs:
            seq = self._answered.pop((replica, ask_seq), None)
            if seq is not None:
                self._events.append(EngineEvent(
                    self.t, EventKind.DECISION_DROPPED, value=float(seq),
                    note=f"decision {seq} reached the scheduler after it stopped waiting "
                         f"({TIMEOUT_ENV}); it was not carried out"))

    def _rebased(self, msg: DecideRequest) -> DecideRequest:
        """The request with its scheduler-stamped times on the run's clock."""
        shift = self._t0 - self._epoch
        if not shift:
            return msg
        snap = None if msg.snapshot is None else msg.snapshot.rebased(shift)
        return replace(msg, snapshot=snap)

    def _scheduler_events(self, events: list[EngineEvent]) -> None:
        shift = self._t0 - self._epoch
        for ev in events:
            if shift:
                ev = replace(ev, t=ev.t - shift)
            if ev.kind is EventKind.REQUEST_START and ev.request_id is not None:
                self._started[ev.request_id] = ev.t
            elif ev.kind is EventKind.PREEMPT:
                self.stats.preemptions += 1
            elif ev.kind is EventKind.PREFIX_EVICT:
                self.stats.prefix_evictions += 1
            self._events.append(ev)


def engine_rid(request_id: int) -> str:
    """The rid SGLang knows a request by. SGLang's scheduler aborts every
    request whose rid *starts with* the aborted one's, so no rid may be a
    prefix of another: "topasd-1." is not a prefix of "topasd-10."."""
    return f"topasd-{request_id}."


def _meta_info(reply: Any) -> dict[str, Any]:
    """The `meta_info` of an `async_generate` reply ({} when it has none)."""
    meta = reply.get("meta_info") if isinstance(reply, dict) else None
    return meta if isinstance(meta, dict) else {}


def _abort_message(reply: Any) -> str | None:
    """Why SGLang aborted a request that `async_generate` returned without an
    error (`meta_info.finish_reason` of type "abort"), else None."""
    reason = _meta_info(reply).get("finish_reason")
    if not isinstance(reason, dict) or reason.get("type") != "abort":
        return None
    return str(reason.get("message") or "no reason given")


def _with_streamed(view: EngineView, made: Mapping[int, int],
                   requests: Mapping[int, Request]) -> EngineView:
    """`view` with each streamed request SGLang has made tokens of as running
    with those tokens (the last snapshot may predate its admission)."""
    running = {r.id: r for r in view.running}
    streamed = {rid: replace(req, generated=n) for rid, n in sorted(made.items())
                if (req := running.get(rid) or requests.get(rid)) is not None
                and n > max(0, req.generated)}
    if not streamed:
        return view
    running.update(streamed)
    return replace(view, running=tuple(running.values()),
                   waiting=tuple(r for r in view.waiting if r.id not in streamed))


def _completion_tokens(reply: Any) -> int | None:
    """The completion length SGLang's `async_generate` reports (`meta_info`)."""
    count = _meta_info(reply).get("completion_tokens")
    return count if isinstance(count, int) and not isinstance(count, bool) else None
