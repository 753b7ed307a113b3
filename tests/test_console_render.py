"""Panels that build their lines themselves draw what Textual's general path
draws of the same data: the headline's trend lines."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.widgets import Sparkline

from console.widgets.headline import Trend


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
