"""bench/chatdev_calls.py: a table of ChatDev's logged calls becomes a call
log that `trace import` reads, each run a chain of its calls in order, each
role's prefix its shortest prompt; a table that is not one is named."""

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
    return load_bench("chatdev_calls")


def _convert(chatdev: Any, tmp_path: Path, table: str, *extra: str) -> Path:
    src, out = tmp_path / "calls.csv", tmp_path / "chatdev.jsonl"
    src.write_text(table)
    chatdev.main([str(src), "-o", str(out), *extra])
    return out


def test_each_run_is_a_chain_of_its_calls_with_each_roles_prefix(chatdev: Any,
                                                                tmp_path: Path) -> None:
    out = _convert(chatdev, tmp_path, TABLE)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["agent"] for r in rows} == {"unattributed", "Chief_Product_Officer",
                                          "Programmer"}
    prefix = {r["agent"]: r["prefix_tokens"] for r in rows}
    assert prefix == {"unattributed": 172, "Chief_Product_Officer": 618, "Programmer": 900}
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


@pytest.mark.parametrize(("table", "message"), [
    ("project,seq,prompt_tokens\nA,0,10\n", "no column speaker, completion_tokens"),
    (TABLE.replace("1500,700", "1500,lots"), "calls.csv:5: seq, prompt_tokens and "
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
