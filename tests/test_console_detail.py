"""The decision detail explains a preemption: each preempted request by task,
stage and agent; every score term at 160 columns, the deciding terms first and
a scroll hint when narrower; that the highest total wins; and a feed whose
actions column never hides an eviction. Through Pilot on the replay fixture."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from console.app import ConsoleApp
from console.snapshot import DecisionRow
from console.sources import ReplaySource
from console.widgets.decisions import TERMS, DecisionDetailView, actions

SEQ = 19  # preempts requests 17 and 18, evicts D, loads B; 11 candidates


@pytest.fixture
def db(console_db: Path) -> Path:
    return console_db


def detail_at(db: Path, size: tuple[int, int]) -> tuple[str, list[str], str]:
    """(summary text, candidate column labels, the panel's subtitle) at decision SEQ."""
    out: dict[str, Any] = {}

    async def main() -> None:
        app = ConsoleApp(replay=ReplaySource(db))
        async with app.run_test(size=size) as pilot:
            app.goto_decision(SEQ)
            await pilot.pause()
            view = app.dashboard.query_one(DecisionDetailView)
            await pilot.pause()
            table = view.query_one("#candidates", DataTable)
            out["summary"] = str(view.query_one("#detail-summary").render())
            out["columns"] = [str(c.label) for c in table.ordered_columns]
            out["subtitle"] = str(view.border_subtitle)

    asyncio.run(main())
    return out["summary"], out["columns"], out["subtitle"]


def test_a_preemption_names_its_requests_and_why_the_winner_won(db: Path) -> None:
    conn = sqlite3.connect(db)
    named = conn.execute("SELECT request_id, task_id, stage, agent FROM requests WHERE "
                         "request_id IN (17, 18) ORDER BY request_id").fetchall()
    best = conn.execute("SELECT max(total) FROM candidates WHERE decision_seq = ? AND won = 0",
                        [SEQ]).fetchone()[0]
    conn.close()
    summary, columns, subtitle = detail_at(db, (160, 48))
    for rid, task, stage, agent in named:
        assert f"{rid} (task {task} · {stage} · {agent})" in summary
    assert "the highest total wins: #" in summary and f"({best:.3f})" in summary
    assert columns[:8] == ["#", "won", "total", *TERMS]  # every term, in Eq. 13's order
    assert not any(t in subtitle for t in TERMS)  # none of them past the edge


def test_a_narrow_panel_puts_the_deciding_terms_first_and_says_what_scrolls(db: Path) -> None:
    _, columns, subtitle = detail_at(db, (100, 40))
    terms = columns[3:8]
    assert sorted(terms) == sorted(TERMS) and tuple(terms) != TERMS
    assert subtitle.startswith("→ scroll for ")
    hidden = subtitle.removeprefix("→ scroll for ").split(", ")
    assert hidden == columns[len(columns) - len(hidden):]  # the last columns, in order


def test_the_feed_keeps_evictions_when_the_loads_do_not_fit() -> None:
    row = DecisionRow(seq=1, t=0.0, admit=(1, 2, 3), preempt=(4,),
                      load=("planner", "reviewer", "coder", "tester"), evict=("architect",),
                      blocked=False, wall_ms=0.1, n_candidates=1, total=1.0)
    text = actions(row).plain
    assert text.startswith("+3 −1 ⇣") and "⇡4" in text and len(text) <= 24
    short = actions(DecisionRow(1, 0.0, (1,), (), ("A",), ("B",), False, 0.1, 1, 1.0)).plain
    assert short == "+1 ⇣B ⇡A "  # named while they fit: evictions first


def test_the_candidates_table_shows_every_new_decisions_rows_and_scrolls_when_they_overflow(
        ) -> None:
    """Decisions of 2, 4, 40, 30 and 3 candidates one after the other: each
    shows all its rows (the 4 that fit as the 2 did, and the 30 that overflow
    as the 40 did, drawn without a new layout of the screen), a scrollbar only
    while the 40 and the 30 overflow the panel, its thumb the one a layout
    sets (a fresh table that showed only the 30)."""
    from textual.app import App, ComposeResult
    from textual.geometry import Region

    from console.snapshot import CandidateRow, DecisionDetail

    def detail(seq: int, n: int) -> DecisionDetail:
        row = DecisionRow(seq=seq, t=float(seq), admit=(1,), preempt=(), load=(), evict=(),
                          blocked=False, wall_ms=0.5, n_candidates=n, total=float(n))
        cands = tuple(CandidateRow(i, i == 0, ("A",), (1,), (), float(n - i), 0.0, 0.0, 0.0,
                                   0.0, float(n - i)) for i in range(n))
        return DecisionDetail(row, "topas", "none", 0, cands, f"{n} of {n} candidates")

    class DetailApp(App[None]):
        CSS_PATH = Path(__file__).parent.parent / "console" / "console.tcss"  # the console's

        def compose(self) -> ComposeResult:
            yield DecisionDetailView(id="detail")

    seen: list[tuple[int, bool, list[str]]] = []
    layouts: list[int] = []  # the decisions whose showing laid the screen out
    thumbs: list[tuple[object, ...]] = []  # after the 30: shown after the 40, and fresh

    def thumb(table: DataTable[Any]) -> tuple[object, ...]:
        bar = table.vertical_scrollbar
        return (table.virtual_size, table.scroll_y, bar.window_virtual_size, bar.window_size,
                bar.position, [line.text for line in bar.render_lines(bar.size.region)])

    async def fresh() -> None:
        app = DetailApp()
        async with app.run_test(size=(120, 20)) as pilot:
            app.query_one(DecisionDetailView).show(detail(4, 30))
            await pilot.pause()
            await pilot.pause()
            thumbs.append(thumb(app.query_one("#candidates", DataTable)))

    async def main() -> None:
        app = DetailApp()
        async with app.run_test(size=(120, 20)) as pilot:
            view = app.query_one(DecisionDetailView)
            table = view.query_one("#candidates", DataTable)
            screen = app.screen
            relayout = screen._refresh_layout

            def counted(*args: Any, **kwargs: Any) -> None:
                layouts.append(seq)
                relayout(*args, **kwargs)

            screen._refresh_layout = counted  # type: ignore[method-assign]
            for seq, n in ((1, 2), (2, 4), (3, 40), (4, 30), (5, 3)):
                view.show(detail(seq, n))
                await pilot.pause()
                await pilot.pause()
                if n == 30:
                    thumbs.append(thumb(table))
                lines = table.render_lines(Region(0, 0, table.size.width, table.size.height))
                firsts = [line.text.split()[0] for line in lines[1:] if line.text.strip()]
                seen.append((table.row_count, table.show_vertical_scrollbar, firsts))

    asyncio.run(main())
    asyncio.run(fresh())
    # the 4 fit as the 2 did and the 30 overflow as the 40 did; the 40 and the 3 do not
    assert 2 not in layouts and 4 not in layouts and 3 in layouts and 5 in layouts
    assert [(rows, bar) for rows, bar, _ in seen] == [(2, False), (4, False), (40, True),
                                                      (30, True), (3, False)]
    assert seen[0][2] == ["0", "1"] and seen[1][2] == ["0", "1", "2", "3"]
    assert seen[4][2] == ["0", "1", "2"] and seen[2][2][:3] == ["0", "1", "2"]
    assert seen[3][2][:3] == ["0", "1", "2"]
    assert thumbs[0] == thumbs[1]
