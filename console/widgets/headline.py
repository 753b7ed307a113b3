"""Headline numbers with small trend lines."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

from rich.color import Color
from rich.segment import Segment
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.renderables.sparkline import Sparkline as Bars
from textual.strip import Strip
from textual.widgets import Sparkline, Static

from console.snapshot import Numbers
from console.widgets.format import ms, retitle, secs

Getter = Callable[[Numbers], float | None]
Shown = Callable[[Numbers], tuple[str, str]]  # (the value, a note on the bottom border)

METRICS: tuple[tuple[str, str, Getter, Shown], ...] = (
    ("throughput", "throughput", lambda n: n.throughput,
     lambda n: (f"{n.throughput:.3f} task/s", f"{n.tasks_finished} done")),
    ("jct-mean", "mean JCT", lambda n: n.jct_mean, lambda n: (secs(n.jct_mean), "")),
    ("jct-p99", "p99 JCT", lambda n: n.jct_p99, lambda n: (secs(n.jct_p99), "")),
    ("decision", "decision latency", lambda n: n.decision_ms,
     lambda n: (ms(n.decision_ms), f"p99 {ms(n.decision_p99_ms)}")),
)


class IntBars(Bars[float]):
    """Textual's sparkline bars, their buckets cut with integers: bucket `b` of
    `n` values over `w` cells is `data[n*b//w : n*(b+1)//w]`, the slice
    `int(Fraction(n, w) * b)` gives (both floor a non-negative ratio), at
    about half the cost of the whole line."""

    @classmethod
    def _buckets(cls, data: list[float], num_buckets: int) -> Iterable[Sequence[float]]:
        n = len(data)
        for b in range(num_buckets):
            partition = data[n * b // num_buckets:n * (b + 1) // num_buckets]
            if partition:
                yield partition


class Trend(Sparkline):
    """Textual's Sparkline, its line built straight from the bars (the same
    bars and colours; Textual's general path for a Rich renderable costs a
    few times more, and every poll redraws four of these)."""

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        if y or height != 1 or not width:
            return super().render_line(y)
        base = self.visual_style.rich_style
        bars = cast(Bars[float], self.render())  # Textual's bars, on the widget's style
        bars = IntBars(bars.data, width=bars.width, height=bars.height,
                       min_color=cast(Color, bars.min_color.color),
                       max_color=cast(Color, bars.max_color.color),
                       summary_function=bars.summary_function)
        return Strip([Segment(s.text, base + s.style) for s in
                      bars.__rich_console__(self.app.console, self.app.console_options)
                      if isinstance(s, Segment)])


class Metric(Vertical):
    """One number, its label and its trend."""

    def __init__(self, label: str, id: str) -> None:
        super().__init__(id=id, classes="metric")
        self.border_title = label

    def compose(self) -> ComposeResult:
        yield Static("—", classes="value")
        yield Trend([], classes="trend")

    def set(self, shown: tuple[str, str], trend: Sequence[float]) -> None:
        """The value on its line, the note on the bottom border (a narrow box
        keeps the value whole)."""
        value, note = shown
        static = self.query_one(".value", Static)
        if str(static.content) != value:  # one line, always: no layout to redo
            static.update(value, layout=False)
        retitle(self, subtitle=note)
        spark = self.query_one(Trend)
        if list(spark.data or ()) != list(trend):
            spark.data = list(trend)


class Headline(Horizontal):
    """Throughput, mean and p99 JCT so far, decision latency; trends beneath."""

    def compose(self) -> ComposeResult:
        for key, label, _, _ in METRICS:
            yield Metric(label, id=f"metric-{key}")

    def show(self, now: Numbers, history: Sequence[Numbers]) -> None:
        for key, _, get, text in METRICS:
            trend = [v for v in (get(n) for n in history) if v is not None]
            self.query_one(f"#metric-{key}", Metric).set(text(now), trend)
