"""The one fold of the event stream (topasd/lifecycle.py): its rules, and the
readers built on it agreeing about a real run."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from backends.sim.engine import SimBackend
from store import Store
from store import queries as q
from topasd.daemon.metrics import Metrics
from topasd.lifecycle import (
    RUNNING,
    WAITING,
    PrefixPhase,
    prefix_after,
    request_phase,
    stage_after,
)
from topasd.model import (
    KEPT_NOTE,
    EngineEvent,
    EventKind,
    Location,
    StageProgress,
    StageStatus,
)
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import generate_trace

K = EventKind


def test_a_request_enters_on_ready_and_leaves_on_finish_or_withdraw() -> None:
    assert request_phase(None, K.REQUEST_ADMIT) is None  # never seen: stays out
    phase = request_phase(None, K.REQUEST_READY)
    assert phase == WAITING
    for kind, after in ((K.REQUEST_ADMIT, RUNNING), (K.REQUEST_START, RUNNING),
                        (K.RETRACT, WAITING), ("request_admit", RUNNING),
                        (K.PREEMPT, WAITING), (K.REQUEST_ADMIT, RUNNING)):
        phase = request_phase(phase, kind)
        assert phase == after, kind
    assert request_phase(phase, K.REQUEST_FINISH) is None
    assert request_phase(WAITING, "request_withdraw") is None  # by value, as the log has it


def test_a_prefix_moves_as_the_engine_reports() -> None:
    p = prefix_after(None, 1.0, K.PREFIX_LOAD_START, 100, 0.5)
    assert (p.location, p.ready, p.transfer, p.since, p.until) == (Location.GPU, False,
                                                                   "load", 1.0, 1.5)
    p = prefix_after(p, 1.5, K.PREFIX_LOAD_END)
    assert p.ready and p.transfer is None and p.tokens == 100
    p = prefix_after(p, 2.0, K.PREFIX_OFFLOAD_START, value=0.25)
    p = prefix_after(p, 2.1, K.PREFIX_EVICT)  # a backup outlives the eviction
    assert (p.location, p.transfer, p.ready) == (Location.HOST, "offload", False)
    p = prefix_after(p, 2.25, K.PREFIX_OFFLOAD_END)
    assert p.host_copy and p.transfer is None
    p = prefix_after(p, 3.0, K.PREFIX_COMPUTE_START)
    assert prefix_after(p, 3.1, K.PREFIX_LOAD_END).transfer == "compute"  # another's end
    gone = prefix_after(p, 3.2, K.PREFIX_EVICT)  # a recompute is cancelled with it
    assert gone.transfer is None and gone.location is Location.HOST  # its host copy stays
    kept = prefix_after(PrefixPhase(50, Location.HOST, host_copy=True), 4.0,
                        K.PREFIX_LOAD_START, note=KEPT_NOTE)
    assert kept.location is Location.GPU and not kept.host_copy  # the kept copy taken back
    assert prefix_after(PrefixPhase(50, Location.HOST, host_copy=True), 5.0,
                        K.PREFIX_DROP).location is Location.NONE


def test_a_stage_is_active_from_its_first_ready_and_sums_its_service() -> None:
    s = stage_after(StageProgress(), K.REQUEST_READY, 2.0)
    s = stage_after(s, K.REQUEST_READY, 3.0)
    s = stage_after(stage_after(s, K.REQUEST_FINISH, 4.0, 0.75), K.REQUEST_FINISH, 5.0, 0.5)
    assert (s.status, s.started_at, s.service_s, s.rounds_done) == (StageStatus.ACTIVE, 2.0,
                                                                    1.25, 2)
    done = stage_after(s, K.STAGE_FINISH, 6.0)
    assert (done.status, done.finished_at, done.service_s) == (StageStatus.DONE, 6.0, 1.25)


def test_the_daemons_metrics_and_the_logs_replay_agree_on_a_run(tmp_path: Path) -> None:
    """The same fold behind both: at every point between events, the daemon's
    queues and resident prefixes equal what the replay of the log rebuilds."""
    wl = load_workload("dag4")
    trace = generate_trace(wl.workflows, max(wl.operating_points), 25, 3)
    with Store(tmp_path / "run.db") as store:
        sink = store.sink("none")
        Run(trace, make_policy("topas"), SimBackend(get_profile("qwen2.5-32b-a100")),
            sink=sink).execute()
        rows = store.db.execute(
            "SELECT t, kind, request_id, task_id, agent, stage, tokens, value, note "
            "FROM engine_events WHERE run_id = ? ORDER BY id", [sink.run_id]).fetchall()
        replay = q.RunReplay(store.db, sink.run_id)
        metrics, checked = Metrics(), 0
        # the earliest time at or after each row: a task's arrival is logged when
        # it comes, its entry request's readiness when the engine's step ends, so
        # a second arrival within that step is logged before the first's ready
        later = [math.inf] * (len(rows) + 1)
        for i in range(len(rows) - 1, -1, -1):
            later[i] = min(rows[i][0], later[i + 1])
        for i, (t, kind, *rest) in enumerate(rows):
            metrics.event(EngineEvent(t, EventKind(kind), *rest))
            if later[i + 1] <= t:
                continue  # the replay applies every event up to t together
            state = replay.state_at(t)
            running = Counter(r.agent for r in state.running)
            waiting = Counter(r.agent for r in state.waiting)
            assert {a: n for a, n in metrics.running.items() if n} == dict(running), t
            assert {a: n for a, n in metrics.waiting.items() if n} == dict(waiting), t
            on_gpu = {p.agent for p in state.prefixes if p.location == "gpu"}
            assert {a for a, n in metrics.on_gpu.items() if n} == on_gpu, t
            moving = {p.agent: (p.transfer, p.transfer_until) for p in state.prefixes
                      if p.transfer}
            assert {a: (m.kind, m.until) for a, m in metrics.transfers.items()} == moving, t
            checked += 1
    kinds = Counter(r[1] for r in rows)  # the run moved prefixes both ways and preempted
    assert checked > 100 and kinds["prefix_load_start"] and kinds["prefix_offload_start"]
    assert kinds["prefix_evict"] and kinds["preempt"] + kinds["retract"]
