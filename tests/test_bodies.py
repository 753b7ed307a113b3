"""Request bodies cost what their bounds allow: a body of millions of tiny
values is refused after a scan (the daemon's peak memory barely moves),
nesting past the bound is refused, a large body within the bounds is served."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.daemonkit import Daemon
from topasd.api.bodies import MAX_JSON_DEPTH, MAX_JSON_VALUES, TooDeep, TooManyValues, parse

MiB = 1024 * 1024


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (Linux: VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def chat(extra: dict | None = None, content: str = "hi") -> dict:
    return {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}],
            **(extra or {})}


def test_the_amplification_body_is_refused_at_the_cost_of_a_scan(tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        post = httpx.Client(base_url=d.url, timeout=120,
                            headers={"Content-Type": "application/json"})
        head = json.dumps(chat())[:-1].encode() + b', "padding": ['
        n = (16 * MiB - len(head) - 2) // 3
        body = head + b"{}," * (n - 1) + b"{}]}"  # 5.6 million {} in an unknown field
        assert len(body) <= 16 * MiB and n > 5_000_000
        before = peak_rss_mb(d.proc.pid)
        for _ in range(4):
            r = post.post("/v1/chat/completions", content=body)
            assert r.status_code == 413, r.text
            assert f"more than {MAX_JSON_VALUES:,} JSON values" in r.json()["error"]["message"]
            assert d.http.get("/health").status_code == 200
        grown = peak_rss_mb(d.proc.pid) - before
        assert grown < 150, f"peak memory grew {grown:.0f} MB"  # parsed: 549 MB for one
        deep = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + \
            b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}"
        r = post.post("/v1/chat/completions", content=deep)
        assert r.status_code == 400 and "nests 34 levels deep" in r.text  # the body's own too
        # large within the bounds: 90,000 values and a 4 MiB string, off the event loop
        fine = chat({"padding": [1] * 90_000, "note": "x" * (4 * MiB)})
        r = post.post("/v1/chat/completions", content=json.dumps(fine).encode())
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        # a string full of brackets and commas is one value, however it reads
        r = post.post("/v1/chat/completions",
                      content=json.dumps(chat(content="[{," * 200_000)).encode())
        assert r.status_code == 422 and "KV tokens" in r.text  # too long for the budget
        assert post.post("/v1/chat/completions", content=b'{"model": ').status_code == 400
        post.close()
        assert d.stop() == 0


@pytest.mark.parametrize(("body", "refusal"), [
    (b"[" + b"0," * MAX_JSON_VALUES + b"0]", TooManyValues),
    (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", TooDeep),
])
def test_the_shape_check_refuses_before_building_objects(body: bytes, refusal: type) -> None:
    with pytest.raises(refusal):
        parse(body)


@pytest.mark.parametrize("value", [
    {"s": 'quote \\" and \\\\ [{,,}] ' * 1000, "n": [[[1, 2], {"k": "v"}]] * 100},
    [],
    "text",
    {"deep": [[[[[[[[[[[]]]]]]]]]]]},
])
def test_bodies_within_the_bounds_parse_as_json_does(value: object) -> None:
    text = json.dumps(value).encode()
    assert parse(text) == json.loads(text)
