"""Token hygiene of a real daemon: off loopback every read of the daemon's data
needs the token too (unless --public-reads), probes stay open; the token comes
from a file or the environment, one on the command line is warned of and kept
out of a detached daemon's command line; query strings never reach the log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.daemonkit import Daemon, clean_env

TOKEN = "a-token-of-more-than-16-chars"
READS = ("/v1/state", "/v1/events?since=0&max_events=1", "/v1/params", "/v1/models", "/metrics",
         "/v1/tasks/1", "/v1/decisions/1")


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "topasd.cli", *args], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=120)


def test_off_loopback_reads_need_the_token_and_probes_do_not(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--host", "0.0.0.0", "--token-file", str(token_file(tmp_path)),
                "--workload", "chain3", "--rate", "1", "--tasks", "2", token=TOKEN) as d:
        plain = httpx.Client(base_url=d.url, timeout=30)
        for path in READS:
            r = plain.get(path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
            assert "Authorization: Bearer" in r.json()["error"]["message"]
            r = plain.get(path, headers={"Authorization": "Bearer not-the-token"})
            assert r.status_code == 403, path
        for path in ("/health", "/ready", "/docs", "/openapi.json"):
            assert plain.get(path).status_code == 200, path
        d.wait_for(lambda st: st["counts"]["tasks_finished"] == 2)  # d.http sends the token
        for path in READS:
            assert d.http.get(path).status_code == 200, path
        spec = plain.get("/openapi.json").json()
        assert "401" in spec["paths"]["/v1/state"]["get"]["responses"]
        assert "401" not in spec["paths"]["/health"]["get"]["responses"]
        # `topasd status` sends the token it is given (a file, or TOPAS_TOKEN)
        lookup = ["status", "--runtime-file", str(d.runtime)]
        res = cli(*lookup)
        assert res.returncode == 2 and "answered GET /v1/state with 401" in res.stderr
        assert "--token-file FILE or TOPAS_TOKEN" in res.stderr
        res = cli(*lookup, "--token-file", str(token_file(tmp_path)))
        assert res.returncode == 0 and f"running: {d.url}" in res.stdout, res.stderr
        res = cli(*lookup, env=clean_env(TOPAS_TOKEN=TOKEN))
        assert res.returncode == 0, res.stderr
        plain.close()
        assert d.stop() == 0


def test_public_reads_open_the_reads_and_mutations_still_need_the_token(
        tmp_path: Path) -> None:
    with Daemon(tmp_path, "--host", "0.0.0.0", "--public-reads",
                env=clean_env(TOPAS_TOKEN=TOKEN)) as d:
        for path in ("/v1/state", "/v1/params", "/metrics"):
            assert d.http.get(path).status_code == 200, path
        assert d.http.post("/v1/tasks", json={"workflow": "chain3"}).status_code == 401
        r = d.http.post("/v1/tasks", json={"workflow": "chain3"},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201
        assert d.stop() == 0


def test_a_token_on_the_command_line_is_warned_of_and_kept_off_a_detached_ones(
        tmp_path: Path) -> None:
    runtime = tmp_path / "rt.json"
    res = cli("start", "--detach", "--port", "0", "--speed", "max", "--token", TOKEN,
              "--runtime-file", str(runtime), "--db", str(tmp_path / "d.db"),
              "--log-file", str(tmp_path / "d.log"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("warning: the bearer token is on the command line")
    pid = json.loads(runtime.read_text())["pid"]
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"topasd.cli\x00start" in cmdline and TOKEN.encode() not in cmdline
        r = httpx.post(json.loads(runtime.read_text())["url"] + "/v1/tasks",
                       json={"workflow": "chain3"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201  # the daemon has the token all the same
        assert "warning" not in (tmp_path / "d.log").read_text()  # not on its command line
        stop = cli("stop", "--runtime-file", str(runtime))
        assert stop.returncode == 0, stop.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    res = cli("start", "--print-config", "--token-file", str(token_file(tmp_path)), cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "" and TOKEN not in res.stdout


def test_query_strings_never_reach_the_access_log(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--log-level", "debug") as d:
        assert d.http.get("/v1/state", params={"token": "hunter2-secret"}).status_code == 200
        assert d.http.get("/health?key=hunter2-secret").status_code == 200
        assert d.http.get("/nowhere?key=hunter2-secret").status_code == 404
        assert d.stop() == 0
    log = d.log.read_text()
    assert '"GET /v1/state HTTP/1.1" 200' in log and '"GET /nowhere HTTP/1.1" 404' in log
    assert "hunter2" not in log
