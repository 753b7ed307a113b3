"""The daemon's engine loop: one thread owning backend, policy, task book,
drivers and the store sink; everything else talks to it through thread-safe
methods that return futures.

The loop (`Service._main`) repeats: advance the backend with the shared
`EventLoop` (decide at each SCHEDULE event, record every event), run the
pending commands (submissions, parameter changes, state queries) from a
queue, then wait for the clock or the next command. Commands run between
decisions, so a parameter change is effective at the next decision and a
state snapshot is consistent.

Clock: on the paced sim the engine's virtual time follows the wall clock,
t = (wall - wall0) x speed; with speed "max" it runs unpaced, as fast as the
work allows (and waits while idle).

Three sources of tasks: the built-in driver (`--workload NAME --rate R`,
`feeder.py`), `POST /v1/tasks` (a sampled task of a registered workflow), and
OpenAI-compatible calls that an application drives itself (`calls.py`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np

from store import Store, StoreError
from topasd.config import Settings
from topasd.daemon import admission, engine, state
from topasd.daemon.bus import EventBus
from topasd.daemon.calls import Call, CallBook, CallResult, CallSpec, OpenTask, Progress
from topasd.daemon.clock import PacedClock
from topasd.daemon.errors import Invalid, NotFound, Unavailable
from topasd.daemon.feeder import Feeder, middle_rate
from topasd.daemon.ledger import KEEP_FINISHED, TaskEntry, TaskLedger
from topasd.daemon.metrics import Metrics
from topasd.daemon.recorder import DETAIL_DECISIONS, Recorder
from topasd.daemon.workflows import SYNTHESIZED, WorkflowRegistry
from topasd.model import EngineEvent, EngineView, EventKind, Request, TaskView, TopasError, Workflow
from topasd.profiles import get_profile
from topasd.runner import EventLoop, RunResult, run_info, stage_counts
from topasd.scheduler import (
    ALL_POLICY_NAMES,
    Policy,
    TunablePolicy,
    build_policy,
    policy_params,
)
from topasd.scheduler.param_specs import canonical_param
from topasd.scheduler.residual import quantile_rows
from workflows.builtin import load_workload
from workflows.driver import TaskDriver
from workflows.spec import load_workflow
from workflows.trace import TaskRecord, check_rate, sample_task

log = logging.getLogger("topasd")

TICK_S = 0.02  # paced: wall seconds between clock ticks while the engine is busy
IDLE_WAIT_S = 0.5  # wait for a command at most this long while idle
UNPACED_SLICE = 1.0  # unpaced: virtual seconds advanced between command checks
PACED_SLICE_WALL = 0.1  # paced: at most this much wall time's worth per pump
KEEP_DECISION_MS = 200_000  # decision wall times kept for the run summary
STREAM_TICK_S = 0.05  # streamed calls learn their tokens at most this often (wall)

Command = tuple[Callable[..., Any], tuple[Any, ...], Future[Any], bool]


class Service:
    """The daemon's engine loop and its thread-safe API (see the module doc)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        profile = get_profile(settings.profile)
        if settings.budget is not None:
            profile = profile.with_overrides(budget_tokens=settings.budget)
        self.workload = load_workload(settings.workload) if settings.workload else None
        specs = tuple(load_workflow(p) for p in settings.workflows)  # read once
        self.workflows = WorkflowRegistry(self.workload, specs)
        self.policy: Policy = build_policy(settings.policy, settings.params)
        self.backend = engine.make_backend(settings, profile)
        limits = self.backend.limits()
        self.profile = engine.engine_profile(profile, limits, settings.budget)
        self.limit = engine.request_limit(self.profile.budget_tokens, limits)
        try:
            self._refuse_unrunnable(settings, specs)
            self.feeder = None if self.workload is None else Feeder(
                self.workload, settings.rate or middle_rate(self.workload), settings.tasks,
                settings.seed)
        except TopasError:
            self.backend.close()
            raise
        self.store = Store(settings.db)
        self.store_sink = self.store.sink(settings.log_candidates)
        self.store_sink.on_failure = self._store_failed
        self.store_problem: str | None = None  # why the decision log stopped, if it did
        self.bus = EventBus()
        self.metrics = Metrics()
        self.params_version = 0
        self._published_params = self._params_dict()
        self.ledger = TaskLedger()
        self.recorder = Recorder(self.store_sink, self.bus, self.metrics,
                                 lambda: self.params_version, self.ledger)
        self.driver = TaskDriver(self.workflows.active)
        self.loop = EventLoop(self.workflows.active, self.policy, self.backend, self.recorder,
                              driver=self.driver)
        self.loop.on_task_done = self._task_done
        self.calls = CallBook(orphaned=self._abandon)
        if self.workload is not None:
            for wf in self.workload.workflows:
                self.workflows.activate(wf.name)
        self.rng = np.random.default_rng(settings.seed + 1)
        self._quantiles = quantile_rows(64, 64, 0)  # E[remaining path] samples (state)
        self.clock = PacedClock(None if settings.speed == "max" else float(settings.speed))
        self.rejected = 0  # driver tasks that cannot fit the KV budget
        self.refused_busy = 0  # new tasks refused at the admission bounds (429)
        self._driver_refused = False  # a driver task was refused so (logged once)
        self._cmds: deque[Command] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._draining = False
        self._drain_deadline = math.inf
        self._closed = False
        self.stopped = threading.Event()
        self.crash: BaseException | None = None
        self.started_wall = time.time()
        self._stall_warned = False
        self._next_housekeeping = 0.0
        self._next_stream = 0.0
        every = settings.summary_every
        self._summary = state.SummaryLog(every) if every else None

    def _refuse_unrunnable(self, settings: Settings, specs: tuple[Workflow, ...]) -> None:
        """Stop the start on work the engine could never run: a workflow of the
        --workload or a --workflow spec whose smallest request exceeds the
        limit, or a rate that puts arrivals beyond the bound on times."""
        for wf in (*(self.workload.workflows if self.workload else ()), *specs):
            problem = engine.never_fits(wf, self.limit)
            if problem is not None:
                raise TopasError(problem)
        if self.workload is not None:
            check_rate(settings.rate or middle_rate(self.workload), settings.tasks or 1)

    # ---------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the run in the store and start the engine loop thread (t = 0 now)."""
        self.clock.wall0 = time.monotonic()
        meta = {"daemon": True, "workload": self.workload.name if self.workload else None,
                "rate": self.feeder.rate if self.feeder else None,
                "tasks": self.settings.tasks, "seed": self.settings.seed,
                "speed": self.settings.speed, "stages": stage_counts(self.workflows.known)}
        self.store_sink.run_started(run_info(self.policy, self.backend, meta))
        self._thread = threading.Thread(target=self._main, name="topasd-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self.unready_reason is None

    @property
    def unready_reason(self) -> str | None:
        """Why the daemon admits no work now (None: it does)."""
        if self.store_problem is not None:
            return (f"the decision log failed ({self.store_problem}): no work is admitted "
                    "until the daemon is restarted")
        if self._thread is None or not self._thread.is_alive() or self.crash is not None:
            return "the engine is not running (starting, stopped or failed)"
        if self._draining:
            return "the daemon is shutting down"
        return None

    def _store_failed(self, cause: str) -> None:
        """The store sink gave up (its thread): stop admitting work, at once."""
        self.store_problem = cause
        log.error("not admitting work any more: the decision log failed (%s); running "
                  "work goes on unlogged, restart the daemon once that is fixed", cause)
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, grace: float | None = None) -> None:
        """Stop admitting new tasks; running work may finish for `grace` wall seconds."""
        grace = self.settings.grace if grace is None else grace
        self._drain_deadline = time.monotonic() + grace
        self._draining = True
        self._wake.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self.stopped.wait(timeout)

    def close(self) -> None:
        """After the loop stopped: finish the store run (flushes every row), close."""
        if self._closed:
            return
        if self._thread is not None and self._thread.is_alive():
            self.drain(0.0)
            self._thread.join()
        self._closed = True
        book, loop = self.loop.book, self.loop
        result = RunResult(policy=self.policy.name, jct=book.jct(), arrivals=dict(book.arrivals),
                           finishes=dict(book.finishes), requests_finished=loop.requests_finished,
                           decisions=loop.decisions, decision_ms=loop.decision_ms,
                           stats=self.backend.stats, wall_s=time.time() - self.started_wall)
        try:
            self.store_sink.run_finished(None if self.crash else result, self.crash)
        except StoreError as exc:
            self.store_problem = self.store_problem or str(exc)
            log.error("%s", exc)
        self.store.close()
        self.backend.close()

    @property
    def run_id(self) -> int | None:
        return self.store_sink.run_id

    # ------------------------------------------------- thread-safe methods

    def submit_task(self, workflow: str, overrides: Mapping[str, Mapping[str, int]]
                    ) -> Future[dict[str, Any]]:
        """A sampled task of a registered workflow (per-stage token overrides)."""
        return self._command(self._cmd_task, workflow, dict(overrides))

    def submit_call(self, spec: CallSpec, progress: Progress | None = None
                    ) -> Future[CallResult]:
        """One OpenAI-compatible call; the future resolves when it finishes. A
        streamed call's `progress` follows it: accepted, admitted, tokens."""
        return self._command(self._cmd_call, spec, progress, deferred=True)

    def withdraw_call(self, future: Future[CallResult], why: str) -> Future[bool]:
        """Take back the call of `future`, waiting or running (its client went
        away); True when the engine took it back (False: it had finished)."""
        return self._command(self._cmd_withdraw, future, why)

    def get_task(self, key: str, workflow: str | None = None) -> Future[dict[str, Any]]:
        """A task by our id or the client's task id, with its requests' trails."""
        return self._command(self._cmd_get_task, key, workflow)

    def list_tasks(self, workflow: str | None, status: str | None,
                   client_task_id: str | None, limit: int) -> Future[dict[str, Any]]:
        """The tasks kept, newest first, filtered (`GET /v1/tasks`)."""
        return self._command(self._cmd_list_tasks, workflow, status, client_task_id, limit)

    def state(self, limit: int = 50) -> Future[dict[str, Any]]:
        return self._command(self._cmd_state, limit)

    def patch_params(self, changes: Mapping[str, Any]) -> Future[dict[str, Any]]:
        return self._command(self._cmd_params, dict(changes))

    def params(self) -> dict[str, Any]:
        """The policy and its parameters as last published by the loop."""
        return self._published_params

    def decision(self, seq: int, candidates: int = 50) -> dict[str, Any]:
        """A recent decision with its best `candidates` candidate states (and the
        chosen one); NotFound when `seq` is unknown or no longer kept in memory."""
        detail = self.recorder.detail(seq, candidates)
        if detail is not None:
            return detail
        oldest, last = self.recorder.oldest_detail(), self.loop.decisions
        if 1 <= seq <= last:
            raise NotFound(f"decision {seq} is older than the last {DETAIL_DECISIONS} kept in "
                           f"memory (from {oldest}); read it from the store (decisions and "
                           "candidates tables)")
        raise NotFound(f"no decision {seq}: decisions are numbered 1..{last} so far")

    def _command(self, fn: Callable[..., Any], *args: Any, deferred: bool = False
                 ) -> Future[Any]:
        fut: Future[Any] = Future()
        if self.stopped.is_set():
            fut.set_exception(Unavailable("the daemon is shutting down; no new work"))
            return fut
        self._cmds.append((fn, args, fut, deferred))
        self._wake.set()
        if self.stopped.is_set():  # the loop ended meanwhile: fail what it left
            self._fail_pending(Unavailable("the daemon is shutting down; no new work"))
        return fut

    # ------------------------------------------------------ the loop thread

    def _main(self) -> None:
        paced = self.clock.speed is not None
        try:
            while True:
                self._wake.clear()
                behind = self._catch_up() if paced else False
                ran = self._run_commands()  # stamped with the engine's current time
                self._housekeeping()
                self._stream()
                if paced and ran:
                    self._advance(self.backend.t)  # decide on new work now, not next tick
                if self._draining and (self.backend.idle()
                                       or time.monotonic() >= self._drain_deadline):
                    break
                if paced:
                    self.bus.notify()
                    if not behind:
                        self._wait_paced()
                else:
                    self._tick_unpaced()
                    self.bus.notify()
        except BaseException as exc:  # a bug: the daemon stops (exit 1), the store says why
            self.crash = exc
            log.exception("engine loop stopped")
        finally:
            self.stopped.set()
            gone = Unavailable("the daemon shut down before this request finished")
            self.calls.fail_all(gone)
            self._fail_pending(gone)
            self.bus.notify(force=True)
            if self.crash is None:
                unfinished = len(self.loop.book.tasks)
                log.info("engine loop stopped at t=%.1fs (%d task(s) in flight, %d abandoned)",
                         self.backend.t, unfinished, self.metrics.abandoned)

    def _catch_up(self) -> bool:
        """Paced: run the engine to the clock's now (a bounded slice); True if behind."""
        assert self.clock.speed is not None
        target = self.clock.now()
        self._advance(min(target, self.backend.t + PACED_SLICE_WALL * self.clock.speed))
        return self.backend.t < target - 1e-9

    def _wait_paced(self) -> None:
        assert self.clock.speed is not None
        timeout = IDLE_WAIT_S if self.backend.idle() else TICK_S
        nxt = self._next_arrival()
        if nxt is not None:
            timeout = min(timeout, max(0.0, (nxt - self.clock.now()) / self.clock.speed))
        self._wake.wait(timeout)

    def _tick_unpaced(self) -> None:
        nxt = self._next_arrival()
        if not self.backend.idle():
            self._advance(self.backend.t + UNPACED_SLICE)
        elif nxt is not None:
            self._advance(max(nxt, self.backend.t))
        else:
            self._advance(self.backend.t)  # decide on new submissions; no time passes
            if self.backend.idle():
                self._check_stall()
                self._wake.wait(IDLE_WAIT_S)

    def _advance(self, target: float) -> None:
        """Run the engine to `target`, letting built-in driver tasks arrive on time."""
        loop = self.loop
        while True:
            nxt = self._next_arrival()
            stop = target if nxt is None or nxt > target else nxt
            t0 = time.perf_counter()
            ms0 = len(loop.decision_ms)
            loop.pump(stop, more_at_stop=stop == nxt)
            self.metrics.pump_wall_s += time.perf_counter() - t0
            self.metrics.decide_wall_s += sum(loop.decision_ms[ms0:]) / 1e3
            self.metrics.t = self.backend.t
            if nxt is None or nxt > self.backend.t:
                return
            self._feed()

    def _next_arrival(self) -> float | None:
        if self.feeder is None or self._draining or self.store_problem is not None:
            return None
        return self.feeder.next_arrival

    def _feed(self) -> None:
        assert self.feeder is not None
        while self.feeder.next_arrival is not None and self.feeder.next_arrival <= self.backend.t:
            record = self.feeder.pop(self.ledger.new_id(), self.workflows.active)
            if self._fit_problem(record) is not None:
                self.rejected += 1
                self.ledger.refuse(record.id, "it cannot fit the KV budget (see "
                                   "driver_rejected in /v1/state)")
                log.warning("driver task %d of %s does not fit the KV budget; skipped",
                            record.id, record.workflow)
                continue
            busy = self._busy()
            if busy is not None:
                self.ledger.refuse(record.id, f"{busy} (see tasks_refused_busy in /v1/state)")
                if not self._driver_refused:
                    self._driver_refused = True
                    log.warning("driver task %d skipped, and any more while the daemon is "
                                "at capacity (counted in tasks_refused_busy): %s", record.id,
                                busy)
                continue
            self._arrive(record, "driver", record.arrival)

    def _housekeeping(self) -> None:
        """Once a second: drop abandoned application tasks, bound the memory of a
        long-running daemon (the run summary covers what is kept)."""
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + min(1.0, (self.settings.task_timeout or 4.0) / 4)
        if self.settings.task_timeout:
            self._expire_open_tasks(now)
        view = self.backend.state(self.loop.book.tasks, self.workflows.active)
        kv = state.budget(view)
        self.metrics.kv_used = kv["used"]
        if self._summary is not None and self._summary.due(now):
            log.info("%s", self._summary.line(self._counts(view), state.headline(
                self.metrics, self.loop.decision_ms, view.t), kv, view.t))
        ms = self.loop.decision_ms
        if len(ms) > KEEP_DECISION_MS:
            del ms[:len(ms) - KEEP_DECISION_MS // 2]
        book = self.loop.book
        if len(book.finishes) > KEEP_FINISHED:
            for tid in list(book.finishes)[:len(book.finishes) - KEEP_FINISHED // 2]:
                del book.finishes[tid]
                book.arrivals.pop(tid, None)

    def _expire_open_tasks(self, now: float) -> None:
        """Drop application-driven tasks that saw no call for `task_timeout` seconds."""
        timeout = self.settings.task_timeout
        for task in self.calls.idle_since(now - timeout):
            self._abandon(task, f"no call for {timeout:.0f} s")

    def _abandon(self, task: OpenTask, why: str) -> None:
        """Drop an application-driven task that will see no more calls."""
        self.calls.close(task, f"was abandoned at t={self.backend.t:.3f}s ({why})")
        view = self.loop.book.drop(task.id)
        self.loop.record(EngineEvent(self.backend.t, EventKind.TASK_ABANDON, task_id=task.id,
                                     note=why))
        self.ledger.abandoned(task.id, view)
        self.metrics.abandoned += 1
        log.info("task %d (%s, client id %r) abandoned: %s", task.id, task.workflow.name,
                 task.key[1] if task.key else None, why)

    def _busy(self) -> admission.Busy | None:
        """The refusal of a new task at the admission bounds (counted), or None."""
        m = self.metrics
        load = admission.Load(len(self.loop.book.tasks), sum(m.waiting.values()),
                              m.counts[EventKind.TASK_FINISH],
                              m.counts[EventKind.REQUEST_FINISH],
                              time.time() - self.started_wall)
        busy = admission.refusal(load, self.settings.max_tasks, self.settings.max_waiting)
        if busy is not None:
            self.refused_busy += 1
        return busy

    def _check_stall(self) -> None:
        waiting = sum(self.metrics.waiting.values())
        if waiting and not self._stall_warned:
            self._stall_warned = True
            log.warning("the engine is idle with %d waiting request(s): policy %s stopped "
                        "admitting", waiting, self.policy.name)

    def _run_commands(self) -> int:
        """Run queued commands in order; returns how many ran."""
        cmds = self._cmds
        n = 0
        while cmds:
            n += 1
            fn, args, fut, deferred = cmds.popleft()
            if not deferred and not fut.set_running_or_notify_cancel():
                continue
            try:
                if deferred:
                    fn(fut, *args)
                else:
                    fut.set_result(fn(*args))
            except TopasError as exc:
                if not fut.done():
                    fut.set_exception(exc)
            except Exception as exc:
                log.exception("command %s failed", getattr(fn, "__name__", fn))
                if not fut.done():
                    fut.set_exception(exc)
        return n

    def _fail_pending(self, exc: BaseException) -> None:
        while self._cmds:
            try:
                _, _, fut, _ = self._cmds.popleft()
            except IndexError:
                return
            if not fut.done():
                with contextlib.suppress(Exception):  # cancelled or resolved concurrently
                    fut.set_exception(exc)

    # ------------------------------------------------------------ commands

    def _cmd_task(self, workflow: str, overrides: dict[str, dict[str, int]]) -> dict[str, Any]:
        self._refuse_unlogged()
        if self._draining:
            raise Unavailable("the daemon is shutting down: not admitting new tasks")
        busy = self._busy()
        if busy is not None:
            raise busy
        wf = self.workflows.registered(workflow)
        unknown = sorted(set(overrides) - set(wf.stages))
        if unknown:
            raise Invalid(f"stages: workflow {workflow!r} has no stage(s) {unknown}; its "
                          f"stages are {list(wf.topo_order)}")
        active = self.workflows.activate(workflow)
        task_id = self.ledger.next_id  # taken only once the task fits
        record = sample_task(active, task_id, self.backend.t, self.rng)
        if overrides:
            stages = {v: tuple(replace(r, input_tokens=o.get("input_tokens", r.input_tokens),
                                       output_tokens=o.get("output_tokens", r.output_tokens))
                               for r in rounds) if (o := overrides.get(v)) else rounds
                      for v, rounds in record.stages.items()}
            record = replace(record, stages=stages)
        problem = self._fit_problem(record)
        if problem:
            raise Invalid(problem)
        self.ledger.new_id()
        entry = self._arrive(record, "api", self.backend.t)
        return entry.as_dict(self.loop.book.tasks.get(task_id))

    def _cmd_call(self, fut: Future[CallResult], spec: CallSpec,
                  progress: Progress | None) -> None:
        if not fut.set_running_or_notify_cancel():
            return  # the client went away before the call reached the engine
        self._refuse_unlogged()
        wf, stage, task = self.calls.route(spec, self.workflows, self._draining)
        agent = wf.stages[stage].agent
        prefix = wf.agents[agent].prefix_tokens
        own = spec.input_tokens + (self.workflows.uncached_system(agent, spec)
                                   if wf.name.startswith(SYNTHESIZED) else 0)
        need = prefix + own + spec.output_tokens
        if need > self.limit.tokens:
            fix = ("lower max_tokens or shorten the prompt" if prefix + 2 <= self.limit.tokens
                   else f"the prefix of agent {agent!r} alone does not leave room: give the "
                        "daemon a larger --budget" + (f", or a spec of {wf.name!r} with a "
                        "shorter prefix" if spec.workflow in self.workflows.known else ""))
            raise Invalid(f"the call needs {need} KV tokens (prefix {prefix} + input "
                          f"{own} + max_tokens {spec.output_tokens}) but "
                          f"{self.limit.what}; {fix}")
        opened = task is None
        if task is None:
            busy = self._busy()
            if busy is not None:
                raise busy
            key = None if spec.task_key is None else (wf.name, spec.task_key)
            task = self._open_task(wf, key, spec.task_key)
        k = task.take_round(stage)
        task.in_flight += 1
        task.last_wall = time.monotonic()
        req = Request(id=self.driver.new_request_id(), task_id=task.id, workflow=wf.name,
                      stage=stage, agent=agent, round=k, input_tokens=own,
                      output_tokens=spec.output_tokens, ready_at=self.backend.t,
                      task_arrival=self.loop.book.arrivals[task.id], prefix_tokens=prefix)
        self.calls.by_request[req.id] = Call(task, req, spec, fut, progress)
        if progress is not None:
            self.backend.follow(req.id)
        try:
            self.loop.submit(req, self.calls)
        except TopasError:  # the engine refused it: undo, so nothing waits for it
            del self.calls.by_request[req.id]
            task.give_back_round(stage, k)
            task.in_flight -= 1
            if opened:
                self._abandon(task, "the engine refused its first call")
            raise
        if progress is not None:
            progress.request_id = req.id
            self.calls.streamed[req.id] = progress
            progress.wake()

    def _stream(self) -> None:
        """Streamed calls: what the engine generated so far (its dashboard state,
        at most every STREAM_TICK_S of wall time)."""
        now = time.monotonic()
        if not self.calls.streamed or now < self._next_stream:
            return
        self._next_stream = now + STREAM_TICK_S
        view = self.backend.state(self.loop.book.tasks, self.workflows.active)
        running = {r.id: r.generated for r in view.running}
        for rid, progress in list(self.calls.streamed.items()):
            if rid in running:
                progress.update(True, running[rid])

    def _cmd_withdraw(self, future: Future[CallResult], why: str) -> bool:
        call = self.calls.find(future)
        if call is None or not self.backend.withdraw(call.request.id, why):
            return False
        # its event now (the engine's clock stays): a retry queued right behind gets
        # the round it gives back
        self._advance(self.backend.t)
        return True

    def _open_task(self, wf: Workflow, key: tuple[str, str] | None,
                   client_key: str | None) -> OpenTask:
        task_id = self.ledger.new_id()
        t = self.backend.t
        self.loop.book.arrive(task_id, wf.name, t)
        self.loop.record(EngineEvent(t, EventKind.TASK_ARRIVE, task_id=task_id, note=wf.name))
        self.ledger.add(TaskEntry(task_id, wf.name, "openai", t, client_key))
        task = OpenTask(task_id, wf, key)
        if key is not None:
            self.calls.open[key] = task
        return task

    def _cmd_get_task(self, key: str, workflow: str | None) -> dict[str, Any]:
        entry = self.ledger.find(key, workflow)
        return {**entry.as_dict(self.loop.book.tasks.get(entry.id)),
                "requests": self.ledger.requests(entry.id)}

    def _cmd_list_tasks(self, workflow: str | None, status: str | None,
                        client_task_id: str | None, limit: int) -> dict[str, Any]:
        tasks: list[dict[str, Any]] = []
        total = 0
        for entry in self.ledger.select(workflow, status, client_task_id):
            total += 1
            if len(tasks) < limit:
                tasks.append(entry.as_dict(self.loop.book.tasks.get(entry.id)))
        return {"tasks": tasks, "total": total, "limit": limit}

    def _cmd_params(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate and apply a parameter change (between two decisions); log it."""
        self._refuse_unlogged()
        changes = {canonical_param(k): v for k, v in changes.items()}
        new_name = changes.pop("policy", None)
        t = self.backend.t
        old_name = self.policy.name
        old_params = policy_params(self.policy)
        switched = new_name is not None and new_name != old_name
        if switched:
            if new_name not in ALL_POLICY_NAMES:
                raise Invalid(f"policy: unknown policy {new_name!r}; choose one of "
                              f"{', '.join(ALL_POLICY_NAMES)}")
            self.policy = self.loop.policy = build_policy(new_name, changes)
        elif changes:
            if not isinstance(self.policy, TunablePolicy):
                raise Invalid(f"policy {old_name!r} has no parameters; switch policy first "
                              "(\"policy\": \"topas\")")
            self.policy.set_params(**changes)
        new_params = policy_params(self.policy)
        if switched:  # a fresh policy: `changed` names what differs from the old one's
            changed = {k: v for k, v in new_params.items()  # (or the body gave); the log
                       if k in changes or old_params.get(k) != v}  # gets the switch and
            logged = new_params  # every parameter in force (a replay resets them at a switch)
            self.store_sink.param_change(t, "policy", old_name, new_name,
                                         from_decision=self.loop.decisions + 1)
        else:
            changed = logged = {k: v for k, v in new_params.items() if old_params.get(k) != v}
        for name, value in sorted(logged.items()):
            self.store_sink.param_change(t, name, old_params.get(name), value,
                                         from_decision=self.loop.decisions + 1)
        if changed or switched:
            self.params_version += 1
            self.metrics.param_changes += len(changed) + switched
            log.info("params changed at t=%.3fs: %s%s", t,
                     f"policy={new_name} " if switched else "",
                     ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items())))
        self._published_params = self._params_dict()
        return {**self._published_params,
                "changed": sorted([*changed, *(["policy"] if switched else [])]), "t": t,
                "effective_from_decision": self.loop.decisions + 1}

    def _cmd_state(self, limit: int) -> dict[str, Any]:
        book, m = self.loop.book, self.metrics
        view = self.backend.state(book.tasks, self.workflows.active)
        return {
            "t": view.t,
            "uptime_s": time.time() - self.started_wall,
            "speed": self.settings.speed,
            "draining": self._draining,
            "run_id": self.run_id,
            "policy": self.policy.name,
            "params_version": self.params_version,
            "budget": state.budget(view),
            "prefixes": state.prefixes(view, m.transfers.copy()),
            "running": state.by_agent(view.running, limit),
            "waiting": state.by_agent(view.waiting, limit),
            "tasks": state.tasks(view, book.tasks, self.ledger, self.recorder.service_model,
                                 self._quantiles, limit),
            "counts": self._counts(view),
            "driver": None if self.feeder is None else self.feeder.as_dict(),
            "stats": state.headline(m, self.loop.decision_ms, view.t),
            "started_ts": self.started_wall,
            "event_id": self.bus.seq,
            "loop": {"pump_wall_s": m.pump_wall_s, "decide_wall_s": m.decide_wall_s},
            "recent_decisions": [d.as_dict() for d in list(self.recorder.recent)[-limit:]],
        }

    def _counts(self, view: EngineView) -> dict[str, int]:
        m = self.metrics
        return {
            "tasks_arrived": m.counts[EventKind.TASK_ARRIVE],
            "tasks_finished": m.counts[EventKind.TASK_FINISH],
            "requests_withdrawn": m.counts[EventKind.REQUEST_WITHDRAW],
            "tasks_in_flight": len(self.loop.book.tasks),
            "requests_finished": self.loop.requests_finished,
            "requests_running": len(view.running),
            "requests_waiting": len(view.waiting),
            "decisions": self.loop.decisions,
            "events": sum(m.counts.values()),
            "driver_rejected": self.rejected,
            "tasks_refused_busy": self.refused_busy,
            "tasks_abandoned": m.abandoned,
            "preemptions": m.counts[EventKind.PREEMPT],
            "retractions": m.counts[EventKind.RETRACT],
        }

    # ----------------------------------------------------------- helpers

    def _refuse_unlogged(self) -> None:
        """Unavailable once the decision log failed: no work it could not record."""
        if self.store_problem is not None:
            raise Unavailable(f"not admitting work: the decision log failed "
                              f"({self.store_problem}); restart the daemon once that is fixed")

    def _fit_problem(self, record: TaskRecord) -> str | None:
        problem = record.oversized_round(self.workflows.active[record.workflow],
                                         self.limit.tokens)
        return None if problem is None else (
            f"{problem} but {self.limit.what}; lower the stage's token overrides")

    def _arrive(self, record: TaskRecord, source: str, t: float) -> TaskEntry:
        entry = self.ledger.add(TaskEntry(record.id, record.workflow, source, t))
        self.loop.arrive(record, t)
        return entry

    def _task_done(self, task: TaskView, t: float) -> None:
        self.ledger.finished(task, t)

    def _params_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "params": policy_params(self.policy),
                "version": self.params_version}
