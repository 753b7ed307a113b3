"""The console against a real daemon (`topasd start`, sim backend, a fast paced
clock, 127.0.0.1): the app runs under `run_test()` and is driven with Pilot.

Waits poll the app's state with a bound (no assertion on how long anything
takes); every daemon runs the DAG-4 driver so tasks stay in flight.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.widgets import DataTable, Input, Select, Static

from console.app import ConsoleApp
from console.params import text_of
from console.screens.params import ParamsScreen
from console.sources import Target
from console.widgets.decisions import DecisionDetailView
from console.widgets.residency import Residency
from console.widgets.tasks import TaskList
from store import Store
from store import queries as q
from tests.daemonkit import Daemon

SIZE = (150, 45)
ARGS = ("--workload", "dag4", "--rate", "1.0", "--speed", "10")
WAIT_S = 45.0


async def until(pilot: Any, cond: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Let the app run until `cond()` is truthy (bounded; fails naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def open_params_form(pilot: Any, app: ConsoleApp) -> ParamsScreen:
    """Connected, `p` pressed, the daemon's parameters loaded into the form."""
    await until(pilot, lambda: app.connected, "the connection")
    await pilot.press("p")
    screen = app.screen
    assert isinstance(screen, ParamsScreen)
    await until(pilot, lambda: screen.info is not None, "the daemon's parameters")
    return screen


def recorded_notes(app: ConsoleApp) -> list[tuple[str, str]]:
    """Every notification the app shows from now on, as (severity, message)."""
    notes: list[tuple[str, str]] = []
    plain_notify = app.notify

    def notify(message: str, *args: Any, severity: str = "information", **kw: Any) -> None:
        notes.append((severity, message))
        plain_notify(message, *args, severity=severity, **kw)  # type: ignore[arg-type]

    app.notify = notify  # type: ignore[method-assign]
    return notes


def run(app: ConsoleApp, scenario: Callable[[Any], Any]) -> None:
    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await scenario(pilot)

    asyncio.run(main())


def live_app(d: Daemon) -> ConsoleApp:
    return ConsoleApp(Target(d.url), poll_s=0.2, render_s=0.1)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with Daemon(tmp_path_factory.mktemp("console-live"), *ARGS, speed="10") as d:
        d.wait_for(lambda s: s["counts"]["decisions"] >= 5 and s["counts"]["tasks_in_flight"])
        yield d


def test_the_panels_fill(daemon: Daemon) -> None:
    app = live_app(daemon)

    async def scenario(pilot: Any) -> None:
        dash = app.dashboard
        tasks = dash.query_one(TaskList)
        feed = dash.query_one("#decisions", DataTable)
        await until(pilot, lambda: tasks.row_count and feed.row_count, "tasks and decisions")
        res = dash.query_one(Residency)
        assert res.snapshot is not None
        assert "A" in {a.agent for a in res.snapshot.agents} <= {"A", "B", "C", "D"}
        assert res.snapshot.budget == 18000
        assert app.connected is True
        status = str(dash.query_one("#status", Static).render())
        assert "connected" in status and daemon.url in status
        # the tasks table lists the daemon's tasks in flight (those it knew lately)
        known = {t["id"] for t in daemon.state(limit=2000)["tasks"]} | {
            t.id for t in app.snapshot.tasks}  # type: ignore[union-attr]
        assert set(tasks.task_ids()) <= known
        await until(pilot, lambda: app.snapshot and app.snapshot.numbers.decision_ms,
                    "decision latency")
        value = str(dash.query_one("#metric-decision .value", Static).render())
        assert "ms" in value
        # decisions keep arriving through the event stream
        seen = app.counters["decisions"]
        await until(pilot, lambda: app.counters["decisions"] > seen + 3, "more decisions")

    run(app, scenario)


def test_selecting_a_decision_shows_its_candidates(daemon: Daemon) -> None:
    app = live_app(daemon)

    async def scenario(pilot: Any) -> None:
        dash = app.dashboard
        feed = dash.query_one("#decisions", DataTable)
        await until(pilot, lambda: feed.row_count >= 3, "three decisions")
        await pilot.press("f")  # stop following, so the cursor stays where we put it
        await pilot.press("d", "up", "up")
        row = feed.cursor_row
        seq = int(feed.get_row_at(row)[0])
        view = dash.query_one(DecisionDetailView)
        await until(pilot, lambda: view.detail is not None and view.detail.row.seq == seq,
                    f"the candidates of decision {seq}")
        api = daemon.http.get(f"/v1/decisions/{seq}").json()
        table = dash.query_one("#candidates", DataTable)
        assert table.row_count == len(api["candidates"]) >= 1
        won = [c for c in api["candidates"] if c["won"]]
        first = table.get_row_at(0)
        assert first[0].plain == str(max(api["candidates"], key=lambda c: c["total"])["idx"])
        if won:
            row_won = next(i for i in range(table.row_count)
                           if table.get_row_at(i)[1].plain == "★")
            assert table.get_row_at(row_won)[0].plain == str(won[0]["idx"])
            assert float(table.get_row_at(row_won)[2].plain) == pytest.approx(  # total
                won[0]["total"], abs=1e-3)
        summary = str(dash.query_one("#detail-summary", Static).render())
        assert f"#{seq}" in summary

    run(app, scenario)


def test_a_paused_screen_is_one_moment_and_says_so_on_a_small_terminal(
        daemon: Daemon) -> None:
    """Paused, the feed shows no decision later than the state the panels show
    (decisions stream in ahead of the polled state; a walkthrough saw the status
    line at 109 decisions beside decision #114). At 80x24 the status line wraps
    rather than cutting off its counts and the pause marker, and the headline
    values fit their boxes; moving the cursor off the last decision says the
    feed no longer follows."""
    app = live_app(daemon)

    async def scenario(pilot: Any) -> None:
        dash = app.dashboard
        feed = dash.query_one("#decisions", DataTable)
        await until(pilot, lambda: feed.row_count >= 3 and app.snapshot, "decisions")
        await pilot.pause(0.5)
        await pilot.press("space")
        snap = app.snapshot
        assert snap is not None
        assert max(d.t for d in app.decision_log) <= snap.t
        assert int(feed.get_row_at(feed.row_count - 1)[0]) <= snap.decisions
        status = str(dash.query_one("#status", Static).render())
        assert status.startswith("❚❚ paused") and "decisions" in status
        # each headline value fits its box (its note rides on the bottom border)
        for box in dash.query(".metric"):
            value = box.query_one(".value", Static)
            assert len(str(value.render())) <= value.content_size.width, box.id
        assert str(dash.query_one("#metric-decision").border_subtitle).startswith("p99 ")
        await pilot.press("space", "d", "up")
        assert "not following" in str(feed.border_title)

    async def small() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await scenario(pilot)

    asyncio.run(small())


def test_changing_beta_in_the_form_changes_the_daemon(daemon: Daemon) -> None:
    app = live_app(daemon)
    before = daemon.http.get("/v1/params").json()

    async def scenario(pilot: Any) -> None:
        screen = await open_params_form(pilot, app)
        beta = screen.query_one("#param-beta", Input)
        assert float(beta.value) == before["params"]["beta"]
        # out of range: refused here, nothing sent
        beta.value = "5000"
        await pilot.press("ctrl+s")
        answer = screen.query_one("#answer", Static)
        assert "not sent" in str(answer.render()) and "beta" in str(answer.render())
        assert daemon.http.get("/v1/params").json()["version"] == before["version"]
        beta.value = "7.5"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "applied" in str(answer.render()), "the daemon's answer")
        assert "beta 20 → 7.5" in str(answer.render())

    run(app, scenario)
    after = daemon.http.get("/v1/params").json()
    assert after["params"]["beta"] == 7.5
    assert after["version"] == before["version"] + 1
    deadline = time.monotonic() + WAIT_S
    while True:  # the store's writer commits within its flush interval
        store = Store(daemon.db, create=False)
        changes = q.param_changes(store.db, daemon.info["run_id"])
        store.close()
        if changes or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(c["name"], c["old"], c["new"], c["source"]) for c in changes][-1:] == [
        ("beta", before["params"]["beta"], 7.5, "api")]


def test_a_killed_daemon_shows_disconnected_and_reconnects(tmp_path: Path) -> None:
    first = Daemon(tmp_path / "a", *ARGS, speed="10")
    port = first.info["port"]
    app = ConsoleApp(Target(first.url), poll_s=0.2, render_s=0.1)
    second: list[Daemon] = []

    async def scenario(pilot: Any) -> None:
        dash = app.dashboard
        feed = dash.query_one("#decisions", DataTable)
        await until(pilot, lambda: app.connected and feed.row_count, "the first daemon")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        await until(pilot, lambda: app.connected is False, "the disconnected state")
        status = dash.query_one("#status", Static)
        assert "disconnected" in str(status.render()) and "retrying" in str(status.render())
        assert dash.has_class("-disconnected")
        assert dash.query_one(Residency).snapshot is not None  # the last state stays
        second.append(Daemon(tmp_path / "b", *ARGS, "--port", str(port), speed="10"))
        await until(pilot, lambda: app.connected is True, "the reconnection")
        assert "● connected" in str(status.render())
        assert not dash.has_class("-disconnected")
        started = httpx.get(f"{second[0].url}/v1/state", params={"limit": 1}).json()
        await until(pilot, lambda: app.snapshot is not None
                    and app.snapshot.started_ts == started["started_ts"], "the new daemon")

    try:
        run(app, scenario)
    finally:
        first.__exit__(None, None, None)
        for d in second:
            assert d.stop() == 0


def test_form_outcomes_are_notified_and_a_baseline_has_no_editable_parameters(
        daemon: Daemon) -> None:
    """The answer under the form can be scrolled out of sight, so every outcome
    is also a notification; switching to a baseline keeps the "applied"
    answer, and a baseline's parameter rows cannot be edited (nothing of them
    would be sent)."""
    app = live_app(daemon)
    notes = recorded_notes(app)

    async def scenario(pilot: Any) -> None:
        screen = await open_params_form(pilot, app)
        policy = screen.query_one("#policy", Select)
        # the placeholder of the loading form is not a policy one can pick
        assert "(loading)" not in [str(p) for p, _ in policy._options]
        screen.query_one("#param-rho", Input).value = "abc"
        await pilot.press("ctrl+s")
        assert notes[-1][0] == "error" and "not sent" in notes[-1][1]
        # reloading refills the form and clears the stale error under it
        await pilot.press("ctrl+r")
        await until(pilot, lambda: "not sent" not in str(
            screen.query_one("#answer", Static).render()), "the reload")
        assert screen.query_one("#param-rho", Input).value == text_of(
            screen.info["params"]["rho"])
        screen.query_one("#policy", Select).value = "fcfs"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: notes and "applied" in notes[-1][1], "the switch")
        assert notes[-1][0] == "information" and "policy → fcfs" in notes[-1][1]
        assert "policy ∅" not in notes[-1][1]  # the switch is said once
        assert "applied" in str(screen.query_one("#answer", Static).render())
        beta = screen.query_one("#param-beta", Input)
        assert beta.disabled
        await pilot.pause(0.2)
        # a baseline's emptied parameter rows are not errors ("✗ M: required" before)
        assert not screen.query(".-invalid")
        # placeholders say what an empty value means
        assert screen.query_one("#param-hol_age", Input).placeholder == "off"

    try:
        run(app, scenario)
        assert daemon.http.get("/v1/params").json()["policy"] == "fcfs"
    finally:
        daemon.http.patch("/v1/params", json={"policy": "topas"}).raise_for_status()


def test_leaving_the_form_with_unsent_edits_says_so(daemon: Daemon) -> None:
    """Escape with unsent edits says they are dropped; ctrl+s on a form that
    could not load from the daemon says why nothing is sent."""
    app = live_app(daemon)
    notes = recorded_notes(app)

    async def scenario(pilot: Any) -> None:
        screen = await open_params_form(pilot, app)
        rho = screen.info["params"]["rho"]
        screen.query_one("#param-rho", Input).value = str(rho + 6)
        screen.action_close()  # says so at once
        assert notes[-1] == ("warning", "left without applying: rho not sent")
        await until(pilot, lambda: app.screen is app.dashboard, "the dashboard again")
        await pilot.press("p")
        unloaded = await until(pilot, lambda: isinstance(app.screen, ParamsScreen) and app.screen,
                               "the form again")
        unloaded.info = None  # as when the daemon could not be read
        unloaded.action_apply()
        assert notes[-1][0] == "warning" and "were not loaded" in notes[-1][1]

    before = daemon.http.get("/v1/params").json()
    run(app, scenario)
    assert daemon.http.get("/v1/params").json() == before  # nothing was sent


def test_a_key_pressed_while_the_form_is_built_reaches_the_dashboard(daemon: Daemon) -> None:
    """The parameter form is built at start, on top of the dashboard but out of
    sight; `p` pressed meanwhile opens it (the key waits for the dashboard)
    rather than being taken by the form that is then put away."""
    app = live_app(daemon)

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: app._held_keys is not None, "the form being built")
        await pilot.press("p")
        await until(pilot, lambda: app._held_keys is None, "the form built")
        await until(pilot, lambda: isinstance(app.screen, ParamsScreen), "the form")
        form = app.screen
        await pilot.pause(0.5)
        assert app.screen is form  # not put away under the user
        await until(pilot, lambda: form.info is not None, "the daemon's parameters")

    run(app, scenario)
