"""The daemon's OpenAPI spec, fuzzed with schemathesis against the running
server: every operation (but the endless event stream, tested in
test_daemon.py) with generated valid and invalid data, a fixed seed. No 5xx,
responses that match the documented statuses, content types and schemas,
invalid data rejected; the daemon answers afterwards and still serves work.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.daemonkit import Daemon

CHECKS = ",".join((
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "use_after_free",
    "ensure_resource_availability",
))


def test_openapi_fuzz_finds_no_server_error_and_the_daemon_survives(tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        res = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{d.url}/openapi.json",
             "--checks", CHECKS, "--max-examples", "20", "--seed", "1", "--workers", "1",
             "--no-shrink", "--exclude-path", "/v1/events", "--request-timeout", "30",
             "--phases", "examples,coverage,fuzzing,stateful"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
        assert "Tested: 13" in res.stdout  # every operation but /v1/events ran
        assert httpx.get(f"{d.url}/health").json()["engine"] is True
        assert httpx.get(f"{d.url}/ready").status_code == 200
        r = d.http.post("/v1/tasks", json={"workflow": "chain3"})
        assert r.status_code == 201
        task = r.json()["id"]
        # (fuzzed calls may leave multi-stage tasks open, waiting for their next stage)
        d.wait_for(lambda s: d.http.get(f"/v1/tasks/{task}").json()["status"] == "done")
        assert d.stop() == 0
    assert "Traceback" not in d.log.read_text()
