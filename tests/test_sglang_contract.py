"""Runs the SGLang contract tests (tests/sglang) in their own virtual environment,
`.venv-sglang` (SGLang 0.5.23 on the CPU; .ci/run creates it), and fails when they
fail. Skips only when that environment does not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-sglang" / "bin" / "python"


@pytest.mark.skipif(not VENV_PY.exists(), reason=(
    ".venv-sglang does not exist: create it as .ci/run does (torch 2.14.1, "
    "sglang 0.5.23 --no-deps, backends/sglang/requirements-cpu.txt) to run the "
    "SGLang contract tests"))
def test_sglang_contract_suite_passes() -> None:
    done = subprocess.run(
        [str(VENV_PY), "-m", "pytest", "tests/sglang", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"SGLang contract tests failed:\n{tail}"
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
    print(done.stdout.strip().splitlines()[-1], file=sys.stderr)
