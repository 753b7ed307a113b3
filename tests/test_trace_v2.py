"""Trace version 2: waits before stages, a per-task branch count for map
stages, summaries of a given size in `history`, the exponential distribution;
sampled, written, read back, and honoured by the driver the simulator and
the daemon share. Version 1 is still read, and still written where it
suffices."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from backends.sim.engine import SimBackend
from tests.daemonkit import service_counts_until
from tests.simkit import RecordingSink
from topasd.config import load_settings
from topasd.daemon.service import Service
from topasd.model import Dist, EventKind, WorkflowError
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.driver import TaskDriver
from workflows.generator import case_trace, draw_workload
from workflows.spec import dist_to_spec, parse_dist, workflow_from_dict
from workflows.trace import (
    RoundSpec,
    TaskRecord,
    Trace,
    TraceError,
    generate_trace,
    load_trace,
    read_trace,
    save_trace,
    write_trace,
)

SPEC = {
    "name": "mapwait",
    "agents": {"P": {"prefix_tokens": 100}, "W": {"prefix_tokens": 200},
               "R": {"prefix_tokens": 50}},
    "stages": [
        {"name": "plan", "agent": "P", "input_tokens": 40, "output_tokens": 30,
         "wait_before_s": 2},
        {"name": "work", "agent": "W", "after": ["plan"], "branches": {"uniform_int": [1, 4]},
         "rounds": 2, "input_tokens": 10, "output_tokens": 20, "history": "parents",
         "tool_wait_s": {"exponential": {"mean": 1.0, "high": 5}},
         "wait_before_s": {"exponential": {"mean": 3.0, "high": 30}}},
        {"name": "reduce", "agent": "R", "after": ["work"], "input_tokens": 5,
         "output_tokens": 10, "history": "parents", "summary_tokens": 15},
    ],
}


def mapwait_trace(tasks: int = 40, rate: float = 0.5) -> Trace:
    return generate_trace([workflow_from_dict(SPEC)], rate, tasks, 0)


# ----------------------------------------------------------------- the spec


def test_an_exponential_is_parsed_sampled_and_written_back() -> None:
    spec = {"exponential": {"mean": 2.0, "low": 0.5, "high": 6.0}}
    dist = parse_dist(spec, "here", (0, 10))
    assert dist == Dist("exponential", scale=2.0, low=0.5, high=6.0)
    assert dist_to_spec(dist) == spec
    rng = np.random.default_rng(2)
    draws = np.array([dist.sample(rng) for _ in range(40000)])
    assert draws.min() >= 0.5 and draws.max() <= 6.0
    # the mean of the clipped draws, in closed form: 0.5 + 2 (e^-0.25 - e^-3)
    assert dist.mean() == pytest.approx(0.5 + 2 * (np.exp(-0.25) - np.exp(-3)))
    assert draws.mean() == pytest.approx(dist.mean(), rel=0.02)


def test_an_unbounded_exponential_wait_is_refused_with_the_fix() -> None:
    bad = {**SPEC, "stages": [{**SPEC["stages"][0],
                               "tool_wait_s": {"exponential": {"mean": 2}}}]}
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(bad, "w.yaml")
    assert str(err.value) == (
        "w.yaml: workflow 'mapwait', stage 'plan', tool_wait_s: values must lie in [0, 1e+09], "
        'but {"exponential": {"mean": 2}} reaches [0, inf]; give the exponential clips within '
        "the range (low: 0, high: at most 1e+09)")
    odd = {**SPEC, "stages": [{**SPEC["stages"][0],
                               "tool_wait_s": {"exponential": {"mean": 2, "scale": 1}}}]}
    with pytest.raises(WorkflowError, match=r"tool_wait_s: unknown parameter\(s\) \['scale'\]; "
                                            r"give mean, low, high$"):
        workflow_from_dict(odd, "w.yaml")


def test_branches_must_be_whole_and_at_least_one() -> None:
    bad = {**SPEC, "stages": [{**SPEC["stages"][0], "branches": 0}]}
    with pytest.raises(WorkflowError, match=r"stage 'plan', branches: values must lie in "
                                            r"\[1, 10000\], but 0 reaches \[0, 0\]"):
        workflow_from_dict(bad, "w.yaml")


# ----------------------------------------------------------------- sampling


def test_sampled_tasks_draw_branches_waits_and_summaries() -> None:
    trace = mapwait_trace(tasks=200)
    counts = set()
    for task in trace.tasks:
        plan, work, reduce = (task.branches(v) for v in ("plan", "work", "reduce"))
        counts.add(len(work))
        assert len(plan) == len(reduce) == 1
        assert task.waits["plan"] == 2.0 and 0 <= task.waits.get("work", 0.0) <= 30
        plan_out = plan[0][0].output_tokens
        for b, rounds in enumerate(work):
            assert [r.branch for r in rounds] == [b, b] and len(rounds) == 2
            assert rounds[0].input_tokens == 10 + plan_out  # its own input + the plan
            assert rounds[1].input_tokens == 10 + plan_out + 20  # + round 0's output
            assert 0 <= rounds[0].tool_wait_s <= 5 and rounds[1].tool_wait_s == 0
        # the reducer carries a 15-token summary of all the work, not the work itself
        assert reduce[0][0].input_tokens == 5 + 15
    assert counts == {1, 2, 3, 4}


def test_version_1_workloads_sample_exactly_as_before() -> None:
    """The version-2 fields draw nothing at their defaults: traces of the
    built-in and generated workloads are the ones earlier releases wrote."""
    out = io.StringIO()
    for name in ("dag4", "metagpt-tl", "table1"):
        write_trace(generate_trace(load_workload(name).workflows, 0.2, 40, 3), out)
    for family in ("mixed", "react", "coding"):
        write_trace(case_trace(draw_workload(family, 5), "heavy", 30, 1.0, 2), out)
    assert hashlib.sha256(out.getvalue().encode()).hexdigest() == (
        "ae3dba4c5561f7bff90ad4a0141ca62d987f95940a4b40f5c0891146615d6ab3")


# ----------------------------------------------------------------- the driver


def test_the_driver_runs_branches_in_parallel_after_the_wait_before_the_stage() -> None:
    wf = workflow_from_dict(SPEC)
    rounds = {"plan": (RoundSpec(40, 30),),
              "work": (RoundSpec(70, 20, 1.5, 0), RoundSpec(90, 20, 0.0, 0),
                       RoundSpec(70, 20, 0.0, 1)),
              "reduce": (RoundSpec(20, 10),)}
    task = TaskRecord(7, "mapwait", 10.0, rounds, waits={"plan": 2.0, "work": 4.0})
    driver = TaskDriver({"mapwait": wf})
    [plan] = driver.start(task, 10.0)
    assert (plan.stage, plan.ready_at) == ("plan", 12.0)
    step = driver.on_finish(plan.id, 13.0)
    assert step.stages_done == ["plan"]
    b0, b1 = step.requests
    assert [(r.stage, r.round, r.ready_at, r.input_tokens) for r in (b0, b1)] == [
        ("work", 0, 17.0, 70), ("work", 0, 17.0, 70)]
    step = driver.on_finish(b1.id, 18.0)  # branch 1 is done; branch 0 still runs
    assert step.requests == [] and step.stages_done == []
    step = driver.on_finish(b0.id, 19.0)
    [again] = step.requests
    assert (again.round, again.ready_at, again.input_tokens) == (1, 20.5, 90)
    step = driver.on_finish(again.id, 21.0)  # the last branch: the stage is done
    assert step.stages_done == ["work"]
    [reduce] = step.requests
    assert (reduce.stage, reduce.ready_at) == ("reduce", 21.0)
    assert driver.on_finish(reduce.id, 22.0).task_done


def test_the_simulator_honours_the_waits_and_runs_every_branch() -> None:
    trace = mapwait_trace()
    sink = RecordingSink()
    result = Run(trace, make_policy("topas"), SimBackend(get_profile("small")),
                 sink=sink).execute()
    assert result.requests_finished == sum(len(r) for t in trace.tasks
                                           for r in t.stages.values())
    ready: dict[tuple[int, str], list[float]] = defaultdict(list)
    done: dict[tuple[int, str], float] = {}
    for ev in sink.events:
        if ev.kind is EventKind.REQUEST_READY:
            ready[ev.task_id, ev.stage].append(ev.t)
        elif ev.kind is EventKind.STAGE_FINISH:
            done[ev.task_id, ev.stage] = ev.t
    for task in trace.tasks:
        i = task.id
        assert ready[i, "plan"] == [pytest.approx(task.arrival + 2.0, abs=1e-9)]
        first = sorted(ready[i, "work"])[:len(task.branches("work"))]
        assert first == [pytest.approx(done[i, "plan"] + task.waits.get("work", 0.0),
                                       abs=1e-9)] * len(first)
        assert len(ready[i, "work"]) == 2 * len(task.branches("work"))
        assert ready[i, "reduce"] == [done[i, "work"]]


def test_the_daemon_honours_the_wait_before_a_stage(tmp_path: Path) -> None:
    spec = tmp_path / "mapwait.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    db = tmp_path / "d.db"
    settings = load_settings({"workflows": [str(spec)], "speed": "max", "db": str(db)},
                             environ={}).settings
    svc = Service(settings)
    svc.start()
    try:
        task = svc.submit_task("mapwait", {}).result(30)
        service_counts_until(svc, lambda c: c["tasks_finished"] == 1)
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT t, kind, stage FROM engine_events WHERE task_id = ? "
                            "ORDER BY id", [task["id"]]).fetchall()
    arrive = next(t for t, kind, _ in rows if kind == "task_arrive")
    plan = next(t for t, kind, stage in rows if kind == "request_ready" and stage == "plan")
    assert plan == pytest.approx(arrive + 2.0, abs=1e-9)
    work_ready = [t for t, kind, stage in rows if kind == "request_ready" and stage == "work"]
    plan_done = next(t for t, kind, stage in rows if kind == "stage_finish" and stage == "plan")
    assert min(work_ready) >= plan_done and len(work_ready) % 2 == 0


# ----------------------------------------------------------------- the file


def test_a_version_2_trace_round_trips(tmp_path: Path) -> None:
    trace = mapwait_trace()
    path = tmp_path / "v2.jsonl"
    save_trace(trace, path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["version"] == 2
    work = [rec["stages"]["work"] for rec in lines[2:]]
    assert all(set(w) <= {"wait_before_s", "rounds", "branches"} for w in work)
    assert any("branches" in w for w in work) and any("rounds" in w for w in work)
    assert all(rec["stages"]["plan"] == {"wait_before_s": 2.0, "rounds": [[40, 30, 0.0]]}
               for rec in lines[2:])
    back = load_trace(path)
    assert back.tasks == trace.tasks and back.workflows == trace.workflows


def v1_lines() -> list[str]:
    out = io.StringIO()
    write_trace(generate_trace(load_workload("chain3").workflows, 0.2, 2, 0), out)
    return out.getvalue().splitlines(keepends=True)


def test_a_version_1_trace_cannot_say_version_2_things() -> None:
    lines = v1_lines()
    task = json.loads(lines[2])
    task["stages"]["a"] = {"wait_before_s": 1.0, "rounds": task["stages"]["a"]}
    with pytest.raises(TraceError) as err:
        read_trace([*lines[:2], json.dumps(task) + "\n"], "t.jsonl")
    assert str(err.value) == (
        "t.jsonl:3: task 0, stage 'a': a stage given as an object (wait_before_s, branches) "
        'needs trace version 2, but the header says version 1; set "version": 2 in the header')
    spec_line = json.dumps({"type": "workflow", "spec": SPEC})
    with pytest.raises(TraceError) as err:
        read_trace([lines[0], spec_line + "\n"], "t.jsonl")
    assert str(err.value) == (
        "t.jsonl:2: workflow 'mapwait': stage 'plan': wait_before_s, stage 'work': "
        "wait_before_s, stage 'work': branches, stage 'work', tool_wait_s: exponential, stage "
        "'reduce': summary_tokens needs trace version 2, but the header says version 1; set "
        '"version": 2 in the header')


def test_version_1_still_reads_and_other_versions_are_named() -> None:
    lines = v1_lines()
    assert len(read_trace(lines, "t.jsonl").tasks) == 2
    as_v2 = [lines[0].replace('"version": 1', '"version": 2'), *lines[1:]]
    assert read_trace(as_v2, "t.jsonl").tasks == read_trace(lines, "t.jsonl").tasks
    with pytest.raises(TraceError) as err:
        read_trace([lines[0].replace('"version": 1', '"version": 3'), *lines[1:]], "t.jsonl")
    assert str(err.value) == ("t.jsonl:1: trace version 3 is not supported (this topasd reads "
                              "versions 1, 2)")


@pytest.mark.parametrize(("stage", "says"), [
    ({"rounds": [[1, 1, 0]], "branches": [[[1, 1, 0]]]},
     ": a stage object takes \"rounds\" (one branch) or \"branches\" (a list of round lists), "
     "and optionally \"wait_before_s\"; got keys ['branches', 'rounds']"),
    ({"round": [[1, 1, 0]]},
     ": a stage object takes \"rounds\" (one branch) or \"branches\" (a list of round lists), "
     "and optionally \"wait_before_s\"; got unknown key(s) ['round']"),
    ({"wait_before_s": -1, "rounds": [[1, 1, 0]]},
     ": wait_before_s must be a number from 0 to 1e+09 s, got -1"),
    ({"branches": []}, ": branches must be a list of 1 to 10000 round lists, got []"),
    ({"branches": [[[1, 1, 0]], [[1, 0, 0]]]},
     ", branch 1, round 0: expected [input_tokens >= 0, output_tokens >= 1, tool_wait_s >= 0] "
     "as integers and a finite number (and, version 2, a list of shared segment names), got "
     "[1, 0, 0]"),
])
def test_a_malformed_stage_object_is_named(stage: dict, says: str) -> None:
    lines = v1_lines()
    header = lines[0].replace('"version": 1', '"version": 2')
    task = json.loads(lines[2])
    task["stages"]["a"] = stage
    with pytest.raises(TraceError) as err:
        read_trace([header, lines[1], json.dumps(task) + "\n"], "t.jsonl")
    assert str(err.value) == f"t.jsonl:3: task 0, stage 'a'{says}"
