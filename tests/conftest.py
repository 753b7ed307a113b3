"""The suite runs the pure-Python scheduler: its tests subclass and patch
TOPAS's classes, which compiled classes do not allow. tests/test_native.py
builds the compiled search and checks it decides exactly as the pure one."""

import os
import shutil
from pathlib import Path

import pytest

os.environ["TOPASD_NATIVE"] = "0"  # before anything imports topasd.scheduler


@pytest.fixture
def console_db(tmp_path: Path) -> Path:
    """A copy of the committed replay fixture (tests/console_fixture.py): opening
    a log may migrate it or switch it to WAL."""
    from tests.console_fixture import FIXTURE

    path = tmp_path / "run.db"
    shutil.copy(FIXTURE, path)
    return path
