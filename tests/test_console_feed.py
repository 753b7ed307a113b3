"""The live decision feed keeps its last FEED_ROWS decisions; a following
cursor announces every new last decision, so the Candidates panel follows it
too, also once the feed is full (the cursor's row index then stays while the
rows under it move)."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import DataTable

from console.snapshot import DecisionRow
from console.widgets.decisions import FEED_ROWS, DecisionFeed, fit_runs, num


def _row(seq: int) -> DecisionRow:
    return DecisionRow(seq=seq, t=float(seq), admit=(seq,), preempt=(), load=(), evict=(),
                       blocked=False, wall_ms=0.5, n_candidates=2, total=1.0)


class FeedApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.highlighted: list[int] = []

    def compose(self) -> ComposeResult:
        yield DecisionFeed(id="decisions")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.highlighted.append(int(event.row_key.value))  # type: ignore[arg-type]


def test_a_full_following_feed_announces_each_new_last_decision() -> None:
    async def run() -> tuple[list[int], int, int | None]:
        app = FeedApp()
        async with app.run_test(size=(80, 20)) as pilot:
            feed = app.query_one(DecisionFeed)
            feed.append([_row(i) for i in range(1, FEED_ROWS + 1)])
            await pilot.pause()
            for seq in range(FEED_ROWS + 1, FEED_ROWS + 4):
                feed.append([_row(seq)])
                await pilot.pause()
            feed.append([])  # nothing new: nothing announced
            await pilot.pause()
            return app.highlighted, feed.row_count, feed.selected()

    seen, rows, selected = asyncio.run(run())
    assert rows == FEED_ROWS and selected == FEED_ROWS + 3
    assert seen[-3:] == [FEED_ROWS + 1, FEED_ROWS + 2, FEED_ROWS + 3]
    assert seen.count(FEED_ROWS + 3) == 1


def test_a_baseline_decision_says_it_has_no_candidate_states() -> None:
    """FCFS and the other baselines score no candidate states: the panel says
    so rather than showing an empty table under '0 of 0 candidates'."""
    from console.snapshot import detail_from_api

    body = {"seq": 4, "t": 1.0, "admit": [3], "preempt": [], "load": [], "evict": [],
            "blocked": False, "wall_ms": 0.1, "n_candidates": 0, "policy": "fcfs",
            "reservation": "optimistic", "chosen": None, "candidates": []}
    assert detail_from_api(body).note == "no candidate states (this policy does not score any)"
    scored = {**body, "policy": "topas", "n_candidates": 5, "chosen": 0, "candidates": [
        {"idx": 0, "won": True, "resident": ["A"], "admit": [3], "preempt": [], "j_admit": 1.0,
         "j_move": 0.0, "j_redo": 0.0, "j_revoke": 0.0, "v_reuse": 0.0, "total": 1.0}]}
    assert detail_from_api(scored).note == "1 of 5 candidates"


def test_a_full_feed_trims_many_rows_at_once_and_keeps_their_order() -> None:
    """A batch larger than one row trims the oldest decisions in one pass: the
    rest keep their order, each row index names its decision and the cursor
    follows to the newest."""
    from textual.coordinate import Coordinate

    async def run() -> tuple[list[str | None], list[Any], int | None, int]:
        app = FeedApp()
        async with app.run_test(size=(80, 20)) as pilot:
            feed = app.query_one(DecisionFeed)
            feed.append([_row(i) for i in range(1, FEED_ROWS + 1)])
            await pilot.pause()
            feed.append([_row(i) for i in range(FEED_ROWS + 1, FEED_ROWS + 51)])
            await pilot.pause()
            keys = [feed.coordinate_to_cell_key(Coordinate(i, 0)).row_key.value
                    for i in range(feed.row_count)]
            return keys, feed.get_row_at(0), feed.selected(), feed.get_row_index(
                str(FEED_ROWS + 50))

    keys, first, selected, last = asyncio.run(run())
    assert keys == [str(i) for i in range(51, FEED_ROWS + 51)]
    assert first[0] == "51"
    assert selected == FEED_ROWS + 50 and last == FEED_ROWS - 1


def test_a_feed_line_is_what_the_datatable_renders_of_its_cells() -> None:
    """The feed builds a decision's line from its runs of text; it is the line
    Textual's DataTable renders of the same cells (styles, padding, the mouse
    metadata naming row and column), on even and odd rows, under the cursor,
    unfocused, under the hover cursor, scrolled sideways and after a trim, with
    cells wider than their columns cut as the DataTable cuts them; the header
    (kept across rows added and trimmed) the DataTable's too, hovered as well."""
    from textual.coordinate import Coordinate

    def wide(seq: int) -> DecisionRow:  # every kind of action, a long agent name;
        # times, scores and wall times wider than their columns (the DataTable cuts them)
        return DecisionRow(seq=seq, t=seq * 1.5 + (12345 if seq % 5 == 0 else 0),
                           admit=(1, 2, 3), preempt=(4,),
                           load=("B", "a-very-long-agent\x1b[31m"), evict=("C",),
                           blocked=seq % 3 == 0, wall_ms=12.25 + (1000 if seq % 7 == 0 else 0),
                           n_candidates=4,
                           total=None if seq % 4 == 0 else 1e-5 * seq if seq % 3 else 1234.5 * seq)

    class Focusable(FeedApp):
        def compose(self) -> ComposeResult:
            yield DecisionFeed(id="decisions")
            yield DataTable(id="other")

    async def run() -> tuple[int, int]:
        app = Focusable()
        async with app.run_test(size=(60, 20)) as pilot:
            feed = app.query_one(DecisionFeed)
            feed.append([_row(i) if i % 2 else wide(i) for i in range(1, 40)])
            await pilot.pause()
            lines = same = 0
            cut = [d for d in feed.rows_shown if len(num(d.total)) > 7 or len(f"{d.t:.2f}") > 7]
            assert cut  # the DataTable would cut these cells
            for step in range(7):
                if step == 6:  # the mouse over the header (the DataTable highlights it)
                    feed.hover_coordinate = Coordinate(-1, 1)
                elif step == 1:
                    feed.move_cursor(row=feed.row_count - 4)
                elif step == 2:
                    app.query_one("#other").focus()
                elif step == 3:
                    feed.hover_coordinate = Coordinate(feed.cursor_row - 1, 0)
                    feed._show_hover_cursor = True
                elif step == 4:
                    feed.scroll_to(x=4, animate=False)
                elif step == 5:
                    feed.append([wide(i) for i in range(40, 40 + FEED_ROWS)])
                await pilot.pause()
                for y in range(feed.size.height):
                    got = list(feed.render_line(y))
                    feed._look = None
                    lines += 1
                    same += got == list(DataTable.render_line(feed, y))
            return lines, same

    lines, same = asyncio.run(run())
    assert lines > 70 and same == lines


def test_the_feed_sizes_itself_as_the_datatable_measures_it() -> None:
    """The feed's scrollable size, set without measuring its cells, is the size
    Textual's DataTable sets by measuring them, as it fills, when cells are wider
    than their columns, after a trim and after a clear."""
    from dataclasses import replace

    from textual.geometry import Size

    wide = DecisionRow(seq=0, t=123456.0, admit=(1, 2, 3), preempt=(4,), load=("B", "long" * 9),
                       evict=("C",), blocked=True, wall_ms=12345.5, n_candidates=4, total=1e9)

    async def run() -> list[tuple[Size, Size]]:
        app = FeedApp()
        async with app.run_test(size=(60, 20)) as pilot:
            feed = app.query_one(DecisionFeed)
            sizes = []
            for batch in ([_row(1)], [_row(i) for i in range(2, 30)],
                          [replace(wide, seq=i) for i in range(30, 40)],
                          [_row(i) for i in range(40, 40 + FEED_ROWS)], None, [_row(999)]):
                if batch is None:
                    feed.replace([])
                else:
                    feed.append(batch)
                await pilot.pause()
                got = feed.virtual_size
                DataTable._update_dimensions(feed, list(feed.rows))
                sizes.append((got, feed.virtual_size))
            return sizes

    for got, want in asyncio.run(run()):
        assert got == want


def test_runs_cut_to_a_width_as_rich_text_folds_them() -> None:
    """A cell's runs cut to its column are the cells Rich's Text keeps of the
    same text at that width (wide characters split at the edge included)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(width=40, color_system="truecolor")
    cases = [[("1234.568", "")], [("ab", "bold"), ("cdef", "red")], [("漢字漢字", ""), ("x", "")],
             [("a", ""), ("漢字", "green")], [("", ""), ("abc", "")]]
    for runs in cases:
        for width in range(0, 9):
            text = Text(no_wrap=True, end="")
            for t, style in runs:
                text.append(t, style)
            want = [(s.text, s.style) for s in console.render(
                text, console.options.update(width=width, no_wrap=True, height=1))
                if s.text and s.text != "\n"]
            got = fit_runs(runs, width)
            if width:
                plain = "".join(t for t, _ in got)
                assert plain.rstrip() == "".join(t for t, _ in want).rstrip(), (runs, width)
