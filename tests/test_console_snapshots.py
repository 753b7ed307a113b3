"""Snapshots (pytest-textual-snapshot) of the console's main screens, on the
committed replay fixture at a fixed terminal size: the dashboard, the decision
candidates, a preemption explained at 160 columns, an opened task, the
parameter form, the help screen. Review changes with
`pytest tests/test_console_snapshots.py --snapshot-update` and the report.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.app import ConsoleApp
from console.screens.task import TaskScreen
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


def test_a_preemption_explained_at_160_columns(snap_compare: Any, app: ConsoleApp) -> None:
    """Decision 19 (preempts requests 17 and 18 of tasks 0 and 1, evicts D):
    the preempted requests by task, stage and agent, the sentence that the
    highest total wins, every score term in the candidate table."""

    async def focus_decision(pilot: Pilot[None]) -> None:
        await pilot.pause()  # the dashboard mounted
        app.goto_decision(19)
        await pilot.pause()

    assert snap_compare(app, press=["c"], run_before=focus_decision, terminal_size=(160, 48))


def test_an_opened_task(snap_compare: Any, app: ConsoleApp) -> None:
    """Task 0 at 40.8 s, found with `/` and opened with Enter: its stages, its
    requests (request 17 preempted once by decision 19) and their decisions."""

    async def opened(pilot: Pilot[None]) -> None:
        await pilot.press("t", "slash", "0", "enter", "enter")
        while not (isinstance(app.screen, TaskScreen) and app.screen.detail is not None):
            await pilot.pause()
        assert app.screen.task_id == 0

    assert snap_compare(app, run_before=opened, terminal_size=(160, 48))
