"""Replay: ask for a time to jump to."""

from __future__ import annotations

import math
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class GotoScreen(ModalScreen[float | None]):
    """A time in seconds, within the run; dismissed with it (or None)."""

    CSS_PATH = "../help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, t0: float, t1: float, now: float) -> None:
        super().__init__(id="goto")
        self.t0, self.t1, self.now = t0, t1, now
        # the limits at the input's precision (rounded outward): what they show is accepted
        self.lo, self.hi = math.floor(t0 * 100) / 100, math.ceil(t1 * 100) / 100

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label(f"Go to time (s), {self.lo:.2f} to {self.hi:.2f}:")
            yield Input(value=f"{self.now:.2f}", id="goto-input", type="number")
            yield Label("", id="goto-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            t = float(event.value)
        except ValueError:
            t = math.nan
        if not math.isfinite(t):
            self.query_one("#goto-error", Label).update("a number of seconds, please")
            return
        if not self.lo <= t <= self.hi:
            self.query_one("#goto-error", Label).update(
                f"outside the run: {self.lo:.2f} to {self.hi:.2f}")
            return
        self.dismiss(min(max(t, self.t0), self.t1))

    def action_cancel(self) -> None:
        self.dismiss(None)
