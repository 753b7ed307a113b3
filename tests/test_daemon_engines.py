"""`topasd start` on the real-engine backends: vLLM on this CPU (a tiny model
with dummy weights), and SGLang's configuration checks (its engine needs a GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from store import queries as q
from tests.daemonkit import Daemon, clean_env

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install -e '.[dev,vllm]')")


def tiny_model(tmp_path: Path) -> Path:
    from backends.vllm import write_tiny_model

    return write_tiny_model(tmp_path / "tiny")


@needs_vllm
def test_the_daemon_serves_a_workload_and_an_openai_call_through_vllm(tmp_path: Path) -> None:
    model = tiny_model(tmp_path)
    with Daemon(tmp_path / "run", "--backend", "vllm", "--model-path", str(model),
                "--workload", "chain3", "--rate", "2", "--tasks", "4",
                speed="1") as d:
        st = d.wait_for(lambda s: s["stats"]["tasks_finished"] >= 4, timeout=120)
        reply = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 7,
            "messages": [{"role": "system", "content": "You are a terse helper."},
                         {"role": "user", "content": "hello"}]}).json()
        assert d.stop() == 0
    assert st["policy"] == "topas" and st["counts"]["driver_rejected"] == 0
    assert reply["usage"]["completion_tokens"] == 7  # exact output length, real engine
    with d.store() as store:
        assert store.integrity() == "ok"
        run = q.get_run(store.db)
        assert run.status == "done" and run.backend == "vllm"
        tasks = q.tasks(store.db, run.id)
        assert sum(1 for t in tasks if t.jct is not None) == 5  # 4 driven + the call
        assert q.counts(store.db, run.id)["decisions"] == run.decisions > 0


@pytest.mark.parametrize(("args", "says"), [
    (["--backend", "vllm"], "needs a model: --model-path"),
    (["--backend", "sglang"], "needs a model: --model-path"),
    (["--backend", "sglang", "--model-path", "m", "--speed", "4"], "runs in real time"),
    (["--model-path", "m"], "needs --backend vllm or sglang"),
])
def test_real_engine_settings_are_checked_before_anything_starts(
        tmp_path: Path, args: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "topasd.cli", "start", "--port", "0", *args],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]


def test_sglang_options_reach_the_engine_arguments() -> None:
    from topasd.config import load_settings

    loaded = load_settings({"backend": "sglang", "model_path": "Qwen/Qwen2.5-7B-Instruct",
                            "tp_size": 2, "dp_size": 2, "mem_fraction": 0.8,
                            "hicache": True, "hicache_size": 40}, environ={})
    s = loaded.settings
    from backends.sglang import SGLangOptions

    args = SGLangOptions(model_path=str(s.model_path), tp_size=s.tp_size, dp_size=s.dp_size,
                         mem_fraction_static=s.mem_fraction,
                         enable_hierarchical_cache=s.hicache,
                         hicache_size=s.hicache_size).server_args()
    assert args["tp_size"] == 2 and args["dp_size"] == 2
    assert args["mem_fraction_static"] == 0.8 and args["hicache_size"] == 40
    assert args["enable_hierarchical_cache"] is True and args["schedule_policy"] == "fcfs"
