"""`topasd console`: the operator console, a Textual app.

Live (a daemon's HTTP API): two workers post messages. One polls `/v1/state`
every `poll_s` seconds (and says when the daemon stops or starts answering,
retrying with backoff, re-reading the runtime file so a restarted daemon is
found again); the other reads `/v1/events` (decisions) and posts them in the
batches the daemon sent. The app keeps only the newest snapshot and the
pending decisions and applies them on a render tick (`render_s`), so the
screen is redrawn at a bounded rate however busy the daemon is; following the
feed, the newest decision's candidates reload at most every FOLLOW_DETAIL_S
(each redraw of a panel costs a terminal app more than its data).

Replay (a store file): a time cursor; each move rebuilds every panel as of
the cursor through `store.queries.RunReplay`.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from textual import events
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer

from console import keys
from console.messages import (
    ConnectionChanged,
    DecisionsArrived,
    DetailLoaded,
    FeedReset,
    StateArrived,
)
from console.screens import task as task_screen
from console.screens.dashboard import Dashboard
from console.screens.goto import GotoScreen, GotoTarget
from console.screens.help import HelpScreen
from console.screens.params import ParamsScreen
from console.screens.task import TaskScreen
from console.snapshot import DecisionRow, Numbers, Snapshot, decision_from_event
from console.sources import ApiError, ConnectionLost, LiveClient, ReplaySource, Target

HISTORY = 60  # headline points kept for the trend lines (live)
LOG_DECISIONS = 2000  # decisions kept for refilling the feed (live)
RETRY_S = 0.5  # first reconnect delay; doubles up to RETRY_MAX_S
RETRY_MAX_S = 2.0
DETAIL_DEBOUNCE_S = 0.15
FOLLOW_DETAIL_S = 10.0  # following the feed, the newest decision's candidates reload this often
# net allocations between young collections while the app runs (Python's: 700). A poll
# decodes ~500 tasks; at 700 its live objects went through several young collections,
# each promoting them a generation, whose collections (a full one every ~20 s) walked
# them again: ~15% of the console's CPU watching a busy daemon, ~4% at 7000
GC_YOUNG = 7000

F = TypeVar("F", bound=Callable[..., Any])


def _while_shown(fn: F) -> F:
    """A UI update that does nothing once the dashboard is torn down (at exit a
    worker's last message or a timer may still arrive)."""

    @functools.wraps(fn)
    def wrapper(self: ConsoleApp, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except NoMatches:
            if self.is_running and self.screen_stack and self.dashboard.is_mounted and \
                    self.dashboard.children:
                raise
            return None

    return wrapper  # type: ignore[return-value]


class ConsoleApp(App[None]):
    """The topasd console: live on a daemon, or replaying a store file."""

    CSS_PATH = "console.tcss"
    TITLE = "topasd console"
    BINDINGS: ClassVar[list[BindingType]] = [*keys.APP]

    def __init__(self, target: Target | None = None, replay: ReplaySource | None = None, *,
                 keymap: Mapping[str, str] | None = None, at: float | None = None,
                 poll_s: float = 2.0, render_s: float = 1.0, feed_s: float | None = None
                 ) -> None:
        super().__init__()
        if (target is None) == (replay is None):
            raise ValueError("give a live target or a replay source, not both")
        self.target = target
        self.replay = replay
        self.client = LiveClient(target) if target is not None else None
        self.keymap = dict(keymap or {})
        self.poll_s = poll_s
        self.render_s = render_s
        # new decisions join the feed this often (each addition costs the screen a new
        # layout, the priciest thing a terminal app does): every third render tick
        self.feed_s = 3 * render_s if feed_s is None else feed_s
        self._fed = 0.0
        self.history: deque[Numbers] = deque(maxlen=HISTORY)
        self.decision_log: deque[DecisionRow] = deque(maxlen=LOG_DECISIONS)
        self.connected: bool | None = None
        self.paused = False
        self.snapshot: Snapshot | None = None  # the one on screen
        self._pending: Snapshot | None = None
        self._pending_rows: list[DecisionRow] = []
        self._detail_timer: Timer | None = None
        self._detail_seq: int | None = None  # shown or loading
        self._detail_timer_due = 0.0
        self._detail_loaded = -FOLLOW_DETAIL_S
        self.counters: Counter[str] = Counter()  # states, renders, decisions, lag (bench)
        self._gc_threshold: tuple[int, int, int] | None = None  # the collector's, to restore
        self._held_keys: list[str] | None = None  # pressed while the form is built
        if replay is not None:
            self.cursor_seq, self.cursor_t = replay.at(replay.t0 if at is None else at)
        else:
            self.cursor_seq, self.cursor_t = None, 0.0

    # ------------------------------------------------------------ set-up

    def get_default_screen(self) -> Screen[Any]:
        return Dashboard(replay=self.replay is not None)

    @property
    def dashboard(self) -> Dashboard:
        if not self.screen_stack or not isinstance(self.screen_stack[0], Dashboard):
            raise NoMatches("the dashboard is not on screen")
        return self.screen_stack[0]

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)

    def start(self) -> None:
        """The dashboard is composed: show the replay cursor, or start the workers."""
        if self.replay is not None:
            self.sub_title = self.replay.label
            status = self.dashboard.status()
            status.replay_label = self.replay.label
            self._show_replay()
            return
        assert self.client is not None
        self.sub_title = self.client.url
        self.dashboard.status().set_connection(False, None, 0, self.client.url)
        self.dashboard.status().connected = None
        self.dashboard.status().refresh_text()
        self.set_interval(self.render_s, self._render_tick)
        self.run_worker(self._poll(), name="poll", group="poll", exclusive=True,
                        exit_on_error=False)
        self.call_later(self._prepare_params)

    async def _prepare_params(self) -> None:
        """Build the parameter form once, out of sight (pushed and popped before a
        frame shows it): composing its widgets takes most of a second, so `p`
        then shows it filled at once."""
        if self.is_screen_installed("params") or len(self.screen_stack) != 1:
            return
        self.install_screen(ParamsScreen(), "params")
        self._held_keys = []  # keys pressed meanwhile are the dashboard's: held
        try:
            await self.push_screen("params")
            if isinstance(self.screen, ParamsScreen):
                self.pop_screen()
        finally:
            held, self._held_keys = self._held_keys or [], None
        for key in held:
            self.simulate_key(key)
        # the screens, styles and modules live as long as the app: out of the cyclic
        # collector's sight, a full collection (each few polls: a parsed /v1/state
        # leaves survivors) walks what the polls made, not ~200k objects (0.15 s);
        # garbage first, so none is kept; the app's end hands them back
        gc.collect()
        gc.freeze()
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            gc.set_threshold(GC_YOUNG, *self._gc_threshold[1:])

    async def on_event(self, event: events.Event) -> None:
        """Keys pressed while the parameter form is built out of sight wait for
        the dashboard (the form on top would take them, then be put away)."""
        if self._held_keys is not None and isinstance(event, events.Key):
            self._held_keys.append(event.key)
            return
        await super().on_event(event)

    async def on_unmount(self) -> None:
        gc.unfreeze()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
        if self.client is not None:
            await self.client.close()
        if self.replay is not None:
            self.replay.close()

    # ------------------------------------------------------------ workers

    async def _poll(self) -> None:
        """Poll /v1/state (brief once connected: what the panels draw); report
        (dis)connection; reset the feed on a new daemon (from its full state)."""
        assert self.client is not None
        client = self.client
        attempt, started = 0, None
        while True:
            try:
                state = await client.state(brief=started is not None)
                snap = _snapshot(state)
                if snap.started_ts != started and "recent_decisions" not in state:
                    state = await client.state()  # a new daemon: its recent decisions too
                    snap = _snapshot(state)
            except (ConnectionLost, ApiError, ValueError, KeyError, TypeError) as exc:
                attempt += 1
                why = exc.message if isinstance(exc, ApiError) else str(exc)
                self.post_message(ConnectionChanged(False, why, attempt, client.url))
                await asyncio.sleep(min(RETRY_MAX_S, RETRY_S * 2 ** min(attempt - 1, 4)))
                client.retarget()
                continue
            if attempt or self.connected is not True:
                self.post_message(ConnectionChanged(True, None, 0, client.url))
            attempt = 0
            if started is None or snap.started_ts != started:
                recent = [decision_from_event(d) for d in state.get("recent_decisions", [])]
                self.post_message(FeedReset(recent, state.get("event_id"), started is not None))
                started = snap.started_ts
            self.post_message(StateArrived(snap))
            await asyncio.sleep(self.poll_s)

    async def _events(self, since: int | None) -> None:
        """Read decisions from /v1/events, posting each batch; reconnect on loss."""
        assert self.client is not None
        client = self.client
        attempt = 0
        while True:
            try:
                async for batch in client.events(since):
                    attempt = 0
                    rows: list[DecisionRow] = []
                    missed = 0
                    for ident, name, data in batch:
                        if ident is not None:
                            since = ident
                        if name == "decision":
                            rows.append(decision_from_event(data))
                        elif name == "lag":
                            missed += int(data.get("missed", 0))
                    if rows or missed:
                        self.post_message(DecisionsArrived(rows, missed))
            except (ConnectionLost, ValueError, KeyError) as exc:
                self.log.warning(f"event stream: {exc}")
            attempt += 1
            await asyncio.sleep(min(RETRY_MAX_S, RETRY_S * 2 ** min(attempt - 1, 4)))

    # ------------------------------------------------------------ messages

    @_while_shown
    def on_connection_changed(self, msg: ConnectionChanged) -> None:
        self.connected = msg.connected
        self.dashboard.status().set_connection(msg.connected, msg.error, msg.attempt, msg.url)
        self.dashboard.set_class(not msg.connected, "-disconnected")
        if msg.connected:
            self.sub_title = msg.url

    @_while_shown
    def on_feed_reset(self, msg: FeedReset) -> None:
        if msg.restarted:
            self.decision_log.clear()
            self.history.clear()  # the trend lines start over with the new daemon
            self._pending_rows.clear()
            self.dashboard.set_decisions([], None)
            self._detail_seq = None
            self.dashboard.show_detail(None, "the daemon restarted; select a decision")
            self.notify("the daemon restarted: decisions start over", severity="warning")
        self._pending_rows.extend(msg.rows)
        self.run_worker(self._events(msg.since), name="events", group="events",
                        exclusive=True, exit_on_error=False)

    def on_state_arrived(self, msg: StateArrived) -> None:
        self.counters["states"] += 1
        self._pending = msg.snapshot

    def on_decisions_arrived(self, msg: DecisionsArrived) -> None:
        self.counters["decisions"] += len(msg.rows)
        self.counters["lag"] += msg.missed
        self._pending_rows.extend(msg.rows)
        if len(self._pending_rows) > LOG_DECISIONS:
            del self._pending_rows[:-LOG_DECISIONS]

    @_while_shown
    def _render_tick(self) -> None:
        """The render tick: apply the newest snapshot and the pending decisions."""
        if self.paused:
            return
        if self._pending is not None:
            snap, self._pending = self._pending, None
            self.snapshot = snap
            self.history.append(snap.numbers)
            self.dashboard.show_snapshot(snap, list(self.history))
            self.counters["renders"] += 1
        if self._pending_rows and time.monotonic() >= self._fed + self.feed_s - 1e-3:
            self._fed = time.monotonic()
            rows, self._pending_rows = _upto(self._pending_rows, self.snapshot)
            self.decision_log.extend(rows)
            self.dashboard.add_decisions(rows)

    # ------------------------------------------------------------ details

    @_while_shown
    def request_detail(self, seq: int) -> None:
        """Show decision `seq`'s candidates (live: after the highlight settles)."""
        if seq == self._detail_seq:
            return
        self._detail_seq = seq
        if self.replay is not None:
            try:
                detail = self.replay.detail(seq)
            except Exception as exc:  # a damaged row must not end the console
                self.dashboard.show_detail(None, f"decision {seq}: {exc}")
                return
            self.dashboard.show_detail(detail)
            return
        following = self.dashboard.feed().following()
        pending = self._detail_timer is not None and self._detail_timer_due > time.monotonic()
        if following and pending:
            return  # the pending load takes the newest decision when it fires
        if self._detail_timer is not None:
            self._detail_timer.stop()
        delay = DETAIL_DEBOUNCE_S  # a user moving the cursor: once the highlight settles
        if following:  # new decisions move it: at most every FOLLOW_DETAIL_S
            delay = max(delay, FOLLOW_DETAIL_S - (time.monotonic() - self._detail_loaded))
        self._detail_timer_due = time.monotonic() + delay
        self._detail_timer = self.set_timer(delay, self._load_detail)

    def _load_detail(self) -> None:
        self._detail_loaded = time.monotonic()
        if self._detail_seq is not None:
            self.run_worker(self._fetch_detail(self._detail_seq), group="detail",
                            exclusive=True, exit_on_error=False)

    async def _fetch_detail(self, seq: int) -> None:
        assert self.client is not None
        try:
            detail = await self.client.decision(seq)
        except (ApiError, ConnectionLost) as exc:
            self.post_message(DetailLoaded(seq, None, str(exc)))
            return
        self.post_message(DetailLoaded(seq, detail))

    @_while_shown
    def on_detail_loaded(self, msg: DetailLoaded) -> None:
        if msg.seq != self._detail_seq:
            return
        if msg.error is not None:
            self._detail_seq = None  # highlighting it again asks again
        self.dashboard.show_detail(msg.detail, f"decision {msg.seq}: {msg.error}")

    # ------------------------------------------------------------ live actions

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        status = self.dashboard.status()
        status.paused = self.paused
        status.refresh_text()
        if not self.paused:
            self._render_tick()

    def refill_decisions(self) -> None:
        """Show the decisions again (after no-ops were shown or hidden)."""
        if self.replay is not None:
            self._show_replay()
            return
        self.dashboard.set_decisions(list(self.decision_log), None)

    # ------------------------------------------------------------ replay

    def _show_replay(self) -> None:
        assert self.replay is not None
        t, seq = self.cursor_t, self.cursor_seq
        snap = self.replay.snapshot(t)
        self.snapshot = snap
        self.dashboard.show_snapshot(snap, self.replay.series(t))
        feed = self.dashboard.feed()
        self.dashboard.set_decisions(self.replay.decisions(t, noop=feed.show_noop, keep=seq),
                                     seq)
        self.dashboard.cursor().set_cursor(t, self.replay.t0, self.replay.t1, seq,
                                           len(self.replay.replay.decision_seqs))
        if seq is not None:
            self.request_detail(seq)
        else:
            self._detail_seq = None
            self.dashboard.show_detail(None, "before the first decision")
        self.counters["renders"] += 1

    def step(self, direction: int) -> None:
        """Replay: move the cursor to the next (+1) or previous (-1) decision."""
        if self.replay is None:
            return
        self.cursor_seq, self.cursor_t = self.replay.step(self.cursor_seq, direction)
        self._show_replay()

    def jump(self, seconds: float) -> None:
        """Replay: move the cursor by `seconds`."""
        self.goto(self.cursor_t + seconds)

    def goto(self, t: float) -> None:
        """Replay: put the cursor at time `t` (clamped to the run)."""
        if self.replay is None:
            return
        if math.isnan(t):
            return
        if math.isinf(t):
            t = self.replay.t0 if t < 0 else self.replay.t1
        self.cursor_seq, self.cursor_t = self.replay.at(t)
        self._show_replay()

    def goto_decision(self, seq: int) -> None:
        """Replay: put the cursor on decision `seq` (at its time)."""
        if self.replay is None:
            return
        self.cursor_seq, self.cursor_t = seq, self.replay.replay.time_of(seq)
        self._show_replay()

    def ask_goto(self) -> None:
        if self.replay is None:
            return
        replay = self.replay

        def chosen(target: GotoTarget | None) -> None:
            if target is None:
                return
            kind, value = target
            if kind == "decision":
                self.goto_decision(int(value))
            else:
                self.goto(value)

        if self._bring_forward(GotoScreen):
            return
        seqs = replay.replay.decision_seqs
        self.push_screen(GotoScreen(replay.t0, replay.t1, self.cursor_t,
                                    (seqs[0], seqs[-1]) if seqs else None), chosen)

    # ------------------------------------------------------------ screens

    def open_task(self, task_id: int) -> None:
        """Open a task: its stages, requests and decisions."""
        if self._bring_forward(TaskScreen):
            self.pop_screen()
        self.push_screen(TaskScreen(task_id))

    def load_task(self, screen: TaskScreen) -> None:
        """Fill an opened task: from the daemon, or as of the replay cursor."""
        if self.replay is None:
            self.run_worker(task_screen.fetch(screen), group="task", exclusive=True,
                            exit_on_error=False)
            return
        detail = self.replay.task(screen.task_id, self.cursor_t)
        screen.show(detail, "not arrived yet at the cursor")

    def show_decision(self, seq: int) -> None:
        """A decision an opened task named: replay: the cursor on it; live: its
        candidates, the feed no longer following (`f` follows again)."""
        if self.replay is not None:
            self.goto_decision(seq)
        else:  # the feed stops following, so newer decisions leave it shown (f resumes)
            feed = self.dashboard.feed()
            feed.follow = False
            feed.append([])
            self._detail_seq = seq
            self._load_detail()
        self.dashboard.query_one("#candidates").focus()

    def open_params(self) -> None:
        """The parameter form; live, one form kept for the session, so that it
        opens filled at once after the first time."""
        if self._bring_forward(ParamsScreen):
            return
        if self.replay is not None:
            self.push_screen(ParamsScreen(self.cursor_t))
            return
        if not self.is_screen_installed("params"):
            self.install_screen(ParamsScreen(), "params")
        self.push_screen("params")

    def action_help(self) -> None:
        if not self._bring_forward(HelpScreen):
            self.push_screen(HelpScreen(self.keymap))

    def _bring_forward(self, kind: type[Screen[Any]]) -> bool:
        """If a `kind` screen is open, close the screens above it (a second
        copy would clash with its widget ids); False if none is open."""
        if not any(isinstance(s, kind) for s in self.screen_stack):
            return False
        while not isinstance(self.screen, kind):
            self.pop_screen()
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        dash = self.dashboard
        yield SystemCommand("Parameters", "Edit the policy and its parameters",
                            self.open_params)
        yield SystemCommand("Help", "Panels and key bindings", self.action_help)
        yield SystemCommand("Focus tasks", "Move to the tasks table",
                            lambda: dash.action_focus_panel("tasks"))
        yield SystemCommand("Focus decisions", "Move to the decision feed",
                            lambda: dash.action_focus_panel("decisions"))
        for key in ("age", "remaining", "progress", "id"):
            yield SystemCommand(f"Sort tasks by {key}", "Order of the tasks table",
                                lambda k=key: dash.query_one("#tasks").cycle_sort(k))  # type: ignore[attr-defined]
        yield SystemCommand("Show or hide no-op decisions", "Decisions that changed nothing",
                            dash.action_toggle_noop)
        if self.replay is None:
            yield SystemCommand("Pause or resume", "Freeze the screen (updates continue "
                                "in the background)", self.toggle_pause)
        else:
            yield SystemCommand("Go to time or decision", "Put the replay cursor at a time "
                                "or on decision #N",
                                self.ask_goto)
            yield SystemCommand("Go to the start", "First event of the run",
                                lambda: self.goto(-math.inf))
            yield SystemCommand("Go to the end", "Last event of the run",
                                lambda: self.goto(math.inf))


def _snapshot(state: dict[str, Any]) -> Snapshot:
    from console.snapshot import snapshot_from_state

    return snapshot_from_state(state)


def _upto(rows: list[DecisionRow], snap: Snapshot | None) -> tuple[list[DecisionRow],
                                                                   list[DecisionRow]]:
    """(rows to show, rows held back): the feed shows no decision later than the
    snapshot the panels show, so a paused screen is one moment (decisions
    stream in ahead of the polled state)."""
    if snap is None:
        return rows, []
    cut = next((i for i, r in enumerate(rows) if r.t > snap.t), len(rows))
    return rows[:cut], rows[cut:]
