"""The help screen: what each panel shows and every key binding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console import keys

PANELS = """\
[b]Residency[/b]  the KV budget as one bar: each agent's prefix on the GPU (▒ while it \
loads or is recomputed), running requests' KV (▓) and free space (░); per agent: its \
prefix's size, where it lives and the move under way (a narrow panel shows the move in \
place of where), running and waiting requests and their KV (tokens in k).
[b]Tasks[/b]  tasks in flight: the client's task id, DAG progress (█ done, ▶ running, \
· waiting), age, expected remaining longest path (Eq. 5; live only) and expected JCT. \
⚠ late, judged against its own workflow once 5 of its tasks finished: age + remaining \
past that workflow's p99 JCT by 25%, or a stage running 25% past that stage's p99. Sort \
with s or by clicking a header; / filters (id, client id, workflow, stage); j/k move; \
enter opens the task: its stages, requests and the decisions that admitted or preempted \
them (enter on one shows it).
[b]Decisions[/b]  the scheduler's decisions (+admitted −preempted ⇣evicted ⇡loaded, \
chosen score, policy wall time). The highlighted one's candidate states are on the \
right with every score term: total = J_admit − J_move − J_redo − J_revoke + V_reuse; \
the highest total wins. Preempted requests are named by task, stage and agent; a \
narrow panel shows the terms that set the winner apart first, and says which columns \
scroll.
[b]Parameters[/b]  p: the policy and its parameters, validated against the daemon's \
ranges, applied with PATCH /v1/params (effective at the next decision).
[b]Replay[/b]  on a store file every panel shows the state as of the time cursor.\
"""


class HelpScreen(ModalScreen[None]):
    """Panels and key bindings."""

    CSS_PATH = "../help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        # the keys that opened it close it too, as a keymap rebinds them
        Binding("question_mark,f1", "dismiss", "Close", show=False, id="console.help"),
        Binding("q", "dismiss", "Close", show=False, id="console.quit")]

    def __init__(self, keymap: Mapping[str, str] | None = None) -> None:
        super().__init__(id="help")
        self.keymap = dict(keymap or {})

    def compose(self) -> ComposeResult:
        table = Table(box=None, expand=True, padding=(0, 2))
        table.add_column("where", style="dim", no_wrap=True)
        table.add_column("keys", style="bold cyan", no_wrap=True)
        table.add_column("what")
        for section, key, what in keys.help_rows(self.keymap):
            table.add_row(section, key, what)
        with VerticalScroll(id="help-body"):  # the keys first: a short terminal shows them
            yield Static(table, id="help-keys")
            yield Static(Text.from_markup(PANELS), id="help-panels")

    def on_mount(self) -> None:
        body = self.query_one("#help-body")
        body.border_title = "topasd console · help"
        body.border_subtitle = "escape closes · keys can be rebound with --keymap FILE"
