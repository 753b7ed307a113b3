"""Headline numbers with small trend lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from console.snapshot import Numbers
from console.widgets.format import ms, secs

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


class Metric(Vertical):
    """One number, its label and its trend."""

    def __init__(self, label: str, id: str) -> None:
        super().__init__(id=id, classes="metric")
        self.border_title = label

    def compose(self) -> ComposeResult:
        yield Static("—", classes="value")
        yield Sparkline([], classes="trend")

    def set(self, shown: tuple[str, str], trend: Sequence[float]) -> None:
        """The value on its line, the note on the bottom border (a narrow box
        keeps the value whole)."""
        value, note = shown
        static = self.query_one(".value", Static)
        if str(static.content) != value:  # one line, always: no layout to redo
            static.update(value, layout=False)
        if self.border_subtitle != note:
            self.border_subtitle = note
        spark = self.query_one(Sparkline)
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
