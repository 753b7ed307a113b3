"""The real SGLang 0.5.23 engine on this CPU, for the end-to-end tests here.

Run by the SGLang venv's pytest in a process of its own
(`.venv-sglang/bin/python -m pytest tests/sglang_engine`; the main suite
reaches them through tests/test_sglang_contract.py). Importing this file
(before anything imports SGLang) selects SGLang's CPU platform
(`SGLANG_USE_CPU_ENGINE=1`), one OpenMP thread per process (decode steps ~8x
faster on 2 shared cores) and puts the name-only `sgl_kernel` stand-in
(`stub/`) on the path of this process and of the processes SGLang spawns.
Nothing outside this directory sees the stand-in. Without SGLang installed
nothing here is collected. Facts: /work/shared/sglang-cpu/RECIPE.md.

Two engines serve the in-process tests: `engine` (one replica, SGLang's own
test switch forcing a retraction every RETRACT_EVERY decode steps, so the
retraction checks never pass vacuously) and, for test_hicache_dp.py,
`tiered_engine` (dp_size=2, HiCache's host pool, with the test-only patch of
its two CUDA-only calls in `hicache_cpu/`, docs/sglang.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / "stub"
HICACHE_CPU = Path(__file__).resolve().parent / "hicache_cpu"  # test-only HiCache plugin
POOL_TOKENS = 2048  # the KV pool of the shared engine (max_total_tokens)
TIER_POOL_TOKENS = 1024  # each replica's device pool in `tiered_engine`
RETRACT_EVERY = 20  # `engine`: SGLang retracts a decoding request every this many steps


def cpu_engine_env() -> dict[str, str]:
    """The environment SGLang's CPU engine needs here (for subprocesses too)."""
    path = [str(STUB), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": ":".join(dict.fromkeys(path))}


@contextmanager
def spawn_env(path: tuple[Path, ...] = (), **extra: str) -> Iterator[None]:
    """`extra` in the environment and `path` at the front of `sys.path` while
    an engine starts (SGLang's spawned processes inherit both: spawn copies
    the parent's `sys.path`), both as they were afterwards."""
    saved = {k: os.environ.get(k) for k in extra}
    saved_path = list(sys.path)
    os.environ.update(extra)
    sys.path[:0] = [str(p) for p in path]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tiered_env() -> dict[str, str]:
    """What `tiered_engine` adds to the environment: dp_size=2 on a CPU (no
    NCCL; one core per replica; RECIPE.md)."""
    return {"SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
            "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import pytest

    os.environ.update(cpu_engine_env())
    sys.path.insert(0, str(STUB))

    @pytest.fixture(scope="session")
    def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
        from backends.vllm.tiny import write_tiny_model

        return write_tiny_model(tmp_path_factory.mktemp("sglang") / "tiny")

    @pytest.fixture(scope="session")
    def engine(tiny_model: Path) -> Iterator[Any]:
        """One SGLang engine for the session's in-process tests (its start-up
        is 20-40 s): an `SGLangBackend` recording SGLang's replies; each user
        calls `reset()` before its run."""
        from backends.sglang import SGLangOptions
        from backends.sglang.backend import SGLangBackend
        from topasd.profiles import get_profile

        options = SGLangOptions(str(tiny_model), device="cpu", load_format="dummy",
                                page_size=1, max_total_tokens=POOL_TOKENS)
        profile = get_profile("small").with_overrides(budget_tokens=POOL_TOKENS)
        with spawn_env(SGLANG_TEST_RETRACT="1", SGLANG_TEST_RETRACT_INTERVAL=str(RETRACT_EVERY)):
            backend = SGLangBackend(options, profile, record=True)
        try:
            yield backend
        finally:
            backend.close()

    @pytest.fixture(scope="module")
    def tiered_engine(tiny_model: Path) -> Iterator[Any]:
        """Two SGLang replicas (dp_size=2), each with a TIER_POOL_TOKENS device
        pool and HiCache's host pool behind it (`direct` I/O, layer-first
        layout: the two functions `hicache_cpu` replaces; its plugin is found
        on the path of the processes this engine spawns, no other's)."""
        from backends.sglang import SGLangOptions
        from backends.sglang.backend import SGLangBackend
        from topasd.profiles import get_profile

        options = SGLangOptions(
            str(tiny_model), dp_size=2, device="cpu", load_format="dummy", page_size=1,
            max_total_tokens=TIER_POOL_TOKENS, enable_hierarchical_cache=True, hicache_ratio=4,
            extra={"hicache_io_backend": "direct", "hicache_mem_layout": "layer_first"})
        profile = get_profile("small").with_overrides(budget_tokens=TIER_POOL_TOKENS)
        with spawn_env((HICACHE_CPU,), **tiered_env()):
            backend = SGLangBackend(options, profile, record=True)
        try:
            yield backend
        finally:
            backend.close()
