"""Residency: the KV budget as one bar, and where each agent's prefix lives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import zip_longest
from typing import Self

from rich._ratio import ratio_distribute
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.geometry import Region
from textual.visual import Visual
from textual.widget import _RenderCache
from textual.widgets import Static

from console.snapshot import Snapshot
from console.widgets.format import agent_colour, secs, split_cells, tokens

REQUESTS_STYLE = "#d4a017"
FREE_STYLE = "grey35"
NARROW = 56  # content cells below which the table drops a column
Cell = tuple[str, str]  # a cell's text and its style (the padding that justifies it too)
LOCATION = {"gpu": ("GPU", "bold green"), "host": ("host", "cyan"), "none": ("none", "grey50")}


class Residency(Static):
    """The KV bar (prefixes by agent, running requests' KV, free) and a row per
    agent: prefix size and place, moves under way, running/waiting requests."""

    def __init__(self, id: str | None = None) -> None:
        self._held = False  # an update's own refresh held back: `_draw` repaints its lines
        super().__init__("waiting for the first state…", id=id)
        self.snapshot: Snapshot | None = None
        self.border_title = "Residency"
        self.drawn: tuple[object, ...] | None = None  # what the panel shows (`shown`)

    def show(self, snapshot: Snapshot) -> None:
        """Redraw when what the panel shows changed (its height is the panel's,
        min and max 100%: no new layout)."""
        self.snapshot = snapshot
        shown = self.shown(snapshot)
        if shown != self.drawn:
            self.drawn = shown
            self._draw(self._render_snapshot(snapshot))

    def _draw(self, content: RenderableType) -> None:
        """`update(content)`, repainting only the lines that differ from those
        drawn (Textual repaints every line of the panel and its border for any
        update; between polls most lines stay). The lines are Textual's own,
        rendered as `render_line` would."""
        drawn = self._render_cache
        if not self.is_mounted or self._dirty_regions or drawn.size != self.size:
            self.update(content, layout=False)
            return
        self._held = True
        try:
            self.update(content, layout=False)
        finally:
            self._held = False
        width, height = self.size
        lines = Visual.to_strips(self, self._render(), width, height, self.visual_style)
        changed = [Region(0, y, width, 1) for y, (old, new) in
                   enumerate(zip_longest(drawn.lines, lines)) if old != new]
        self._render_cache = _RenderCache(self.size, lines)
        if changed:
            self.refresh(*changed)
        self._dirty_regions.clear()  # rendered: `render_line` reads the cache

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Self:
        """As a Static's; held by `_draw`: only the cached visual dropped."""
        if self._held:
            self._layout_cache.clear()
            return self
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def shown(self, s: Snapshot) -> tuple[object, ...]:
        """Everything the panel draws of `s`: its width and rows, the budget, the
        agents and the moves under way (their time left)."""
        width = max(10, self.content_size.width or 60)
        return (width, self._agent_rows(), s.budget, s.kv_prefixes, s.kv_requests, s.agents,
                tuple(_moving(s, a.transfer, a.transfer_until, width < NARROW)
                      for a in s.agents if a.transfer is not None))

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self.drawn = self.shown(self.snapshot)
            self.update(self._render_snapshot(self.snapshot))

    def _render_snapshot(self, s: Snapshot) -> RenderableType:
        width = max(10, self.content_size.width or 60)
        colours = {a.agent: agent_colour(i) for i, a in enumerate(s.agents)}
        narrow = width < NARROW
        return Group(self._bar(s, width, colours), self._legend(s, width),
                     self._table(s, colours, narrow, self._agent_rows()))

    def _agent_rows(self) -> int | None:
        """Agent rows that fit in the panel's row of the screen (None: any number)."""
        parent = self.parent
        height = getattr(getattr(parent, "size", None), "height", 0)
        if not height:
            return None
        return max(1, height - 2 - 3)  # the border; the bar, KV line and header

    def _bar(self, s: Snapshot, width: int, colours: dict[str, str]) -> Text:
        on_gpu = [a for a in s.agents if a.location == "gpu"]
        budget = s.budget or (s.kv_prefixes + s.kv_requests) or 1
        parts = [a.tokens for a in on_gpu] + [s.kv_requests, s.kv_free or 0]
        used = sum(parts[:-1])
        if used > budget:  # never seen on the sim; keep the bar honest anyway
            parts[-1] = 0
        else:
            parts[-1] = budget - used
        cells = split_cells(width, parts)
        bar = Text()
        for a, n in zip(on_gpu, cells, strict=False):
            bar.append(("█" if a.ready else "▒") * n, style=colours[a.agent])
        bar.append("▓" * cells[-2], style=REQUESTS_STYLE)
        bar.append("░" * cells[-1], style=FREE_STYLE)
        return bar

    def _legend(self, s: Snapshot, width: int) -> Text:
        """The KV line, in the first form that fits on one line: whole words,
        then short labels, then without separators (thousands as k, as in the
        table)."""
        forms = ((("prefixes", "requests", "free"), "KV {} / {}: ", " · "),
                 (("pre", "req", "free"), "KV {} / {}: ", " · "),
                 (("pre", "req", "free"), "KV {}/{}: ", " "))
        used = tokens(s.kv_prefixes + s.kv_requests)
        budget = "?" if s.budget is None else tokens(s.budget)
        for labels, head, sep in forms:
            text = Text(head.format(used, budget))
            for i, (label, style, n) in enumerate(zip(
                    labels, ("bold", f"bold {REQUESTS_STYLE}", "bold"),
                    (s.kv_prefixes, s.kv_requests, s.kv_free), strict=True)):
                text.append(sep if i else "")
                text.append(f"{label} ", style=style)
                text.append(tokens(n))
            if text.cell_len <= width:
                break
        return text

    def _table(self, s: Snapshot, colours: dict[str, str], narrow: bool,
               rows: int | None = None) -> AgentTable:
        """A row per agent (thousands of tokens as k). Narrow, a move under way
        replaces the place: one column less. More agents than `rows`: those on
        the GPU or with requests first, and a last row counting the others."""
        columns = [("agent", "left"), ("prefix", "right"), ("where", "left"),
                   ("moving", "left"), ("run", "right"), ("wait", "right"), ("KV", "right")]
        if narrow:
            columns.remove(("moving", "left"))
        agents = list(s.agents)
        hidden = 0
        if rows is not None and len(agents) > rows:
            busy = [a for a in agents if a.location == "gpu" or a.running or a.waiting]
            agents = (busy + [a for a in agents if a not in busy])[:rows - 1]
            hidden = len(s.agents) - len(agents)
            agents.sort(key=s.agents.index)
        body: list[list[Cell]] = []
        for a in agents:
            where, style = LOCATION.get(a.location, (a.location, ""))
            if a.location == "gpu" and not a.ready:
                where, style = "GPU…", "yellow"
            moving = _moving(s, a.transfer, a.transfer_until, narrow)
            cells: list[Cell] = [(f"■ {a.agent}", colours[a.agent]), (tokens(a.tokens), "")]
            if narrow:
                cells.append((moving, "magenta") if a.transfer else (where, style))
            else:
                cells += [(where, style), (moving, "magenta" if a.transfer else "grey50")]
            body.append([*cells, (str(a.running), ""), (str(a.waiting), ""),
                         (tokens(a.kv_running), "")])
        if hidden:
            body.append([(f"+{hidden} more", "grey50 italic"), *[("", "")] * (len(columns) - 1)])
        return AgentTable(tuple(columns), body)


def _moving(s: Snapshot, transfer: str | None, until: float | None, narrow: bool) -> str:
    """A prefix move under way and the time it has left ('—' when none)."""
    if transfer is None:
        return "—"
    arrows = ({"load": "→GPU", "offload": "→host", "compute": "prefill"} if narrow else
              {"load": "host→GPU", "offload": "GPU→host", "compute": "prefill"})
    moving = arrows.get(transfer, transfer)
    if until is not None:
        left = until - s.t
        moving += " <0.01s" if left < 0.005 else f" {secs(left, 2)}"  # not "0.00s": not done
    return moving


class AgentTable:
    """The agents' table as Rich draws `rich_table` of it (no box, one cell of
    padding a side but at the edges, the columns widened in proportion to
    fill the width), built from its cells; Rich's Table itself when
    the columns do not fit the width or a cell is not plain printable text."""

    def __init__(self, columns: tuple[tuple[str, str], ...], rows: list[list[Cell]]) -> None:
        self.columns = columns
        self.rows = rows

    def widths(self, width: int) -> list[int] | None:
        """Each column's cells, padding included, on `width` (None: no fit)."""
        last = len(self.columns) - 1
        pads = [(i > 0) + (i < last) for i in range(last + 1)]
        widths = [max([cell_len(name), *(cell_len(row[i][0]) for row in self.rows)]) + pads[i]
                  for i, (name, _) in enumerate(self.columns)]
        widths = [w or 1 for w in widths]
        if sum(widths) > width or width < 1:
            return None
        return [w + extra for w, extra in zip(widths, ratio_distribute(width - sum(widths), widths),
                                              strict=True)]

    def printable(self) -> bool:
        """Whether every cell is printable text (no tab, newline or control
        code: Rich expands, splits or strips those)."""
        return all(text.isprintable() for row in self.rows for text, _ in row)

    def rich_table(self) -> Table:
        """The same table as Rich's `Table`."""
        table = Table(box=None, expand=True, pad_edge=False, padding=(0, 1))
        for name, justify in self.columns:
            table.add_column(name, justify=justify, header_style="bold", no_wrap=True)  # type: ignore[arg-type]
        for row in self.rows:
            table.add_row(*(Text(text, style=style) for text, style in row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = self.widths(options.max_width) if self.printable() else None
        if widths is None:
            yield from self.rich_table().__rich_console__(console, options)
            return
        header = tuple((name, "") for name, _ in self.columns)
        bold = console.get_style("table.header") + Style(bold=True)
        for row, style in ((header, bold), *((r, Style()) for r in self.rows)):
            yield from self._line(row, widths, style)
            yield Segment.line()

    def _line(self, row: Sequence[Cell], widths: list[int], style: Style) -> Iterator[Segment]:
        """One line's segments as Rich cuts them: a cell's padding apart, its
        text and the spaces that justify it one segment in the cell's style."""
        last = len(self.columns) - 1
        for i, ((text, cell_style), width, (_, justify)) in enumerate(zip(
                row, widths, self.columns, strict=True)):
            left, right = int(i > 0), int(i < last)
            room = " " * (width - left - right - cell_len(text))
            if left:
                yield Segment(" ", style)
            if text or room:
                yield Segment(room + text if justify == "right" else text + room,
                              style + Style.parse(cell_style) if cell_style else style)
            if right:
                yield Segment(" ", style)
