"""Runs the SGLang tests in their own virtual environment, `.venv-sglang` (SGLang
0.5.23 on the CPU; .ci/run creates it), and fails when they fail: the contract
tests (tests/sglang) and, in a process of their own (they select SGLang's CPU
platform before importing it), the end-to-end tests through the real engine
(tests/sglang_engine). Skips only when that environment does not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-sglang" / "bin" / "python"


NEEDS_VENV = pytest.mark.skipif(not VENV_PY.exists(), reason=(
    ".venv-sglang does not exist: create it as .ci/run does (torch 2.14.1, "
    "sglang 0.5.23 --no-deps, backends/sglang/requirements-cpu.txt) to run the "
    "SGLang tests"))


def _suite_passes(path: str) -> None:
    done = subprocess.run(
        [str(VENV_PY), "-m", "pytest", path, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"SGLang tests in {path} failed:\n{tail}"
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
    print(done.stdout.strip().splitlines()[-1], file=sys.stderr)


@NEEDS_VENV
def test_sglang_contract_suite_passes() -> None:
    _suite_passes("tests/sglang")


@NEEDS_VENV
def test_sglang_engine_suite_passes() -> None:
    """Replay, the daemon and its console, host-tier moves and dp_size=2
    through SGLang's real engine on this CPU (tests/sglang_engine)."""
    _suite_passes("tests/sglang_engine")
