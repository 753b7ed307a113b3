"""Panels that build their lines themselves draw what Textual's general path
draws of the same data (the headline's trend lines, the residency's agents
table); panels redraw only when
what they show changed."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.styled import Styled
from textual.app import App, ComposeResult
from textual.widget import Widget
from textual.widgets import Sparkline

from console.widgets.headline import Trend
from console.widgets.residency import AgentTable


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


Drawn = list[list[tuple[str, Style | None]]]


class Framed(Panel):
    """One panel as the dashboard sizes it: the screen's height, a border."""

    CSS = "Widget { height: 100%; border: round white; }"


def _drawn(widget: Widget) -> Drawn:
    """The widget's lines as the screen draws them (its border included; a line
    not marked for a repaint comes from the lines drawn before)."""
    return [[(seg.text, seg.style) for seg in strip]
            for strip in widget.render_lines(widget.outer_size.region)]


def _shown_against_fresh(make: Any, states: list[Any], size: tuple[int, int]
                         ) -> tuple[list[Drawn], list[Drawn], list[set[Any]]]:
    """Show `states` in turn on one widget (`make()`, in a Framed app): its
    lines after each, beside those of a fresh widget that showed only that
    state, and the regions each show marked for a repaint."""
    async def screens() -> tuple[list[Drawn], list[Drawn], list[set[Any]]]:
        seen, fresh, repainted = [], [], []
        widget = make()
        async with Framed(widget).run_test(size=size) as pilot:
            for s in states:
                await pilot.pause()
                widget.show(s)
                repainted.append(set(widget._repaint_regions))
                await pilot.pause()
                seen.append(_drawn(widget))
        for s in states:
            one = make()
            async with Framed(one).run_test(size=size) as pilot:
                await pilot.pause()
                one.show(s)
                await pilot.pause()
                fresh.append(_drawn(one))
        return seen, fresh, repainted

    return asyncio.run(screens())


def test_the_residency_repaints_the_lines_that_changed_as_a_fresh_panel_draws_them() -> None:
    """Each state shown after another repaints just the lines that differ
    (the panel's other lines and its border stay), and the screen then holds
    what a panel that showed only that state draws: the bar, the KV line and
    the rows as they grow, shrink, move and change place."""
    from dataclasses import replace

    from console.snapshot import AgentRow, Numbers, Snapshot
    from console.widgets.residency import Residency

    agents = tuple(AgentRow(name, 1000 * (i + 1), "gpu" if i % 2 else "host", True, None, None,
                            i, 2 * i, 300 * i) for i, name in enumerate("ABCDE"))
    snap = Snapshot(t=10.0, budget=20000, kv_prefixes=9000, kv_requests=3000, agents=agents[:3],
                    tasks=(), numbers=Numbers(10.0, 0, 0.0, None, None, None, None),
                    tasks_in_flight=3, requests_running=2, requests_waiting=5, decisions=7,
                    policy="topas")
    states = [snap, replace(snap, agents=(replace(agents[0], waiting=9), *agents[1:3])),
              replace(snap, agents=agents, kv_requests=6000),
              replace(snap, agents=(replace(agents[2], location="host", transfer="load",
                                            transfer_until=14.0), *agents[3:])),
              replace(snap, t=12.5, agents=(replace(agents[2], location="host", transfer="load",
                                                    transfer_until=14.0), *agents[3:])),
              replace(snap, agents=agents[:1], budget=None)]

    seen, fresh, regions = _shown_against_fresh(lambda: Residency(id="residency"), states,
                                                (90, 14))
    assert seen == fresh
    repainted = [len({r.y for r in shown}) for shown in regions]
    assert all(0 < n < 12 for n in repainted[1:])  # some lines, never the whole panel


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


def test_the_tasks_table_repaints_its_rows_as_a_fresh_table_draws_them() -> None:
    """A new poll's rows repaint below the header, the border and header as
    drawn; the screen then holds what a table that showed only that poll draws
    (rows older, gone, late, more and fewer of them)."""
    from dataclasses import replace

    from console.snapshot import Numbers, Snapshot, TaskRow
    from console.widgets.tasks import TaskList

    rows = tuple(TaskRow(i, "dag4", 1.0 + i, 9.0, 1, 4, ("b",), (), 2.0) for i in range(8))
    snap = Snapshot(t=10.0, budget=None, kv_prefixes=0, kv_requests=0, agents=(), tasks=rows,
                    numbers=Numbers(10.0, 0, 0.0, None, None, None, None), tasks_in_flight=8,
                    requests_running=8, requests_waiting=0, decisions=3, policy="topas")
    states = [snap, replace(snap, t=12.0, tasks=tuple(replace(r, age=r.age + 2) for r in rows)),
              replace(snap, tasks=rows[2:]),
              replace(snap, tasks=tuple(replace(r, remaining_s=500.0, stages_done=3)
                                        for r in rows[:3])),
              replace(snap, tasks=rows)]

    seen, fresh, repainted = _shown_against_fresh(lambda: TaskList(id="tasks"), states,
                                                  (100, 14))
    assert seen == fresh
    # a poll later (its title the same): inside the border, below the header
    assert repainted[1] and all(r.x >= 1 and r.y >= 2 for r in repainted[1])


def _cells(console: Console, renderable: object, width: int) -> list[list[tuple[str, Style]]]:
    """Each line's segments as (text, style) on a base style, as Textual's
    Static draws a Rich renderable."""
    base = Style(color="white", bgcolor="black")
    lines = Segment.split_and_crop_lines(
        console.render(Styled(renderable, base), console.options.update_width(width)),  # type: ignore[arg-type]
        width, include_new_lines=False, pad=False)
    return [[(seg.text, base + (seg.style or Style())) for seg in line] for line in lines]


def test_the_agents_table_is_what_rich_draws_of_its_cells() -> None:
    """The residency's agents table, built from its cells, draws the segments
    Rich's Table draws of the same rows (column widths widened in proportion,
    justification, the bold header, each cell's style over its padding), at widths from
    too narrow (Rich's own table then) to wide, for assorted contents (control
    codes, tabs and newlines among them: Rich's own table then)."""
    console = Console(width=200, color_system="truecolor", highlight=False)
    wide = [("agent", "left"), ("prefix", "right"), ("where", "left"), ("moving", "left"),
            ("run", "right"), ("wait", "right"), ("KV", "right")]
    narrow = [c for c in wide if c[0] != "moving"]
    rng = random.Random(31)
    words = ["planner", "a", "漢字エージェント", "coder-with-a-long-name", "—", "12.5k", "0",
             "host→GPU 0.42s", "GPU…", "none", "+3 more", ""]
    odd = ["tab\there", "bell\x07", "esc\x1b[31m", "two\nlines"]
    styles = ["", "bold green", "magenta", "grey50 italic", "#d4a017", "yellow"]
    tables = direct = 0
    for columns in (wide, narrow):
        for n_rows, odd_cell in ((0, False), (1, False), (3, False), (8, False), (1, True),
                                 (3, True)):
            rows = [[(rng.choice(words), rng.choice(styles)) for _ in columns]
                    for _ in range(n_rows)]
            if odd_cell:
                rows[-1][rng.randrange(len(columns))] = (rng.choice(odd), "")
            table = AgentTable(tuple(columns), rows)  # type: ignore[arg-type]
            for width in (10, 30, 45, 56, 60, 80, 117, 160):
                tables += 1
                direct += table.printable() and table.widths(width) is not None
                want = _cells(console, table.rich_table(), width)
                assert _cells(console, table, width) == want, (columns, rows, width)
    assert tables == 96 and 20 <= direct < tables  # built directly, and by Rich's table
