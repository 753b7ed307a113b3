"""Finding a task in the console: `/` filters the tasks table, j/k move,
Enter opens the task (stages, requests, the decisions that admitted or
preempted them), Enter on a decision goes to it. On the committed replay
fixture and on a live daemon, through Pilot; late judged per workflow."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from console.app import ConsoleApp
from console.screens.task import TaskScreen
from console.snapshot import LATE_SLACK, Snapshot, TaskRow
from console.sources import ReplaySource, Target
from console.widgets.decisions import DecisionDetailView
from console.widgets.tasks import TaskList
from store import queries as q
from tests.daemonkit import Daemon
from tests.test_console_live import until

SIZE = (160, 48)


@pytest.fixture
def db(console_db: Path) -> Path:
    return console_db


def test_filter_move_open_a_task_and_go_to_its_decision(db: Path) -> None:
    async def main() -> None:
        app = ConsoleApp(replay=ReplaySource(db), at=60.0)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            tasks = app.dashboard.query_one(TaskList)
            every = tasks.task_ids()
            assert len(every) >= 3
            await pilot.press("t", "slash")
            box = app.dashboard.query_one("#task-filter", Input)
            assert box.display and box.has_focus
            target = every[-1]
            await pilot.press(*str(target), "enter")
            await pilot.pause()
            assert tasks.has_focus and not box.display
            assert all(str(target) in str(i) for i in tasks.task_ids())
            assert f"match /{target}" in str(tasks.border_title)
            await pilot.press("slash", "escape")  # cleared: every task again
            await pilot.pause()
            assert tasks.task_ids() == every and tasks.filter_text == ""
            await pilot.press("j", "j", "k")
            assert tasks.cursor == 1
            chosen = tasks.task_ids()[1]
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, TaskScreen), "the task screen")
            screen = app.screen
            assert isinstance(screen, TaskScreen) and screen.detail is not None
            want = q.task_at(app.replay.store.db, app.replay.run.id,  # type: ignore[union-attr]
                             chosen, 60.0)
            assert want is not None
            reqs = screen.query_one("#task-requests", DataTable)
            assert reqs.row_count == len(want["requests"]) > 0
            decisions = screen.query_one("#task-decisions", DataTable)
            seqs = sorted(d["seq"] for r in want["requests"] for d in r["decisions"])
            assert decisions.row_count == len(seqs) > 0
            await pilot.press("enter")  # the first decision: the cursor on it
            await pilot.pause()
            assert app.screen is app.dashboard and app.cursor_seq == seqs[0]

    asyncio.run(main())


def test_late_is_judged_against_the_tasks_own_workflow() -> None:
    """A long workflow's healthy task is not late at an age past the short
    workflow's p99; a short one stuck far past its own p99 is."""
    groups = {"long": q.GroupStats(10, 300.0, {}), "short": q.GroupStats(10, 5.0, {"s": (10, 2.0)})}

    def task(workflow: str, age: float, since: tuple[tuple[str, float], ...] = ()) -> TaskRow:
        return TaskRow(1, workflow, 0.0, age, 0, 2, (), (), None, stage_since=since)

    snap = Snapshot(t=100.0, budget=None, kv_prefixes=0, kv_requests=0, agents=(), tasks=(),
                    numbers=None, tasks_in_flight=0, requests_running=0,  # type: ignore[arg-type]
                    requests_waiting=0, decisions=0, policy="topas", groups=groups)
    assert snap.late_reason(task("long", 100.0)) is None
    assert snap.late_reason(task("long", 300.0 * (1 + LATE_SLACK) + 1)) is not None
    assert snap.late_reason(task("short", 4.0)) is None
    assert "short's p99 5 s" in (snap.late_reason(task("short", 60.0)) or "")
    stuck = task("short", 3.0, (("s", 97.0),))  # its stage s runs for 3 s, p99 2 s
    assert "stage s" in (snap.late_reason(stuck) or "")
    few = Snapshot(**{**{f: getattr(snap, f) for f in snap.__slots__},  # type: ignore[attr-defined]
                      "groups": {"short": q.GroupStats(4, 5.0, {})}})
    assert few.late_reason(task("short", 60.0)) is None  # 4 finished: too few to judge


def test_a_live_task_found_by_its_client_id_opens_with_its_decisions(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--grace", "0", speed="1") as d:
        for stage in ("a", "b"):
            r = d.http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "go"}],
                "topasd": {"task_id": "job-7", "workflow": "chain3", "stage": stage}})
            assert r.status_code == 200
        for _ in range(3):
            d.http.post("/v1/tasks", json={"workflow": "dag4"})

        async def main() -> None:
            app = ConsoleApp(Target(d.url), poll_s=0.1, render_s=0.05)
            async with app.run_test(size=SIZE) as pilot:
                tasks = app.dashboard.query_one(TaskList)
                await until(pilot, lambda: tasks.row_count == 4, "four tasks")
                await pilot.press("t", "slash", *"job-7", "enter")
                await until(pilot, lambda: tasks.row_count == 1, "the filtered task")
                assert "job-7" in str(tasks.cells(0)[1])
                await pilot.press("enter")
                await until(pilot, lambda: isinstance(app.screen, TaskScreen)
                            and app.screen.detail is not None, "the task")
                screen = app.screen
                assert isinstance(screen, TaskScreen) and screen.detail is not None
                assert screen.detail.client_id == "job-7"
                assert [r.stage for r in screen.detail.requests or ()] == ["a", "b"]
                decisions = screen.query_one("#task-decisions", DataTable)
                assert decisions.row_count == 2  # each request's admission
                first = screen.detail.decisions()[0][0]
                view = app.dashboard.query_one(DecisionDetailView)
                await pilot.press("enter")
                # the candidates of the feed's newest decision may have loaded before the
                # key (the feed follows): wait for the key's own, the task's first decision
                await until(pilot, lambda: view.detail is not None
                            and view.detail.row.seq == first, f"decision {first}")
                assert not app.dashboard.feed().follow  # the feed leaves it shown

        asyncio.run(main())
        assert d.stop() == 0


def test_a_tasks_row_shows_what_rich_makes_of_its_cells() -> None:
    """The tasks table builds a row's segments itself; they show what Rich's
    `Text` makes of the same cells, cut to the column less one ('…'), padded to
    it, styled (late in red, the progress bar), control codes dropped, at
    both widths' columns."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from rich.text import Text

    from console.widgets.tasks import COLUMNS, NARROW, WIDE, _Look, task_cells, task_runs

    snap = Snapshot(t=100.0, budget=None, kv_prefixes=0, kv_requests=0, agents=(), tasks=(),
                    numbers=None, tasks_in_flight=0, requests_running=0,  # type: ignore[arg-type]
                    requests_waiting=0, decisions=0, policy="topas",
                    groups={"dag4": q.GroupStats(10, 5.0, {})})
    rows = [TaskRow(7, "dag4", 99.0, 1.0, 1, 4, ("b",), ("c",), 0.5),
            TaskRow(123456789, "dag4", 0.0, 700.0, 120, 130, ("a", "b", "c", "d", "e"), ("f",),
                    None, client_id="a-very-long-client-id\x1b[31m"),
            TaskRow(3, "dag4-with-a-long-name", 40.0, 60.0, 0, None, (), ("x",), 12.0,
                    client_id="日本語のクライアント")]
    assert [snap.late(r) for r in rows] == [False, True, False]
    console = Console(width=200, color_system="truecolor")
    row_style = Style(color="white", bgcolor="#202020")
    for columns in (WIDE, NARROW):
        look = _Look(row_style, Style(), Style(), columns)
        for r in rows:
            text = Text(no_wrap=True)
            cells = task_cells(snap, r)
            for i in columns:
                cell, w = cells[i], COLUMNS[i][1]
                cell.truncate(w - 1, overflow="ellipsis")
                cell.pad_right(w - cell.cell_len)
                text.append_text(cell)
            want = Segment.simplify(Segment.apply_style(text.render(console), row_style))
            got = look.segments(task_runs(snap, r, snap.late(r)), row_style, console)
            assert list(Segment.simplify(got)) == list(want)
            assert sum(s.cell_length for s in got) == sum(COLUMNS[i][1] for i in columns)
