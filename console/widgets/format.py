"""Small text helpers shared by the widgets."""

from __future__ import annotations

from collections.abc import Sequence

from textual.widget import Widget

AGENT_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")


def agent_colour(index: int) -> str:
    return AGENT_COLOURS[index % len(AGENT_COLOURS)]


def secs(x: float | None, digits: int = 1) -> str:
    """Seconds as text ('—' when unknown), minutes past 10 min."""
    if x is None:
        return "—"
    if abs(x) >= 600:
        return f"{x / 60:.{digits}f}m"
    return f"{x:.{digits}f}s"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}ms"


def tokens(n: int | None) -> str:
    """Token counts in at most five cells: 950, 3.6k, 15.3k, 1.2M."""
    if n is None:
        return "—"
    if abs(n) >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if abs(n) >= 1_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def ids(values: Sequence[object], limit: int = 6) -> str:
    """A short list: 'r1 r2 r3 +4'."""
    if not values:
        return "—"
    shown = " ".join(str(v) for v in values[:limit])
    return shown + (f" +{len(values) - limit}" if len(values) > limit else "")


def split_cells(width: int, parts: Sequence[int]) -> list[int]:
    """`width` cells split in proportion to `parts` (largest remainder; a non-zero
    part gets at least one cell while cells remain)."""
    total = sum(parts)
    if total <= 0 or width <= 0:
        return [0] * len(parts)
    exact = [p * width / total for p in parts]
    cells = [int(x) for x in exact]
    for i, p in enumerate(parts):
        if p > 0 and cells[i] == 0:
            cells[i] = 1
    while sum(cells) > width:
        i = max(range(len(cells)), key=lambda k: (cells[k] - exact[k], cells[k]))
        cells[i] -= 1
    order = sorted(range(len(parts)), key=lambda k: exact[k] - cells[k], reverse=True)
    k = 0
    while sum(cells) < width and order:
        cells[order[k % len(order)]] += 1
        k += 1
    return cells


def retitle(widget: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """Set a border's title and subtitle (None: leave it) where they changed:
    Textual repaints the whole widget for any assignment, of the same text too."""
    if title is not None and widget.border_title != title:
        widget.border_title = title
    if subtitle is not None and widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle
