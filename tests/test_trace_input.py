"""Bad trace input found by users, each pinned by its exact message: a line
too long (refused before it is read whole), a byte that is not UTF-8 deep in a
file, a truncated string; and what a replay reports: no prefix loads for an
agent without a prefix, every policy named by `replay --help`."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from backends.sim.engine import SimBackend
from tests.simkit import RecordingSink
from topasd.cli import main
from topasd.model import EventKind
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import ALL_POLICY_NAMES, make_policy
from workflows.lines import DEFAULT_MAX_LINE_BYTES
from workflows.spec import workflow_from_dict
from workflows.trace import TraceError, generate_trace, load_trace, save_trace

HEADER = '{"type": "header", "format": "topasd-trace", "version": 1}\n'
WORKFLOW = {"name": "w", "agents": {"Z": {"prefix_tokens": 0}, "A": {"prefix_tokens": 900}},
            "stages": [{"name": "a", "agent": "Z", "output_tokens": 60},
                       {"name": "b", "agent": "A", "after": ["a"], "output_tokens": 60,
                        "rounds": 2, "tool_wait_s": 1.5},
                       {"name": "c", "agent": "Z", "after": ["b"], "output_tokens": 30}]}


def small_trace(tmp_path: Path, tasks: int = 3) -> Path:
    path = tmp_path / "t.jsonl"
    save_trace(generate_trace([workflow_from_dict(WORKFLOW)], 2.0, tasks, 0), path)
    return path


def replay_error(*args: str) -> str:
    res = CliRunner().invoke(main, ["replay", *args, "-p", "fcfs", "-q"])
    assert res.exit_code == 2, res.output
    return res.output.strip()


def test_a_line_longer_than_the_bound_is_refused_with_its_line(tmp_path: Path) -> None:
    path = small_trace(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    longest = max(len(x.rstrip("\n").encode()) for x in lines)
    assert load_trace(path, max_line_bytes=longest).tasks  # a line at the bound is read
    limit = len(lines[2].rstrip("\n").encode()) - 1
    first = next(i for i, x in enumerate(lines, 1) if len(x.rstrip("\n").encode()) > limit)
    assert replay_error(str(path), "--max-line-bytes", str(limit)) == (
        f"error: {path}:{first}: line longer than {limit} bytes (reading stopped there); a "
        "trace line is far shorter, so the file is likely damaged or not a trace; if the "
        "line is real, raise --max-line-bytes")


def test_the_line_bound_counts_no_line_ending(tmp_path: Path) -> None:
    path = small_trace(tmp_path)
    text = path.read_text()
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    longest = max(len(x.encode()) for x in text.splitlines())
    assert load_trace(crlf, max_line_bytes=longest).tasks == load_trace(path).tasks


def test_max_line_bytes_needs_a_trace_file() -> None:
    assert replay_error("-w", "chain3", "--max-line-bytes", "10") == (
        "error: --max-line-bytes bounds the lines of TRACE_FILE; --workload reads no trace "
        "(drop it)")


def test_a_300_mb_line_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    round_ = b"[100,20,0.5],"
    chunk = round_ * (2**20 // len(round_))
    with open(path, "wb") as fh:  # streamed to disk: the test never holds the line
        fh.write(HEADER.encode() + b'{"type":"task","id":0,"workflow":"w","arrival":0,'
                 b'"stages":{"a":[')
        while fh.tell() < 300 * 10**6:
            fh.write(chunk)
        fh.write(b"[1,1,0]]}}\n")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as err:
            load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        f"{path}:2: line longer than {DEFAULT_MAX_LINE_BYTES} bytes (reading stopped there); "
        "a trace line is far shorter, so the file is likely damaged or not a trace; if the "
        "line is real, raise --max-line-bytes")
    assert peak < 200 * 2**20, f"peak {peak / 2**20:.0f} MiB while refusing the line"


def test_a_byte_that_is_not_utf8_is_named_by_its_offset_and_line(tmp_path: Path) -> None:
    path = small_trace(tmp_path, tasks=2000)
    data = bytearray(path.read_bytes())
    lines = data.split(b"\n")
    line = 1500
    at = sum(len(x) + 1 for x in lines[:line - 1]) + lines[line - 1].index(b'"workflow"') + 2
    data[at] = 0xE9  # 'w' of "workflow" becomes latin-1 'é'
    assert at > 100_000
    path.write_bytes(bytes(data))
    column = at - sum(len(x) + 1 for x in lines[:line - 1]) + 1
    assert replay_error(str(path)) == (
        f"error: {path}:{line}: not UTF-8 text (byte 0xe9 at offset {at} of the file, column "
        f"{column} of the line); a trace is UTF-8 text")


def test_a_byte_order_mark_counts_in_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b'{"type": "caf\xe9"}\n')
    with pytest.raises(TraceError) as err:
        load_trace(path)
    at = 3 + len(HEADER) + len('{"type": "caf')
    assert str(err.value) == (f"{path}:2: not UTF-8 text (byte 0xe9 at offset {at} of the "
                              "file, column 14 of the line); a trace is UTF-8 text")


def test_an_unterminated_string_says_at_column_once(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_text(HEADER + '{"type": "task", "workflow": "w\n')
    assert replay_error(str(path)) == (
        f"error: {path}:2: not valid JSON (Unterminated string starting at column 30); is the "
        "line truncated?")


def test_an_agent_without_a_prefix_counts_no_prefix_loads(tmp_path: Path) -> None:
    trace = load_trace(small_trace(tmp_path, tasks=60))
    profile = get_profile("qwen2.5-32b-a100").with_overrides(keep_evicted=True)
    sink = RecordingSink()
    backend = SimBackend(profile)
    Run(trace, make_policy("topas-paper"), backend, sink=sink).execute()
    moves = [ev for ev in sink.events if ev.kind in (EventKind.PREFIX_LOAD_START,
                                                     EventKind.PREFIX_COMPUTE_START)]
    assert any(ev.agent == "Z" for ev in moves)  # the policy did move the empty prefix
    loads = [ev for ev in moves if ev.kind is EventKind.PREFIX_LOAD_START]
    computes = [ev for ev in moves if ev.kind is EventKind.PREFIX_COMPUTE_START]
    assert backend.stats.prefix_loads == sum(ev.agent == "A" for ev in loads)
    assert backend.stats.prefix_computes == sum(ev.agent == "A" for ev in computes)


def test_replay_help_names_every_policy_of_the_registry() -> None:
    res = CliRunner().invoke(main, ["replay", "--help"], terminal_width=60)
    assert res.exit_code == 0
    words = set(re.findall(r"[\w-]+", res.output))
    assert "topas-paper" in words
    assert set(ALL_POLICY_NAMES) <= words, set(ALL_POLICY_NAMES) - words


def test_json_header_from_the_writer_still_parses(tmp_path: Path) -> None:
    """The bounded reader hands read_trace the same lines a text file would."""
    path = small_trace(tmp_path)
    first = json.loads(path.read_text().splitlines()[0])
    assert first["format"] == "topasd-trace"
    assert load_trace(path).meta == {"workload": "w", "rate": 2.0, "tasks": 3, "seed": 0}
