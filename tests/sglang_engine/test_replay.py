"""Replay through the real SGLang engine on this CPU, every policy.

A Chain-3 trace whose 512-token agent prefixes do not all fit beside the
requests in a 2,048-token KV pool runs under each policy on one shared engine
(reset between runs). SGLang's own test switch (`SGLANG_TEST_RETRACT`)
makes it retract a decoding request every few steps, so every run has
retractions to account for. Every decision is carried out inside SGLang's scheduler;
what the decision log says is checked against what SGLang itself reports in
each reply's `meta_info`: output lengths and finish reasons, retractions
(SGLang counts the policy's preemptions, which go through its retract path,
and its own), and prefix cache hits (`cached_tokens`).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.sglang.backend import SGLangBackend
from backends.vllm.workload import chain3_cpu
from store import Store
from tests.daemonkit import rows
from topasd.runner import Run, RunResult
from topasd.scheduler import POLICY_NAMES, make_policy
from workflows.trace import Trace

PREFIX = 512


@dataclass
class Outcome:
    result: RunResult
    run_id: int
    replies: dict[int, dict[str, Any]]  # request id -> SGLang's meta_info


@dataclass
class Runs:
    trace: Trace
    db: Path
    by_policy: dict[str, Outcome]


@pytest.fixture(scope="module")
def runs(engine: SGLangBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    db = tmp_path_factory.mktemp("replay") / "runs.db"
    trace = chain3_cpu(tasks=5, rate=20.0, seed=2, prefix=PREFIX, input_tokens=64,
                       output_tokens=32)
    store = Store(db)
    out: dict[str, Outcome] = {}
    try:
        for name in POLICY_NAMES:
            engine.reset()
            sink = store.sink("top:2")
            result = Run(trace, make_policy(name), engine, sink=sink).execute()
            assert sink.run_id is not None
            out[name] = Outcome(result, sink.run_id, dict(engine.replies))
    finally:
        store.close()
    yield Runs(trace, db, out)


def _events(runs: Runs, policy: str, kind: str) -> list[sqlite3.Row]:
    return rows(runs.db, "SELECT * FROM engine_events WHERE run_id = ? AND kind = ? "
                          "ORDER BY id", runs.by_policy[policy].run_id, kind)


def _outputs(runs: Runs, policy: str) -> dict[int, int]:
    """Request id -> the output length the log says the trace asked for."""
    return {r["request_id"]: r["output_tokens"] for r in rows(
        runs.db, "SELECT request_id, output_tokens FROM requests WHERE run_id = ?",
        runs.by_policy[policy].run_id)}


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_task_completes_with_what_sglang_generated(runs: Runs, policy: str) -> None:
    o = runs.by_policy[policy]
    wanted = _outputs(runs, policy)
    assert sorted(o.result.jct) == [t.id for t in runs.trace.tasks]
    assert o.result.requests_finished == len(wanted) == 3 * len(runs.trace.tasks)
    assert sorted(o.replies) == sorted(wanted)
    for rid, meta in o.replies.items():
        assert meta["completion_tokens"] == wanted[rid] == 32
        assert meta["finish_reason"]["type"] == "length"  # max_new_tokens, never an abort
    run = rows(runs.db, "SELECT * FROM runs WHERE id = ?", o.run_id)[0]
    assert (run["policy"], run["backend"], run["status"]) == (policy, "sglang", "done")
    assert run["decisions"] == o.result.decisions > 0


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_retractions_in_the_log_are_sglangs(runs: Runs, policy: str) -> None:
    """Per request: the policy's preemptions plus SGLang's own retractions in
    the log (SGLang's test switch forces some on this engine) = SGLang's
    `num_retractions`; each one is followed by one more
    admission; every logged preemption carries the decision that asked it."""
    o = runs.by_policy[policy]
    preempts = _events(runs, policy, "preempt")
    retracts = _events(runs, policy, "retract")
    assert retracts  # the shared engine retracts every RETRACT_EVERY steps (conftest)
    logged = Counter(e["request_id"] for e in preempts)
    logged.update(e["request_id"] for e in retracts)
    reported = {rid: m["num_retractions"] for rid, m in o.replies.items()
                if m["num_retractions"]}
    assert dict(logged) == reported
    admits = Counter(e["request_id"] for e in _events(runs, policy, "request_admit"))
    assert admits == Counter({rid: 1 + logged[rid] for rid in o.replies})
    asked = {(d["seq"], rid) for d in rows(runs.db, "SELECT seq, preempt FROM decisions "
                                                   "WHERE run_id = ?", o.run_id)
             for rid in json.loads(d["preempt"] or "[]")}
    assert all((e["decision"], e["request_id"]) in asked for e in preempts)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_prefix_hits_are_where_the_log_holds_the_prefix(runs: Runs, policy: str) -> None:
    """A request admitted after an earlier request of its agent was, with no
    eviction of the agent's prefix between, finds the whole prefix in SGLang's
    radix cache (TOPAS's residency pins it); the first admission of an agent
    in a run finds none of it (the cache was flushed). A prefix the policy
    evicted and loaded again may or may not be left in SGLang's cache (an
    evicted prefix is unpinned and reclaimed only when SGLang needs the room,
    docs/sglang.md), so those are not judged."""
    o = runs.by_policy[policy]
    every = _events(runs, policy, "request_start")  # a retracted request starts again
    starts = {e["request_id"]: e for e in every}
    evictions = _events(runs, policy, "prefix_evict")
    retracted = {e["request_id"] for kind in ("preempt", "retract")
                 for e in _events(runs, policy, kind)}
    judged = 0
    for rid, start in starts.items():
        if rid in retracted:
            continue  # re-prefilled: SGLang counts the cached tokens of every prefill
        earlier = [s for s in every if s["agent"] == start["agent"] and s["t"] < start["t"]]
        cached = o.replies[rid]["cached_tokens"]
        if not earlier:
            assert cached == 0, (rid, cached)
            judged += 1
            continue
        since = max(s["t"] for s in earlier)
        evicted = any(e["agent"] == start["agent"] and since <= e["t"] <= start["t"]
                      for e in evictions)
        if not evicted:
            assert cached >= PREFIX, (rid, start["agent"], cached)
            judged += 1
    assert judged >= len(starts) // 2


def test_topas_keeps_a_prefix_resident_that_fcfs_recomputes_no_more_often(runs: Runs) -> None:
    """SGLang's own count of prefill tokens it could skip: TOPAS's pinned
    prefixes give at least as many cache hits over the run as FCFS's."""
    hits = {p: sum(m["cached_tokens"] for m in runs.by_policy[p].replies.values())
            for p in ("topas", "fcfs")}
    assert hits["topas"] > 0 and hits["fcfs"] > 0, hits


def test_the_replay_command_runs_policies_through_one_sglang_engine(
        tiny_model: Path, tmp_path: Path) -> None:
    """`topasd replay TRACE --backend sglang --model-path DIR` as a user runs
    it (SGLANG_USE_CPU_ENGINE=1 in its environment selects the CPU engine)."""
    from tests.daemonkit import clean_env
    from tests.sglang_engine.conftest import cpu_engine_env
    from workflows.trace import save_trace

    trace = tmp_path / "trace.json"
    save_trace(chain3_cpu(tasks=3, rate=20.0, seed=1, prefix=PREFIX, input_tokens=64,
                          output_tokens=16), trace)
    db = tmp_path / "log.db"
    done = subprocess.run(
        [sys.executable, "-m", "topasd.cli", "replay", str(trace), "--backend", "sglang",
         "--model-path", str(tiny_model), "--budget", "2048", "-p", "topas", "-p", "fcfs",
         "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=600, env=clean_env(**cpu_engine_env()))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["backend"] == "sglang" and out["clock"] == "wall"
    assert [(r["policy"], r["tasks"], r["tasks_unfinished"]) for r in out["runs"]] == [
        ("topas", 3, 0), ("fcfs", 3, 0)]
    runs = rows(db, "SELECT policy, backend, status FROM runs ORDER BY id")
    assert [tuple(r) for r in runs] == [("topas", "sglang", "done"), ("fcfs", "sglang", "done")]
