"""Contract tests: the adapter against SGLang 0.5.23's own classes on the CPU.

Each test fails if SGLang's API drifts from what backends/sglang expects: the
plugin loader and hook registry, the kv_hints / custom_params path to the
scheduler's Req, Req / ScheduleBatch / PrefillAdder / UnifiedRadixCache /
allocator behaviour, and the Scheduler attributes the adapter reads.
"""

from __future__ import annotations

import inspect
import itertools
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from backends.sglang import SUPPORTED_SGLANG
from backends.sglang.adapter import EngineSnapshot, LocalDecider, PolicyExecutor
from backends.sglang.metadata import WorkflowMeta, kv_hints_envelope, read_meta
from tests.sglang.conftest import PREFIXES, CpuEngine
from topasd.model import (
    Agent,
    CostHints,
    Decision,
    Location,
    RequestState,
    Stage,
    StageProgress,
    StageStatus,
    TaskView,
    Workflow,
)
from topasd.scheduler import make_policy

ROOT = Path(__file__).resolve().parents[2]
COSTS = CostHints(t_decode_s=0.02, prefill_s_per_token=1e-4, prefill_base_s=0.002,
                  kv_bytes_per_token=262_144, swap_bytes_per_s=25e9)


def meta(rid: int, agent: str = "plan", task: int | None = None, stage: str | None = None,
         prefix: int | None = None) -> WorkflowMeta:
    stages = {"plan": "plan", "code": "code", "test": "test"}
    return WorkflowMeta(request_id=rid, task_id=rid if task is None else task,
                        workflow="chain3", stage=stage or stages[agent], agent=agent, round=0,
                        prefix_tokens=len(PREFIXES[agent]) if prefix is None else prefix,
                        task_arrival=0.0, ready_at=0.0)


def dyn(rid: int, n: int = 8) -> list[int]:
    return [10_000 + 100 * rid + j for j in range(n)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def scripted(*decisions: Decision) -> Any:
    """A decider returning the given decisions in turn (then nothing)."""
    queue = list(decisions)

    def decide(snap: EngineSnapshot) -> Decision | None:
        return queue.pop(0) if queue else None

    return decide


def topas_for(decider: Any) -> PolicyExecutor:
    return PolicyExecutor(decider, clock=Clock())


def run_pass(topas: PolicyExecutor, eng: CpuEngine, running_batch: Any = None) -> Any:
    """The hooked call as SGLang 0.5.23 makes it (keyword arguments), then the
    loop's merge of its new batch; returns the new batch (or None)."""
    return eng.end_pass(topas.around_prefill(
        lambda sched, **kw: sched.prefill_pass(**kw), eng, prefill_delayer_single_pass=None,
        running_batch=eng.running_batch if running_batch is None else running_batch))


# ----------------------------------------------------------------- version


def test_sglang_version_is_the_supported_one() -> None:
    import sglang

    assert sglang.__version__ == SUPPORTED_SGLANG


# ------------------------------------------------------------------ plugin


def _run_py(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env_extra, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


PLUGIN_CHECK = """
    from sglang.srt.plugins import load_plugins, load_plugins_by_group, GENERAL_PLUGINS_GROUP
    from sglang.srt.managers.scheduler import Scheduler
    from backends.sglang import plugin
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "topasd" in found, found
    assert found["topasd"][0] is plugin.register
    original = Scheduler._get_new_batch_prefill_raw
    original_flush = Scheduler.flush_cache
    load_plugins()
    hooked = Scheduler._get_new_batch_prefill_raw
    print("HOOKED" if hooked is not original else "UNHOOKED")
    assert (Scheduler.flush_cache is original_flush) == (hooked is original)
    if hooked is not original:
        assert hooked.__wrapped__ is original
        assert Scheduler.flush_cache.__wrapped__ is original_flush
        calls = []
        class Fake:
            _topasd = None
        class T:
            def around_prefill(self, orig, sched, *a, **k):
                calls.append(orig is original)
                return "ran"
            def take_events(self):
                return []
        fake = Fake()
        fake._topasd = T()
        assert hooked(fake, prefill_delayer_single_pass=None, running_batch=None) == "ran"
        assert calls == [True]
"""


def test_plugin_loads_through_sglangs_loader_and_hooks_the_prefill_pass() -> None:
    done = _run_py(PLUGIN_CHECK, {"TOPASD_SGLANG_ENDPOINT": "ipc:///tmp/topasd-test.sock",
                                  "SGLANG_PLUGINS": "topasd"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("HOOKED")


def test_plugin_is_inert_without_the_daemon() -> None:
    env = {"SGLANG_PLUGINS": "topasd", "TOPASD_SGLANG_ENDPOINT": ""}
    done = _run_py(PLUGIN_CHECK, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("UNHOOKED")


def test_hook_target_is_the_scheduler_prefill_pass_with_sglangs_loop() -> None:
    """The hooked method walks `self.waiting_queue` through `add_one_req` and
    rebinds `self.waiting_queue` afterwards (the adapter narrows and restores it)."""
    from sglang.srt.managers.scheduler import Scheduler

    from backends.sglang.plugin import PREFILL_TARGET

    assert PREFILL_TARGET.rsplit(".", 1)[1] == "_get_new_batch_prefill_raw"
    src = inspect.getsource(Scheduler._get_new_batch_prefill_raw)
    assert "for req in self.waiting_queue:" in src
    assert "adder.add_one_req(" in src
    assert "self.waiting_queue = [x for x in self.waiting_queue if x not in can_run_set]" in src
    assert "running_batch.batch_is_full" in src


def test_scheduler_has_the_attributes_the_adapter_uses() -> None:
    from sglang.srt.managers.scheduler import Scheduler

    src = inspect.getsource(Scheduler)
    for attr in ("waiting_queue", "running_batch", "chunked_req", "tree_cache",
                 "token_to_kv_pool_allocator", "new_token_ratio_tracker",
                 "chunked_prefill_size", "max_prefill_tokens", "enable_hierarchical_cache",
                 "tp_group"):
        assert re.search(rf"self\.{attr}(: [^=]+)? =|self\.{attr},", src), attr
    params = inspect.signature(Scheduler._add_request_to_queue).parameters
    assert list(params) == ["self", "req", "is_retracted"]


def test_the_engine_reports_its_kv_pool_where_the_backend_reads_it() -> None:
    """`backends.sglang.backend.pool_tokens` reads `max_total_num_tokens` from
    the scheduler's start-up report the Engine keeps (`_scheduler_init_result`,
    the same dict `get_server_info` merges in); `get_server_info` itself runs
    the Engine's event loop, which would strand the tokenizer's reply handler."""
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.scheduler import Scheduler

    assert "self._scheduler_init_result = scheduler_init_result" in inspect.getsource(
        Engine.__init__)
    assert "self._scheduler_init_result.scheduler_infos[0]" in inspect.getsource(
        Engine.get_server_info)
    assert "self.loop.run_until_complete" in inspect.getsource(Engine.get_server_info)
    assert '"max_total_num_tokens": self.max_total_num_tokens' in inspect.getsource(
        Scheduler.get_init_info)


# ---------------------------------------------------------------- metadata


def test_kv_hints_metadata_travels_from_generate_request_to_scheduler_req() -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.kv_hints import KvHintsEnvelope
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    m = meta(41, "code")
    obj = GenerateReqInput(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4},
                           kv_hints=kv_hints_envelope(m))
    obj.normalize_batch_and_arguments()
    assert isinstance(obj.kv_hints, KvHintsEnvelope)
    wire = pickle.loads(pickle.dumps(obj.kv_hints))  # tokenizer -> scheduler is pickled IPC
    # the two hand-offs SGLang makes on the way (source pins the pass-through)
    assert "kv_hints=obj.kv_hints" in inspect.getsource(TokenizerManager)
    assert "kv_hints=recv_req.kv_hints" in inspect.getsource(Scheduler._handle_generate_request)
    eng = CpuEngine()
    req = eng.submit(m, dyn(41), 4)
    req.kv_hints = wire
    assert read_meta(req) == m


def test_custom_params_metadata_reaches_the_req() -> None:
    eng = CpuEngine()
    m = meta(5, "test")
    req = eng.submit(m, dyn(5), 4, via="custom_params")
    assert req.kv_hints is None
    assert read_meta(req) == m


def test_requests_without_metadata_are_not_topasds() -> None:
    eng = CpuEngine()
    req = eng.submit(meta(1), dyn(1), 4, via="none")
    assert read_meta(req) is None


# -------------------------------------------------------------------- view


def test_view_matches_sglang_state() -> None:
    eng = CpuEngine(kv_size=512)
    reqs = [eng.submit(meta(i, "plan"), dyn(i), 16) for i in range(3)]
    eng.submit(meta(3, "code"), dyn(3, 10), 12)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0, 1, 2))))
    run_pass(topas, eng)
    for _ in range(3):
        eng.decode_step()
    snap = topas.snapshot(eng)
    assert [r.id for r in snap.running] == [0, 1, 2]
    assert [r.id for r in snap.waiting] == [3]
    for r, req in zip(snap.running, reqs, strict=True):
        assert r.state is RequestState.RUNNING
        assert r.generated == len(req.output_ids) == 4
        assert r.input_tokens == len(req.origin_input_ids) - 40 == 8
        assert r.output_tokens == 16 and r.prefix_tokens == 40 and r.agent == "plan"
    assert snap.waiting[0].input_tokens == 10 and snap.waiting[0].generated == 0
    assert snap.budget_tokens == eng.token_to_kv_pool_allocator.size == 512
    assert snap.new_token_ratio == pytest.approx(0.7)
    assert snap.max_prefill_tokens == 16384 and snap.chunk_tokens == 8192
    assert snap.prefixes["plan"].location is Location.GPU and snap.prefixes["plan"].tokens == 40
    assert snap.prefixes["code"].location is Location.NONE
    # KV the view implies equals what the allocator handed out: the prefix once,
    # each request's input and generated tokens but the newest (not yet written)
    used = 40 + sum(r.input_tokens + r.generated - 1 for r in snap.running)
    assert used == 512 - eng.token_to_kv_pool_allocator.available_size()


# --------------------------------------------------------------- admission


def test_decision_sets_admission_order_through_the_prefill_adder() -> None:
    eng = CpuEngine()
    for i in range(4):
        eng.submit(meta(i, "plan"), dyn(i), 8)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(2, 0))))
    batch = run_pass(topas, eng)
    assert [r.rid for r in batch.reqs] == ["rid-2", "rid-0"]
    assert eng.waiting_rids() == ["rid-1", "rid-3"]  # held back, arrival order kept
    assert eng.running_rids() == ["rid-2", "rid-0"]
    assert topas.plan == []


def test_admission_beyond_the_prefill_budget_waits_for_the_next_round() -> None:
    eng = CpuEngine(max_prefill_tokens=48)  # one 48-token prefill per round
    for i in range(3):
        eng.submit(meta(i, "plan"), dyn(i), 8)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(1, 2, 0))))
    run_pass(topas, eng)
    assert eng.passes == [["rid-1"]]
    assert topas.plan == [2, 0]
    run_pass(topas, eng)  # no new decision: the plan goes on
    # the shared 40-token prefix is cached now: both 8-token extends fit in 48
    assert eng.passes == [["rid-1"], ["rid-2", "rid-0"]]
    assert topas.plan == [] and topas.decisions == 1


def test_no_admission_without_a_decision_to_admit() -> None:
    eng = CpuEngine()
    eng.submit(meta(0), dyn(0), 8)
    topas = topas_for(scripted(Decision(0.0, "t")))
    assert run_pass(topas, eng) is None
    assert eng.waiting_rids() == ["rid-0"]


def test_untracked_requests_follow_the_plan() -> None:
    eng = CpuEngine()
    eng.submit(meta(0), dyn(0), 8, via="none")
    eng.submit(meta(1), dyn(1), 8)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(1,))))
    batch = run_pass(topas, eng)
    assert [r.rid for r in batch.reqs] == ["rid-1", "rid-0"]


def test_sglang_refuses_an_admission_beyond_its_kv_accounting() -> None:
    eng = CpuEngine(kv_size=128)
    eng.submit(meta(0), dyn(0, 8), 100)  # 48 + 100 > 128: PrefillAdder says NO_TOKEN
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0,))))
    assert run_pass(topas, eng) is None
    assert eng.waiting_rids() == ["rid-0"] and topas.plan == [0]


# -------------------------------------------------------------- preemption


def test_preemption_goes_through_sglangs_retract_path() -> None:
    eng = CpuEngine()
    reqs = [eng.submit(meta(i, "plan"), dyn(i), 32) for i in range(3)]
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0, 1, 2)),
                               Decision(0.0, "t", preempt=(1,))))
    run_pass(topas, eng)
    for _ in range(5):
        eng.decode_step()
    free_before = eng.token_to_kv_pool_allocator.available_size()
    eng.submit(meta(9, "code"), dyn(9), 4)  # an arrival: decide again
    run_pass(topas, eng)
    victim = reqs[1]
    assert eng.running_rids() == ["rid-0", "rid-2"]
    assert victim.is_retracted and victim.rid in eng.waiting_rids()
    assert len(victim.output_ids) == 6  # generated tokens kept, to be re-prefilled
    freed = eng.token_to_kv_pool_allocator.available_size() + eng.tree_cache.evictable_size()
    assert freed - free_before >= 6 + 5  # its decode KV is free (input may stay cached)
    snap = topas.snapshot(eng)
    back = next(r for r in snap.waiting if r.id == 1)
    assert back.generated == 6 and back.preemptions == 1
    # re-admission recomputes input + generated tokens beyond the cached prefix
    topas.plan = [1]
    batch = run_pass(topas, eng)
    assert [r.rid for r in batch.reqs] == ["rid-1"]
    assert victim.extend_len + victim.prefix_len == 48 + 6


def test_the_view_and_preemption_use_the_passes_running_batch() -> None:
    """SGLang merges the last prefill batch into the running batch it passes
    to the hooked method and stores it in `sched.running_batch` only after
    the pass: the running requests are the argument's, not the attribute's."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    eng = CpuEngine()
    for i in range(2):
        eng.submit(meta(i, "plan"), dyn(i), 32)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0, 1)),
                               Decision(0.0, "t", preempt=(0,))))
    run_pass(topas, eng)
    merged = eng.running_batch  # the pass's batch ...
    eng.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)  # ... not yet stored
    eng.submit(meta(9, "code"), dyn(9), 4)  # an arrival: decide again
    seen: list[Any] = []
    topas.decider = lambda snap: seen.append(snap) or Decision(0.0, "t", preempt=(0,))
    topas._key = None
    run_pass(topas, eng, running_batch=merged)
    assert sorted(r.id for r in seen[0].running) == [0, 1]
    assert [r.rid for r in merged.reqs] == ["rid-1"]  # preempted from the pass's batch
    assert "rid-0" in eng.waiting_rids()


def test_a_pass_without_an_answer_asks_again_at_the_next_pass() -> None:
    """No decision (the daemon did not answer in time) must not stall the
    engine: the same state is decided again at the next prefill pass."""
    eng = CpuEngine()
    eng.submit(meta(0), dyn(0), 8)
    answers: list[Decision | None] = [None, Decision(0.0, "t", admit=(0,))]
    asked: list[int] = []

    def decide(snap: EngineSnapshot) -> Decision | None:
        asked.append(snap.seq)
        return answers.pop(0) if answers else None

    topas = topas_for(decide)
    assert run_pass(topas, eng) is None  # no answer: nothing admitted
    batch = run_pass(topas, eng)
    assert len(asked) == 2 and [r.rid for r in batch.reqs] == ["rid-0"]


def test_an_admitting_pass_needs_no_second_decision() -> None:
    """SGLang returns a pass's new batch beside the running batch and merges
    them at the next pass: the state keyed after the pass counts the new
    batch as running, so the next pass, with nothing changed, asks nothing."""
    eng = CpuEngine()
    for i in range(2):
        eng.submit(meta(i, "plan"), dyn(i), 8)
    asked: list[int] = []

    def decide(snap: EngineSnapshot) -> Decision:
        asked.append(snap.seq)
        return Decision(0.0, "t", admit=tuple(r.id for r in snap.waiting))

    topas = topas_for(decide)
    batch = run_pass(topas, eng)
    assert [r.rid for r in batch.reqs] == ["rid-0", "rid-1"]
    views = topas._seq
    for _ in range(3):
        eng.decode_step()
        assert run_pass(topas, eng) is None
    assert len(asked) == 1
    assert topas._seq == views  # a pass that decides nothing builds no view (no tree walks)
    eng.submit(meta(2, "plan"), dyn(2), 8)  # an arrival changes the state
    run_pass(topas, eng)
    assert len(asked) == 2 and eng.running_rids() == ["rid-0", "rid-1", "rid-2"]


def test_a_plan_sglang_refuses_with_nothing_running_is_decided_again() -> None:
    """A decision SGLang's admission check turns down while nothing runs would
    leave the state unchanged for ever. The adapter decides again after 1, 2,
    4, ... passes, and from the third refusal in a row releases its pins, so
    SGLang's LRU makes the room the decision needed."""
    eng = CpuEngine(kv_size=256)
    topas = topas_for(scripted())
    _cached_idle_prefix(eng, topas, "plan", 0)
    eng.submit(meta(1, "plan"), dyn(1), 4)
    topas.apply(eng, Decision(0.0, "t", load=("plan",), admit=(1,)))  # `plan` resident
    run_pass(topas, eng)
    finished = eng.running_batch.reqs[0]
    from sglang.srt.mem_cache.common import release_kv_cache

    finished.finished_reason = object()
    release_kv_cache(finished, eng.tree_cache, checkpoint=True)
    eng.running_batch.filter_batch(keep_indices=[])
    assert "plan" in topas.pins
    # request 2 fits the pool only without the pinned prefix: 32 + 24 + 180 > 256 - 40
    eng.submit(meta(2, "code"), dyn(2, 24), 180)
    asked: list[int] = []

    def decide(snap: EngineSnapshot) -> Decision:  # a decision blind to the pin's room
        asked.append(topas._passes)
        return Decision(0.0, "t", load=("code",), admit=(2,))

    topas.decider = decide
    passes = 0
    while not eng.running_rids():
        passes += 1
        assert passes < 40, f"request 2 never admitted (asked at passes {asked})"
        run_pass(topas, eng)
    assert eng.running_rids() == ["rid-2"] and "plan" not in topas.pins
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert len(asked) >= 3 and gaps == sorted(gaps) and max(gaps) >= 2  # backing off


def test_preempting_an_unknown_request_is_reported_not_done() -> None:
    eng = CpuEngine()
    eng.submit(meta(0), dyn(0), 8)
    topas = topas_for(scripted())
    report = topas.apply(eng, Decision(0.0, "t", preempt=(0, 77)))
    assert report.preempted == [] and len(report.skipped) == 2
    assert eng.waiting_rids() == ["rid-0"]


def test_records_of_requests_sglang_dropped_are_forgotten(monkeypatch: Any) -> None:
    """A long-running engine: per-request records stay bounded. Requests that
    left SGLang (here aborted while waiting) are forgotten once the records
    outgrow the limit; a request still held keeps its queue time and counts."""
    import backends.sglang.adapter as adapter

    monkeypatch.setattr(adapter, "FORGET_AT", 3)
    eng = CpuEngine()
    for i in range(6):
        eng.submit(meta(i), dyn(i), 8)
    topas = topas_for(scripted())
    first = topas.snapshot(eng)  # 6 records, but 6 requests present: nothing to forget
    assert sorted(topas.first_seen) == list(range(6))
    topas.preemptions[5] = 2  # as if retracted twice before
    eng.waiting_queue = eng.waiting_queue[4:]  # 0-3 aborted
    snap = topas.snapshot(eng)
    assert sorted(topas.first_seen) == [4, 5] and topas.preemptions == {5: 2}
    assert [r.queued_at for r in snap.waiting] == [r.queued_at for r in first.waiting[4:]]
    assert snap.waiting[1].preemptions == 2


def test_a_retraction_by_sglang_is_reported() -> None:
    """SGLang's own decode-time retraction (`retract_decode`: release_req, then
    back to the queue) puts an admitted request back in the waiting queue:
    the view reports it as a RETRACT event and counts it."""
    from topasd.model import EventKind

    eng = CpuEngine()
    for i in range(2):
        eng.submit(meta(i), dyn(i), 8)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0, 1))))
    run_pass(topas, eng)
    eng.decode_step()
    topas.take_events()
    batch = eng.running_batch
    victim = batch.reqs[1]
    batch.release_req(1, 1)  # what retract_decode does with its victim
    batch.filter_batch(keep_indices=[0])
    eng._add_request_to_queue(victim, is_retracted=True)
    snap = topas.snapshot(eng)
    assert [r.id for r in snap.waiting] == [1] and snap.waiting[0].preemptions == 1
    events = [(e.kind, e.request_id, e.note) for e in topas.take_events()]
    assert events == [(EventKind.RETRACT, 1, "sglang")]
    topas.snapshot(eng)
    assert topas.take_events() == []  # reported once


def test_a_request_sglang_is_finishing_or_aborting_is_not_preempted() -> None:
    """SGLang's retract path skips requests it is ending (an abort sets
    `to_finish`): preempting one would put an aborted request back in the
    queue, so the adapter skips it and reports why."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    eng = CpuEngine()
    for i in range(2):
        eng.submit(meta(i), dyn(i), 8)
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0, 1))))
    run_pass(topas, eng)
    eng.running_batch.reqs[0].to_finish = FINISH_ABORT("client gone")
    report = topas.apply(eng, Decision(0.0, "t", preempt=(0, 1)))
    assert report.preempted == [1]
    assert report.skipped == ["preempt 0: finishing, aborted or in a beam group (SGLang's "
                              "retract path skips it)"]
    assert eng.running_rids() == ["rid-0"] and eng.waiting_rids() == ["rid-1"]


def test_malformed_metadata_leaves_the_request_to_sglang() -> None:
    """A request whose topasd metadata is malformed must not take the
    scheduler down: it is served as untracked, after the plan."""
    eng = CpuEngine()
    eng.submit(meta(0), dyn(0), 8)
    bad = eng.submit(meta(1), dyn(1), 8, via="custom_params")
    bad.sampling_params.custom_params["topasd"] = {"request_id": "x"}
    assert read_meta(bad) is None
    topas = topas_for(scripted(Decision(0.0, "t", admit=(0,))))
    batch = run_pass(topas, eng)
    assert [r.rid for r in batch.reqs] == ["rid-0", "rid-1"]


# ----------------------------------------------------------------- prefixes


def _cached_idle_prefix(eng: CpuEngine, topas: PolicyExecutor, agent: str, rid: int) -> None:
    """Run one request of `agent` to completion so its prefix stays cached, idle."""
    from sglang.srt.mem_cache.common import release_kv_cache

    eng.submit(meta(rid, agent), dyn(rid), 2)
    topas.plan = [rid]
    run_pass(topas, eng)
    req = eng.running_batch.reqs[-1]
    req.finished_reason = object()
    release_kv_cache(req, eng.tree_cache, checkpoint=True)
    eng.running_batch.filter_batch(keep_indices=[])


def test_kept_prefix_is_pinned_against_lru_eviction_and_evict_releases_it() -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    eng = CpuEngine()
    topas = topas_for(scripted())
    _cached_idle_prefix(eng, topas, "plan", 0)
    _cached_idle_prefix(eng, topas, "code", 1)
    assert topas.snapshot(eng).prefixes["plan"].location is Location.GPU
    # TOPAS keeps `plan` resident (admits nothing now): it is pinned
    eng.submit(meta(2, "plan"), dyn(2), 4)
    topas.apply(eng, Decision(0.0, "t", load=("plan",), admit=(2,)))
    assert "plan" in topas.pins
    topas.plan = []
    eng.tree_cache.evict(EvictParams(num_tokens=10_000))
    snap = topas.snapshot(eng)
    assert snap.prefixes["plan"].location is Location.GPU  # survived SGLang's LRU
    assert snap.prefixes["code"].location is Location.NONE  # unpinned: reclaimed
    # evict: unpinned; SGLang's LRU reclaims it; the view shows it gone at once
    topas.apply(eng, Decision(0.0, "t", evict=("plan",)))
    assert "plan" not in topas.pins
    assert topas.snapshot(eng).prefixes["plan"].location is Location.NONE
    eng.tree_cache.evict(EvictParams(num_tokens=10_000))
    assert eng.tree_cache.tree_core.match_full_device_prefix(
        _key(PREFIXES["plan"]))[0] == 0


def test_a_cache_flush_releases_the_pins_first_and_pins_again_once_cached() -> None:
    """SGLang's flush_cache resets the radix tree beneath the adapter's locks;
    releasing a lock of the old tree afterwards raised (KeyError) in the
    scheduler. The plugin's flush hook releases them first, and the prefix
    is pinned again once a request computes it."""
    from backends.sglang.plugin import ATTR, flush_hook

    eng = CpuEngine()
    topas = topas_for(scripted())
    _cached_idle_prefix(eng, topas, "plan", 0)
    eng.submit(meta(1, "plan"), dyn(1), 4)
    topas.apply(eng, Decision(0.0, "t", load=("plan",), admit=(1,)))
    assert "plan" in topas.pins
    setattr(eng, ATTR, topas)

    def flush(sched: CpuEngine) -> bool:  # Scheduler.flush_cache when idle
        sched.tree_cache.reset()
        sched.token_to_kv_pool_allocator.clear()
        return True

    assert flush_hook(flush, eng) is True
    assert topas.pins == {} and "plan" in topas.want
    assert eng.tree_cache.protected_size() == 0
    topas.release_all(eng)  # what shutdown does: nothing stale left to unlock
    topas.want = {"plan"}
    topas.plan = [1]
    run_pass(topas, eng)  # request 1 computes the prefix again ...
    run_pass(topas, eng)  # ... and the next pass pins it
    assert "plan" in topas.pins
    from sglang.srt.mem_cache.common import release_kv_cache

    req = eng.running_batch.reqs[0]  # request 1 finishes: only the pin holds KV
    req.finished_reason = object()
    release_kv_cache(req, eng.tree_cache, checkpoint=True)
    eng.running_batch.filter_batch(keep_indices=[])
    assert eng.tree_cache.protected_size() == len(PREFIXES["plan"])


def _key(ids: list[int]) -> Any:
    from array import array

    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", ids))


def test_a_loaded_prefix_is_pinned_once_cached_even_after_its_request_finished() -> None:
    """The load's prefix is computed by its request's prefill, so it cannot be
    pinned at decision time; it is pinned at the next pass, even when that
    request has finished by then, and no LRU eviction takes it afterwards."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.common import release_kv_cache

    eng = CpuEngine()
    eng.submit(meta(0, "plan"), dyn(0, 200), 2)  # its own 200 tokens follow the prefix
    topas = topas_for(scripted(Decision(0.0, "t", load=("plan",), admit=(0,)),
                               Decision(0.0, "t")))
    run_pass(topas, eng)
    assert "plan" not in topas.pins  # computing: nothing to pin yet
    req = eng.running_batch.reqs[0]
    req.finished_reason = object()  # request 0 finishes
    release_kv_cache(req, eng.tree_cache, checkpoint=True)
    eng.running_batch.filter_batch(keep_indices=[])
    eng.submit(meta(1, "code"), dyn(1), 2)  # an arrival; the decision keeps `plan`
    run_pass(topas, eng)
    assert "plan" in topas.pins
    # the pin holds the prefix's 40 tokens, not request 0's cached 200 behind them
    assert eng.tree_cache.protected_size() == len(PREFIXES["plan"])
    eng.tree_cache.evict(EvictParams(num_tokens=10_000))  # SGLang's LRU, needing room
    assert topas.snapshot(eng).prefixes["plan"].location is Location.GPU
    assert eng.tree_cache.protected_size() == len(PREFIXES["plan"])


def test_admitting_onto_a_cached_prefix_reuses_it() -> None:
    eng = CpuEngine()
    topas = topas_for(scripted())
    _cached_idle_prefix(eng, topas, "plan", 0)
    eng.submit(meta(1, "plan"), dyn(1), 4)
    topas.plan = [1]
    batch = run_pass(topas, eng)
    assert batch.reqs[0].prefix_len >= 40  # prefix KV reused, not recomputed


# ---------------------------------------------------------- rank determinism


def _scenario(eng: CpuEngine) -> None:
    for i in range(4):
        eng.submit(meta(i, "plan", task=i), dyn(i), 24)
    for i in range(4, 7):
        eng.submit(meta(i, "code", task=i - 4, stage="code"), dyn(i), 16)


def chain3() -> Workflow:
    """plan -> code -> test, one agent each (prefixes as in PREFIXES)."""
    agents = {a: Agent(a, len(ids)) for a, ids in PREFIXES.items()}
    stages = {"plan": Stage("plan", "plan"), "code": Stage("code", "code", after=("plan",)),
              "test": Stage("test", "test", after=("code",))}
    return Workflow("chain3", agents, stages)


def _topas_decider(clock: Clock) -> LocalDecider:
    wf = chain3()
    tasks = {i: TaskView(i, wf.name, 0.0, {v: StageProgress(StageStatus.ACTIVE)
                                           for v in wf.topo_order}) for i in range(10)}
    return LocalDecider(make_policy("topas"), {wf.name: wf}, COSTS, lambda: tasks, clock)


def test_two_adapters_on_the_same_sglang_state_decide_and_act_alike() -> None:
    """Two ranks: same SGLang state and clock -> same views, same TOPAS decisions,
    same resulting SGLang state (queue order, running batch, free KV)."""
    outcomes = []
    for _ in range(2):
        eng, clock = CpuEngine(kv_size=256), Clock()
        decider = _topas_decider(clock)
        topas = PolicyExecutor(decider, clock=clock)
        _scenario(eng)
        trace = []
        for step in range(6):
            run_pass(topas, eng)
            eng.decode_step()
            if step == 2:
                eng.submit(meta(9, "test", task=9, stage="test"), dyn(9), 8)
            trace.append((eng.waiting_rids(), eng.running_rids(),
                          eng.token_to_kv_pool_allocator.available_size()))
        outcomes.append((trace, [(d.admit, d.preempt, d.load, d.evict) for d in decider.log],
                         topas.snapshot(eng).waiting, topas.snapshot(eng).running))
    assert outcomes[0][1], "TOPAS made no decision"
    assert any(d[0] for d in outcomes[0][1]), "TOPAS admitted nothing"
    assert outcomes[0] == outcomes[1]


RANK_CHILD = """
    import os, sys, pickle
    import torch.distributed as dist
    sys.path.insert(0, {root!r})
    from tests.sglang.conftest import CpuEngine
    from tests.sglang import test_contract as tc
    from backends.sglang.adapter import RankSync, PolicyExecutor
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                            rank=rank, world_size=2)
    group = dist.new_group([0, 1], backend="gloo")
    sync = RankSync(rank, [0, 1], group)
    eng, clock = CpuEngine(kv_size=256), tc.Clock()
    decider = tc._topas_decider(clock) if rank == 0 else None
    topas = PolicyExecutor(decider, clock=clock, sync=sync)
    tc._scenario(eng)
    for _ in range(5):
        eng.end_pass(topas.around_prefill(lambda s: s.prefill_pass(), eng))
        eng.decode_step()
    out = (eng.waiting_rids(), eng.running_rids(),
           eng.token_to_kv_pool_allocator.available_size(), topas.decisions)
    sys.stdout.write(repr(out))
    dist.destroy_process_group()
"""


def test_followers_apply_the_leaders_decision_over_sglangs_broadcast() -> None:
    """Two gloo ranks: only rank 0 has a policy; rank 1 gets each decision through
    SGLang's broadcast_pyobj and ends in the same state."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    code = textwrap.dedent(RANK_CHILD.format(root=str(ROOT)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), port], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [o.strip().splitlines()[-1] for o, _ in outs]
    assert results[0] == results[1]
    assert eval(results[0])[3] > 0  # decisions were made


# ------------------------------------------------- the dashboard's state


def _snap(rids: list[int], agent_places: dict[str, Location], budget: int = 100,
          seq: int = 1) -> EngineSnapshot:
    from topasd.model import PrefixState, Request

    reqs = tuple(Request(id=r, task_id=r, workflow="chain3", stage="plan", agent="plan",
                         round=0, input_tokens=8, output_tokens=4, ready_at=0.0,
                         task_arrival=0.0, queued_at=5.0) for r in rids)
    return EngineSnapshot(budget, 0.7, {a: PrefixState(a, 40, loc, last_used=5.0)
                                        for a, loc in agent_places.items()},
                          (), reqs, False, 8192, 16384,
                          (frozenset(rids), frozenset()), seq)


def test_the_dashboard_merges_every_replicas_last_snapshot() -> None:
    from backends.sglang.adapter import merge_snapshots

    empty = merge_snapshots([], 300)
    assert (empty.budget_tokens, empty.waiting, empty.prefixes) == (300, (), {})
    a = _snap([1, 2], {"plan": Location.NONE, "code": Location.GPU}, seq=4)
    b = _snap([3], {"plan": Location.GPU}, budget=120, seq=2)
    assert merge_snapshots([a], 300) is a
    both = merge_snapshots([a, b], 300)
    assert [r.id for r in both.waiting] == [1, 2, 3]
    assert both.budget_tokens == 220 and both.seq == 4
    assert {k: p.location for k, p in both.prefixes.items()} == {
        "plan": Location.GPU, "code": Location.GPU}  # the best place any replica holds it
    assert both.key[0] == frozenset({1, 2, 3})


def test_a_snapshot_moves_onto_a_later_starting_clock() -> None:
    snap = _snap([1], {"plan": Location.GPU})
    moved = snap.rebased(2.0)
    assert moved.waiting[0].queued_at == 3.0 and moved.prefixes["plan"].last_used == 3.0
    assert moved.waiting[0].ready_at == 0.0  # the daemon's own times stay
    assert snap.rebased(0.0) == snap
