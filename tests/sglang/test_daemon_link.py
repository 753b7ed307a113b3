"""The daemon-side backend and the scheduler-side adapter over the real ZMQ
channel: a decision asked by the scheduler's leader is answered by a topasd
policy through the Backend protocol (the Engine is a stand-in: no GPU here)."""

from __future__ import annotations

import os
import threading
from typing import Any

from backends.sglang import SGLangOptions
from backends.sglang.backend import SGLangBackend, prompt_ids
from backends.sglang.channel import LeaderChannel
from backends.sglang.metadata import read_meta
from backends.sglang.plugin import RemoteDecider
from tests.sglang.conftest import CpuEngine
from tests.sglang.test_contract import Clock, chain3
from topasd.model import EventKind, Request, StageProgress, TaskView
from topasd.profiles import get_profile
from topasd.scheduler import make_policy


class RecordingEngine:
    """Stands in for sglang.Engine: records generate calls, finishes them at once."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def async_generate(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"text": ""}

    def shutdown(self) -> None:
        return None


def _request(rid: int, task: int, agent: str = "plan") -> Request:
    return Request(id=rid, task_id=task, workflow="chain3", stage=agent, agent=agent, round=0,
                   input_tokens=8, output_tokens=4, ready_at=0.0, task_arrival=0.0,
                   prefix_tokens=40)


def test_scheduler_asks_daemon_decides_and_the_plan_is_admitted() -> None:
    fake = RecordingEngine()
    endpoint = f"ipc:///tmp/topasd-link-{os.getpid()}.sock"
    backend = SGLangBackend(SGLangOptions("dummy", dp_size=2), get_profile("small"),
                            endpoint=endpoint, engine_factory=lambda o: fake,
                            require_plugin=False)  # a stand-in: no scheduler
    try:
        backend.submit(_request(5, task=3))
        backend.submit(_request(6, task=4))
        kinds = [ev.kind for ev in backend.run_until(backend.t + 0.3)]
        assert kinds.count(EventKind.REQUEST_READY) == 2
        assert kinds.count(EventKind.REQUEST_FINISH) == 2  # the stand-in finishes at once
        assert [c["routed_dp_rank"] for c in fake.calls] == [1, 0]  # task % dp_size
        call = fake.calls[0]
        assert call["input_ids"] == prompt_ids(_request(5, task=3))
        assert call["sampling_params"] == {"max_new_tokens": 4, "ignore_eos": True}

        # the scheduler side receives the request as SGLang would build it
        eng = CpuEngine()
        from sglang.srt.managers.kv_hints import decode_kv_hints_envelope

        req = eng.submit(read_meta(_FakeReq(call["kv_hints"])), list(range(8)), 4)
        req.kv_hints = decode_kv_hints_envelope(call["kv_hints"])
        from backends.sglang.adapter import PolicyExecutor

        decider = RemoteDecider(LeaderChannel(endpoint, replica=1, timeout_s=20))
        topas = PolicyExecutor(decider, clock=Clock())
        decider.topas = topas
        leader = threading.Thread(target=lambda: eng.end_pass(topas.around_prefill(
            lambda s: s.prefill_pass(), eng)))
        leader.start()
        wf = chain3()
        tasks = {3: TaskView(3, "chain3", 0.0, {v: StageProgress() for v in wf.topo_order})}
        policy = make_policy("fcfs")
        kinds = []
        deadline = backend.t + 20
        while leader.is_alive() and backend.t < deadline:
            for ev in backend.run_until(backend.t + 0.05):
                kinds.append(ev.kind)
                if ev.kind is EventKind.SCHEDULE:
                    view = backend.view(tasks, {"chain3": wf})
                    assert [r.id for r in view.waiting] == [5]
                    backend.apply(policy.decide(view))
        leader.join(5)
        assert kinds.count(EventKind.SCHEDULE) == 1
        assert eng.running_rids() == ["rid-5"]  # the fcfs decision was admitted
        assert backend.stats.decisions == 1 and backend.stats.prefix_loads == 1
    finally:
        backend.close()


class _FakeReq:
    def __init__(self, hints: dict[str, Any]) -> None:
        from sglang.srt.managers.kv_hints import decode_kv_hints_envelope

        self.kv_hints = decode_kv_hints_envelope(hints)


class ClippingEngine(RecordingEngine):
    """Replies as SGLang does when it clipped max_new_tokens to its memory."""

    async def async_generate(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"text": "", "meta_info": {"completion_tokens": 2}}


def test_a_finish_reports_the_tokens_sglang_generated() -> None:
    endpoint = f"ipc:///tmp/topasd-link-clip-{os.getpid()}.sock"
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"), endpoint=endpoint,
                            engine_factory=lambda o: ClippingEngine(),
                            require_plugin=False)  # a stand-in: no scheduler
    try:
        backend.submit(_request(5, task=3))  # asks for 4 tokens
        finishes = [ev for ev in backend.run_until(backend.t + 0.3)
                    if ev.kind is EventKind.REQUEST_FINISH]
    finally:
        backend.close()
    assert [(ev.request_id, ev.tokens) for ev in finishes] == [(5, 2)]
    assert "generated 2 of 4 tokens" in finishes[0].note


def test_a_decision_the_leader_stopped_waiting_for_is_logged_as_dropped() -> None:
    """The leader asks, times out and goes on; the daemon's late answer is
    dropped by the leader, which says so with its next message: the daemon
    logs that the decision it made was never carried out."""
    from backends.sglang.adapter import EngineSnapshot
    from topasd.model import Decision

    endpoint = f"ipc:///tmp/topasd-link-drop-{os.getpid()}.sock"
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"), endpoint=endpoint,
                            engine_factory=lambda o: RecordingEngine(),
                            require_plugin=False)  # a stand-in: no scheduler
    leader = LeaderChannel(endpoint, replica=0, timeout_s=0.2)
    snap = EngineSnapshot(budget_tokens=100, new_token_ratio=0.7, prefixes={}, running=(),
                          waiting=(), batch_is_full=False, chunk_tokens=8192,
                          max_prefill_tokens=16384, key=(frozenset(), frozenset()), seq=7)
    try:
        assert leader.decide(7, snap, []) is None  # nobody answered in time
        asked = False
        for ev in backend.run_until(backend.t + 0.2):
            if ev.kind is EventKind.SCHEDULE:
                backend.apply(Decision(backend.t, "fcfs", seq=3))  # logged, answered late
                asked = True
        assert asked
        leader.send_events([])  # the leader's next message reports the drop
        dropped = [ev for ev in backend.run_until(backend.t + 0.2)
                   if ev.kind is EventKind.DECISION_DROPPED]
        assert [ev.value for ev in dropped] == [3.0]
        assert "decision 3" in dropped[0].note and "not carried out" in dropped[0].note
    finally:
        leader.close()
        backend.close()


class BusyFlushEngine(RecordingEngine):
    """Refuses the first `busy` flushes, as SGLang does while its scheduler
    still holds a request whose reply the daemon already has."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.flushes = 0
        self.busy = busy
        self.tokenizer_manager = self

    async def flush_cache(self) -> Any:
        from types import SimpleNamespace

        self.flushes += 1
        return SimpleNamespace(success=self.flushes > self.busy, message="")


def test_reset_asks_again_while_sglang_is_letting_the_last_request_go() -> None:
    engine = BusyFlushEngine(busy=2)
    backend = SGLangBackend(SGLangOptions("dummy"), get_profile("small"),
                            endpoint=f"ipc:///tmp/topasd-link-flush-{os.getpid()}.sock",
                            engine_factory=lambda o: engine, require_plugin=False)
    try:
        backend.reset()
    finally:
        backend.close()
    assert engine.flushes == 3
