"""`stream: true` streams: keep-alive comments while a call waits, the role
chunk at its admission, its tokens as the engine makes them (in engine time
on the paced simulator; on vLLM as its steps produce them), usage last. Real
daemons over HTTP; token times checked against the decision log's
`prefill_end` (first token) and `request_finish` of the same request."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemonkit import Daemon
from topasd.daemon.calls import filler_text

GRANULARITY_S = 0.3  # a paced daemon's slice (0.1 s) + the stream's tick (0.05 s), doubled


def read_stream(url: str, body: dict[str, Any], out: list[tuple[float, str, Any]],
                stop_after: str | None = None) -> None:
    """POST a streamed call; append (wall time, kind, data) per SSE block:
    kind 'comment', 'role', 'text', 'finish', 'usage', 'done' or 'error'."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        buf = ""
        for piece in r.iter_text():
            buf += piece
            *blocks, buf = buf.split("\n\n")
            for block in blocks:
                out.append((time.monotonic(), *classify(block)))
                if out[-1][1] == stop_after:
                    return


def classify(block: str) -> tuple[str, Any]:
    if block.startswith(":"):
        return "comment", block
    data = block.removeprefix("data: ")
    if data == "[DONE]":
        return "done", None
    chunk = json.loads(data)
    if "error" in chunk:
        return "error", chunk["error"]
    if not chunk["choices"]:
        return "usage", chunk["usage"]
    choice = chunk["choices"][0]
    if choice["finish_reason"]:
        return "finish", chunk["topasd"]
    if "role" in choice["delta"]:
        return "role", None
    return "text", choice["delta"]["content"]


def token_times(db: Path, request_id: int, first: str = "prefill_end") -> tuple[float, float]:
    """(first token, finish) of a request in engine seconds, from the log: the
    first token at its `first` event."""
    conn = sqlite3.connect(db)
    try:
        rows = dict(conn.execute("SELECT kind, min(t) FROM engine_events WHERE request_id = ? "
                                 "AND kind IN (?, 'request_finish') GROUP BY kind",
                                 [request_id, first]).fetchall())
    finally:
        conn.close()
    return rows[first], rows["request_finish"]


def call_body(tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "You write." * 10},
                         {"role": "user", "content": "write"}], **extra}


def check_streamed(got: list[tuple[float, str, Any]], tokens: int) -> dict[str, Any]:
    """The chunks' order and content; the finish chunk's topasd fields."""
    kinds = [k for _, k, _ in got if k != "comment"]
    texts = [d for _, k, d in got if k == "text"]
    assert kinds[0] == "role" and kinds[-3:] == ["finish", "usage", "done"]
    assert set(kinds[1:-3]) == {"text"} and len(texts) >= 3, kinds
    assert "".join(texts) == filler_text(tokens)  # as the unstreamed reply's text
    (usage,) = [d for _, k, d in got if k == "usage"]
    assert usage["completion_tokens"] == tokens
    (meta,) = [d for _, k, d in got if k == "finish"]
    return meta  # type: ignore[no-any-return]


def test_tokens_stream_in_engine_time_on_the_simulator(tmp_path: Path) -> None:
    speed = 4.0
    with Daemon(tmp_path, speed=str(speed)) as d:
        got: list[tuple[float, str, Any]] = []
        read_stream(d.url, call_body(400), got)
        meta = check_streamed(got, 400)
        assert d.stop() == 0
    first, finish = token_times(d.db, meta["request_id"])
    texts = [t for t, k, _ in got if k == "text"]
    rest = (finish - first) / speed  # the decode of every token after the first, wall
    assert rest > 1.0  # long enough to tell streaming from one chunk at the end
    # an engine that was idle runs behind the clock and catches up faster than the
    # pace at first: at least half of the rest's wall time lies between the chunks
    assert texts[-1] - texts[0] >= rest / 2
    assert len(texts) >= rest / 0.5  # a chunk every half second at least


def test_a_waiting_call_gets_keep_alives_then_its_role_at_admission(tmp_path: Path) -> None:
    """Two calls of one agent that do not fit together: the second waits,
    hearing a comment every --stream-keepalive seconds, and gets its role chunk
    only once it is admitted, after the first finished."""
    with Daemon(tmp_path, "--budget", "700", "--stream-keepalive", "0.2",
                speed="8") as d:
        first: list[tuple[float, str, Any]] = []
        second: list[tuple[float, str, Any]] = []
        one = threading.Thread(target=read_stream, args=(d.url, call_body(400), first))
        one.start()
        d.wait_for(lambda s: s["counts"]["requests_running"] == 1)
        read_stream(d.url, call_body(400), second)
        one.join(60)
        assert d.stop() == 0
    check_streamed(first, 400)
    meta = check_streamed(second, 400)
    waits = [t for t, k, _ in second if k == "comment"]
    (role,) = [t for t, k, _ in second if k == "role"]
    first_done = next(t for t, k, _ in first if k == "done")
    assert len(waits) >= 2 and max(waits) < role  # comments while it waited, none after
    assert all("waiting for admission" in d for _, k, d in second if k == "comment")
    assert role >= first_done - GRANULARITY_S  # admitted once the first left
    assert meta["latency_s"] > 0


def test_a_client_that_leaves_mid_stream_takes_its_call_back(tmp_path: Path) -> None:
    with Daemon(tmp_path, speed="2") as d:
        got: list[tuple[float, str, Any]] = []
        read_stream(d.url, call_body(2000), got, stop_after="text")  # then hangs up
        st = d.wait_for(lambda s: s["counts"]["requests_withdrawn"] == 1)
        assert st["counts"]["requests_running"] == 0
        assert d.stop() == 0


def test_a_refused_streamed_call_is_an_http_error(tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        r = d.http.post("/v1/chat/completions", json=call_body(
            8, topasd={"task_id": "j", "workflow": "chain3", "stage": "zz"}))
        assert r.status_code == 422 and "no stage 'zz'" in r.json()["error"]["message"]
        assert d.stop() == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (pip install -e '.[dev,vllm]')")
def test_tokens_stream_as_vllm_makes_them(tmp_path: Path) -> None:
    """The tiny dummy-weight model on this CPU: the first token reaches the
    client before the last by at least the time vLLM took to decode the rest."""
    from backends.vllm import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny")
    with Daemon(tmp_path / "run", "--backend", "vllm", "--model-path", str(model),
                speed="1") as d:
        got: list[tuple[float, str, Any]] = []
        read_stream(d.url, call_body(256), got)
        meta = check_streamed(got, 256)
        assert d.stop() == 0
    first, finish = token_times(d.db, meta["request_id"])  # vLLM's clock: wall seconds
    texts = [t for t, k, _ in got if k == "text"]
    assert finish - first > 0.5  # decoding took long enough to tell
    assert texts[-1] - texts[0] >= (finish - first) - GRANULARITY_S
