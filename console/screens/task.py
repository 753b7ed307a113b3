"""An opened task (Enter on the tasks table): its stages, its requests and the
decisions that admitted or preempted them; Enter on a decision shows it
(live: its candidates; replay: the cursor on it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from console.snapshot import TaskDetail
from console.sources import ApiError, ConnectionLost
from console.widgets.footer import SteadyFooter
from console.widgets.format import secs

if TYPE_CHECKING:
    from console.app import ConsoleApp


def _t(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


class TaskScreen(Screen[None]):
    """One task: a summary line, its stages, its requests, their decisions."""

    CSS_PATH = "../task.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Back")]

    def __init__(self, task_id: int) -> None:
        super().__init__(id="task")
        self.task_id = task_id
        self.detail: TaskDetail | None = None

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static(f"task {self.task_id}: loading …", id="task-summary")
        with Horizontal(id="task-body"):
            with Vertical(id="task-left"):
                yield DataTable(id="task-stages", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="task-requests", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="task-decisions", cursor_type="row", zebra_stripes=True)
        yield SteadyFooter()

    def on_mount(self) -> None:
        for table_id, title, cols in (
                ("task-stages", "Stages", ("stage", "status", "rounds", "started", "finished")),
                ("task-requests", "Requests", ("request", "stage", "agent", "state", "ready",
                                               "admitted", "queued", "finished", "preempted")),
                ("task-decisions", "Decisions · enter: show", ("decision", "action",
                                                               "request", "stage"))):
            table = self.query_one(f"#{table_id}", DataTable)
            table.border_title = title
            for col in cols:
                table.add_column(col, key=col)
        self.query_one("#task-decisions", DataTable).focus()
        self.console.load_task(self)

    def show(self, detail: TaskDetail | None, error: str = "") -> None:
        self.detail = detail
        summary = self.query_one("#task-summary", Static)
        if detail is None:
            summary.update(Text(f"task {self.task_id}: {error}", style="bold red"))
            return
        jct = "" if detail.finished is None else f" · JCT {secs(detail.finished - detail.arrival)}"
        client = f" · client id {detail.client_id}" if detail.client_id else ""
        summary.update(Text(f"task {detail.id} ({detail.workflow}){client} · {detail.status} · "
                            f"arrived {detail.arrival:.2f}s{jct}", style="bold"))
        stages = self.query_one("#task-stages", DataTable)
        stages.clear()
        for st in detail.stages:
            stages.add_row(st.name, st.status, str(st.rounds_done), _t(st.started),
                           _t(st.finished))
        self._requests(detail)

    def _requests(self, detail: TaskDetail) -> None:
        reqs = self.query_one("#task-requests", DataTable)
        reqs.clear()
        decisions = self.query_one("#task-decisions", DataTable)
        decisions.clear()
        if detail.requests is None:
            reqs.border_subtitle = "too old: no longer kept (the store's request_log has them)"
            return
        for r in detail.requests:
            queued = None if r.admitted is None else r.admitted - r.ready
            hit = f"{r.preemptions}" + (f" +{r.retractions} by the engine" if r.retractions
                                        else "")
            reqs.add_row(str(r.id), r.stage, r.agent, r.state, _t(r.ready), _t(r.admitted),
                         secs(queued, 2), _t(r.finished), hit, key=str(r.id))
        for seq, action, r in detail.decisions():
            style = {"preempt": "red", "admit": "green"}.get(action, "yellow")
            label = f"held ×{r.held}" if action == "hold" else action
            decisions.add_row(f"#{seq}", Text(label, style=style), str(r.id), r.stage,
                              key=f"{seq}:{r.id}")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "task-decisions" and event.row_key.value is not None:
            seq = int(event.row_key.value.split(":")[0])
            self.app.pop_screen()
            self.console.show_decision(seq)

    def action_close(self) -> None:
        self.app.pop_screen()


async def fetch(screen: TaskScreen) -> None:
    """Live: the task from the daemon (a worker)."""
    client = screen.console.client
    assert client is not None
    try:
        detail = await client.task(screen.task_id)
    except (ApiError, ConnectionLost) as exc:
        screen.show(None, str(exc))
        return
    screen.show(detail)
