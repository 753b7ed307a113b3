"""Start a throwaway `topasd start` daemon for a benchmark and wait until it is ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


def start_daemon(workdir: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """`topasd start --port 0 ... ARGS` in `workdir`, with its own runtime file and
    store; returns the process and its URL once `/ready` answers (60 s at most)."""
    runtime = workdir / "daemon.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPAS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "topasd.cli", "start", "--port", "0", *args,
         "--runtime-file", str(runtime), "--db", str(workdir / "bench.db"),
         "--log-level", "warning"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"topasd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            info = json.loads(runtime.read_text())
            if info.get("pid") == proc.pid and httpx.get(f"{info['url']}/ready").status_code == 200:
                return proc, info["url"]
        except (OSError, ValueError, httpx.HTTPError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("topasd did not start within 60 s")
