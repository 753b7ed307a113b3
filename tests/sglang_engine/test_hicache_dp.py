"""Host-tier moves and two data-parallel replicas through SGLang's real engine.

`tiered_engine` (conftest) runs two SGLang replicas (dp_size=2), each with a
1,024-token device pool and HiCache's host pool behind it. The workflow's
stages use agents X, Y, X with 600-token prefixes: one prefix and a request
fit on a replica's device, two prefixes do not. So before stage b TOPAS must
move X off the device (SGLang's write-through has already copied it to the
host pool) and before stage c move it back, which SGLang does as a host ->
device load inside its admission. Each task runs on its own replica
(task i on replica i % 2), decided by that replica's TOPAS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from backends.sglang.backend import SGLangBackend
from store import Store
from tests.daemonkit import rows
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import Trace, generate_trace

PREFIX = 600
TASKS = 2  # one per replica
LATE_S = 2.0  # task 1 arrives once task 0's first stage has computed X on replica 0


@dataclass
class TieredRun:
    db: Path
    run_id: int
    replies: dict[int, dict[str, Any]]  # request id -> SGLang's meta_info
    stage_of: dict[int, tuple[int, str]]  # request id -> (task id, stage)


def xyx_trace() -> Trace:
    """TASKS tasks of X -> Y -> X; task 1 arrives LATE_S after task 0."""
    stage = {"input_tokens": 64, "output_tokens": 16}
    wf = workflow_from_dict({
        "name": "xyx", "agents": {"X": {"prefix_tokens": PREFIX}, "Y": {"prefix_tokens": PREFIX}},
        "stages": [{"name": "a", "agent": "X", **stage},
                   {"name": "b", "agent": "Y", "after": ["a"], **stage},
                   {"name": "c", "agent": "X", "after": ["b"], **stage}]}, "xyx")
    trace = generate_trace([wf], 50.0, TASKS, 0, name="xyx")
    tasks = tuple(replace(t, arrival=LATE_S * t.id) for t in trace.tasks)
    return replace(trace, tasks=tasks)


@pytest.fixture(scope="module")
def run(tiered_engine: SGLangBackend, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[TieredRun]:
    db = tmp_path_factory.mktemp("tiered") / "runs.db"
    store = Store(db)
    try:
        sink = store.sink("top:2")
        Run(xyx_trace(), make_policy("topas"), tiered_engine, sink=sink).execute()
        assert sink.run_id is not None
    finally:
        store.close()
    stage_of = {r["request_id"]: (r["task_id"], r["stage"]) for r in rows(
        db, "SELECT request_id, task_id, stage FROM requests WHERE run_id = ?", sink.run_id)}
    yield TieredRun(db, sink.run_id, dict(tiered_engine.replies), stage_of)


def _decisions(run: TieredRun) -> list[dict[str, Any]]:
    """The run's decisions that admitted something, JSON fields decoded."""
    out = []
    for d in rows(run.db, "SELECT * FROM decisions WHERE run_id = ? ORDER BY seq", run.run_id):
        row = dict(d)
        for k in ("admit", "load", "evict"):
            row[k] = json.loads(row[k] or "[]")
        if row["admit"]:
            out.append(row)
    return out


def _admitted_by(run: TieredRun, task: int, stage: str) -> tuple[int, dict[str, Any]]:
    """The request of (task, stage) and the decision that admitted it."""
    rid = next(r for r, ts in run.stage_of.items() if ts == (task, stage))
    return rid, next(d for d in _decisions(run) if rid in d["admit"])


def test_every_request_finishes_with_its_length(run: TieredRun) -> None:
    assert sorted(run.replies) == sorted(run.stage_of) and len(run.stage_of) == 3 * TASKS
    for meta in run.replies.values():
        assert meta["completion_tokens"] == 16 and meta["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("task", range(TASKS))
def test_topas_moves_a_prefix_to_host_and_sglang_loads_it_back(run: TieredRun,
                                                               task: int) -> None:
    """Stage b's decision evicts X from the device (HiCache keeps its host
    copy); stage c's loads X again, and SGLang serves all of X's prefix from
    its host pool, none from the device and none recomputed."""
    rid_a, _ = _admitted_by(run, task, "a")
    assert run.replies[rid_a]["cached_tokens"] == 0  # X computed on this replica
    _, at_b = _admitted_by(run, task, "b")
    assert "X" in at_b["evict"] and "Y" in at_b["load"]
    rid_c, at_c = _admitted_by(run, task, "c")
    assert "X" in at_c["load"] and "Y" in at_c["evict"]
    details = run.replies[rid_c]["cached_tokens_details"]
    assert details["device"] == 0 and details["host"] >= PREFIX - 1, details


def test_each_replica_is_decided_by_its_own_topas(run: TieredRun) -> None:
    """Every admitting decision admits requests of one replica (task % 2),
    and both replicas' requests were admitted by TOPAS's decisions."""
    replicas_by_decision = [{run.stage_of[r][0] % 2 for r in d["admit"]}
                            for d in _decisions(run)]
    assert all(len(s) == 1 for s in replicas_by_decision), replicas_by_decision
    assert set().union(*replicas_by_decision) == {0, 1}
    admitted = {r for d in _decisions(run) for r in d["admit"]}
    assert admitted == set(run.stage_of)


def test_each_replica_has_its_own_residency(run: TieredRun) -> None:
    """X computed on replica 0 is no hit on replica 1: task 1's first request,
    admitted after task 0's had finished, computes X again; each replica
    loads its own host copy back."""
    firsts = [_admitted_by(run, t, "a")[0] for t in range(TASKS)]
    finished = rows(run.db, "SELECT request_id, admitted, finished FROM requests "
                            "WHERE run_id = ?", run.run_id)
    when = {r["request_id"]: (r["admitted"], r["finished"]) for r in finished}
    assert when[firsts[0]][1] < when[firsts[1]][0], when  # X was cached on replica 0
    assert [run.replies[r]["cached_tokens"] for r in firsts] == [0] * TASKS
    loads = [run.replies[_admitted_by(run, t, "c")[0]]["cached_tokens_details"]["host"]
             for t in range(TASKS)]
    assert all(h >= PREFIX - 1 for h in loads), loads
