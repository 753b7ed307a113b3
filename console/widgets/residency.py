"""Residency: the KV budget as one bar, and where each agent's prefix lives."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from console.snapshot import Snapshot
from console.widgets.format import agent_colour, secs, split_cells, tokens

REQUESTS_STYLE = "#d4a017"
FREE_STYLE = "grey35"
LOCATION = {"gpu": ("GPU", "bold green"), "host": ("host", "cyan"), "none": ("none", "grey50")}


class Residency(Static):
    """The KV bar (prefixes by agent, running requests' KV, free) and a row per
    agent: prefix size and place, moves under way, running/waiting requests."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__("waiting for the first state…", id=id)
        self.snapshot: Snapshot | None = None
        self.border_title = "Residency"

    def show(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.update(self._render_snapshot(snapshot))

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self.update(self._render_snapshot(self.snapshot))

    def _render_snapshot(self, s: Snapshot) -> RenderableType:
        width = max(10, self.content_size.width or 60)
        colours = {a.agent: agent_colour(i) for i, a in enumerate(s.agents)}
        return Group(self._bar(s, width, colours), self._legend(s), self._table(s, colours))

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

    def _legend(self, s: Snapshot) -> Text:
        budget = "?" if s.budget is None else tokens(s.budget)
        text = Text(f"KV {tokens(s.kv_prefixes + s.kv_requests)} / {budget}: ")
        text.append("prefixes ", style="bold")
        text.append(tokens(s.kv_prefixes))
        text.append(" · ")
        text.append("requests ", style=f"bold {REQUESTS_STYLE}")
        text.append(tokens(s.kv_requests))
        text.append(" · ")
        text.append("free ", style="bold")
        text.append(tokens(s.kv_free))
        return text

    def _table(self, s: Snapshot, colours: dict[str, str]) -> Table:
        table = Table(box=None, expand=True, pad_edge=False, padding=(0, 1))
        for name, justify in (("agent", "left"), ("prefix", "right"), ("where", "left"),
                              ("moving", "left"), ("run", "right"), ("wait", "right"),
                              ("KV", "right")):
            table.add_column(name, justify=justify, header_style="bold", no_wrap=True)  # type: ignore[arg-type]
        for a in s.agents:
            where, style = LOCATION.get(a.location, (a.location, ""))
            if a.location == "gpu" and not a.ready:
                where, style = "GPU…", "yellow"
            moving = "—"
            if a.transfer is not None:
                arrow = {"load": "host→GPU", "offload": "GPU→host", "compute": "prefill"}
                moving = arrow.get(a.transfer, a.transfer)
                if a.transfer_until is not None:
                    moving += f" {secs(max(0.0, a.transfer_until - s.t), 2)}"
            table.add_row(Text("■ ", style=colours[a.agent]) + Text(a.agent),
                          tokens(a.tokens), Text(where, style=style),
                          Text(moving, style="magenta" if a.transfer else "grey50"),
                          str(a.running), str(a.waiting), tokens(a.kv_running))
        return table
