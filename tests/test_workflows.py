"""Workflow specs and traces: validation errors name the place; traces round-trip."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tests.simkit import builtin_present
from topasd.model import TopasError, WorkflowError
from workflows.builtin import BUILTIN, load_workload, workload_from_dict
from workflows.spec import load_workflow, workflow_from_dict, workflow_to_dict
from workflows.trace import (
    TRACE_FORMAT,
    TRACE_VERSION,
    RoundSpec,
    TaskRecord,
    Trace,
    TraceError,
    generate_trace,
    load_trace,
    read_trace,
    sample_task,
    save_trace,
    trace_tasks,
    write_trace,
)


def spec(*stages: dict, agents: dict | None = None, name: str = "wf") -> dict:
    return {"name": name, "agents": agents or {"A": {"prefix_tokens": 100},
                                               "B": {"prefix_tokens": 200}},
            "stages": list(stages)}


# --------------------------------------------------------------------------
# Spec validation: every error names the offending place
# --------------------------------------------------------------------------


def test_cycle_is_named() -> None:
    data = spec({"name": "plan", "agent": "A", "after": ["review"]},
                {"name": "code", "agent": "B", "after": ["plan"]},
                {"name": "review", "agent": "A", "after": ["code"]},
                {"name": "ship", "agent": "B", "after": ["review"]})
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data)
    msg = str(err.value)
    assert "'wf'" in msg and "cycle" in msg
    cycle = msg[msg.index("(") + 1:msg.index(")")]
    # the cycle's stages, each once, in edge order around the loop; not the exit
    members = cycle.split(" -> ")
    assert sorted(members) == ["code", "plan", "review"]
    order = ["plan", "code", "review"]
    start = order.index(members[0])
    assert members == order[start:] + order[:start]
    assert "ship" not in cycle


def test_self_loop_is_a_cycle() -> None:
    with pytest.raises(WorkflowError, match=r"cycle \(solo"):
        workflow_from_dict(spec({"name": "solo", "agent": "A", "after": ["solo"]}))


def test_unknown_agent_names_stage_and_agent() -> None:
    data = spec({"name": "a", "agent": "A"}, {"name": "b", "agent": "Ghost", "after": ["a"]})
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data)
    msg = str(err.value)
    assert "stage 'b'" in msg and "'Ghost'" in msg and "'wf'" in msg
    assert "['A', 'B']" in msg  # the known agents, to help the fix


def test_unknown_predecessor_names_stage_and_predecessor() -> None:
    data = spec({"name": "a", "agent": "A"}, {"name": "b", "agent": "B", "after": ["a", "zz"]})
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data)
    assert "stage 'b'" in str(err.value) and "'zz'" in str(err.value)


def test_duplicate_stage_is_named() -> None:
    data = spec({"name": "a", "agent": "A"}, {"name": "b", "agent": "B"},
                {"name": "a", "agent": "B"})
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data)
    assert "stage 'a'" in str(err.value) and "twice" in str(err.value)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("output_tokens", {"gaussian": [1, 2]}, "gaussian"),
    ("input_tokens", {"uniform": [10, 5]}, "low <= high"),
    ("tool_wait_s", {"lognormal": {"median": 1.0}}, "sigma"),
    ("rounds", {"choice": []}, "non-empty"),
    ("output_tokens", {"uniform": [1, 2], "choice": [3]}, "exactly one"),
    ("observation_tokens", {"uniform_int": "ab"}, "malformed"),
    # NaN and infinity (YAML .nan, Python's JSON) and a sigma whose draws
    # overflow are refused when the spec loads, not met by trace sampling
    ("output_tokens", {"lognormal": {"median": float("nan"), "sigma": 1, "high": 9}}, "finite"),
    ("rounds", {"choice": [1, float("nan")]}, "finite"),
    ("input_tokens", {"uniform": [1, float("inf")]}, "finite"),
    ("output_tokens", {"lognormal": {"median": 9, "sigma": 1e308, "high": 99}}, "(0, 20]"),
    # a clip with low above high gave `high` every time, without a word
    ("output_tokens", {"lognormal": {"median": 50, "sigma": 1, "low": 100, "high": 10}},
     "low <= high"),
    # counts are whole: 2.5 rounds ran as 2, 10.7 tokens as 11
    ("rounds", 2.5, "not a whole number"),
    ("output_tokens", 10.7, "not a whole number"),
    ("input_tokens", {"choice": [10, 20.5]}, "not a whole number"),
])
def test_bad_distribution_names_stage_and_field(field: str, value, says: str) -> None:
    data = spec({"name": "a", "agent": "A"}, {"name": "b", "agent": "B", field: value})
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data)
    msg = str(err.value)
    assert f"stage 'b', {field}" in msg
    assert says in msg


def test_boolean_is_not_a_distribution() -> None:
    data = spec({"name": "a", "agent": "A"}, {"name": "b", "agent": "B", "input_tokens": True})
    with pytest.raises(WorkflowError, match=r"stage 'b', input_tokens.*boolean"):
        workflow_from_dict(data)


def test_zero_rounds_rejected() -> None:
    with pytest.raises(WorkflowError, match=r"stage 'a', rounds: values must lie in \[1, 10000\]"):
        workflow_from_dict(spec({"name": "a", "agent": "A", "rounds": 0}))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("input_tokens", -500, "input_tokens: values must lie in [0, 1e+07]"),
    ("output_tokens", -3, "output_tokens: values must lie in [1, 1e+07]"),
    ("output_tokens", {"uniform_int": [0, 9]}, "reaches [0, 9]"),
    ("tool_wait_s", -4, "tool_wait_s: values must lie in [0, 1e+09]"),
    ("rounds", 100_000_000, "rounds: values must lie in [1, 10000]"),
    ("output_tokens", {"lognormal": {"median": 100, "sigma": 1}}, "reaches [0, inf]"),
    ("input_tokens", float("nan"), "input_tokens: fixed parameters must be finite"),
])
def test_stage_numbers_out_of_range_are_refused(field: str, value: object, says: str) -> None:
    """No silent clamping: a value a stage field cannot take is an error."""
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(spec({"name": "a", "agent": "A", field: value}))
    assert "stage 'a'" in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize(("data", "where"), [
    (spec({"name": "a", "agent": "A", "ouput_tokens": 3}), "stages.0.ouput_tokens"),
    (spec({"name": "a", "agent": "A"}, agents={"A": {"prefix_tokens": -5}}),
     "agents.A.prefix_tokens"),
    # a 10^20-token prefix with a budget to match kept the simulator prefilling forever
    (spec({"name": "a", "agent": "A"}, agents={"A": {"prefix_tokens": 10**20}}),
     "agents.A.prefix_tokens: Input should be less than or equal to 10000000"),
    (spec({"name": "a", "agent": "A", "history": "everything"}), "stages.0.history"),
    (spec({"name": "a", "agent": "A"}, agents={"A": {"prefix_tokens": "100"}}),
     "agents.A.prefix_tokens: Value error, expected a whole number of tokens, got the text "
     "'100' (write it without quotes)"),
    ({"name": "wf", "agents": {"A": {"prefix_tokens": 1}}, "stages": []}, "stages"),
    ({"name": "wf", "stages": [{"name": "a", "agent": "A"}]}, "agents"),
    ({"name": "wf", "agents": {"A": {"prefix_tokens": 1}}, "stages": [None]},
     "stages.0: Input should be a mapping (key: value)"),  # no class names of ours
])
def test_schema_errors_name_the_field(data: dict, where: str) -> None:
    with pytest.raises(WorkflowError) as err:
        workflow_from_dict(data, where="my.yaml")
    msg = str(err.value)
    assert msg.startswith("my.yaml: ")
    assert where in msg


SPEC = "name: wf\nagents: {A: {prefix_tokens: 1}}\nstages:\n"
SPEC_FILE_ERRORS = [  # (file, text, what the error says, from the file's name on)
    ("bad.yaml", SPEC + "  - {name: a, agent: Nobody}\n",
     r"bad\.yaml: workflow 'wf', stage 'a': unknown agent 'Nobody'"),
    ("cyc.yaml", SPEC + "  - {name: a, agent: A, after: [b]}\n"
                        "  - {name: b, agent: A, after: [a]}\n",
     r"cyc\.yaml: workflow 'wf': the stage graph has a cycle"),
    ("broken.yaml", "name: [unclosed\n", r"broken\.yaml: not valid YAML"),
    ("list.yaml", "- a\n- b\n", "must be a mapping"),
    ("quoted.yaml", SPEC + "  - {name: a, agent: A, output_tokens: '100'}\n",
     r"output_tokens: expected a number .*got the text '100' \(write it without quotes\)"),
    ("noclip.yaml", SPEC + "  - {name: a, agent: A, output_tokens: "
                           "{lognormal: {median: 100, sigma: 1}}}\n",
     r"values must lie in \[1, 1e\+07\], but \{\"lognormal\": \{\"median\": 100, "
     r"\"sigma\": 1\}\} reaches \[0, inf\]; give the lognormal clips within the range "
     r"\(low: 1, high: at most 1e\+07\)"),
    ("deep.json", "{\"name\": " + "[" * 5000 + "]" * 5000 + "}", r"deep\.json: nested too "
                                                                    "deeply to read"),
]


@pytest.mark.parametrize(("name", "text", "says"), SPEC_FILE_ERRORS)
def test_spec_file_errors_name_the_file(tmp_path: Path, name: str, text: str,
                                        says: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkflowError, match=says) as err:
        load_workflow(path)
    assert "\n" not in str(err.value)  # one line
    if name == "broken.yaml":  # at the file's line and column (not "<unicode string>")
        assert "unicode string" not in str(err.value)
        assert "line 2, column 1: while parsing a flow sequence" in str(err.value)


def test_yaml_exponents_are_numbers_as_in_json(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) reads `1e3` as text; a spec reads it as the number a
    user (and JSON) means, so the field's range applies to it."""
    path = tmp_path / "exp.yaml"
    path.write_text(SPEC + "  - {name: a, agent: A, output_tokens: 1e3, tool_wait_s: 2.5E1}\n")
    stage = load_workflow(path).stages["a"]
    assert stage.profile.output_tokens.mean() == 1000.0
    assert stage.profile.tool_wait_s.mean() == 25.0
    path.write_text(SPEC + "  - {name: a, agent: A, tool_wait_s: 1.0e12}\n")
    with pytest.raises(WorkflowError, match=r"tool_wait_s: values must lie in \[0, 1e\+09\]"):
        load_workflow(path)


def test_a_sampled_request_beyond_the_budget_names_the_workload() -> None:
    wf = workflow_from_dict(spec({"name": "a", "agent": "A"}))
    trace = generate_trace([wf], 1.0, 2, 0, name="mine")
    with pytest.raises(TraceError, match=r"^workload 'mine', workflow 'wf': sampled task 0, "
                                         r"stage 'a', round 0: needs .* or lower the stage's "
                                         r"sizes \(a prefix, or a distribution's high clip\)"):
        trace.check_fits(10)


def test_a_missing_spec_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError, match="cannot read workflow spec"):
        load_workflow(tmp_path / "missing.yaml")


def test_valid_spec_builds_the_dag(tmp_path: Path) -> None:
    path = tmp_path / "fork.yaml"
    path.write_text(
        "name: fork\nagents: {A: {prefix_tokens: 10}, B: {prefix_tokens: 20}}\nstages:\n"
        "  - {name: root, agent: A}\n"
        "  - {name: left, agent: B, after: [root]}\n"
        "  - {name: right, agent: B, after: [root]}\n"
        "  - {name: join, agent: A, after: [left, right]}\n")
    wf = load_workflow(path)
    assert wf.entry_stages == ("root",)
    assert wf.preds["join"] == ("left", "right")
    assert wf.depth == {"root": 0, "left": 1, "right": 1, "join": 2}
    assert not wf.is_chain
    assert wf.prefix_tokens("left") == 20


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_workloads_load_and_round_trip(name: str) -> None:
    builtin_present(name)
    wl = load_workload(name)
    assert wl.workflows and wl.operating_points
    for wf in wl.workflows:
        assert workflow_from_dict(workflow_to_dict(wf)) == wf


def test_unknown_workload_lists_the_builtins() -> None:
    with pytest.raises(TopasError) as err:
        load_workload("no-such-workload")
    assert all(name in str(err.value) for name in BUILTIN)


# --------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------


def test_sampling_carries_history_and_rounds() -> None:
    wf = workflow_from_dict(spec(
        {"name": "a", "agent": "A", "input_tokens": 100, "output_tokens": 30},
        {"name": "b", "agent": "B", "after": ["a"], "input_tokens": 50, "output_tokens": 20,
         "rounds": 3, "tool_wait_s": 1.5, "observation_tokens": 7, "history": "parents"},
        {"name": "c", "agent": "A", "after": ["b"], "input_tokens": 10, "output_tokens": 5,
         "history": "ancestors", "carry_rounds": False, "rounds": 2},
    ))
    task = sample_task(wf, 4, 2.5, np.random.default_rng(0))
    assert task.id == 4 and task.arrival == 2.5 and task.workflow == "wf"
    assert task.stages["a"] == (RoundSpec(100, 30, 0.0),)
    # b reads a's 30 output tokens; each later round carries 20 output + 7 observation
    assert task.stages["b"] == (RoundSpec(80, 20, 1.5), RoundSpec(107, 20, 1.5),
                                RoundSpec(134, 20, 0.0))
    # c reads all ancestors' outputs (30 + 3 x 20) and does not carry its rounds
    assert task.stages["c"] == (RoundSpec(100, 5, 0.0), RoundSpec(100, 5, 0.0))


def test_poisson_arrivals() -> None:
    wl = load_workload("chain3")
    t = np.array([task.arrival for task in trace_tasks(wl.workflows, 0.5, 400, 1)])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert 400 / t[-1] == pytest.approx(0.5, rel=0.2)
    for rate in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(TopasError, match="rate must be a finite number > 0"):
            next(trace_tasks(wl.workflows, rate, 5, 1))


def test_streamed_tasks_draw_every_gap_then_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """`trace_tasks` (the daemon's driver) yields `generate_trace`'s tasks: the
    seed draws every arrival gap, then every task's rounds, also when the gaps
    it skips span several chunks."""
    import workflows.trace as trace_mod

    monkeypatch.setattr(trace_mod, "ARRIVAL_CHUNK", 4)
    wl = load_workload("dag4")
    n = 11
    rng = np.random.default_rng(9)
    gaps = rng.exponential(1 / 2.0, size=n)
    gaps[0] = 0.0
    arrivals = np.round(np.cumsum(gaps), 6).tolist()
    expected = [sample_task(wl.workflows[0], i, arrivals[i], rng) for i in range(n)]
    assert list(trace_tasks(wl.workflows, 2.0, n, 9)) == expected
    assert generate_trace(wl.workflows, 2.0, n, 9).tasks == tuple(expected)


def test_generated_trace_is_seeded() -> None:
    wl = load_workload("chain3")
    a = generate_trace(wl.workflows, 0.2, 30, seed=5)
    b = generate_trace(wl.workflows, 0.2, 30, seed=5)
    c = generate_trace(wl.workflows, 0.2, 30, seed=6)
    assert a.tasks == b.tasks and a.tasks != c.tasks
    with pytest.raises(TopasError, match="at least 1"):
        generate_trace(wl.workflows, 0.2, 0, seed=5)


# --------------------------------------------------------------------------
# Trace round trip
# --------------------------------------------------------------------------


ALL_KINDS = spec(
    {"name": "a", "agent": "A", "input_tokens": {"uniform_int": [10, 90]},
     "output_tokens": {"lognormal": {"median": 40, "sigma": 0.5, "low": 5, "high": 200}}},
    {"name": "b", "agent": "B", "after": ["a"], "rounds": {"choice": [1, 2, 3]},
     "tool_wait_s": {"uniform": [0.1, 2.0]}, "observation_tokens": {"fixed": 12},
     "output_tokens": 34, "history": "parents"},
    {"name": "c", "agent": "A", "after": ["a", "b"], "history": "ancestors",
     "carry_rounds": False},
    name="kinds",
)


@pytest.mark.parametrize("name", [*BUILTIN, "all-kinds"])
def test_trace_round_trip(tmp_path: Path, name: str) -> None:
    if name == "all-kinds":
        workflows = (workflow_from_dict(ALL_KINDS),)
        meta_name = "kinds"
    else:
        builtin_present(name)
        workflows = load_workload(name).workflows
        meta_name = name
    trace = generate_trace(workflows, 0.3, 25, seed=11, name=meta_name)
    path = tmp_path / "t.jsonl"
    save_trace(trace, path)
    back = load_trace(path)
    assert back.tasks == trace.tasks
    assert dict(back.workflows) == dict(trace.workflows)
    assert dict(back.meta) == dict(trace.meta)
    # writing the loaded trace again gives the same bytes
    again = io.StringIO()
    write_trace(back, again)
    assert again.getvalue() == path.read_text()


def test_trace_lines_follow_the_documented_shape(tmp_path: Path) -> None:
    wf = workflow_from_dict(ALL_KINDS)
    trace = generate_trace([wf], 1.0, 3, seed=0)
    path = tmp_path / "t.jsonl"
    save_trace(trace, path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["type"] == "header"
    # nothing in it needs version 2: written as version 1, which older readers read
    assert lines[0]["format"] == TRACE_FORMAT and lines[0]["version"] == 1
    assert lines[0]["workload"] == "kinds" and lines[0]["tasks"] == 3
    assert lines[1] == {"type": "workflow", "spec": workflow_to_dict(wf)}
    for rec, task in zip(lines[2:], trace.tasks, strict=True):
        assert rec["type"] == "task" and rec["id"] == task.id and rec["arrival"] == task.arrival
        assert set(rec["stages"]) == {"a", "b", "c"}
        for v, rounds in rec["stages"].items():
            assert rounds == [[r.input_tokens, r.output_tokens, r.tool_wait_s]
                              for r in task.stages[v]]


def test_tasks_are_sorted_by_arrival_on_load() -> None:
    wf = workflow_from_dict(spec({"name": "a", "agent": "A"}))
    later = TaskRecord(0, "wf", 5.0, {"a": (RoundSpec(1, 1),)})
    sooner = TaskRecord(1, "wf", 1.0, {"a": (RoundSpec(1, 1),)})
    out = io.StringIO()
    write_trace(Trace({"wf": wf}, (later, sooner), {"workload": "wf"}), out)
    back = read_trace(out.getvalue().splitlines(keepends=True))
    assert [t.id for t in back.tasks] == [1, 0]


def test_trace_without_metadata_round_trips() -> None:
    wf = workflow_from_dict(spec({"name": "a", "agent": "A"}))
    out = io.StringIO()
    write_trace(Trace({"wf": wf}, (TaskRecord(0, "wf", 0.0, {"a": (RoundSpec(1, 1),)}),), {}),
                out)
    assert read_trace(out.getvalue().splitlines(keepends=True)).tasks[0].id == 0


# --------------------------------------------------------------------------
# Malformed traces: each error names the line
# --------------------------------------------------------------------------


def good_lines() -> list[str]:
    wf = workflow_from_dict(spec({"name": "a", "agent": "A"},
                                 {"name": "b", "agent": "B", "after": ["a"]}))
    trace = Trace({"wf": wf}, (
        TaskRecord(0, "wf", 0.0, {"a": (RoundSpec(10, 5),), "b": (RoundSpec(3, 4, 0.5),
                                                                RoundSpec(9, 4))}),
        TaskRecord(1, "wf", 2.0, {"a": (RoundSpec(10, 5),), "b": (RoundSpec(3, 4),)}),
    ), {"workload": "wf"})
    out = io.StringIO()
    write_trace(trace, out)
    return out.getvalue().splitlines(keepends=True)


def edit_task(lines: list[str], index: int, change) -> list[str]:
    rec = json.loads(lines[index])
    change(rec)
    return [*lines[:index], json.dumps(rec) + "\n", *lines[index + 1:]]


MALFORMED = {
    "truncated": (lambda ls: [*ls[:3], ls[3][: len(ls[3]) // 2]], 4, "not valid JSON"),
    # cut short with lines after it: the column is where this line ends, not 1
    "truncated-mid": (lambda ls: [*ls[:2], '{"type": "task", "id": 0, "arrival":\n', *ls[3:]],
                      3, "Expecting value at column 37"),
    "missing-field": (lambda ls: edit_task(ls, 2, lambda r: r.pop("arrival")), 3,
                      "lacks field 'arrival'"),
    "unknown-workflow": (lambda ls: edit_task(ls, 3, lambda r: r.update(workflow="nope")), 4,
                         "'nope'"),
    "duplicate-id": (lambda ls: edit_task(ls, 3, lambda r: r.update(id=0)), 4,
                     "appears twice (first on line 3)"),
    "deep-nesting": (lambda ls: [*ls[:3], ls[3].replace("{", '{"note": ' + "[" * 5000
                                                         + "]" * 5000 + ", ", 1)], 4,
                     "nested too deeply"),
    "huge-tokens": (lambda ls: edit_task(ls, 3, lambda r: r["stages"]["b"].__setitem__(
        0, [10**12, 4, 0])), 4, "beyond the 1e+07-token bound"),
    "header-without-version": (lambda ls: [ls[0].replace(', "version": 1', ""), *ls[1:]], 1,
                               f'lacks "version"; add "version": {TRACE_VERSION}'),
    "header-without-format": (lambda ls: [ls[0].replace(f'"format": "{TRACE_FORMAT}", ', ""),
                                          *ls[1:]], 1, 'the header lacks "format"'),
    "pretty-printed": (lambda ls: [json.dumps(json.loads(ls[0]), indent=2) + "\n", *ls[1:]],
                       1, "spread over several lines (pretty-printed)"),
    "json-array": (lambda ls: ["[" + ls[0].strip() + "]\n", *ls[1:]], 1,
                   "not a JSON array"),
    "wrong-stages": (lambda ls: edit_task(ls, 2, lambda r: r["stages"].pop("b")), 3,
                     "exactly the stages"),
    "bad-round": (lambda ls: edit_task(ls, 3, lambda r: r["stages"]["b"].__setitem__(
        0, [3, 0, 0])), 4, "stage 'b', round 0"),
    "negative-arrival": (lambda ls: edit_task(ls, 3, lambda r: r.update(arrival=-1)), 4,
                         "arrival a finite number >= 0"),
    "nan-arrival": (lambda ls: edit_task(ls, 3, lambda r: r.update(arrival=float("nan"))), 4,
                    "arrival a finite number >= 0"),
    "infinite-arrival": (lambda ls: edit_task(ls, 2, lambda r: r.update(arrival=float("inf"))),
                         3, "arrival a finite number >= 0"),
    "unknown-type": (lambda ls: [*ls, '{"type": "comment"}\n'], 5, "unknown record type"),
    "workflow-twice": (lambda ls: [*ls[:3], ls[1], *ls[3:]], 4,
                       "defined twice (first on line 2)"),
    "nan-wait": (lambda ls: edit_task(ls, 3, lambda r: r["stages"]["b"].__setitem__(
        0, [3, 4, float("nan")])), 4, "a finite number"),
    "workflow-not-a-name": (lambda ls: edit_task(ls, 2, lambda r: r.update(workflow=["x"])), 3,
                            "must be a name"),
    "header-twice": (lambda ls: [*ls, ls[0]], 5, "header must be the first line"),
    "header-missing": (lambda ls: ls[1:], 1, "header must be the first line"),
    "wrong-version": (lambda ls: [ls[0].replace('"version": 1', '"version": 99'), *ls[1:]], 1,
                      "version 99 is not supported"),
    "not-a-trace": (lambda ls: [ls[0].replace(TRACE_FORMAT, "csv"), *ls[1:]], 1,
                    "not a topasd trace"),
    "not-an-object": (lambda ls: [*ls[:2], "[1, 2]\n", *ls[2:]], 3, "'type' field"),
    "bad-spec": (lambda ls: [*ls[:1], ls[1].replace('"agent": "B"', '"agnt": "B"'), *ls[2:]], 2,
                 "agnt"),
    "workflow-without-spec": (lambda ls: [ls[0], '{"type": "workflow"}\n', *ls[2:]], 2,
                              "workflow record lacks field 'spec'"),
    "spec-not-an-object": (lambda ls: [ls[0], '{"type": "workflow", "spec": "x"}\n', *ls[2:]],
                           2, "'spec' must be an object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_trace_names_the_line(case: str) -> None:
    mutate, lineno, says = MALFORMED[case]
    lines = "".join(mutate(good_lines())).splitlines(keepends=True)
    with pytest.raises(TraceError) as err:
        read_trace(lines, "t.jsonl")
    msg = str(err.value)
    assert msg.startswith(f"t.jsonl:{lineno}:"), msg
    assert says in msg
    assert "\n" not in msg


def test_empty_trace_and_trace_without_tasks() -> None:
    with pytest.raises(TraceError, match="empty trace"):
        read_trace([], "t.jsonl")
    with pytest.raises(TraceError, match="no task records"):
        read_trace(good_lines()[:2], "t.jsonl")


def test_blank_lines_before_the_header_are_skipped() -> None:
    """docs/trace-format.md: blank lines are skipped, the first ones too."""
    assert read_trace(["\n", " \n", *good_lines()], "t.jsonl").tasks[1].line == 6


def test_a_spec_on_standard_input_gets_advice_it_can_follow() -> None:
    import yaml

    text = yaml.safe_dump(spec({"name": "a", "agent": "A"}))
    with pytest.raises(TraceError, match=r"^<stdin>:1: this looks like a workflow spec .*save "
                                         r"it to a file and pass --workload FILE"):
        read_trace(text.splitlines(keepends=True), "<stdin>")


def test_good_lines_parse() -> None:
    trace = read_trace(good_lines(), "t.jsonl")
    assert [t.id for t in trace.tasks] == [0, 1]
    assert trace.tasks[0].stages["b"][0] == RoundSpec(3, 4, 0.5)


def test_request_larger_than_budget_is_named() -> None:
    trace = read_trace(good_lines(), "t.jsonl")
    trace.check_fits(200 + 9 + 4)  # the largest request: prefix B 200 + 9 + 4
    with pytest.raises(TraceError) as err:
        trace.check_fits(200 + 9 + 4 - 1)
    msg = str(err.value)
    assert "task 0, stage 'b', round 1" in msg and "needs 213" in msg and "212" in msg


# --------------------------------------------------------------------------
# docs/trace-format.md stays true
# --------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "trace-format.md"


def doc_blocks(lang: str) -> list[str]:
    text = DOC.read_text()
    blocks, fence = [], f"```{lang}\n"
    while fence in text:
        text = text[text.index(fence) + len(fence):]
        blocks.append(text[:text.index("```")])
    return blocks


def test_doc_example_is_a_valid_trace() -> None:
    (example,) = doc_blocks("jsonl")
    trace = read_trace(example.splitlines(keepends=True), "example.jsonl")
    wf = trace.workflows["plan-act"]
    assert [t.id for t in trace.tasks] == [0, 1]
    # the example's rounds follow the sampler's rules the doc explains
    p = wf.stages["act"].profile
    for task in trace.tasks:
        plan_out = sum(r.output_tokens for r in task.stages["plan"])
        act = task.stages["act"]
        assert act[0].input_tokens == p.input_tokens.value + plan_out
        for prev, nxt in itertools.pairwise(act):
            assert nxt.input_tokens == (prev.input_tokens + prev.output_tokens
                                        + p.observation_tokens.value)
        assert act[-1].tool_wait_s == 0.0
    # written back, it is the same text
    out = io.StringIO()
    write_trace(trace, out)
    assert out.getvalue() == example


def test_doc_line_examples_parse() -> None:
    blocks = doc_blocks("json")
    header = json.loads(next(b for b in blocks if '"type": "header"' in b))
    task = json.loads(next(b for b in blocks if '"type":"task"' in b))
    assert header["format"] == TRACE_FORMAT and header["version"] == 1
    wf = workflow_from_dict(spec({"name": "a", "agent": "A"},
                                 {"name": "b", "agent": "B", "after": ["a"]},
                                 {"name": "c", "agent": "A", "after": ["b"]},
                                 name=task["workflow"]))
    lines = [json.dumps(header) + "\n",
             json.dumps({"type": "workflow", "spec": workflow_to_dict(wf)}) + "\n",
             json.dumps(task) + "\n"]
    assert read_trace(lines).tasks[0].stages["a"] == (RoundSpec(200, 300, 0.0),)


@pytest.mark.parametrize(("data", "says"), [
    ({"workflows": [spec({"name": "a", "agent": "A"})]}, "needs a name"),
    ({"name": "w", "workflows": []}, "non-empty list"),
    ({"name": "w", "workflows": [spec({"name": "a", "agent": "A"})],
      "operating_pionts": [0.1]}, "unknown key(s) ['operating_pionts']"),
    ({"name": "w", "workflows": [spec({"name": "a", "agent": "A"})],
      "operating_points": ["fast"]}, "operating_points must be a list of arrival rates"),
    ({"name": "w", "workflows": [spec({"name": "a", "agent": "A"}),
                                 spec({"name": "b", "agent": "B"})]}, "['wf'] used twice"),
    ({"name": "w", "workflows": [spec({"name": "a", "agent": "A"}), {"name": "x"}]},
     "workflows[1]"),
])
def test_a_bad_workload_of_several_workflows_is_one_clear_error(data: dict, says: str) -> None:
    with pytest.raises(WorkflowError) as err:
        workload_from_dict(data, "w.yaml")
    assert str(err.value).startswith("w.yaml") and says in str(err.value), str(err.value)


def test_files_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(WorkflowError, match=r"latin1\.yaml: not UTF-8 text"):
        load_workload(str(bad))
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"type": "header", "note": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not UTF-8 text \(byte 0xe9 at offset "
                                         r"31 of the file, column 32 of the line\)"):
        load_trace(trace)


# --------------------------------------------------------------------------
# Shared agents, time and id bounds, booleans, spec/trace mix-ups
# --------------------------------------------------------------------------


def two_workflows(size_1: int, size_2: int) -> dict:
    return {"name": "mix", "workflows": [
        spec({"name": "a", "agent": "A"}, agents={"A": {"prefix_tokens": size_1}}, name="w1"),
        spec({"name": "a", "agent": "A"}, agents={"A": {"prefix_tokens": size_2}}, name="w2"),
    ]}


def test_an_agent_with_two_prefix_sizes_is_refused_in_a_workload() -> None:
    with pytest.raises(WorkflowError) as err:
        workload_from_dict(two_workflows(100, 15000), "conf.yaml")
    msg = str(err.value)
    assert msg.startswith("conf.yaml, workflows[1]: agent 'A'"), msg
    assert "15000 in workflow 'w2'" in msg and "100 in workflow 'w1'" in msg
    wl = workload_from_dict(two_workflows(100, 100), "conf.yaml")  # one size: fine
    assert [wf.agents["A"].prefix_tokens for wf in wl.workflows] == [100, 100]


def workflow_line(data: dict) -> str:
    return json.dumps({"type": "workflow", "spec": data}) + "\n"


def test_an_agent_with_two_prefix_sizes_is_refused_in_a_trace() -> None:
    lines = good_lines()  # 'wf' on line 2 gives A 100
    other = spec({"name": "x", "agent": "A"}, agents={"A": {"prefix_tokens": 15000}}, name="w2")
    with pytest.raises(TraceError) as err:
        read_trace([*lines[:2], workflow_line(other), *lines[2:]], "t.jsonl")
    msg = str(err.value)
    assert msg.startswith("t.jsonl:3: agent 'A'"), msg
    assert "15000 in workflow 'w2'" in msg and "100 in workflow 'wf' (line 2)" in msg
    same = spec({"name": "x", "agent": "A"}, agents={"A": {"prefix_tokens": 100}}, name="w2")
    assert set(read_trace([*lines[:2], workflow_line(same), *lines[2:]]).workflows) == {
        "wf", "w2"}


BOUNDS = {
    "arrival-1e300": (lambda r: r.update(arrival=1e300), "at most 1e+09 s"),
    "arrival-1e17": (lambda r: r.update(arrival=1e17), "got 1e+17"),
    "arrival-just-above": (lambda r: r.update(arrival=1e9 + 1), "arrival"),
    "wait-1e300": (lambda r: r["stages"]["b"].__setitem__(0, [3, 4, 1e300]),
                   "round 0: tool_wait_s 1e+300 is beyond the 1e+09 s bound"),
    "huge-id": (lambda r: r.update(id=99999999999999999999999), "from -2**63 to 2**63-1"),
    "id-2**63": (lambda r: r.update(id=2**63), "got 9223372036854775808"),
    "id-below-2**63": (lambda r: r.update(id=-(2**63) - 1), "got -9223372036854775809"),
    "bool-id": (lambda r: r.update(id=True), "got true"),
    "bool-arrival": (lambda r: r.update(arrival=True), "got true"),
    "bool-round": (lambda r: r["stages"]["b"].__setitem__(0, [True, 10, 0]),
                   "round 0: expected [input_tokens >= 0"),
    "bool-wait": (lambda r: r["stages"]["b"].__setitem__(0, [3, 4, False]), "got [3, 4, false]"),
    "huge-int-wait": (lambda r: r["stages"]["b"].__setitem__(0, [3, 4, 10**400]),
                      "tool_wait_s 1000"),
}


@pytest.mark.parametrize("case", sorted(BOUNDS))
def test_out_of_bounds_and_boolean_task_fields_name_the_line(case: str) -> None:
    change, says = BOUNDS[case]
    with pytest.raises(TraceError) as err:
        read_trace(edit_task(good_lines(), 3, change), "t.jsonl")
    msg = str(err.value)
    assert msg.startswith("t.jsonl:4: ") and says in msg, msg


def test_the_largest_id_and_time_are_accepted() -> None:
    def largest(r: dict) -> None:
        r.update(id=2**63 - 1, arrival=1e9)
        r["stages"]["b"] = [[3, 4, 1e9], [3, 4, 0]]

    task = read_trace(edit_task(good_lines(), 3, largest)).tasks[-1]
    assert (task.id, task.arrival, task.stages["b"][0].tool_wait_s) == (2**63 - 1, 1e9, 1e9)


def test_a_boolean_version_or_prefix_is_refused() -> None:
    lines = good_lines()
    with pytest.raises(TraceError, match=r"^t\.jsonl:1: trace version true is not supported"):
        read_trace([lines[0].replace('"version": 1', '"version": true'), *lines[1:]], "t.jsonl")
    bad = lines[1].replace('"prefix_tokens": 100', '"prefix_tokens": true')
    with pytest.raises(TraceError, match=r"^t\.jsonl:2: agents\.A\.prefix_tokens: .*true"):
        read_trace([lines[0], bad, *lines[2:]], "t.jsonl")


def test_tool_waits_in_a_spec_are_bounded() -> None:
    with pytest.raises(WorkflowError, match=r"tool_wait_s: values must lie in \[0, 1e\+09\]"):
        workflow_from_dict(spec({"name": "a", "agent": "A", "tool_wait_s": 1e300}))
    with pytest.raises(WorkflowError, match=r"reaches \[0, inf\]"):  # an unclipped lognormal
        workflow_from_dict(spec({"name": "a", "agent": "A",
                                 "tool_wait_s": {"lognormal": {"median": 1, "sigma": 1}}}))


@pytest.mark.parametrize(("rate", "n"), [(1e-300, 3), (1e-320, 1), (1e-9, 3)])
def test_a_rate_too_small_for_the_time_bound_is_refused(rate: float, n: int) -> None:
    wl = load_workload("chain3")
    with pytest.raises(TopasError, match="beyond the 1e\\+09 s bound on arrival times"):
        generate_trace(wl.workflows, rate, n, seed=0)
    assert generate_trace(wl.workflows, 2.5e-9, 3, seed=0).tasks  # span 8e8 s: fine


def test_spec_errors_in_a_trace_have_the_documented_shape() -> None:
    """FILE:LINE: workflow 'NAME', stage ..., as docs/trace-format.md shows."""
    lines = good_lines()
    bad = lines[1].replace('"rounds": 1, "input_tokens": 256, "output_tokens": 256, '
                           '"tool_wait_s": 0, "observation_tokens": 0, "history": "none", '
                           '"carry_rounds": true}]',
                           '"rounds": 0, "input_tokens": 256, "output_tokens": 256, '
                           '"tool_wait_s": 0, "observation_tokens": 0, "history": "none", '
                           '"carry_rounds": true}]')
    assert bad != lines[1]
    with pytest.raises(TraceError) as err:
        read_trace([lines[0], bad, *lines[2:]], "t.jsonl")
    assert f"error: {err.value}\n" in DOC.read_text()
    assert str(err.value).startswith("t.jsonl:2: workflow 'wf', stage 'b', rounds: ")


def test_a_byte_order_mark_is_not_data(tmp_path: Path) -> None:
    lines = good_lines()
    path = tmp_path / "bom.jsonl"
    path.write_text("".join(lines), encoding="utf-8-sig")
    assert [t.id for t in load_trace(path).tasks] == [0, 1]
    assert [t.id for t in read_trace(["\ufeff" + lines[0], *lines[1:]]).tasks] == [0, 1]


@pytest.mark.parametrize("form", ["yaml", "yaml-comment", "json-pretty", "json-line",
                                  "yaml-blank-first"])
def test_a_spec_read_as_a_trace_is_named(tmp_path: Path, form: str) -> None:
    import yaml

    data = spec({"name": "a", "agent": "A"})
    text = {"yaml": yaml.safe_dump(data), "yaml-comment": "# mine\n" + yaml.safe_dump(data),
            "json-pretty": json.dumps(data, indent=2), "json-line": json.dumps(data),
            "yaml-blank-first": "\n" + yaml.safe_dump(data)}[form]
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert "this looks like a workflow spec (YAML or JSON), not a trace; use --workload " \
        f"{path}" in str(err.value), str(err.value)
    load_workload(str(path))  # and it is a good spec


def test_a_trace_read_as_a_spec_is_named(tmp_path: Path) -> None:
    for name, text in (("t.jsonl", "".join(good_lines())),
                       ("one.jsonl", good_lines()[0]),
                       ("bom.jsonl", "\ufeff" + "".join(good_lines()))):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(WorkflowError) as err:
            load_workload(str(path))
        assert str(err.value).startswith(f"{path}: this looks like a trace (JSON Lines with a "
                                         "header), not a workflow spec; pass it as TRACE_FILE")


def test_a_number_too_long_for_python_names_the_line() -> None:
    lines = good_lines()
    long_id = lines[3].replace('"id":1', '"id":' + "9" * 5000)
    assert long_id != lines[3]
    with pytest.raises(TraceError, match=r"^t\.jsonl:4: unreadable JSON number"):
        read_trace([*lines[:3], long_id], "t.jsonl")


def test_a_negative_task_id_still_loads(tmp_path: Path) -> None:
    """Task ids are any signed 64-bit integer (the trace format never asked
    for >= 0; only ids beyond SQLite's INTEGER are refused)."""
    tr = generate_trace(load_workload("chain3").workflows, 0.3, 2, seed=1, name="chain3")
    path = tmp_path / "t.jsonl"
    save_trace(tr, path)
    lines = path.read_text().splitlines()
    task = json.loads(lines[-1])
    task["id"] = -(2**63)
    lines[-1] = json.dumps(task)
    path.write_text("\n".join(lines) + "\n")
    assert sorted(t.id for t in load_trace(path).tasks) == [-(2**63), tr.tasks[0].id]
