"""Snapshots (pytest-textual-snapshot) of the console's main screens, on the
committed replay fixture at a fixed terminal size: the dashboard, the decision
candidates, the parameter form, the help screen. Review changes with
`pytest tests/test_console_snapshots.py --snapshot-update` and the report.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from console.app import ConsoleApp
from console.sources import ReplaySource
from tests.console_fixture import FIXTURE

SIZE = (150, 45)


@pytest.fixture
def app(tmp_path: Path) -> ConsoleApp:
    path = tmp_path / "console_run.db"  # the file name shows in the title
    shutil.copy(FIXTURE, path)
    return ConsoleApp(replay=ReplaySource(path), at=40.8)


def test_dashboard(snap_compare: Any, app: ConsoleApp) -> None:
    assert snap_compare(app, terminal_size=SIZE)


def test_dashboard_candidates_focused(snap_compare: Any, app: ConsoleApp) -> None:
    assert snap_compare(app, press=["full_stop", "full_stop", "c"], terminal_size=SIZE)


def test_parameters(snap_compare: Any, app: ConsoleApp) -> None:
    assert snap_compare(app, press=["p"], terminal_size=SIZE)


def test_help(snap_compare: Any, app: ConsoleApp) -> None:
    assert snap_compare(app, press=["question_mark"], terminal_size=SIZE)


def test_dashboard_on_a_small_terminal(snap_compare: Any, app: ConsoleApp) -> None:
    """80x24: no trend lines, the KV line on one line, the agents that fit in the
    Residency panel and a count of the others (not drawn under the Decisions)."""
    assert snap_compare(app, terminal_size=(80, 24))
