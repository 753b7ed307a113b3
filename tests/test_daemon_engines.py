"""`topasd start` on the real-engine backends: vLLM on this CPU (a tiny model
with dummy weights), and SGLang's configuration checks (its engine needs a GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

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
        # within the 16,384-token pool, beyond the tiny model's 8,192-token context:
        # refused up front, before the engine loop meets it at its stage
        long = httpx.post(f"{d.url}/v1/tasks", timeout=60, json={
            "workflow": "chain3", "stages": {"b": {"input_tokens": 5000, "output_tokens": 5}}})
        assert long.status_code == 422 and "max_model_len) is 8192" in long.text
        call = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 5,
            "messages": [{"role": "user", "content": "x" * 40_000}]})
        assert call.status_code == 422 and "max_model_len) is 8192" in call.text
        after = d.state()
        assert after["counts"]["tasks_in_flight"] == 0 and d.http.get("/ready").is_success
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


class PoolReportingEngine:
    """Stands in for sglang.Engine (no GPU here): keeps its scheduler's start-up
    report where the Engine does (`_scheduler_init_result`), finishes every
    generate call at once, and fails a test that runs the Engine's own event
    loop (`get_server_info`), which would strand SGLang's reply handler."""

    def __init__(self, pool: int | None) -> None:
        info = {} if pool is None else {"max_total_num_tokens": pool}
        self._scheduler_init_result = SimpleNamespace(scheduler_infos=[info])
        self.calls: list[dict[str, object]] = []

    def get_server_info(self) -> dict[str, object]:
        raise AssertionError("get_server_info runs the Engine's event loop: requests would hang")

    async def async_generate(self, **kwargs: object) -> dict[str, object]:
        self.calls.append(kwargs)
        return {"text": ""}

    def shutdown(self) -> None:
        return None


def _sglang_backend(tmp_path: Path, engine: PoolReportingEngine,
                    require_plugin: bool = False) -> object:
    from backends.sglang import SGLangOptions
    from backends.sglang.backend import SGLangBackend
    from topasd.profiles import get_profile

    return SGLangBackend(SGLangOptions("dummy"), get_profile("small"),
                         endpoint=f"ipc://{tmp_path}/link.sock", engine_factory=lambda o: engine,
                            require_plugin=require_plugin)


def _request(rid: int, input_tokens: int, output_tokens: int) -> object:
    from topasd.model import Request

    return Request(id=rid, task_id=rid, workflow="w", stage="s", agent="a", round=0,
                   input_tokens=input_tokens, output_tokens=output_tokens, ready_at=0.0,
                   task_arrival=0.0, prefix_tokens=40)


def test_the_sglang_backend_refuses_a_request_larger_than_the_engines_kv_pool(
        tmp_path: Path) -> None:
    """The pool is SGLang's own (sized from GPU memory), not the profile's; a
    request that cannot fit is refused at submit, naming the fix, and nothing
    reaches the engine."""
    from topasd.model import EventKind, TopasError

    engine = PoolReportingEngine(pool=300)
    backend = _sglang_backend(tmp_path, engine)
    try:
        assert backend.budget_tokens == 300  # type: ignore[attr-defined]
        with pytest.raises(TopasError, match=r"needs 301 KV tokens .* holds 300; raise "
                                             r"--mem-fraction"):
            backend.submit(_request(1, input_tokens=61, output_tokens=200))  # type: ignore
        backend.submit(_request(2, input_tokens=60, output_tokens=200))  # type: ignore
        kinds = [ev.kind for ev in backend.run_until(backend.t + 0.3)]  # type: ignore
    finally:
        backend.close()  # type: ignore[attr-defined]
    assert kinds.count(EventKind.REQUEST_READY) == 1
    assert [c["rid"] for c in engine.calls] == ["topasd-2."]


def test_without_a_reported_pool_the_sglang_backend_uses_the_profiles(tmp_path: Path) -> None:
    from topasd.profiles import get_profile

    backend = _sglang_backend(tmp_path, PoolReportingEngine(pool=None))
    try:
        assert backend.budget_tokens == get_profile("small").budget_tokens  # type: ignore
    finally:
        backend.close()  # type: ignore[attr-defined]


def test_the_daemon_checks_fits_against_the_engines_pool(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With SGLang the daemon's fit checks (API calls, driven tasks) use the
    pool the engine reports; a --budget below it stays."""
    from backends.base import EngineLimits
    from topasd.config import load_settings
    from topasd.daemon import engine, service
    from topasd.profiles import get_profile

    small = get_profile("small")
    assert engine.engine_profile(small, EngineLimits(), None) is small  # no pool reported
    for budget, pool, want in [(None, 300, 300), (200, 300, 200), (500, 300, 300)]:
        got = engine.engine_profile(small, EngineLimits(pool_tokens=pool), budget)
        assert got.budget_tokens == want
    # vLLM's pool is the --budget rounded up to whole blocks, all of it the engine's:
    # a call that fits 1,024 tokens was refused against the 1,000 asked for
    vllm_like = EngineLimits(pool_tokens=1024, pool_from_budget=True)
    assert engine.engine_profile(small, vllm_like, 1000).budget_tokens == 1024

    backend = _sglang_backend(tmp_path, PoolReportingEngine(pool=300))
    monkeypatch.setattr(engine, "make_backend", lambda settings, profile: backend)
    loaded = load_settings({"backend": "sglang", "model_path": "m", "profile": "small",
                            "db": str(tmp_path / "d.db")}, environ={})
    svc = service.Service(loaded.settings)
    try:
        assert svc.profile.budget_tokens == 300
        # /v1/state between decisions (SGLang's view exists only while one is due): the
        # engine's pool and no queues before any scheduler reported
        state = svc._cmd_state(5)
        assert state["budget"]["tokens"] == 300 and state["running"] == state["waiting"] == {}
    finally:
        svc.store.close()
        backend.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("option", "value", "why"), [
    ("enable_dp_attention", True, "attention-DP ranks hold different queues"),
    ("pp_size", 2, "every pipeline stage would ask the daemon"),
    ("enable_priority_scheduling", True, "re-sort TOPAS's admission order"),
    ("schedule_policy", "lpm", "TOPAS orders admissions itself"),
    ("speculative_algorithm", "EAGLE", "keys the radix cache differently"),
])
def test_sglang_options_the_adapter_cannot_serve_are_refused(option: str, value: object,
                                                              why: str) -> None:
    """An SGLang option that would make SGLang's scheduler (or its ranks)
    disagree with TOPAS's decisions is refused up front, naming it and why."""
    from backends.sglang import SGLangOptions
    from topasd.model import TopasError

    with pytest.raises(TopasError, match=rf"SGLang option {option}=.* not supported .*{why}"):
        SGLangOptions("m", extra={option: value})
    default = {"pp_size": 1, "schedule_policy": "fcfs"}.get(option)
    same = SGLangOptions("m", extra={option: default})
    assert same.server_args()["schedule_policy"] == "fcfs"


def test_the_sglang_backend_stops_when_sglang_schedules_without_the_plugin(
        tmp_path: Path) -> None:
    """A request SGLang finishes before its scheduler ever asked the daemon
    means the topasd plugin is not loaded in SGLang's scheduler (SGLang ran
    its own FCFS): the backend stops with the fix instead of logging a run
    TOPAS never scheduled. Once the scheduler has spoken, finishes are fine."""
    from backends.sglang.channel import LeaderChannel
    from topasd.model import EventKind, TopasError

    backend = _sglang_backend(tmp_path, PoolReportingEngine(pool=300), require_plugin=True)
    try:
        backend.submit(_request(1, input_tokens=10, output_tokens=4))  # type: ignore
        with pytest.raises(TopasError, match=r"without its scheduler ever asking topasd: the "
                                             r"topasd plugin is not loaded .*SGLANG_PLUGINS"):
            list(backend.run_until(backend.t + 0.5))  # type: ignore[attr-defined]
    finally:
        backend.close()  # type: ignore[attr-defined]
    backend = _sglang_backend(tmp_path, PoolReportingEngine(pool=300), require_plugin=True)
    leader = LeaderChannel(backend.endpoint, replica=0, timeout_s=5)  # type: ignore
    try:  # the plugin's scheduler asks at its first pass (the backend answers None)
        asking = threading.Thread(target=leader.decide, args=(1, None, []))
        asking.start()
        while asking.is_alive():
            list(backend.run_until(backend.t + 0.05))  # type: ignore[attr-defined]
        backend.submit(_request(2, input_tokens=10, output_tokens=4))  # type: ignore
        kinds = [ev.kind for ev in backend.run_until(backend.t + 0.3)]  # type: ignore
    finally:
        leader.close()
        backend.close()  # type: ignore[attr-defined]
    assert EventKind.REQUEST_FINISH in kinds
