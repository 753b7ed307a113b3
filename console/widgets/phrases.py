"""A Static of phrases that a narrow terminal wraps between phrases, never
inside one ('11 running', 'preempted 12 19 21')."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

SEPARATORS = (" · ", "   ", "  ")  # dropped where a phrase starts a new line


class Phrases(Static):
    """Shows `set_phrases(...)`, re-wrapped whenever its width changes."""

    def __init__(self, content: str = "", id: str | None = None, min_lines: int = 1) -> None:
        super().__init__(content, id=id)
        self.min_lines = min_lines  # its CSS min-height: fewer lines keep its height
        self._phrases: list[Text] = []
        self._shown: Text | None = None

    def set_phrases(self, phrases: Sequence[Text]) -> None:
        self._phrases = list(phrases)
        self._show(wrap_phrases(self._phrases, self.content_size.width))

    def on_resize(self) -> None:
        if self._phrases:
            self._show(wrap_phrases(self._phrases, self.content_size.width))

    def _show(self, text: Text) -> None:
        """Show `text`: nothing to do when it is what is shown, and a new layout
        only when its number of lines changed (a repaint costs far less)."""
        old = self._shown
        if old is not None and old == text:
            return
        self._shown = text

        def height(t: Text) -> int:
            return max(self.min_lines, t.plain.count("\n") + 1)

        self.update(text, layout=old is None or height(old) != height(text))


def wrap_phrases(phrases: Sequence[Text], width: int) -> Text:
    """The phrases on as few lines as `width` allows, broken only between
    phrases (a phrase that ends in a newline ends its line; one wider than a
    line wraps on its own)."""
    out, line = Text(), 0
    for phrase in phrases:
        if line and width > 0 and line + phrase.cell_len > width:
            out.append("\n")
            for sep in SEPARATORS:
                if phrase.plain.startswith(sep):
                    phrase = phrase[len(sep):]
                    break
            line = 0
        out.append_text(phrase)
        line = 0 if phrase.plain.endswith("\n") else line + phrase.cell_len
    return out
