"""The key bindings' footer, composed again only when what it shows changes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer


class SteadyFooter(Footer):
    """Textual's footer, but a change of the screen's bindings that leaves the
    keys shown as they are (showing a kept screen again, a focus move) keeps
    its keys: Textual's mounts them anew each time, and each mount costs the
    screen a new layout (most of what showing the parameter form again took)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: tuple[Any, ...] | None = None

    def _keys(self, screen: Screen[Any]) -> tuple[Any, ...]:
        """What the footer shows for `screen`'s bindings now."""
        return tuple((b.key, self.app.get_key_display(b), b.description, b.action, b.group,
                      enabled, tooltip)
                     for _, b, enabled, tooltip in screen.active_bindings.values() if b.show)

    def compose(self) -> ComposeResult:
        keys: Iterable[Widget] = super().compose()
        if self._bindings_ready:
            self._shown = self._keys(self.screen)
        yield from keys

    def bindings_changed(self, screen: Screen[Any]) -> None:
        if (self._shown is not None and self.is_attached and screen is self.screen
                and self._keys(screen) == self._shown):
            return
        super().bindings_changed(screen)
