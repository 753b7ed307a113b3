"""End to end through a real vLLM engine on this CPU (the tiny dummy-weight model).

A Chain-3 trace of five tasks whose 512-token agent prefixes do not fit two at
a time in a 1,024-token KV pool runs under TOPAS and under FCFS, each decision
carried out inside vLLM's scheduler. The runs use the profile clock (each
step's modelled time), so every run makes the same decisions; the engine
itself does all the work. Skipped only where vLLM is not installed
(`pip install -e '.[dev,vllm]'`; CI installs it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from backends.vllm import available

if not available():  # a developer machine without the extra
    pytest.skip("vLLM is not installed (pip install -e '.[dev,vllm]')", allow_module_level=True)

from click.testing import CliRunner

from backends.sim.engine import SimBackend
from backends.vllm import make_backend, write_tiny_model
from backends.vllm.backend import VllmBackend
from backends.vllm.sizing import cpu_profile
from backends.vllm.workload import DEFAULT_BUDGET, chain3_cpu
from store import Store
from tests.daemonkit import rows as store_rows
from tests.simkit import RecordingSink
from topasd.cli import main
from topasd.model import Decision, EventKind, Location, Request
from topasd.profiles import HardwareProfile
from topasd.runner import Run, RunResult
from topasd.scheduler import make_policy
from workflows.trace import Trace, save_trace

POLICIES = ("topas", "fcfs")


@dataclass
class Outcome:
    backend: VllmBackend
    result: RunResult
    run_id: int


@dataclass
class Runs:
    trace: Trace
    db: Path
    model: Path
    profile: HardwareProfile
    by_policy: dict[str, Outcome]


def _trace() -> Trace:
    # a trace whose decisions include a preemption under TOPAS (its tandem does
    # not fire here) and FCFS's simple order
    return chain3_cpu(tasks=5, rate=10.0, seed=8, input_tokens=64, output_tokens=64)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("vllm")
    model = write_tiny_model(tmp / "tiny")
    trace = _trace()
    # fixed step costs: the profile clock makes the runs deterministic
    profile = cpu_profile(DEFAULT_BUDGET, 512).with_overrides(
        t_lin_per_token_s=5e-6, t_attn_per_pair_s=1e-9, t_kv_read_per_token_s=1e-8,
        t_overhead_s=0.002)
    store = Store(tmp / "runs.db")
    out: dict[str, Outcome] = {}
    try:
        for name in POLICIES:
            backend = make_backend(str(model), budget_tokens=DEFAULT_BUDGET, profile=profile,
                                   clock="profile", audit=True, record=True)
            sink = store.sink("all")
            try:
                result = Run(trace, make_policy(name), backend, sink=sink).execute()
            finally:
                backend.close()
            out[name] = Outcome(backend, result, sink.run_id)
    finally:
        store.close()
    yield Runs(trace, tmp / "runs.db", model, profile, out)


def _expected_outputs(trace: Trace) -> list[int]:
    return sorted(r.output_tokens for t in trace.tasks for rs in t.stages.values() for r in rs)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_task_completes_with_the_traces_exact_output_lengths(runs: Runs,
                                                                   policy: str) -> None:
    o = runs.by_policy[policy]
    assert sorted(o.result.jct) == [t.id for t in runs.trace.tasks]
    assert o.result.requests_finished == len(_expected_outputs(runs.trace))
    # what vLLM returned, request by request, against what the trace asked for
    assert sorted(o.backend.finished_tokens.values()) == _expected_outputs(runs.trace)
    rows = store_rows(runs.db, "SELECT output_tokens, finished FROM requests WHERE run_id = ?",
                 o.run_id)
    assert sorted(r["output_tokens"] for r in rows) == _expected_outputs(runs.trace)
    assert all(r["finished"] is not None for r in rows)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_store_holds_the_decisions_and_engine_events(runs: Runs, policy: str) -> None:
    o = runs.by_policy[policy]
    run = store_rows(runs.db, "SELECT * FROM runs WHERE id = ?", o.run_id)[0]
    assert (run["policy"], run["backend"], run["status"]) == (policy, "vllm", "done")
    assert json.loads(run["params"])["backend"]["model"] == str(runs.model)
    assert run["decisions"] == o.result.decisions > 0
    kinds = {r["kind"]: r["n"] for r in store_rows(
        runs.db, "SELECT kind, count(*) AS n FROM engine_events WHERE run_id = ? GROUP BY kind",
        o.run_id)}
    n_req = len(_expected_outputs(runs.trace))
    for kind in ("request_ready", "request_finish"):
        assert kinds[kind] == n_req
    assert kinds["request_admit"] == kinds["request_start"] == n_req + kinds.get("preempt", 0)
    assert kinds["task_finish"] == len(runs.trace.tasks)
    assert kinds["prefix_compute_start"] == kinds["prefix_compute_end"] >= 3
    assert "retract" not in kinds  # block-exact accounting: vLLM never ran out of KV


def _decisions(db: Path, run_id: int) -> list[dict[str, Any]]:
    rows = store_rows(db, "SELECT seq, t, noop, admit, preempt, load, evict, chosen_resident "
                     "FROM decisions WHERE run_id = ? ORDER BY seq", run_id)
    out = []
    for r in rows:
        d = dict(r)
        for k in ("admit", "preempt", "load", "evict", "chosen_resident"):
            d[k] = json.loads(d[k]) if d[k] else []
        out.append(d)
    return out


def test_topas_preempted_and_vllm_carried_out_exactly_those_preemptions(runs: Runs) -> None:
    o = runs.by_policy["topas"]
    decisions = _decisions(runs.db, o.run_id)
    logged = sorted(rid for d in decisions for rid in d["preempt"])
    assert logged, "this trace makes TOPAS preempt (deterministic under the profile clock)"
    events = store_rows(runs.db, "SELECT t, request_id FROM engine_events WHERE run_id = ? AND "
                            "kind = 'preempt' ORDER BY id", o.run_id)
    assert sorted(e["request_id"] for e in events) == logged
    by_t = {d["t"]: set(d["preempt"]) for d in decisions if d["preempt"]}
    assert all(e["request_id"] in by_t[e["t"]] for e in events)
    # engine side: vLLM's scheduler preempted exactly these, in the step right
    # after each decision, and never preempted anything on its own
    audit = o.backend.audit
    assert sorted(rid for row in audit for rid in row.preempted) == logged
    assert not any(row.engine_preempted for row in audit)
    for row in audit:
        asked = {rid for d in decisions if d["seq"] in row.decisions for rid in d["preempt"]}
        assert set(row.preempted) == asked


@pytest.mark.parametrize("policy", POLICIES)
def test_the_logged_residency_is_what_vllm_holds(runs: Runs, policy: str) -> None:
    o = runs.by_policy[policy]
    decisions = {d["seq"]: d for d in _decisions(runs.db, o.run_id)}
    resident: set[str] = set()
    after: dict[int, frozenset[str]] = {}  # the log's resident set after each decision
    for seq in sorted(decisions):
        d = decisions[seq]
        resident = (resident - set(d["evict"])) | set(d["load"])
        after[seq] = frozenset(resident)
        if policy == "topas":  # the chosen state's prefixes, and idle ones kept (keep_idle)
            assert set(d["chosen_resident"]) <= resident
    for row in o.backend.audit:
        # pinned in vLLM's block pool <=> resident and computed in the log's state,
        # or evicted and kept (its blocks stay pinned until their room is needed)
        assert row.pinned == row.book_ready | row.book_kept
        assert not row.book_ready & row.book_kept
        # no cached prefix block of an agent the policy dropped or never loaded
        assert row.cached <= row.book_gpu | row.book_kept
        if row.decisions:
            assert row.book_gpu == after[max(row.decisions)]
    # the pool is too small for two agents beside a request: one at a time
    assert max(len(row.book_gpu) for row in o.backend.audit) == 1
    assert sum(len(d["load"]) for d in decisions.values()) >= 3


@pytest.mark.parametrize("policy", POLICIES)
def test_vllm_runs_the_simulators_schedule_step_for_step(runs: Runs, policy: str) -> None:
    """Under the profile clock (vLLM executes every step, the step's time comes
    from the profile) vLLM and the simulator make the same decisions and give
    every task the same JCT: the simulator's engine model is vLLM's."""
    real = runs.by_policy[policy].result
    sink = RecordingSink()
    sim = Run(runs.trace, make_policy(policy), SimBackend(runs.profile), sink=sink).execute()
    assert real.decisions == sim.decisions
    logged = _decisions(runs.db, runs.by_policy[policy].run_id)  # the decisions themselves
    assert [(d["admit"], d["preempt"], d["load"], d["evict"]) for d in logged] == [
        (list(d.admit), list(d.preempt), list(d.load), list(d.evict)) for d in sink.decisions]
    assert [d["t"] for d in logged] == pytest.approx([d.t for d in sink.decisions])
    assert real.jct == pytest.approx(sim.jct, rel=1e-9, abs=1e-9)
    assert real.stats.preemptions == sim.stats.preemptions
    assert real.stats.prefix_computes == sim.stats.prefix_computes
    assert real.stats.prefix_loads == sim.stats.prefix_loads  # kept prefixes taken back


def test_an_evicted_prefix_keeps_its_blocks_and_vllm_reuses_them(runs: Runs) -> None:
    """The paper's TOPAS evicts every idle prefix (R' = {a(r) : r in Q'};
    `topas` keeps them while there is room); with room to spare the backend
    keeps the prefix's blocks pinned, and the next load takes them back: vLLM
    computes each prefix once and prefills exactly what FCFS (which never
    evicts here) prefills. Before, every eviction meant a recompute."""
    trace = chain3_cpu(tasks=4, rate=1.0, seed=3, input_tokens=64, output_tokens=64)
    prefill: dict[str, int] = {}
    for name in ("topas-paper", "fcfs"):
        backend = make_backend(str(runs.model), budget_tokens=8192, profile=runs.profile,
                               clock="profile", audit=True, record=True)
        try:
            result = Run(trace, make_policy(name), backend).execute()
        finally:
            backend.close()
        assert sorted(result.finishes) == [t.id for t in trace.tasks]
        assert backend.stats.prefix_computes == 3  # once per agent
        prefill[name] = sum(s.prefill_tokens for s in backend.samples)
        for row in backend.audit:
            assert row.pinned == row.book_ready | row.book_kept
        if name == "topas-paper":
            assert backend.stats.prefix_loads >= 3  # kept copies taken back
            assert any(row.book_kept for row in backend.audit)
    assert prefill["topas-paper"] == prefill["fcfs"]


def test_replay_cli_runs_the_vllm_backend(runs: Runs, tmp_path: Path) -> None:
    """In its own process, as a user runs it: stdout is the JSON alone (vLLM's
    own log lines go to stderr)."""
    import subprocess
    import sys

    from tests.daemonkit import clean_env

    trace = chain3_cpu(tasks=2, rate=20.0, seed=0, input_tokens=32, output_tokens=32)
    path = tmp_path / "t.jsonl"
    save_trace(trace, path)
    db = tmp_path / "cli.db"
    result = subprocess.run([
        sys.executable, "-m", "topasd.cli", "replay", str(path), "--backend", "vllm",
        "--model", str(runs.model), "--budget", str(DEFAULT_BUDGET), "--policy", "topas",
        "--json", "--db", str(db)], capture_output=True, text=True, timeout=600,
        env=clean_env())
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    (row,) = payload["runs"]
    assert (row["policy"], row["tasks"]) == ("topas", 2)
    assert payload["profile"] == "vllm-cpu-tiny"
    assert (payload["backend"], payload["clock"]) == ("vllm", "steps")
    got = store_rows(db, "SELECT backend, status FROM runs")
    assert [(r["backend"], r["status"]) for r in got] == [("vllm", "done")]


def test_replay_with_the_profile_clock_is_the_same_run_twice(runs: Runs, tmp_path: Path) -> None:
    """`--clock profile`: engine time is the profile's model of each real step,
    so two replays agree to the last digit however loaded the machine is (the
    default wall-time steps swung a 3-task mean JCT from 2 to 16 s)."""
    trace = chain3_cpu(tasks=3, rate=20.0, seed=1, input_tokens=32, output_tokens=32)
    path = tmp_path / "t.jsonl"
    save_trace(trace, path)
    args = ["replay", str(path), "--backend", "vllm", "--model", str(runs.model), "--budget",
            str(DEFAULT_BUDGET), "-p", "topas", "-p", "fcfs", "--clock", "profile", "-q"]
    shown = [CliRunner().invoke(main, [*args, "--json"]) for _ in range(2)]
    keep = ("policy", "mean_jct_s", "p99_jct_s", "makespan_s", "decisions", "preemptions")
    first, second = ([{k: r[k] for k in keep} for r in json.loads(res.stdout)["runs"]]
                     for res in shown)
    assert first == second and [r["policy"] for r in first] == ["topas", "fcfs"]
    assert json.loads(shown[0].stdout)["clock"] == "profile"
    table = CliRunner().invoke(main, args).stdout
    assert "vLLM engine, clock profile" in table.splitlines()[0]


def test_a_request_beyond_the_models_context_is_refused_before_vllm_starts(
        tmp_path: Path) -> None:
    """The pool holds it, the model's context (max_position_embeddings) does
    not: replay names that limit and its fix before starting an engine."""
    model = write_tiny_model(tmp_path / "short", max_len=1024)
    trace = chain3_cpu(tasks=1, rate=1.0, seed=0, input_tokens=600, output_tokens=32)
    path = tmp_path / "t.jsonl"
    save_trace(trace, path)
    result = CliRunner().invoke(main, ["replay", str(path), "--backend", "vllm", "--model",
                                       str(model), "--policy", "fcfs"])
    assert result.exit_code == 2
    assert "but the engine's context is 1024; the model's max_position_embeddings caps " \
        "it" in result.output


@pytest.mark.parametrize("native", [False, True], ids=["topas", "vllm-default"])
def test_an_idle_engine_waits_for_the_next_arrival(runs: Runs, native: bool) -> None:
    trace = chain3_cpu(tasks=2, rate=0.5, seed=0, input_tokens=32, output_tokens=32)
    assert trace.tasks[1].arrival > 1.0  # the engine idles before the second task
    backend = make_backend(str(runs.model), budget_tokens=DEFAULT_BUDGET, clock="profile",
                           native=native, record=True)
    try:
        result = Run(trace, make_policy("topas"), backend).execute()
    finally:
        backend.close()
    assert sorted(result.jct) == [0, 1]
    assert result.arrivals[1] == trace.tasks[1].arrival
    assert sorted(backend.finished_tokens.values()) == [32] * 6
    if native:  # vLLM's own scheduler decided alone
        assert result.decisions == 0
    else:
        assert result.decisions > 0


def _script_request(rid: int, agent: str, prefix: int = 64) -> Request:
    """A one-round request for the hand-driven backend tests."""
    return Request(id=rid, task_id=rid, workflow="w", stage="s", agent=agent, round=0,
                   input_tokens=16, output_tokens=4, ready_at=0.0, task_arrival=0.0,
                   prefix_tokens=prefix)


def _pump(backend: VllmBackend, until: float | None, decide: Any, kind: EventKind,
          seen: list[int]) -> None:
    """Run the backend to `until`, answering each SCHEDULE with `decide(view)`
    (None: no decision) and recording the request ids of `kind` events."""
    for ev in backend.run_until(until):
        if ev.kind is EventKind.SCHEDULE:
            d = decide(backend.view({}, {}))
            if d is not None:
                backend.apply(d)
        elif ev.kind is kind:
            seen.append(ev.request_id)


def _admit_all(v: Any) -> Decision | None:
    """Load every missing prefix and admit every waiting request."""
    if not v.waiting:
        return None
    load = tuple(sorted({r.agent for r in v.waiting if not v.prefixes[r.agent].on_gpu}))
    return Decision(v.t, "script", load=load, admit=tuple(r.id for r in v.waiting))


def test_an_admission_and_its_preemption_before_one_step_leave_it_waiting(runs: Runs) -> None:
    """Two decisions between engine steps: admit 1, then preempt it (a task
    arriving at the same instant asks again). vLLM must carry them out in that
    order: request 1 stays waiting until admitted again (started anyway, the
    backend would stop with EngineMismatch)."""
    backend = make_backend(str(runs.model), budget_tokens=DEFAULT_BUDGET, clock="profile")
    finished: list[int] = []

    def pump(until: float | None, decide: Any) -> None:
        _pump(backend, until, decide, EventKind.REQUEST_FINISH, finished)

    try:
        backend.submit(_script_request(1, "A"))
        pump(backend.t, lambda v: Decision(v.t, "script", load=("A",), admit=(1,)))
        backend.submit(_script_request(2, "B"))
        pump(backend.t, lambda v: Decision(v.t, "script", preempt=(1,)))
        assert 1 in backend._waiting and 1 not in backend._running
        pump(None, lambda v: None)  # engine steps with nothing admitted: 1 must not start
        assert finished == [] and 1 in backend._waiting
        backend.submit(_script_request(3, "A"))  # the next scheduling point: admit all
        pump(None, _admit_all)
        assert sorted(finished) == [1, 2, 3]
        assert backend.stats.preemptions == 1
        # without record=True (a daemon) the backend keeps no per-step or
        # per-request history: its memory stays flat over a long run
        assert backend.stats.steps > 0 and backend.samples == [] and not backend.finished_tokens
    finally:
        backend.close()


def test_an_eviction_and_a_reload_before_one_step_leave_the_prefix_pinned(runs: Runs) -> None:
    """Two decisions between engine steps (a daemon's run_until slice can end
    right after `apply`): evict A, then load A back for a new request. vLLM
    must carry them out in that order, so A ends pinned and the request runs
    (the queued eviction does not unpin A after the reload)."""
    backend = make_backend(str(runs.model), budget_tokens=DEFAULT_BUDGET, clock="profile")
    started: list[int] = []

    def pump(until: float | None, decide: Any) -> None:
        _pump(backend, until, decide, EventKind.REQUEST_START, started)

    try:
        backend.submit(_script_request(1, "A", 256))
        pump(None, _admit_all)
        backend.submit(_script_request(3, "B", 32))
        pump(backend.t, lambda v: Decision(v.t, "script", evict=("A",)))
        backend.submit(_script_request(2, "A", 256))
        pump(backend.t, lambda v: Decision(v.t, "script", load=("A",), admit=(2,)))
        pump(None, _admit_all)
        assert sorted(started) == [1, 2, 3]
        assert "A" in backend.sched.pins and backend.view({}, {}).prefixes["A"].ready
    finally:
        backend.close()


@pytest.mark.parametrize("native", [False, True])
def test_a_withdrawn_request_leaves_vllm_and_the_rest_run(runs: Runs, native: bool) -> None:
    """Requests taken back (their clients went away) leave vLLM too, wherever
    they stood: waiting, admitted by a decision vLLM has not carried out yet,
    running (its blocks freed at once) or preempted with the preemption still
    queued. vLLM forgets each; the others finish; a finished one is refused."""
    backend = make_backend(str(runs.model), budget_tokens=DEFAULT_BUDGET, clock="profile",
                           native=native)
    withdrawn: dict[int, int] = {}
    finished: list[int] = []

    def pump(until: float | None, decide: Any) -> None:
        for ev in backend.run_until(until):
            if ev.kind is EventKind.SCHEDULE:
                d = decide(backend.view({}, {}))
                if d is not None:
                    backend.apply(d)
            elif ev.kind is EventKind.REQUEST_WITHDRAW:
                withdrawn[ev.request_id] = ev.tokens
                assert ev.note == "client gone"
            elif ev.kind is EventKind.REQUEST_FINISH:
                finished.append(ev.request_id)

    def gone(rid: int) -> None:
        vid = backend._vid[rid]
        assert vid in backend.sched.requests
        assert backend.withdraw(rid, "client gone")
        assert vid not in backend.sched.requests  # vLLM's side forgot it

    def long_request(rid: int) -> Request:
        return replace(_script_request(rid, "A"), output_tokens=200)

    try:
        for rid in (1, 2, 3):
            backend.submit(long_request(rid))
        pump(backend.t, lambda v: None)  # ready, nothing admitted yet
        gone(2)  # waiting
        assert not backend.withdraw(2, "again") and not backend.withdraw(9, "unknown")
        pump(backend.t + 0.05, _admit_all)  # 1 and 3 run a while
        assert {1, 3} <= set(backend._running) and backend._running[1].generated > 0
        pool = backend.sched.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        gone(1)  # running: its blocks come back now
        assert pool.get_num_free_blocks() > free
        if not native:  # decisions queued for vLLM's next step
            backend.submit(_script_request(4, "A"))
            pump(backend.t, _admit_all)  # 4 admitted, not started
            assert 4 in backend._running and backend._vid[4] in backend.sched._plan.admit, (
                backend._running, backend._waiting)
            gone(4)
            backend.apply(Decision(backend.t, "script", preempt=(3,)))
            assert 3 in backend._waiting  # its preemption waits for the next step
            gone(3)
        pump(None, _admit_all)
        if not native:  # the request computing its agent's prefix (two chunks) goes
            for rid in (6, 7):
                backend.submit(_script_request(rid, "B", prefix=768))
            pump(backend.t, _admit_all)
            pump(backend.t + 1e-6, _admit_all)  # one step: 6 computes B's prefix
            assert backend._await_prefix.get("B") == [6]
            gone(6)
            pump(None, _admit_all)  # 7 computes it instead, and runs
            assert 7 in finished
            # the only request a decision admitted to compute C's prefix goes before
            # vLLM's next step: nothing would compute C, so C is evicted
            backend.submit(_script_request(8, "C", prefix=768))
            pump(backend.t, lambda v: Decision(v.t, "script", evict=("B",), load=("C",),
                                               admit=(8,)))
            assert backend.view({}, {}).prefixes["C"].location is Location.GPU
            gone(8)
            c = backend.view({}, {}).prefixes["C"]
            assert c.location is Location.NONE and not c.ready
            pump(None, _admit_all)
            assert "C" not in backend.sched._want and "C" not in backend.sched.pins
            backend.submit(_script_request(9, "C", prefix=768))  # C computed again, runs
            pump(None, _admit_all)
            assert 9 in finished
        expected_gone = {1, 2} | (set() if native else {3, 4, 6, 8})
        assert set(withdrawn) == expected_gone and withdrawn[2] == 0 and withdrawn[1] > 0
        assert sorted(finished) == ([3] if native else [7, 9])
        assert not backend._running and not backend._waiting
        backend.submit(_script_request(5, "A"))  # the engine goes on
        pump(None, _admit_all)
        assert finished[-1] == 5 and not backend.withdraw(5, "finished")
        assert backend.stats.withdrawn == len(expected_gone)
    finally:
        backend.close()


def _shared_context_trace() -> Trace:
    """Three tasks of a fan-out whose three workers (one agent, a 512-token
    prefix) carry a 64-token document, then a stage reading it again; sizes in
    whole 32-token blocks, so vLLM shares exactly what the simulator does."""
    from workflows.spec import workflow_from_dict
    from workflows.trace import RoundSpec, TaskRecord

    wf = workflow_from_dict({"name": "fan", "agents": {"A": {"prefix_tokens": 512}},
                             "stages": [{"name": "w", "agent": "A"},
                                        {"name": "x", "agent": "A", "after": ["w"]}]})
    tasks = tuple(TaskRecord(i, "fan", 0.4 * i, {
        "w": tuple(RoundSpec(64 + 32, 32 + 32 * (b % 2), 0.0, b, ("doc",)) for b in range(3)),
        "x": (RoundSpec(64 + 64, 32, 0.0, 0, ("doc",)),)}, context={"doc": 64})
        for i in range(3))
    return Trace({"fan": wf}, tasks, {"workload": "fan"})


@pytest.mark.parametrize("policy", POLICIES)
def test_vllm_and_the_simulator_share_the_same_task_context(runs: Runs, policy: str) -> None:
    """Shared task context through vLLM's prefix cache: each task's document is
    one copy whose blocks the holders share. Under the profile clock vLLM and
    the simulator make the same decisions, hit the same copies for the same
    requests at the same times, and vLLM's own prefix-cache hit of each
    request is its prefix plus the copies the simulator says it hit."""
    trace = _shared_context_trace()
    backend = make_backend(str(runs.model), budget_tokens=DEFAULT_BUDGET, profile=runs.profile,
                           clock="profile", record=True)
    real_sink, sim_sink = RecordingSink(), RecordingSink()
    try:
        real = Run(trace, make_policy(policy), backend, sink=real_sink).execute()
    finally:
        backend.close()
    sim = Run(trace, make_policy(policy), SimBackend(backend.profile), sink=sim_sink).execute()
    assert [(d.admit, d.preempt, d.load, d.evict) for d in real_sink.decisions] == [
        (d.admit, d.preempt, d.load, d.evict) for d in sim_sink.decisions]
    assert real.jct == pytest.approx(sim.jct, rel=1e-9, abs=1e-9)

    def hits(sink: RecordingSink) -> list[tuple[Any, ...]]:
        kinds = (EventKind.CONTEXT_HIT, EventKind.CONTEXT_COMPUTE_START,
                 EventKind.CONTEXT_COMPUTE_END, EventKind.CONTEXT_DROP)
        return [(round(ev.t, 9), ev.kind, ev.request_id, ev.note, ev.tokens)
                for ev in sink.events if ev.kind in kinds]

    assert hits(real_sink) == hits(sim_sink)
    got = hits(real_sink)
    assert sum(1 for h in got if h[1] is EventKind.CONTEXT_HIT) == 3 * 3  # 2 workers, x
    assert sum(1 for h in got if h[1] is EventKind.CONTEXT_COMPUTE_START) == 3
    hit_tokens = {h[2]: h[4] for h in got if h[1] is EventKind.CONTEXT_HIT}
    computed = {h[2] for h in got if h[1] is EventKind.CONTEXT_COMPUTE_START}
    for rid, cached in backend.cached_tokens.items():
        prefix = cached - hit_tokens.get(rid, 0)
        assert prefix in (0, 512), (rid, cached)  # 0: it computed the agent's prefix
        assert rid not in computed or cached == prefix
    assert sum(backend.cached_tokens.values()) == 512 * (len(backend.cached_tokens) - 1) + \
        64 * 9
