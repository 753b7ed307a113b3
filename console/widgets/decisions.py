"""Decisions: the feed, and the candidates of the selected decision."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Self

from rich.cells import cell_len, set_cell_size
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.app import ComposeResult
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import CellKey, RowKey

from console.snapshot import CandidateRow, DecisionDetail, DecisionRow
from console.widgets.format import ids, retitle
from console.widgets.phrases import Phrases

FEED_ROWS = 120  # decisions the live feed keeps
TERMS = ("J_admit", "J_move", "J_redo", "J_revoke", "V_reuse")  # Eq. 13's, in its order
# the total and every term right after # and won, the sets last: at 160 columns all the
# terms show; a narrower panel puts the terms that decide first and says what scrolls
CANDIDATE_COLUMNS = ("#", "won", "total", *TERMS, "resident", "admit", "preempt")
WIDE_DETAIL = 96  # the candidates panel from this many cells shows the terms in Eq. 13's order
ACTIONS_WIDTH = 16  # the feed's actions past this many cells count loads instead of naming
FEED_COLUMNS = (("seq", 6), ("t", 7), ("score", 7), ("ms", 5), ("actions", ACTIONS_WIDTH))
STRIP_CACHE = 4 * FEED_ROWS  # rendered lines kept (a row in a few looks)


def term_values(c: CandidateRow) -> dict[str, float]:
    return {"J_admit": c.j_admit, "J_move": c.j_move, "J_redo": c.j_redo,
            "J_revoke": c.j_revoke, "V_reuse": c.v_reuse}


def deciding_order(detail: DecisionDetail) -> tuple[str, ...]:
    """The terms by how much they set the chosen state apart from the best
    rejected one (signed as they enter the total), the most first."""
    won = next((c for c in detail.candidates if c.won), None)
    rest = [c for c in detail.candidates if not c.won]
    if won is None or not rest:
        return TERMS
    best = max(rest, key=lambda c: c.total)
    sign = {"J_admit": 1, "J_move": -1, "J_redo": -1, "J_revoke": -1, "V_reuse": 1}
    a, b = term_values(won), term_values(best)
    return tuple(sorted(TERMS, key=lambda k: -abs(sign[k] * (a[k] - b[k]))))


def winner_phrase(detail: DecisionDetail) -> Text | None:
    """'the highest total wins: #3 (41.2) over #7 (39.9)'."""
    won = next((c for c in detail.candidates if c.won), None)
    rest = [c for c in detail.candidates if not c.won]
    if won is None:
        return None
    text = Text("  the highest total wins: ", style="bold") + Text(
        f"#{won.idx} ({num(won.total)})", style="bold green")
    if rest:
        best = max(rest, key=lambda c: c.total)
        text += Text(f" over #{best.idx} ({num(best.total)})")
    return text


def held_phrase(detail: DecisionDetail) -> Text | None:
    """'  held 7: r1 ×4, r3 ×3': the requests the decision left out of W_t
    (TOPAS's `phases` and `lot_size`), counted by agent."""
    if not detail.held:
        return None
    agents = Counter(detail.requests.get(rid, (None, "?", "?"))[2] for rid in detail.held)
    by_agent = ", ".join(f"{a} ×{n}" for a, n in sorted(agents.items()))
    return Text("  ") + Text(f"held {len(detail.held)}", style="bold yellow") + Text(
        f": {strip_control_codes(by_agent)}")


Run = tuple[str, str]  # (text, style)


def action_runs(d: DecisionRow, width: int = ACTIONS_WIDTH) -> list[Run]:
    """'+3 −1 ⇣C ⇡A h4' (admitted, preempted, prefixes evicted and loaded,
    requests held out of W_t) as runs of text. Evictions come before loads;
    past `width` cells the prefixes are counted ('⇣2 ⇡5'), so a full column
    never hides an eviction nor the holds."""
    held = f"h{d.n_held}" if d.n_held else ""
    if d.noop:
        return [("no-op ", "grey50"), (held, "yellow")] if held else [("no-op", "grey50")]
    runs: list[Run] = []
    for n, sign, style in ((len(d.admit), "+", "green"), (len(d.preempt), "−", "red")):
        if n:
            runs.append((f"{sign}{n} ", style))
    named = sum(len(a) + 2 for a in (*d.evict, *d.load)) + len(held)
    for names, arrow, style in ((d.evict, "⇣", "magenta"), (d.load, "⇡", "cyan")):
        if names and sum(cell_len(t) for t, _ in runs) + named > width:
            runs.append((f"{arrow}{len(names)} ", style))
            continue
        runs += [(strip_control_codes(f"{arrow}{a} "), style) for a in names]
    if held:  # before `blocked`, which the width may cut
        runs.append((held + " " if d.blocked else held, "yellow"))
    if d.blocked:
        runs.append(("blocked", "yellow"))
    return runs


def actions(d: DecisionRow, width: int = ACTIONS_WIDTH) -> Text:
    """`action_runs` as Rich text."""
    return runs_text(action_runs(d, width))


def runs_text(runs: Iterable[Run]) -> Text:
    text = Text()
    for part, style in runs:
        text.append(part, style=style)
    return text


def fit_runs(runs: Sequence[Run], width: int) -> Sequence[Run]:
    """`runs` cut to `width` cells as a one-line cell of a DataTable cuts its
    text (Rich's fold overflow: the cells past the width dropped, a wide
    character split at the edge becomes a space)."""
    if sum(cell_len(text) for text, _ in runs) <= width:
        return runs
    out: list[Run] = []
    for text, style in runs:
        n = cell_len(text)
        if n >= width:
            out.append((set_cell_size(text, width), style))
            break
        out.append((text, style))
        width -= n
    return out


def num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}" if abs(x) < 1e-3 and x else f"{x:.3f}"


class _FeedLook:
    """What one repaint of the feed renders rows with: the table's styles and
    column widths, as Textual's DataTable looks them up for a row cursor."""

    def __init__(self, table: DecisionFeed) -> None:
        self.base = table.rich_style
        self.width = table.size.width
        self.widths = tuple(c.get_render_width(table) for c in table.ordered_columns)
        self.rows = tuple(table.get_component_styles(f"datatable--{k}-row").rich_style
                          for k in ("even", "odd"))
        self.cursor = table.get_component_rich_style("datatable--cursor")
        self.hover = table.get_component_rich_style("datatable--hover")
        self.show_cursor = table.show_cursor
        self.show_hover = table._show_hover_cursor
        self.css_color = table.cursor_foreground_priority == "css"
        self.css_bgcolor = table.cursor_background_priority == "css"
        self.key = (self.base, self.width, self.widths, self.rows, self.cursor, self.hover,
                    self.show_cursor, self.show_hover, self.css_color, self.css_bgcolor)

    def component(self, cursor: bool, hover: bool) -> Style:
        style = Style()
        if hover and self.show_cursor and self.show_hover:
            style += self.hover
        if cursor and self.show_cursor:
            style += self.cursor
        return style

    def segments(self, cells: Sequence[Sequence[Run]], index: int, cursor: bool,
                 hover: bool) -> list[Segment]:
        """Row `index`'s segments as the DataTable renders them (each cell padded
        by one cell a side, its runs on the row's style plus the cursor's, cut
        to the column; the mouse metadata naming the cell)."""
        row = self.rows[index % 2]
        component = self.component(cursor, hover)
        post = (Style.from_color(color=component.color) if self.css_color else Style.null()) + (
            Style.from_color(bgcolor=component.bgcolor) if self.css_bgcolor else Style.null())
        out: list[Segment] = []
        for column, (runs, width) in enumerate(zip(cells, self.widths, strict=True)):
            pre = row + Style.from_meta({"row": index, "column": column}) + component
            pad = pre + post
            runs = fit_runs(runs, width - 2)
            used = sum(cell_len(text) for text, _ in runs)
            out.append(Segment(" ", pad))
            out += [Segment(text, pre + Style.parse(style) + post) for text, style in runs
                    if text]
            out.append(Segment(" " * (width - 1 - used), pad))
        extend = row + component + Style.from_meta({"row": index, "column": 0,
                                                    "out_of_bounds": True})
        out.append(Segment(" " * max(0, self.width - sum(self.widths)), extend))
        return out


class DecisionFeed(DataTable[Text | str]):
    """Decisions, newest at the bottom; no-ops hidden unless asked for. Its
    rows render as Textual's DataTable renders them, from each decision's
    runs of text, kept by decision and look (a decision's cells never change;
    every added or trimmed row starts the DataTable's own caches over)."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.show_noop = False
        self.follow = True
        self._trimming = False
        self.rows_shown: list[DecisionRow] = []
        self.border_title = "Decisions"
        self._look: _FeedLook | None = None  # styles and widths of one repaint
        self._strips: LRUCache[tuple[Any, ...], Strip] = LRUCache(STRIP_CACHE)

    def on_mount(self) -> None:
        # fixed widths (a wider cell would cost the screen a new layout), the
        # variable-width actions last: a wide one no longer pushes ms out of sight
        for label, width in FEED_COLUMNS:
            self.add_column(label, key=label, width=width)

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Self:
        """As a DataTable's, but a trimmed row asks for no layout of its own (the
        feed's height, if it changed, asks for one; a full feed's does not)."""
        return super().refresh(*regions, repaint=repaint, layout=layout and not self._trimming,
                               recompose=recompose)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """The DataTable's scrollable size, without measuring the new rows' cells:
        with every column of a fixed width and every row one unlabelled line (the
        feed's), a cell's width moves no column and the size is the columns'
        widths by the rows' lines under the header."""
        keys = list(new_rows)
        if any(c.auto_width for c in self.columns.values()) or any(
                r.label is not None or r.auto_height
                for r in (self.rows.get(k) for k in keys) if r is not None):
            super()._update_dimensions(keys)
            return
        width = sum(c.get_render_width(self) for c in self.columns.values())
        header = self.header_height if self.show_header else 0
        self.virtual_size = Size(width + self._row_label_column_width,
                                 self._total_row_height + header)

    def clear(self, columns: bool = False) -> Self:
        self._strips.clear()  # a restarted daemon numbers its decisions from 1 again
        return super().clear(columns)

    def render_lines(self, crop: Region) -> list[Strip]:
        self._look = None
        try:
            return super().render_lines(crop)
        finally:
            self._look = None

    def render_line(self, y: int) -> Strip:
        """A decision's line from its runs (lines past the last row: the
        DataTable's; the header the DataTable's, kept by look and hover: every
        added or trimmed row starts the DataTable's own caches over)."""
        scroll_x, scroll_y = self.scroll_offset
        header = self.header_height if self.show_header else 0
        index = y + scroll_y - header
        if self.cursor_type != "row" or (y >= header and not 0 <= index < len(self.rows_shown)):
            return super().render_line(y)
        if self._look is None:
            self._look = _FeedLook(self)
        if y < header:
            hovered = self.hover_coordinate  # a row cursor highlights a hovered header only
            top: tuple[Any, ...] = ("header", y, scroll_x, hovered.row < 0 and hovered,
                                    self._pseudo_class_state, self._look.key)
            line = self._strips.get(top)
            if line is None:
                line = self._strips[top] = super().render_line(y)
            return line
        look, d = self._look, self.rows_shown[index]
        cursor = index == self.cursor_coordinate.row
        hover = index == self.hover_coordinate.row
        key = (d.seq, index, cursor, hover, scroll_x, look.key)
        strip = self._strips.get(key)
        if strip is None:
            line = Strip(look.segments(self._runs(d), index, cursor, hover))
            strip = line.crop(scroll_x, scroll_x + look.width).adjust_cell_length(
                look.width, look.base).simplify()
            self._strips[key] = strip
        return strip

    def shows(self, d: DecisionRow) -> bool:
        """Whether the feed lists `d` (no-ops only when they are shown)."""
        return self.show_noop or not d.noop

    def append(self, rows: Sequence[DecisionRow]) -> None:
        """Add new decisions (live); keeps the last FEED_ROWS. A full feed trims as
        many as it adds, so its height stays and the screen needs no new layout."""
        was_last = not self.row_count or self.cursor_row >= self.row_count - 1
        before = self.selected()
        for d in rows:
            if not self.shows(d) or str(d.seq) in self.rows:
                continue
            self.add_row(*self._cells(d), key=str(d.seq))
            self.rows_shown.append(d)
        extra = len(self.rows_shown) - FEED_ROWS
        if extra > 0:
            self._remove_rows([str(d.seq) for d in self.rows_shown[:extra]])
            del self.rows_shown[:extra]
        if self.follow and was_last and self.row_count:
            last = self.row_count - 1
            if self.cursor_row == last and self.selected() != before:
                # a full feed trimmed: the same row holds a newer decision; moving there
                # again would not say so, and the candidates would stay behind
                key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
                self.post_message(DataTable.RowHighlighted(self, last, key))
            self.move_cursor(row=last, animate=False)
            # to the very end once laid out: a horizontal scrollbar would hide the last row
            self.call_after_refresh(self.scroll_end, animate=False, x_axis=False)
        self._title()

    def _remove_rows(self, keys: Sequence[str]) -> None:
        """`DataTable.remove_row` for many rows at once: the rows' places are
        renumbered, the cursor re-checked and the caches dropped once, not once
        per row (each of those passes walks every row of the feed)."""
        gone = {RowKey(k) for k in keys}
        for key in gone:
            for column_key in self._data.pop(key):
                self._updated_cells.discard(CellKey(key, column_key))
            del self.rows[key]
        places = self._row_locations
        kept = sorted((places.get(k), k) for k in places if k not in gone)
        self._row_locations = TwoWayDict({k: i for i, (_, k) in enumerate(kept)})
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate  # clamped; Textual's watchers run
        self.hover_coordinate = self.hover_coordinate
        self._update_count += 1
        self._trimming = True  # its own layout request: the new size, if any, asks
        try:
            self.refresh(layout=True)
        finally:
            self._trimming = False

    def replace(self, rows: Sequence[DecisionRow], select: int | None = None) -> None:
        """Show `rows` (the last FEED_ROWS of them), the cursor on decision `select`."""
        self.clear()
        # at most FEED_ROWS: more would cost append() a row-by-row trim (seconds)
        self.rows_shown = [d for d in rows if self.shows(d) or d.seq == select][-FEED_ROWS:]
        for d in self.rows_shown:
            self.add_row(*self._cells(d), key=str(d.seq))
        if select is not None and str(select) in self.rows:
            self.move_cursor(row=self.get_row_index(str(select)), animate=False)
        elif self.row_count:
            self.move_cursor(row=self.row_count - 1, animate=False)
        self._title()

    def selected(self) -> int | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return None if key is None else int(key)

    def following(self) -> bool:
        """New decisions move the cursor: follow is on and it is on the last row."""
        return self.follow and (not self.row_count or self.cursor_row >= self.row_count - 1)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._title()  # moving off the last row stops following: say so

    def _title(self) -> None:
        flags = [] if self.show_noop else ["no-ops hidden"]
        if not self.follow:
            flags.append("not following")
        elif not self.following():
            flags.append("not following (f or the last row follows)")
        retitle(self, "Decisions" + "".join(f" · {f}" for f in flags))

    @staticmethod
    def _runs(d: DecisionRow) -> list[list[Run]]:
        """Each cell's runs of text, in FEED_COLUMNS' order."""
        return [[(str(d.seq), "")], [(f"{d.t:.2f}", "")], [(num(d.total), "")],
                [(f"{d.wall_ms:.2f}", "")], action_runs(d)]

    @classmethod
    def _cells(cls, d: DecisionRow) -> list[Text | str]:
        *plain, acts = cls._runs(d)
        return [*("".join(t for t, _ in runs) for runs in plain), runs_text(acts)]


class CandidateTable(DataTable[Text | str]):
    """The candidate states. Its size is the panel's; a new decision's rows
    that keep the scrollbars as the last one's did (none, or the same ones)
    ask for no new layout of the screen: Textual lays out the screen for any
    new scrollable size, but with the table's own size fixed only its
    scrollbars' thumbs move, and those are set here."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._sizing = False  # within `_update_dimensions`: a new scrollable size

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        self._sizing = True
        try:
            super()._update_dimensions(new_rows)
        finally:
            self._sizing = False

    def scrollbars(self, size: Size) -> tuple[bool, bool]:
        """(horizontal, vertical): the scrollbars Textual shows for a scrollable
        `size` in the table's present room (overflow auto both ways)."""
        width, height = self.container_size
        wide, tall = size.width > width, size.height > height
        if tall and not wide:
            wide = size.width > width - self.styles.scrollbar_size_vertical
        if wide and not tall:
            tall = size.height > height - self.styles.scrollbar_size_horizontal
        return wide, tall

    def _same_scrollbars(self) -> bool:
        """Whether the new scrollable size keeps the scrollbars shown now."""
        styles = self.styles
        if not (self.is_mounted and self.container_size and styles.overflow_x == "auto"
                and styles.overflow_y == "auto"):
            return False
        return self.scrollbars(self.virtual_size) == self.scrollbars_shown()

    def scrollbars_shown(self) -> tuple[bool, bool]:
        """(horizontal, vertical): the scrollbars shown now."""
        return self.show_horizontal_scrollbar, self.show_vertical_scrollbar

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Self:
        """As a DataTable's, but a new size that keeps the scrollbars asks for a
        repaint and sets the scrollbars' thumbs (what the layout would do)."""
        if layout and self._sizing and self._same_scrollbars():
            self._scroll_update(self.virtual_size)
            if self.scrollbars_shown() == self.scrollbars(self.virtual_size):
                layout = False
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)


class DecisionDetailView(Vertical):
    """What a decision did, and every candidate state with its score terms."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Candidates"
        self.detail: DecisionDetail | None = None

    def compose(self) -> ComposeResult:
        yield Phrases("select a decision", id="detail-summary", min_lines=3)
        yield CandidateTable(id="candidates")

    def on_mount(self) -> None:
        self._columns(TERMS)

    def _columns(self, terms: tuple[str, ...]) -> None:
        """The columns in this order (new ones only when the order changes)."""
        table = self.query_one("#candidates", DataTable)
        labels = ("#", "won", "total", *terms, "resident", "admit", "preempt")
        if tuple(str(c.label) for c in table.ordered_columns) == labels:
            table.clear()  # the same columns: their widths grow to fit, never shrink
            return
        table.clear(columns=True)
        for label in labels:
            table.add_column(label, key=label)

    def show_message(self, text: str) -> None:
        self.detail = None
        self.query_one("#detail-summary", Phrases).set_phrases([Text(text)])
        self.query_one("#candidates", DataTable).clear()
        self.border_subtitle = ""

    def show(self, detail: DecisionDetail) -> None:
        self.detail = detail
        d = detail.row
        phrases = [Text(f"#{d.seq}", style="bold") + Text(f" at t={d.t:.3f}s"),
                   Text(f" · {detail.policy}"), Text(f" · {d.wall_ms:.2f} ms"),
                   Text(f" · {detail.note}\n")]
        if self.screen.has_class("-short"):  # the feed's row has the rest: rows for the table
            phrases = [Text(f"#{d.seq}  ", style="bold")]
        preempted = [detail.named(r) for r in d.preempt[:4]]
        if len(d.preempt) > 4:
            preempted.append(f"+{len(d.preempt) - 4}")
        for i, (label, values, style) in enumerate((
                ("admitted", ids(list(d.admit), 8), "green"),
                ("preempted", " ".join(preempted) or "—", "red"),
                ("evicted", ids(list(d.evict), 8), "magenta"),
                ("loaded", ids(list(d.load), 8), "cyan"))):
            phrases.append(Text("  " if i else "") + Text(f"{label} ", style=f"bold {style}")
                           + Text(values))
        held = held_phrase(detail)
        if held is not None:
            phrases.append(held)
        wins = winner_phrase(detail)
        if wins is not None:
            phrases.append(wins)
        summary = self.query_one("#detail-summary", Phrases)
        summary.min_lines = 1 if self.screen.has_class("-short") else 3  # as its CSS says
        summary.set_phrases(phrases)
        wide = self.size.width >= WIDE_DETAIL or not self.size.width
        terms = TERMS if wide else deciding_order(detail)
        self._columns(terms)
        table = self.query_one("#candidates", DataTable)
        for c in detail.candidates:
            style = "bold green" if c.won else ""
            terms_of = term_values(c)
            table.add_row(Text(str(c.idx), style=style), Text("★" if c.won else "", style=style),
                          Text(num(c.total), style=style), *(num(terms_of[k]) for k in terms),
                          ",".join(c.resident) or "∅", ids(list(c.admit)), ids(list(c.preempt)),
                          key=str(c.idx))
        self.call_after_refresh(self._scroll_hint, table)

    def _scroll_hint(self, table: DataTable[Text | str]) -> None:
        """Say which columns lie past the panel's right edge (they scroll)."""
        x, hidden = 0, []
        for column in table.ordered_columns:
            x += column.get_render_width(table)
            if x > table.scrollable_content_region.width + int(table.scroll_x):
                hidden.append(str(column.label))
        retitle(self, subtitle=f"→ scroll for {', '.join(hidden)}" if hidden else "")

    def on_resize(self) -> None:
        if self.detail is not None:
            self.show(self.detail)
