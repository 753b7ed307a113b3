"""Panels that build their lines themselves draw what Textual's general path
draws of the same data (the headline's trend lines); panels redraw only when
what they show changed."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult
from textual.widget import Widget
from textual.widgets import Sparkline

from console.widgets.headline import Trend


class Panel(App[None]):
    """One panel on its own."""

    def __init__(self, panel: Widget) -> None:
        super().__init__()
        self.panel = panel

    def compose(self) -> ComposeResult:
        yield self.panel


def test_a_trend_line_is_textuals_sparkline() -> None:
    """No data, one point, a flat series, fewer points than cells, more points
    than cells, negative values: the same bars in the same colours."""
    series: list[list[float]] = [[], [3.0], [2.0] * 10, [1.0, 5.0, 2.0],
                                 [float((i * 37) % 11) for i in range(60)], [-4.0, 0.0, 7.5, -1.0]]

    class Trends(App[None]):
        def compose(self) -> ComposeResult:
            yield Trend([], id="trend")
            yield Sparkline([], id="spark")

    async def run() -> list[tuple[bool, int]]:
        app = Trends()
        async with app.run_test(size=(37, 4)) as pilot:
            trend, spark = app.query_one("#trend", Trend), app.query_one("#spark", Sparkline)
            seen = []
            for data in series:
                trend.data = spark.data = data
                await pilot.pause()
                got, want = trend.render_line(0), Sparkline.render_line(spark, 0)
                seen.append((list(got) == list(want), got.cell_length))
            return seen

    assert asyncio.run(run()) == [(True, 37)] * len(series)


def test_the_residency_redraws_only_when_what_it_shows_changed() -> None:
    """A new state whose agents, KV and moves are the same (a later time, other
    tasks) leaves the panel as drawn; a changed agent, or the time left of a
    move under way, redraws it."""
    from dataclasses import replace

    from console.snapshot import AgentRow, Numbers, Snapshot
    from console.widgets.residency import Residency

    agent = AgentRow("A", 3500, "gpu", True, None, None, 2, 5, 900)
    snap = Snapshot(t=10.0, budget=20000, kv_prefixes=3500, kv_requests=900, agents=(agent,),
                    tasks=(), numbers=Numbers(10.0, 0, 0.0, None, None, None, None),
                    tasks_in_flight=3, requests_running=2, requests_waiting=5, decisions=7,
                    policy="topas")
    moving = replace(snap, agents=(replace(agent, location="host", transfer="load",
                                           transfer_until=14.0),))

    async def run() -> list[bool]:
        app = Panel(Residency(id="residency"))
        async with app.run_test(size=(80, 12)) as pilot:
            panel = app.query_one(Residency)
            redrawn = []
            for s in (snap, replace(snap, t=12.0, tasks_in_flight=4, decisions=9),
                      replace(snap, agents=(replace(agent, waiting=6),)), moving,
                      replace(moving, t=11.0), replace(moving, t=11.0, decisions=99)):
                before = panel.content
                panel.show(s)
                await pilot.pause()
                redrawn.append(panel.content is not before)
            return redrawn

    assert asyncio.run(run()) == [True, False, True, True, True, False]


def test_the_tasks_table_redraws_only_when_its_rows_changed() -> None:
    """The same tasks at the same ages leave the table as drawn (no line
    rendered again); a task a poll later (older) redraws it."""
    from dataclasses import replace

    from console.snapshot import Numbers, Snapshot, TaskRow
    from console.widgets.tasks import TaskList

    rows = tuple(TaskRow(i, "dag4", 1.0, 9.0, 1, 4, ("b",), (), 2.0) for i in range(5))
    snap = Snapshot(t=10.0, budget=None, kv_prefixes=0, kv_requests=0, agents=(), tasks=rows,
                    numbers=Numbers(10.0, 0, 0.0, None, None, None, None), tasks_in_flight=5,
                    requests_running=5, requests_waiting=0, decisions=3, policy="topas")

    async def run() -> list[int]:
        app = Panel(TaskList(id="tasks"))
        async with app.run_test(size=(100, 12)) as pilot:
            table = app.query_one(TaskList)
            rendered: list[int] = []
            real = table.render_line

            def counted(y: int) -> Any:
                rendered[-1] += 1
                return real(y)

            table.render_line = counted  # type: ignore[method-assign]
            for s in (snap, replace(snap, decisions=4),
                      replace(snap, t=12.0, tasks=tuple(replace(r, age=11.0) for r in rows))):
                rendered.append(0)
                table.show(s)
                await pilot.pause()
            return rendered

    first, same, older = asyncio.run(run())
    assert first > 5 and same == 0 and older > 5
