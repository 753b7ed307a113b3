"""Replay: ask for a time, or a decision number (`#N`), to jump to."""

from __future__ import annotations

import math
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

# ("t", seconds) or ("decision", seq)
GotoTarget = tuple[str, float]


def parse_target(text: str, lo: float, hi: float, seqs: tuple[int, int] | None
                 ) -> GotoTarget | str:
    """The target `text` names ("62.2", "62.2s"; "#17", "d17"), or why it is none."""
    text = text.strip().lower()
    if text.startswith(("#", "d")):
        number = text.lstrip("#d").strip()
        if not number.isdigit():
            return "a decision as #N, e.g. #17"
        if seqs is None:
            return "this run has no decisions"
        seq = int(number)
        if not seqs[0] <= seq <= seqs[1]:
            return f"no decision {seq}: decisions are #{seqs[0]} to #{seqs[1]}"
        return ("decision", float(seq))
    try:
        t = float(text.removesuffix("s"))
    except ValueError:
        t = math.nan
    if not math.isfinite(t):
        return "a number of seconds, or #N for a decision"
    if not lo <= t <= hi:
        return f"outside the run: {lo:.2f} to {hi:.2f}"
    return ("t", t)


class GotoScreen(ModalScreen[GotoTarget | None]):
    """A time in seconds within the run, or a decision `#N`; dismissed with it
    (or None)."""

    CSS_PATH = "../help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, t0: float, t1: float, now: float,
                 seqs: tuple[int, int] | None = None) -> None:
        super().__init__(id="goto")
        self.t0, self.t1, self.now, self.seqs = t0, t1, now, seqs
        # the limits at the input's precision (rounded outward): what they show is accepted
        self.lo, self.hi = math.floor(t0 * 100) / 100, math.ceil(t1 * 100) / 100

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label(f"Go to time (s), {self.lo:.2f} to {self.hi:.2f}:")
            if self.seqs is not None:
                yield Label(f"or to a decision: #N, #{self.seqs[0]} to #{self.seqs[1]}",
                            id="goto-decisions")
            yield Input(value=f"{self.now:.2f}", id="goto-input")
            yield Label("", id="goto-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        target = parse_target(event.value, self.lo, self.hi, self.seqs)
        if isinstance(target, str):
            self.query_one("#goto-error", Label).update(target)
            return
        kind, value = target
        self.dismiss((kind, min(max(value, self.t0), self.t1)) if kind == "t" else target)

    def action_cancel(self) -> None:
        self.dismiss(None)
