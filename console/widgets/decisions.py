"""Decisions: the feed, and the candidates of the selected decision."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from console.snapshot import DecisionDetail, DecisionRow
from console.widgets.format import ids
from console.widgets.phrases import Phrases

FEED_ROWS = 300  # decisions the live feed keeps
# the total right after # and won: a narrow panel cuts the last columns
CANDIDATE_COLUMNS = ("#", "won", "total", "resident", "admit", "preempt", "J_admit", "J_move",
                     "J_redo", "J_revoke", "V_reuse")


def actions(d: DecisionRow) -> Text:
    """'+3 −1 ⇡A ⇣C' (admitted, preempted, prefixes loaded and evicted)."""
    if d.noop:
        return Text("no-op", style="grey50")
    text = Text()
    for n, sign, style in ((len(d.admit), "+", "green"), (len(d.preempt), "−", "red")):
        if n:
            text.append(f"{sign}{n} ", style=style)
    for names, arrow, style in ((d.load, "⇡", "cyan"), (d.evict, "⇣", "magenta")):
        for a in names:
            text.append(f"{arrow}{a} ", style=style)
    if d.blocked:
        text.append("blocked", style="yellow")
    return text


def num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}" if abs(x) < 1e-3 and x else f"{x:.3f}"


class DecisionFeed(DataTable[Text | str]):
    """Decisions, newest at the bottom; no-ops hidden unless asked for."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.show_noop = False
        self.follow = True
        self.rows_shown: list[DecisionRow] = []
        self.border_title = "Decisions"

    def on_mount(self) -> None:
        # the variable-width actions last: a wide one no longer pushes ms out of sight
        for label in ("seq", "t", "score", "ms", "actions"):
            self.add_column(label, key=label)

    def shows(self, d: DecisionRow) -> bool:
        """Whether the feed lists `d` (no-ops only when they are shown)."""
        return self.show_noop or not d.noop

    def append(self, rows: Sequence[DecisionRow]) -> None:
        """Add new decisions (live); keeps the last FEED_ROWS."""
        was_last = not self.row_count or self.cursor_row >= self.row_count - 1
        before = self.selected()
        for d in rows:
            if not self.shows(d) or str(d.seq) in self.rows:
                continue
            self.add_row(*self._cells(d), key=str(d.seq))
            self.rows_shown.append(d)
        extra = len(self.rows_shown) - FEED_ROWS
        if extra > 0:
            for d in self.rows_shown[:extra]:
                self.remove_row(str(d.seq))
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
        self.border_title = "Decisions" + "".join(f" · {f}" for f in flags)

    @staticmethod
    def _cells(d: DecisionRow) -> list[Text | str]:
        return [str(d.seq), f"{d.t:.2f}", num(d.total), f"{d.wall_ms:.2f}", actions(d)]


class DecisionDetailView(Vertical):
    """What a decision did, and every candidate state with its score terms."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Candidates"
        self.detail: DecisionDetail | None = None

    def compose(self) -> ComposeResult:
        yield Phrases("select a decision", id="detail-summary")
        table: DataTable[Text | str] = DataTable(id="candidates", cursor_type="row",
                                                 zebra_stripes=True)
        yield table

    def on_mount(self) -> None:
        self._columns()

    def _columns(self) -> None:
        """(Re)set the columns, so their widths fit the rows shown now."""
        table = self.query_one("#candidates", DataTable)
        table.clear(columns=True)
        for label in CANDIDATE_COLUMNS:
            table.add_column(label, key=label)

    def show_message(self, text: str) -> None:
        self.detail = None
        self.query_one("#detail-summary", Phrases).set_phrases([Text(text)])
        self.query_one("#candidates", DataTable).clear()

    def show(self, detail: DecisionDetail) -> None:
        self.detail = detail
        d = detail.row
        phrases = [Text(f"#{d.seq}", style="bold") + Text(f" at t={d.t:.3f}s"),
                   Text(f" · {detail.policy}"), Text(f" · {d.wall_ms:.2f} ms"),
                   Text(f" · {detail.note}\n")]
        if self.screen.has_class("-short"):  # the feed's row has the rest: rows for the table
            phrases = [Text(f"#{d.seq}  ", style="bold")]
        for i, (label, values, style) in enumerate((
                ("admitted", d.admit, "green"), ("preempted", d.preempt, "red"),
                ("loaded", d.load, "cyan"), ("evicted", d.evict, "magenta"))):
            phrases.append(Text("  " if i else "") + Text(f"{label} ", style=f"bold {style}")
                           + Text(ids(list(values), 8)))
        self.query_one("#detail-summary", Phrases).set_phrases(phrases)
        self._columns()
        table = self.query_one("#candidates", DataTable)
        for c in detail.candidates:
            style = "bold green" if c.won else ""
            table.add_row(Text(str(c.idx), style=style), Text("★" if c.won else "", style=style),
                          Text(num(c.total), style=style), ",".join(c.resident) or "∅",
                          ids(list(c.admit)), ids(list(c.preempt)), num(c.j_admit),
                          num(c.j_move), num(c.j_redo), num(c.j_revoke), num(c.v_reuse),
                          key=str(c.idx))
