"""Tasks in flight: DAG progress, age, expected remaining path; sortable.

A Line-API widget (`ScrollView`): an update only re-sorts plain rows and marks
the widget dirty; just the lines on screen are rendered, so hundreds of tasks
cost about as little as ten (a `DataTable` measures every cell it is given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.cells import cell_len
from rich.console import Console
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.markup import escape
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.snapshot import Snapshot, TaskRow
from console.widgets.format import retitle, secs

SORTS: tuple[tuple[str, str, Callable[[TaskRow], float]], ...] = (
    ("age", "age ▼", lambda r: -r.age),
    ("remaining", "E[remaining] ▼", lambda r: -(r.remaining_s or -1.0)),
    ("progress", "progress ▲", lambda r: r.stages_done / (r.stages_total or 1)),
    ("id", "task ▲", lambda r: r.id),
)
# (header, width, the sort it selects when clicked)
# the expectations before the stage lists: a narrow panel cuts the last columns, and
# E[JCT] is the one that turns red; progress fits '10/10' beside its bar
COLUMNS: tuple[tuple[str, int, str | None], ...] = (
    ("task", 7, "id"), ("client", 10, None), ("workflow", 11, None), ("age", 8, "age"),
    ("progress", 15, "progress"), ("E[rem]", 8, "remaining"), ("E[JCT]", 9, None),
    ("running", 9, None), ("waiting", 9, None))
# a narrow panel (a small terminal): no workflow, the expectations right after progress
NARROW_WIDTH = 60
NARROW = tuple(next(i for i, c in enumerate(COLUMNS) if c[0] == name)
               for name in ("task", "progress", "E[JCT]", "E[rem]", "age", "client", "running",
                            "waiting"))
WIDE = tuple(range(len(COLUMNS)))


Run = tuple[str, str]  # (text, style)
Cell = tuple[str, tuple[Run, ...]]  # (the style of the whole cell, its runs of text)


def progress_runs(row: TaskRow, width: int = 8) -> Cell:
    """Stages done (█), running (▶) and waiting (·) as a bar, then 'done/total'."""
    total = row.stages_total or max(row.stages_done + len(row.running) + len(row.waiting), 1)
    done = min(width, round(width * row.stages_done / total))
    run = min(width - done, round(width * len(row.running) / total))
    wait = min(width - done - run, round(width * len(row.waiting) / total))
    return "green", (("█" * done, ""), ("▶" * run, "yellow"), ("·" * wait, "cyan"),
                     ("░" * (width - done - run - wait), "grey35"),
                     (f" {row.stages_done}/{row.stages_total if row.stages_total else '?'}", ""))


def task_runs(s: Snapshot, r: TaskRow, late: bool) -> list[Cell]:
    """The cells of one task's line (`late`: `s.late(r)`), in COLUMNS' order."""
    style = "bold red" if late else ""
    return [(style, ((f"{'⚠' if late else ' '}{r.id}", ""),)), ("", ((r.client_id or "—", ""),)),
            ("", ((r.workflow, ""),)), (style, ((secs(r.age), ""),)), progress_runs(r),
            ("", ((secs(r.remaining_s), ""),)), (style, ((secs(r.expected_jct), ""),)),
            ("", ((",".join(r.running) or "—", ""),)), ("", ((",".join(r.waiting) or "—", ""),))]


def cell_text(cell: Cell) -> Text:
    style, runs = cell
    text = Text(style=style)
    for part, run_style in runs:
        text.append(part, style=run_style)
    return text


def task_cells(s: Snapshot, r: TaskRow) -> list[Text]:
    """The cells of one task's line, as Rich text."""
    return [cell_text(c) for c in task_runs(s, r, s.late(r))]


class _Look:
    """What one repaint of the tasks table renders rows with: the widget's
    style, the cursor's and odd rows' styles, the columns shown; and the
    styles of the cells' runs on a row's style, as Rich combines them."""

    def __init__(self, base: Style, cursor: Style, odd: Style, columns: tuple[int, ...]) -> None:
        self.base, self.cursor, self.odd, self.columns = base, cursor, odd, columns
        self.width = sum(COLUMNS[i][1] for i in columns)  # the cells of a row's segments
        self._styles: dict[Style, dict[tuple[str, str], Style]] = {}  # by row: by cell, run

    def _row_styles(self, row: Style) -> dict[tuple[str, str], Style]:
        styles = self._styles.get(row)
        if styles is None:
            styles = self._styles[row] = _RowStyles(row)
        return styles

    def segments(self, cells: list[Cell], row: Style, console: Console) -> list[Segment]:
        """A row's segments (`width` cells): each shown cell cut to its
        column's width less one ('…' ends a cut) and padded to the width, as
        `Text.truncate` and `Text.pad_right` make them (those do it when a cell
        must be cut)."""
        out: list[Segment] = []
        styles = self._row_styles(row)
        for i in self.columns:
            (cell_style, runs), w = cells[i], COLUMNS[i][1]
            if all(text.isascii() and text.isprintable() for text, _ in runs):
                parts, used = runs, sum(len(text) for text, _ in runs)  # a cell a character
            else:
                parts = tuple((strip_control_codes(text), style) for text, style in runs)
                used = sum(cell_len(text) for text, _ in parts)
            if used >= w:
                cell = cell_text((cell_style, parts))
                cell.truncate(w - 1, overflow="ellipsis")
                cell.pad_right(w - cell.cell_len)
                text = Text()
                text.append_text(cell)  # the cell's style as a span: `render` draws spans
                out += [Segment(s.text, row + s.style if s.style else row)
                        for s in text.render(console)]
                continue
            out += [Segment(text, styles[cell_style, style]) for text, style in parts if text]
            out.append(Segment(" " * (w - used), styles[cell_style, ""]))
        return out


class _RowStyles(dict[tuple[str, str], Style]):
    """A row's style plus a cell's and a run's (by their names), as Rich adds them."""

    def __init__(self, row: Style) -> None:
        super().__init__()
        self.row = row

    def __missing__(self, key: tuple[str, str]) -> Style:
        cell, run = key
        style = self[key] = self.row + Style.parse(cell) + Style.parse(run)
        return style


ROWS_STEP = 64  # the scrolled height grows and shrinks in steps (each costs a layout)


def _rows(n: int) -> int:
    """`n` lines rounded up to the next ROWS_STEP (the rest render blank)."""
    return -(-n // ROWS_STEP) * ROWS_STEP


def matches(row: TaskRow, text: str) -> bool:
    """A task matches a filter when its id, client id, workflow or one of its
    running or waiting stages contains the text (case-insensitive)."""
    text = text.strip().lower()
    fields = (str(row.id), row.client_id or "", row.workflow, *row.running, *row.waiting)
    return not text or any(text in f.lower() for f in fields)


class TaskList(ScrollView, can_focus=True):
    """One line per task in flight, under a header; late tasks in red (see
    `Snapshot.late_reason`). Keys move the cursor (also j/k); `s` (or a click on
    a header) sorts; `/` filters (`TaskList.filter_text`); Enter opens the
    task (posts `TaskList.Opened`)."""

    class Opened(Message):
        """Enter on a task: open it."""

        def __init__(self, task_id: int) -> None:
            super().__init__()
            self.task_id = task_id


    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "tasklist--header", "tasklist--cursor", "tasklist--odd"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("enter", "open", "Open task", show=False),
        Binding("pageup", "move(-20)", "Page up", show=False),
        Binding("pagedown", "move(20)", "Page down", show=False),
        Binding("home", "move(-1000000)", "First", show=False),
        Binding("end", "move(1000000)", "Last", show=False),
    ]
    cursor: reactive[int] = reactive(0)

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_index = 0
        self.filter_text = ""
        self.snapshot: Snapshot | None = None
        self.shown: list[TaskRow] = []
        self._lines: dict[int, Strip] = {}  # rendered rows of this update, by index
        self._late: frozenset[int] = frozenset()  # the shown tasks that are late
        self._look: _Look | None = None  # styles and columns of one repaint
        self._drawn: tuple[object, ...] | None = None  # rows, lateness, columns on screen
        self.border_title = "Tasks"

    # ------------------------------------------------------------ data

    @property
    def sort_key(self) -> str:
        return SORTS[self.sort_index][0]

    @property
    def row_count(self) -> int:
        return len(self.shown)

    def task_ids(self) -> list[int]:
        """The tasks, in display order."""
        return [r.id for r in self.shown]

    def cells(self, index: int) -> list[Text]:
        """The cells of line `index` (for tests and tooling)."""
        assert self.snapshot is not None
        return task_cells(self.snapshot, self.shown[index])

    def cycle_sort(self, key: str | None = None) -> None:
        """Sort by the next key (or by `key`)."""
        if key is None:
            self.sort_index = (self.sort_index + 1) % len(SORTS)
        else:
            self.sort_index = next(i for i, s in enumerate(SORTS) if s[0] == key)
        if self.snapshot is not None:
            self.show(self.snapshot)

    def show(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        _, _, key = SORTS[self.sort_index]
        rows = ([r for r in snapshot.tasks if matches(r, self.filter_text)] if self.filter_text
                else snapshot.tasks)
        self.shown = sorted(rows, key=lambda r: (key(r), r.id))
        self._late = frozenset(r.id for r in self.shown if snapshot.late(r))
        shown = (f"{len(self.shown)} of {len(snapshot.tasks)} match /{self.filter_text}"
                 if self.filter_text else f"{len(self.shown)} in flight")
        retitle(self, escape(f"Tasks · {shown} · {len(self._late)} late · "
                             f"by {SORTS[self.sort_index][1]}"),
                "⚠ late: past its workflow's p99 +25% · / filter · enter open")
        drawn = (tuple(self.shown), self._late, self.columns())
        if drawn == self._drawn:
            return  # the same rows, lateness and columns: nothing to redraw
        self._drawn = drawn
        self._lines.clear()
        height = self.virtual_size.height
        if not height - 2 * ROWS_STEP < len(self.shown) + 1 <= height:  # grows past its end,
            height = _rows(len(self.shown) + 1)  # or shrinks by two steps: a new height
        size = Size(sum(COLUMNS[i][1] for i in self.columns()), height)
        if size != self.virtual_size:  # a new size costs the screen a layout: rarely
            self.virtual_size = size
        self.cursor = min(self.cursor, max(0, len(self.shown) - 1))
        width, height = self.size
        self.refresh(Region(0, 1, width, max(0, height - 1)))  # the rows: header, border stay

    def set_filter(self, text: str) -> None:
        """Show only the tasks `matches` finds (empty: all)."""
        self.filter_text = text
        self.cursor = 0
        if self.snapshot is not None:
            self.show(self.snapshot)

    def action_open(self) -> None:
        if self.shown:
            self.post_message(self.Opened(self.shown[self.cursor].id))

    def columns(self) -> tuple[int, ...]:
        """The indices into COLUMNS shown at this width."""
        return NARROW if 0 < self.size.width < NARROW_WIDTH else WIDE

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self.show(self.snapshot)  # the columns may change with the width

    # ------------------------------------------------------------ cursor

    def action_move(self, delta: int) -> None:
        if self.shown:
            self.cursor = min(max(self.cursor + delta, 0), len(self.shown) - 1)

    def watch_cursor(self, old: int, new: int) -> None:
        self._lines.pop(old, None)
        self._lines.pop(new, None)
        # line 0 is the header: keep the cursor's line below it in view
        self.scroll_to_region(Region(0, new, 1, 2), animate=False, force=True)
        self.refresh()

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = event.x + int(self.scroll_x)
            for _, width, sort in (COLUMNS[i] for i in self.columns()):
                if x < width:
                    if sort is not None:
                        self.cycle_sort(sort)
                    return
                x -= width
            return
        index = int(self.scroll_y) + event.y - 1
        if 0 <= index < len(self.shown):
            self.cursor = index

    # ------------------------------------------------------------ rendering

    def render_lines(self, crop: Region) -> list[Strip]:
        """Textual's, with the styles and columns looked up once per repaint
        (a widget's `rich_style` walks its ancestors' styles each time)."""
        self._look = None
        try:
            return super().render_lines(crop)
        finally:
            self._look = None

    def _current_look(self) -> _Look:
        if self._look is None:
            self._look = _Look(self.rich_style, self.get_component_rich_style("tasklist--cursor"),
                               self.get_component_rich_style("tasklist--odd"), self.columns())
        return self._look

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x = int(self.scroll_x)
        look = self._current_look()
        if y == 0:
            style = self.get_component_rich_style("tasklist--header")
            text = Text()
            for label, w, _ in (COLUMNS[i] for i in look.columns):
                text.append(label.ljust(w)[:w])
            return self._strip(text, style, scroll_x, width)
        index = int(self.scroll_y) + y - 1
        if index >= len(self.shown) or self.snapshot is None:
            return Strip.blank(width, look.base)
        strip = self._lines.get(index)
        if strip is None:
            row = self.shown[index]
            base = look.base
            if index == self.cursor:
                base += look.cursor
                if not self.has_focus:
                    base += Style(dim=True)
            elif index % 2:
                base += look.odd
            cells = task_runs(self.snapshot, row, row.id in self._late)
            strip = Strip(look.segments(cells, base, self.app.console), look.width)
            self._lines[index] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, look.base)

    def _strip(self, text: Text, style: Style, scroll_x: int, width: int) -> Strip:
        segments = [Segment(s.text, style + s.style if s.style else style)
                    for s in text.render(self.app.console)]
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, style)

    def notify_style_update(self) -> None:
        self._lines.clear()  # drawn in the old styles (a theme changed)
        super().notify_style_update()

    def on_focus(self) -> None:
        self._lines.pop(self.cursor, None)
        self.refresh()

    def on_blur(self) -> None:
        self._lines.pop(self.cursor, None)
        self.refresh()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.refresh()
