"""The main screen: headline numbers, residency, tasks, decisions and candidates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input

from console import keys
from console.snapshot import DecisionDetail, DecisionRow, Numbers, Snapshot
from console.widgets.decisions import DecisionDetailView, DecisionFeed
from console.widgets.footer import SteadyFooter
from console.widgets.headline import Headline
from console.widgets.residency import Residency
from console.widgets.status import CursorBar, StatusLine
from console.widgets.tasks import TaskList

if TYPE_CHECKING:
    from console.app import ConsoleApp


class TaskFilter(Input):
    """The tasks' filter box (`/`): escape clears it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "clear", "Clear", show=False)]

    def action_clear(self) -> None:
        screen = self.screen
        if isinstance(screen, Dashboard):
            screen.close_filter(keep=False)

FOOTER_ORDER = {b.id: i for i, b in enumerate(keys.ALL)}  # the footer's order
SHORT = 32  # terminal rows below which the headline has no trend lines
LIVE_ACTIONS = {"pause", "follow"}
REPLAY_ACTIONS = {"step", "jump", "to_start", "to_end", "goto"}


class Dashboard(Screen[None]):
    """Everything at a glance; live or at the replay cursor."""

    BINDINGS: ClassVar[list[BindingType]] = [*keys.DASHBOARD, *keys.LIVE, *keys.REPLAY]

    def __init__(self, replay: bool) -> None:
        super().__init__(id="dashboard")
        self.replay = replay

    @property
    def active_bindings(self) -> dict[str, ActiveBinding]:
        """Textual's, in the order of `keys.ALL` (the app's Help and Quit first):
        the footer lists the app's last, a binding a keymap moved after the rest,
        and cuts the end of the line on a narrow terminal."""
        bindings = super().active_bindings
        return dict(sorted(bindings.items(), key=lambda kv: FOOTER_ORDER.get(
            kv[1].binding.id, len(FOOTER_ORDER))))

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield StatusLine(id="status")
        yield Headline(id="headline")
        with Horizontal(id="middle"):
            yield Residency(id="residency")
            yield TaskList(id="tasks")
        yield TaskFilter(placeholder="filter tasks: id, client id, workflow or stage "
                         "(enter: keep, escape: clear)", id="task-filter")
        with Horizontal(id="bottom"):
            yield DecisionFeed(id="decisions")
            yield DecisionDetailView(id="detail")
        if self.replay:
            yield CursorBar(id="cursor")
        yield SteadyFooter(compact=True, show_command_palette=False)  # `?` lists ctrl+p

    def on_mount(self) -> None:
        self.query_one("#decisions", DecisionFeed).focus()
        self.console.start()

    def on_resize(self, event: events.Resize) -> None:
        """A short terminal drops the headline's trend lines and the decision
        summary's first line: the rows go to the panels and the candidates."""
        short = event.size.height < SHORT
        if short != self.has_class("-short"):
            self.set_class(short, "-short")
            view = self.query_one(DecisionDetailView)
            if view.detail is not None:
                view.show(view.detail)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in LIVE_ACTIONS:
            return not self.replay
        if action in REPLAY_ACTIONS:
            return self.replay
        return True

    # ------------------------------------------------------------ showing

    def show_snapshot(self, snapshot: Snapshot, history: Sequence[Numbers]) -> None:
        self.query_one(StatusLine).set_snapshot(snapshot)
        self.query_one(Headline).show(snapshot.numbers, history)
        self.query_one(Residency).show(snapshot)
        self.query_one(TaskList).show(snapshot)

    def add_decisions(self, rows: Sequence[DecisionRow]) -> None:
        self.query_one(DecisionFeed).append(rows)

    def set_decisions(self, rows: Sequence[DecisionRow], select: int | None) -> None:
        self.query_one(DecisionFeed).replace(rows, select)

    def show_detail(self, detail: DecisionDetail | None, message: str = "") -> None:
        view = self.query_one(DecisionDetailView)
        if detail is None:
            view.show_message(message)
        else:
            view.show(detail)

    # ------------------------------------------------------------ events

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "decisions" and event.row_key.value is not None:
            self.console.request_detail(int(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "decisions":
            self.query_one("#candidates", DataTable).focus()

    # ------------------------------------------------------------ actions

    def action_focus_panel(self, target: str) -> None:
        self.query_one(f"#{target}").focus()

    def action_params(self) -> None:
        self.console.open_params()

    def action_sort_tasks(self) -> None:
        self.query_one(TaskList).cycle_sort()

    def action_filter_tasks(self) -> None:
        box = self.query_one(TaskFilter)
        box.display = True
        box.value = self.query_one(TaskList).filter_text
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "task-filter":
            self.query_one(TaskList).set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "task-filter":
            self.close_filter(keep=True)

    def close_filter(self, keep: bool) -> None:
        """Hide the filter box (`keep`: its filter stays), back to the tasks."""
        box = self.query_one(TaskFilter)
        if not keep:
            box.value = ""
            self.query_one(TaskList).set_filter("")
        box.display = False
        self.query_one(TaskList).focus()

    def on_task_list_opened(self, event: TaskList.Opened) -> None:
        self.console.open_task(event.task_id)

    def action_toggle_noop(self) -> None:
        feed = self.query_one(DecisionFeed)
        feed.show_noop = not feed.show_noop
        self.console.refill_decisions()

    def action_pause(self) -> None:
        self.console.toggle_pause()

    def action_follow(self) -> None:
        feed = self.query_one(DecisionFeed)
        feed.follow = not feed.follow
        if feed.follow and feed.row_count:
            feed.move_cursor(row=feed.row_count - 1, animate=False)
        feed.append([])

    def action_step(self, direction: int) -> None:
        self.console.step(direction)

    def action_jump(self, seconds: float) -> None:
        self.console.jump(seconds)

    def action_to_start(self) -> None:
        self.console.goto(float("-inf"))

    def action_to_end(self) -> None:
        self.console.goto(float("inf"))

    def action_goto(self) -> None:
        self.console.ask_goto()

    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def cursor(self) -> CursorBar:
        return self.query_one(CursorBar)

    def feed(self) -> DecisionFeed:
        return self.query_one(DecisionFeed)

    def focused_id(self) -> Any:
        return None if self.focused is None else self.focused.id
