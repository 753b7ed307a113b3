"""`topasd trace import --format calls`: the shipped example call logs import,
round-trip (every call's prompt and completion tokens are in the trace's
tasks), and replay through every policy; shapes, waits, arrivals and fitted
profiles are what docs/trace-format.md says; bad logs are named."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from topasd.cli import main
from topasd.scheduler import ALL_POLICY_NAMES
from workflows.calllog import Call, CallLogError, load_calls, read_calls
from workflows.importer import import_calls
from workflows.trace import Trace, load_trace

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
JSONL, CSV = EXAMPLES / "calls.jsonl", EXAMPLES / "calls.csv"


def cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def imported(tmp_path: Path, log: Path, *extra: str) -> Trace:
    out = tmp_path / f"{log.stem}.trace.jsonl"
    code, _, err = cli("trace", "import", str(log), "--format", "calls", "-o", str(out), *extra)
    assert code == 0, err
    return load_trace(out)


def round_trips(log: Path, trace: Trace) -> None:
    """Every call of `log` is one round of the trace, its tokens exact."""
    calls = load_calls(log)
    result = import_calls(calls, "x", str(log))
    tasks = {t.id: t for t in trace.tasks}
    assert sum(len(r) for t in trace.tasks for r in t.stages.values()) == len(calls)
    for c in calls:
        tid, stage, branch, k = result.placement[c.task, c.id]
        wf = trace.workflows[tasks[tid].workflow]
        r = tasks[tid].branches(stage)[branch][k]
        assert wf.stages[stage].agent == c.agent
        assert wf.prefix_tokens(stage) + r.input_tokens == c.prompt_tokens, c
        assert r.output_tokens == c.completion_tokens, c


@pytest.mark.parametrize("log", [JSONL, CSV], ids=["jsonl", "csv"])
def test_the_example_logs_round_trip(tmp_path: Path, log: Path) -> None:
    trace = imported(tmp_path, log)
    round_trips(log, trace)
    assert trace.meta["source_format"] == "calls"
    assert trace.meta["calls"] == len(load_calls(log))


def test_the_example_replays_through_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert cli("trace", "import", str(JSONL), "-o", str(out))[0] == 0
    policies = [arg for name in ALL_POLICY_NAMES for arg in ("-p", name)]
    code, stdout, err = cli("replay", str(out), *policies, "--json", "-q")
    assert code == 0, err
    runs = json.loads(stdout)["runs"]
    assert [r["policy"] for r in runs] == list(ALL_POLICY_NAMES)
    assert all(r["tasks"] == 11 and r["tasks_unfinished"] == 0 for r in runs)


def test_tasks_of_one_shape_share_a_workflow_fitted_over_all_of_them(tmp_path: Path) -> None:
    trace = imported(tmp_path, JSONL)
    by_wf: dict[str, list[str]] = {}
    for tid, key in enumerate(trace.meta["task_ids"]):
        by_wf.setdefault(next(t.workflow for t in trace.tasks if t.id == tid), []).append(key)
    assert sorted(sorted(k.split("-")[0] for k in keys) for keys in by_wf.values()) == [
        ["coding"] * 3, ["research"] * 4, ["support"] * 4]
    research = trace.workflows[next(w for w, ks in by_wf.items() if "research-01" in ks)]
    assert [(s.name, s.after) for s in research.stages.values()] == [
        ("Planner", ()), ("Researcher", ("Planner",)), ("Writer", ("Researcher",))]
    workers = research.stages["Researcher"].profile
    counts = [len(t.branches("Researcher")) for t in trace.tasks if t.workflow == research.name]
    assert sorted(counts) == [2, 3, 3, 4]  # a map whose width varies per task
    assert workers.branches.kind == "lognormal" and (workers.branches.low,
                                                     workers.branches.high) == (2, 4)
    inputs = [r.input_tokens for t in trace.tasks if t.workflow == research.name
              for r in t.stages["Researcher"]]
    dist = workers.input_tokens  # no task's exact sizes: a fit over all of them
    assert dist.kind == "lognormal" and (dist.low, dist.high) == (min(inputs), max(inputs))
    assert min(inputs) < dist.mean() < max(inputs)


def test_waits_and_rounds_come_from_the_times(tmp_path: Path) -> None:
    trace = imported(tmp_path, JSONL)
    calls = {(c.task, c.id): c for c in load_calls(JSONL)}
    ids = trace.meta["task_ids"]
    for task in trace.tasks:
        key = ids[task.id]
        if key.startswith("coding"):  # code, the tests run, review, fix (by `order`)
            code, review = calls[key, "code"], calls[key, "review"]
            assert list(task.stages) == ["Coder#1", "Reviewer", "Coder#2"]
            assert task.waits["Reviewer"] == round(review.start - code.end, 6)
        if key.startswith("support"):  # one ReAct stage, the tool waits between rounds
            [rounds] = task.branches("SupportAgent")
            steps = [calls[key, f"step{k}"] for k in range(len(rounds))]
            assert [r.tool_wait_s for r in rounds] == [
                round(b.start - a.end, 6) for a, b in itertools.pairwise(steps)] + [0.0]
    first = min(c.start for c in calls.values())
    for task in trace.tasks:
        start = min(c.start for (k, _), c in calls.items() if k == ids[task.id])
        assert task.arrival == round(start - first, 6)


def test_csv_times_in_iso_8601_and_a_map_of_varying_width(tmp_path: Path) -> None:
    out = tmp_path / "csv.jsonl"
    code, _, err = cli("trace", "import", str(CSV), "-o", str(out))
    assert code == 0 and err.splitlines() == [
        f"imported 9 calls of 2 tasks into 1 workflow: calls (2 tasks, 3 stages); wrote trace "
        f"version 2 to {out}",
        "note: 7 calls give shared-content hints; they were checked, but a trace does not carry "
        "shared task context yet, so each call holds its own copy"]
    trace = load_trace(out)
    [wf] = trace.workflows.values()
    assert list(wf.stages) == ["Writer#1", "Critic", "Writer#2"]
    assert [len(t.branches("Critic")) for t in trace.tasks] == [2, 3]
    assert [t.arrival for t in trace.tasks] == [0.0, 90.0]
    assert [t.waits["Writer#2"] for t in trace.tasks] == [30.0, 36.0]


def test_a_rate_places_the_tasks_and_a_log_without_times_needs_one(tmp_path: Path) -> None:
    log = tmp_path / "plain.jsonl"
    log.write_text("".join(json.dumps({"task": t, "call": c, "agent": a, "prompt_tokens": 50,
                                       "completion_tokens": 20}) + "\n"
                           for t in (7, 9) for c, a in (("a", "A"), ("b", "B"))))
    code, _, err = cli("trace", "import", str(log), "-o", str(tmp_path / "t.jsonl"))
    assert code == 2 and err.strip() == (
        f"error: {log}: the calls have no start and end times to place the tasks in time; "
        "give --rate R (Poisson arrivals, task/s)")
    trace = imported(tmp_path, log, "--rate", "0.5", "--seed", "3")
    assert [t.id for t in trace.tasks] == [7, 9]  # integer task ids are kept
    assert trace.tasks[0].arrival == 0.0 < trace.tasks[1].arrival
    assert trace.meta["rate"] == 0.5 and "task_ids" not in trace.meta
    [wf] = trace.workflows.values()  # no parents, no order: a chain in file order
    assert [(s.name, s.after) for s in wf.stages.values()] == [("A", ()), ("B", ("A",))]
    assert imported(tmp_path, log, "--rate", "0.5", "--seed", "3").tasks == trace.tasks


def test_isomorphic_tasks_share_a_workflow_whatever_the_file_order() -> None:
    def call(task: str, cid: str, agent: str, parents: list[str], line: int) -> Call:
        return Call(task, cid, agent, 100, 10, line, parents=tuple(parents), start=float(line),
                    end=float(line) + 0.5)
    calls = [call("t1", "p", "P", [], 1), call("t1", "x", "W", ["p"], 2),
             call("t1", "y", "R", ["x"], 3),
             call("t2", "y2", "R", ["x2"], 4), call("t2", "x2", "W", ["p2"], 5),
             call("t2", "p2", "P", [], 6),
             call("t3", "p", "P", [], 7), call("t3", "x", "R", ["p"], 8),
             call("t3", "y", "W", ["x"], 9)]
    result = import_calls(calls, "iso")
    assert result.shapes == (("iso-1", 2), ("iso-2", 1))


@pytest.mark.parametrize(("lines", "says"), [
    (['{"task": 1, "call": "a", "agent": "A", "prompt_tokens": 5}'],
     "calls:1: the call lacks completion_tokens (or output_tokens); every call names its task, "
     "call id, agent, prompt_tokens and completion_tokens"),
    (['{"task": 1, "call": "a", "role": "A", "prompt_tokens": 5, "completion_tokens": 0}'],
     "calls:1: completion_tokens must be a whole number from 1 to 1e+07, got 0"),
    (['{"task": 1, "call": "a", "agent": "A", "prompt_tokens": 5, "completion_tokens": 2, '
      '"start": "noon", "end": 3}'],
     'calls:1: start "noon" is neither a number of seconds nor an ISO 8601 time '
     "(2025-01-31T12:00:00.5Z)"),
    (['{"task": 1, "call": "a", "agent": "A", "prompt_tokens": 5, "completion_tokens": 2, '
      '"start": 4, "end": 3}'], "calls:1: end 3 is before start 4"),
    (['{"task": 1, "call": "a", "agent": "A", "prompt_tokens": 5, "completion_tokens": 2, '
      '"prefix_tokens": 9}'],
     "calls:1: prefix_tokens 9 exceeds prompt_tokens 5; the prefix is part of the prompt"),
    (["task,call,agent,prompt_tokens,completion_tokens", "1,a,A,5"],
     "calls:2: 4 cells but the header row has 5 (task, call, agent, prompt_tokens, "
     "completion_tokens)"),
    (["task,call,agent,prompt_tokens,completion_tokens,shared", "1,a,A,5,2,plan"],
     'calls:2: shared must list id:tokens pairs (codebase:3500;plan:400), got "plan"'),
    (['{"type": "header", "format": "topasd-trace", "version": 1}'],
     "calls:1: this is a topasd trace, not a call log; replay it as it is (`topasd replay "
     "calls`)"),
    (["", "  "], 'calls: empty call log (no calls); see docs/trace-format.md, "Importing a '
                 'call log"'),
])
def test_a_malformed_call_is_named(lines: list[str], says: str) -> None:
    with pytest.raises(CallLogError) as err:
        read_calls([x + "\n" for x in lines])
    assert str(err.value) == says


def rec(cid: str, agent: str = "A", **kw: object) -> str:
    return json.dumps({"task": "t", "call": cid, "agent": agent, "prompt_tokens": 50,
                       "completion_tokens": 5, "start": 0, "end": 1, **kw}) + "\n"


@pytest.mark.parametrize(("lines", "says"), [
    ([rec("a"), rec("a")], "calls:2: task 't' has call 'a' twice (first on line 1); give each "
                           "call of a task its own id"),
    ([rec("a"), rec("b", parents=["z"])],
     "calls:2: call 'b' names parent 'z', which is no call of task 't'"),
    ([rec("a", parents=["b"]), rec("b", parents=["a"])],
     "calls: task 't': its calls' parents form a cycle (a -> b); a call can only depend on "
     "earlier calls"),
    ([rec("a", order=0), rec("b")],
     "calls:2: call 'b' has no order, but other calls of task 't' do; give every call of a "
     "task its order (or parents)"),
    ([rec("a", prefix_tokens=10), rec("b", prefix_tokens=12)],
     "calls:2: agent 'A' has prefix_tokens 12 here but 10 on line 1; an agent is one cached "
     "prefix, so give it one size (or name the roles apart)"),
    ([rec("a"), json.dumps({"task": "t", "call": "b", "agent": "A", "prompt_tokens": 50,
                            "completion_tokens": 5}) + "\n"],
     "calls:2: call 'b' has no start and end, but other calls do; give every call its times, "
     "or none"),
])
def test_a_malformed_log_is_named(lines: list[str], says: str) -> None:
    with pytest.raises(CallLogError) as err:
        import_calls(read_calls(lines), "x")
    assert str(err.value) == says


def test_call_log_lines_are_bounded_and_utf8(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    second = rec("b", agent="cafX").replace("X", "\xe9")  # a latin-1 byte, not escaped
    log.write_bytes(rec("a").encode() + second.encode("latin-1"))
    code, _, err = cli("trace", "import", str(log), "-o", str(tmp_path / "t.jsonl"))
    at = len(rec("a")) + second.index("\xe9")
    assert code == 2 and err.strip() == (
        f"error: {log}:2: not UTF-8 text (byte 0xe9 at offset {at} of the file, column "
        f"{at - len(rec('a')) + 1} of the line); a call log is UTF-8 text")
    code, _, err = cli("trace", "import", str(JSONL), "-o", str(tmp_path / "t.jsonl"),
                       "--max-line-bytes", "100")
    assert code == 2 and err.strip() == (
        f"error: {JSONL}:1: line longer than 100 bytes (reading stopped there); a call log "
        "line is far shorter, so the file is likely damaged or not a call log; if the line "
        "is real, raise --max-line-bytes")
