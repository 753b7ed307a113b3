"""bench/external_calls.py: ChatDev's table of logged calls and ParrotServe's
MetaGPT token usage become call logs that `trace import` reads (a ChatDev
run a chain of its calls in order; a MetaGPT run its architect, then rounds
of files in parallel), each agent's prefix its shortest prompt; input that
is not the format named is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchkit import load_bench
from workflows.calllog import load_calls
from workflows.importer import import_calls

TABLE = """project,seq,time,speaker,assistant_role,phase,prompt_tokens,completion_tokens
calc_A,0,x,,,,172,198
calc_A,1,x,Chief Product Officer,Chief Product Officer,DemandAnalysis,618,4
calc_A,2,x,Programmer,Programmer,Coding,926,1432
calc_A,3,x,Programmer,Programmer,CodeComplete,1500,700
clock_B,1,x,Programmer,Programmer,Coding,900,800
clock_B,0,x,,,,180,150
"""


@pytest.fixture(scope="module")
def chatdev() -> Any:
    return load_bench("external_calls")


def _convert(chatdev: Any, tmp_path: Path, table: str, *extra: str,
             fmt: str = "chatdev", name: str = "calls.csv") -> Path:
    src, out = tmp_path / name, tmp_path / "calls.jsonl"
    src.write_text(table)
    chatdev.main([fmt, str(src), "-o", str(out), *extra])
    return out


def test_each_run_is_a_chain_of_its_calls_with_each_roles_prefix(chatdev: Any,
                                                                tmp_path: Path) -> None:
    out = _convert(chatdev, tmp_path, TABLE)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["agent"] for r in rows} == {"unattributed", "Chief_Product_Officer",
                                          "Programmer"}
    prefix = {r["agent"]: r["prefix_tokens"] for r in rows}
    # the officer made one call: no prefix to share
    assert prefix == {"unattributed": 172, "Chief_Product_Officer": 0, "Programmer": 900}
    trace = import_calls(load_calls(out), "chatdev", rate=0.1).trace
    assert len(trace.tasks) == 2
    b = next(t for t in trace.tasks if sum(len(r) for r in t.stages.values()) == 2)
    wf = trace.workflows[b.workflow]  # clock_B: its seq 0 call first, whatever the row order
    first = next(v for v in wf.topo_order if not wf.preds[v])
    assert wf.stages[first].agent == "unattributed"
    assert b.stages[first][0].input_tokens == 180 - 172  # prompt less the role's prefix


def test_no_prefix_gives_every_role_none(chatdev: Any, tmp_path: Path) -> None:
    out = _convert(chatdev, tmp_path, TABLE, "--prefix", "none")
    assert all("prefix_tokens" not in json.loads(line)
               for line in out.read_text().splitlines())


def test_a_metagpt_run_is_its_architect_then_rounds_of_parallel_files(
        chatdev: Any, tmp_path: Path) -> None:
    usage = [{"file": "run1", "round": "r0", "role": "noname", "prompt_tokens": 180,
              "completion_tokens": 700}]
    usage += [{"file": "run1", "round": f"r{k}", "role": f"f{j}.py",
               "prompt_tokens": 2000 + 100 * k + j, "completion_tokens": 100 * (j + 1)}
              for k in (1, 2) for j in range(3)]
    out = _convert(chatdev, tmp_path, json.dumps(usage), fmt="parrot-metagpt",
                   name="usage.json")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    prefix = {r["agent"]: r["prefix_tokens"] for r in rows}
    assert prefix == {"Architect": 0, "Engineer": 2100}  # one call: no prefix to share
    trace = import_calls(load_calls(out), "metagpt", rate=0.1).trace
    (task,) = trace.tasks
    wf = trace.workflows[task.workflow]
    assert [wf.stages[v].agent for v in wf.topo_order] == ["Architect", "Engineer",
                                                           "Engineer"]
    second = wf.topo_order[2]
    assert wf.preds[second] == (wf.topo_order[1],)
    assert [r.output_tokens for r in task.stages[second]] == [100, 200, 300]  # 3 branches
    with pytest.raises(SystemExit):
        _convert(chatdev, tmp_path, json.dumps([{**usage[0], "round": "final"}]),
                 fmt="parrot-metagpt", name="usage.json")


@pytest.mark.parametrize(("table", "message"), [
    ("project,seq,prompt_tokens\nA,0,10\n", "no column speaker, completion_tokens"),
    (TABLE.replace("1500,700", "1500,lots"), "calls.csv:5: seq, prompt_tokens, "
                                             "completion_tokens must be whole numbers"),
    (TABLE.replace("clock_B,0", ",0"), "calls.csv:7: the project (the run) is empty"),
])
def test_a_table_that_is_not_chatdevs_calls_is_named(chatdev: Any, tmp_path: Path, table: str,
                                                    message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        _convert(chatdev, tmp_path, table)
    assert err.value.code == 2
    assert message in capsys.readouterr().err
