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
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / "stub"
POOL_TOKENS = 2048  # the KV pool of the shared engine (max_total_tokens)


def cpu_engine_env() -> dict[str, str]:
    """The environment SGLang's CPU engine needs here (for subprocesses too)."""
    path = [str(STUB), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": ":".join(dict.fromkeys(path))}


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
        backend = SGLangBackend(options, profile, record=True)
        try:
            yield backend
        finally:
            backend.close()
