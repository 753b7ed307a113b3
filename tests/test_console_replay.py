"""The console on a recorded store: `store.queries.RunReplay` against the raw
event rows, and the real app (`run_test` + Pilot) stepping its time cursor.

The store is the committed fixture (tests/console_fixture.py), copied to a
temporary folder because opening a log may migrate it or switch it to WAL.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from textual.widgets import Button, DataTable, Input, Label, Select, Static, Switch

from console.app import ConsoleApp
from console.screens.params import ParamsScreen
from console.sources import ReplaySource
from console.widgets.residency import Residency
from console.widgets.status import CursorBar
from console.widgets.tasks import TaskList
from store import Store
from store import queries as q
from tests.simkit import run_checked, scenarios
from topasd.model import Decision, EngineView
from topasd.scheduler import make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import RoundSpec, TaskRecord, Trace

SIZE = (150, 45)


@pytest.fixture
def db(console_db: Path) -> Path:
    return console_db


def sql(db: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def where_at(db: Path, t: float) -> dict[str, str]:
    """Each agent's prefix place at `t`, straight from the events: the GPU after a
    load or recompute starts, then the host (its backup finished) or nowhere."""
    place: dict[str, str] = {}
    backed: set[str] = set()
    for agent, kind in sql(db, "SELECT agent, kind FROM engine_events WHERE kind LIKE "
                               "'prefix_%' AND t <= ? ORDER BY t, id", t):
        if kind in ("prefix_load_start", "prefix_compute_start"):
            place[agent] = "gpu"
        elif kind == "prefix_offload_end":
            backed.add(agent)
        elif kind == "prefix_evict":
            place[agent] = "host" if agent in backed else "none"
    return place


def in_flight_at(db: Path, t: float) -> set[int]:
    arrived = {r[0] for r in sql(db, "SELECT task_id FROM engine_events WHERE "
                                     "kind = 'task_arrive' AND t <= ?", t)}
    done = {r[0] for r in sql(db, "SELECT task_id FROM engine_events WHERE "
                                  "kind = 'task_finish' AND t <= ?", t)}
    return arrived - done


def run_app(db: Path, scenario: Callable[[Any, ConsoleApp], Any], **kw: Any) -> None:
    async def main() -> None:
        app = ConsoleApp(replay=ReplaySource(db), **kw)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await scenario(pilot, app)

    asyncio.run(main())


# ------------------------------------------------------------- the queries


def test_state_at_matches_the_recorded_events(db: Path) -> None:
    store = Store(db, create=False)
    replay = q.RunReplay(store.db)
    t0, t1 = replay.span
    assert t0 == 0.0 and t1 == pytest.approx(sql(db, "SELECT max(t) FROM engine_events")[0][0])
    budget = replay.budget_tokens
    assert budget == 18000
    for t in (0.5, 17.7, 40.75, 41.0, 62.2, 77.7, 93.0, t1):
        s = replay.state_at(t)
        assert {p.agent: p.location for p in s.prefixes} == where_at(db, t)
        assert {tk.task_id for tk in s.tasks} == in_flight_at(db, t)
        admitted = sql(db, "SELECT count(*) FROM engine_events WHERE kind = 'request_admit' "
                           "AND t <= ?", t)[0][0]
        left = sql(db, "SELECT count(*) FROM engine_events WHERE kind IN ('request_finish', "
                       "'preempt', 'retract') AND t <= ?", t)[0][0]
        assert len(s.running) == admitted - left
        assert s.decisions == sql(db, "SELECT count(*) FROM decisions WHERE t <= ?", t)[0][0]
        used = sum(p.tokens for p in s.prefixes if p.location == "gpu")
        used += sum(r.kv_tokens for r in s.running)
        assert used <= budget
        for r in s.running:
            inp, out = sql(db, "SELECT input_tokens, output_tokens FROM requests "
                               "WHERE request_id = ?", r.request_id)[0]
            assert inp <= r.kv_tokens <= inp + out
        finished = sql(db, "SELECT completion - arrival FROM tasks WHERE completion <= ?", t)
        assert s.headline.tasks_finished == len(finished)
        if finished:
            mean = sum(x[0] for x in finished) / len(finished)
            assert s.headline.jct_mean_s == pytest.approx(mean)
    store.close()


class _Watched:
    """A policy whose every view, decision and tasks in flight are kept (the
    view's task map is the runner's live one)."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.name = policy, policy.name
        self.seen: list[tuple[EngineView, Decision, frozenset[int]]] = []

    def decide(self, view: EngineView) -> Decision:
        d = self.policy.decide(view)
        self.seen.append((view, d, frozenset(view.tasks)))
        return d

    def observe(self, ev: Any) -> None:
        self.policy.observe(ev)


def check_replay_against_the_engine(tmp: Path, trace: Trace, policy: str, knobs: dict,
                                    warm: bool, closed_form: bool) -> None:
    """After each decision (the last at its time), `state_at` shows what the
    engine held then: its running and waiting requests, the prefixes it holds
    on the GPU (loading ones too) and the tasks in flight."""
    pol = _Watched(make_policy(policy))
    path = tmp / f"{policy}.db"
    path.unlink(missing_ok=True)
    store = Store(path)
    run_checked(trace, pol, knobs, warm, closed_form, sink=store.sink())
    replay = q.RunReplay(store.db)
    for i, (view, d, tasks) in enumerate(pol.seen):
        if i + 1 < len(pol.seen) and pol.seen[i + 1][0].t == view.t:
            continue
        s = replay.state_at(view.t)
        running = {r.id for r in view.running} | set(d.admit)
        assert {r.request_id for r in s.running} == running - set(d.preempt)
        waiting = {r.id for r in view.waiting} - set(d.admit)
        assert {r.request_id for r in s.waiting} == waiting | set(d.preempt)
        gpu = {a for a, p in view.prefixes.items() if p.on_gpu} | set(d.load)
        assert {p.agent for p in s.prefixes if p.location == "gpu"} == gpu - set(d.evict)
        assert {tk.task_id for tk in s.tasks} == tasks
    store.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_the_replayed_state_is_the_engines_after_every_decision(
        tmp_path_factory: pytest.TempPathFactory, scenario: Any) -> None:
    tmp = tmp_path_factory.mktemp("replay-vs-engine")
    for policy in ("topas", "lpm"):
        check_replay_against_the_engine(tmp, *scenario[:1], policy, *scenario[1:])


def test_a_load_waiting_for_the_host_link_holds_its_gpu_room_from_the_decision(
        tmp_path: Path) -> None:
    """The engine reserves a prefix's GPU room when a load is decided, even when
    the serial host link is still busy with another transfer: the log starts
    the load at the decision, so a replay shows the prefix on the GPU from
    then on, waiting for the link included (found by the property test above)."""
    agents = {"A0": {"prefix_tokens": 0}, "A1": {"prefix_tokens": 16}}
    w0 = workflow_from_dict({"name": "w0", "agents": agents,
                             "stages": [{"name": "s0", "agent": "A0"}]})
    w1 = workflow_from_dict({"name": "w1", "agents": agents, "stages": [
        {"name": "s0", "agent": "A1"}, {"name": "s1", "agent": "A0"},
        {"name": "s2", "agent": "A0", "after": ["s0"]}]})
    one = (RoundSpec(0, 1, 0.0),)
    trace = Trace({"w0": w0, "w1": w1}, (
        TaskRecord(0, "w0", 0.0, {"s0": one}),
        TaskRecord(1, "w1", 0.0, {"s0": one, "s1": one, "s2": one})), {})
    knobs = {"budget_tokens": 17, "host_cache": True, "mixed_chunk": False,
             "swap_bytes_per_s": 1e9}
    check_replay_against_the_engine(tmp_path, trace, "topas", knobs, False, False)
    store = Store(tmp_path / "topas.db", create=False)
    waited = [s for s in q.prefix_spans(store.db, 1) if s.kind == "load"]
    assert waited and all("waited" in s.note for s in waited)
    store.close()


def test_checkpoints_do_not_change_the_state(db: Path) -> None:
    store = Store(db, create=False)
    fine = q.RunReplay(store.db, checkpoint_every=7)
    whole = q.RunReplay(store.db, checkpoint_every=10**9)
    assert len(fine._checkpoints) > 10
    for t in (0.0, 3.3, 35.0, 40.7675437437803, 66.0, 99.9, 200.0):
        assert fine.state_at(t) == whole.state_at(t)
    store.close()


def test_params_at_applies_logged_changes(db: Path) -> None:
    store = Store(db, create=False)
    run = q.get_run(store.db)
    assert q.params_at(store.db, run, 50.0) == ("topas", run.params["policy"])
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, source) "
                     "VALUES (?, 30.0, 0, 'beta', '20.0', '5.0', 'api')", [run.id])
        conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, source) "
                     "VALUES (?, 60.0, 0, 'policy', '\"topas\"', '\"lpm\"', 'api')", [run.id])
    conn.close()
    assert q.params_at(store.db, run, 29.0)[1]["beta"] == 20.0
    policy, params = q.params_at(store.db, run, 30.0)
    assert (policy, params["beta"]) == ("topas", 5.0)
    assert q.params_at(store.db, run, 61.0) == ("lpm", {})  # a switch starts afresh
    # a decision and a change at one engine time: the change's first decision decides
    # (rows written before from_decision existed fall back to the time)
    seq, t = sql(db, "SELECT seq, t FROM decisions WHERE run_id = ? AND seq > 3 ORDER BY seq "
                     "LIMIT 1", run.id)[0]
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, source, "
                     "from_decision) VALUES (?, ?, 0, 'rho', '1.0', '7.0', 'api', ?)",
                     [run.id, t, seq + 1])
    conn.close()
    assert q.params_at(store.db, run, t, seq)[1]["rho"] == 1.0  # decided before it
    assert q.params_at(store.db, run, t, seq + 1)[1]["rho"] == 7.0
    assert q.params_at(store.db, run, t)[1]["rho"] == 7.0  # at the time: in force
    assert q.params_at(store.db, run, 30.0, seq)[1]["beta"] == 5.0  # NULL: by its time
    store.close()
    conn = sqlite3.connect(db)
    with conn:  # a switch logs every parameter in force, most unchanged
        conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, source) "
                     "VALUES (?, 60.0, 0, 'seed', '0', '0', 'api')", [run.id])
    conn.close()
    source = ReplaySource(db)
    shown = [(c["name"], c["new"]) for c in source.param_changes(100.0)]
    assert sorted(shown) == [("beta", 5.0), ("policy", "lpm"), ("rho", 7.0)]  # no seed
    source.close()


# ------------------------------------------------------------- the app


def test_stepping_the_cursor_shows_residency_and_decisions_at_that_time(db: Path) -> None:
    seqs = [r[0] for r in sql(db, "SELECT seq FROM decisions ORDER BY seq")]

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        start = sql(db, "SELECT max(seq) FROM decisions WHERE t <= 34")[0][0]
        assert app.cursor_seq == start
        i = seqs.index(start) + 7
        for _ in range(7):
            await pilot.press("full_stop")
        await pilot.pause()
        seq = seqs[i]
        t = sql(db, "SELECT t FROM decisions WHERE seq = ?", seq)[0][0]
        assert (app.cursor_seq, app.cursor_t) == (seq, t)
        res = app.dashboard.query_one(Residency)
        assert res.snapshot is not None
        assert {a.agent: a.location for a in res.snapshot.agents} == where_at(db, t)
        feed = app.dashboard.query_one("#decisions", DataTable)
        assert feed.get_row_at(feed.cursor_row)[0] == str(seq)
        last_shown = int(feed.get_row_at(feed.row_count - 1)[0])
        assert last_shown == sql(db, "SELECT max(seq) FROM decisions WHERE t <= ? AND "
                                     "(noop = 0 OR seq = ?)", t, seq)[0][0]
        cands = app.dashboard.query_one("#candidates", DataTable)
        expected = sql(db, "SELECT count(*) FROM candidates WHERE decision_seq = ?", seq)[0][0]
        assert cands.row_count == expected > 0
        won = sql(db, "SELECT idx FROM candidates WHERE decision_seq = ? AND won", seq)[0][0]
        assert any(cands.get_row_at(i)[1].plain == "★" and cands.get_row_at(i)[0].plain
                   == str(won) for i in range(cands.row_count))
        tasks = app.dashboard.query_one(TaskList)
        assert set(tasks.task_ids()) == in_flight_at(db, t)
        # one step back
        await pilot.press("comma")
        await pilot.pause()
        assert app.cursor_seq == seqs[i - 1]

    run_app(db, scenario, at=34.0)


def test_the_cursor_on_a_hidden_no_op_shows_that_decision(db: Path) -> None:
    """No-ops are hidden from the feed by default, but the cursor's own
    decision is shown and detailed even when it is one."""
    noops = sql(db, "SELECT d.seq, d.t FROM decisions d WHERE d.noop = 1 AND d.seq = "
                    "(SELECT max(seq) FROM decisions WHERE t <= d.t) ORDER BY d.seq")
    assert noops, "the fixture run has a no-op decision"
    seq, t = noops[0]

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.pause()
        assert app.cursor_seq == seq
        feed = app.dashboard.query_one("#decisions", DataTable)
        assert feed.get_row_at(feed.cursor_row)[0] == str(seq)
        cands = app.dashboard.query_one("#candidates", DataTable)
        expected = sql(db, "SELECT count(*) FROM candidates WHERE decision_seq = ?", seq)[0][0]
        assert cands.row_count == expected

    run_app(db, scenario, at=t)


def test_jumping_in_time_and_go_to(db: Path) -> None:
    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.press("right_square_bracket", "right_square_bracket")
        await pilot.pause()
        assert app.cursor_t == pytest.approx(20.0)
        assert app.cursor_seq == sql(db, "SELECT max(seq) FROM decisions WHERE t <= 20")[0][0]
        tasks = app.dashboard.query_one(TaskList)
        assert set(tasks.task_ids()) == in_flight_at(db, 20.0)
        await pilot.press("g")
        await pilot.pause()
        field = app.screen.query_one("#goto-input", Input)
        field.value = "62.2"
        await pilot.press("enter")
        await pilot.pause()
        assert app.cursor_t == pytest.approx(62.2)
        assert app.dashboard.query_one(Residency).snapshot.t == pytest.approx(62.2)  # type: ignore[union-attr]
        await pilot.press("dollar_sign")
        await pilot.pause()
        assert app.dashboard.query_one(TaskList).row_count == 0  # all done
        # at the end the cursor reads as the end ("t=134.45s of 134.4s" before)
        bar = str(app.dashboard.query_one(CursorBar).render())
        now, end = re.search(r"t=(\S+) of (\S+) ·", bar).groups()  # type: ignore[union-attr]
        assert now == end

    run_app(db, scenario)


def test_go_to_takes_a_decision_number(db: Path) -> None:
    """`g` then `#N`: the cursor on decision N, every panel as of its time; a
    number outside the run is refused, saying which numbers there are."""
    last = sql(db, "SELECT max(seq) FROM decisions")[0][0]
    seq, t = sql(db, "SELECT seq, t FROM decisions WHERE seq = ?", last // 2)[0]

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.press("g")
        await pilot.pause()
        assert f"#1 to #{last}" in str(app.screen.query_one("#goto-decisions", Label).render())
        field = app.screen.query_one("#goto-input", Input)
        field.value = f"#{last + 1}"
        await pilot.press("enter")
        await pilot.pause()
        assert f"decisions are #1 to #{last}" in str(
            app.screen.query_one("#goto-error", Label).render())
        field.value = f"#{seq}"
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.dashboard
        assert (app.cursor_seq, app.cursor_t) == (seq, t)
        feed = app.dashboard.query_one("#decisions", DataTable)
        assert feed.get_row_at(feed.cursor_row)[0] == str(seq)
        assert app.dashboard.query_one(Residency).snapshot.t == t  # type: ignore[union-attr]

    run_app(db, scenario)


def test_replay_params_screen_is_read_only_at_the_cursor(db: Path) -> None:
    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, ParamsScreen)
        beta = app.screen.query_one("#param-beta", Input)
        assert beta.value == "20" and beta.disabled
        # the fixture predates the extensions: shown at the defaults it ran with
        # (the preempt switch showed off, though that run preempted)
        assert app.screen.query_one("#param-preempt", Switch).value is True
        assert app.screen.query_one("#param-preempt_margin", Input).value == "0"
        assert app.screen.query_one("#param-pack_order", Select).value == "ratio"
        heights = {str(lab.render()): lab.size.height for lab in app.screen.query(".param-label")}
        assert len(set(heights.values())) == 1, heights  # no label wraps (preempt_margin did)
        answer = str(app.screen.query_one("#answer", Static).render())
        assert app.screen.query_one("#param-start_gate", Switch).value is False
        assert app.screen.query_one("#param-keep_idle", Switch).value is False
        assert app.screen.query_one("#param-age_curve", Select).value == "log"
        assert answer.endswith("\npreempt, preempt_margin, hol_age, pack_order, "
                               "longest_first, start_gate, "
                               "fresh_hol, started_hol, age_curve, srpt, keep_idle, "
                               "preempt_exchange, swap_only, decode_peak, head_reserve, overdue, "
                               "lot_size, phases, tandem, final_reserve, window, window_cap, "
                               "search_budget: not in this log (an older topasd wrote it), "
                               "shown at the defaults "
                               "it ran with"), answer
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.dashboard

    run_app(db, scenario, at=50.0)


def test_replay_params_screen_lists_the_last_changes_and_says_how_many_came_before(
        db: Path) -> None:
    run_id = sql(db, "SELECT id FROM runs")[0][0]
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, source) "
                     "VALUES (?, 5.0, 0, 'h_age', 'null', '64.0', 'api')", [run_id])
        for i in range(10):
            conn.execute("INSERT INTO param_changes (run_id, t, wall_ts, name, old, new, "
                         "source) VALUES (?, ?, 0, 'beta', ?, ?, 'api')",
                         [run_id, 10.0 + i, str(20.0 + i), str(21.0 + i)])
    conn.close()

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.press("p")
        await pilot.pause()
        text = str(app.screen.query_one("#answer", Static).render())
        assert text.startswith("11 live change(s) up to t=50.00s; the last 8, 3 before them")
        assert "beta: 29 → 30 (api)" in text and "beta: 21 → 22" not in text
        await pilot.press("escape")

    run_app(db, scenario, at=50.0)
    source = ReplaySource(db)  # the unset H_age shows as the form shows it: empty
    first = source.param_changes(50.0)[0]
    assert (first["name"], first["old"]) == ("h_age", None)
    source.close()


def test_noop_toggle_and_sorting(db: Path) -> None:
    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        feed = app.dashboard.query_one("#decisions", DataTable)
        hidden = feed.row_count
        await pilot.press("n")
        await pilot.pause()
        assert feed.row_count == sql(db, "SELECT count(*) FROM decisions WHERE t <= 60")[0][0]
        assert feed.row_count > hidden
        tasks = app.dashboard.query_one(TaskList)
        ages = [float(tasks.cells(i)[3].plain.rstrip("s")) for i in range(tasks.row_count)]
        assert ages == sorted(ages, reverse=True) and len(ages) > 1
        await pilot.press("s", "s", "s")  # age -> remaining -> progress -> id
        await pilot.pause()
        ids = [int(tasks.cells(i)[0].plain.strip("⚠ ")) for i in range(tasks.row_count)]
        assert ids == sorted(ids) == tasks.task_ids()

    run_app(db, scenario, at=60.0)


def test_the_palette_brings_an_open_screen_forward(db: Path) -> None:
    """Parameters or Go-to chosen from the command palette while already open
    (even under Help) comes forward; no second copy is opened."""
    from console.screens.goto import GotoScreen
    from console.screens.help import HelpScreen

    async def palette(pilot: Any, command: str) -> None:
        from textual.command import CommandList

        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*command)
        # the palette searches as it is typed: enter once it highlights the command
        results = pilot.app.screen.query_one(CommandList)
        for _ in range(600):
            at = results.highlighted
            if at is not None and command in str(results.get_option_at_index(at).prompt):
                break
            await pilot.pause(0.05)
        await pilot.press("enter")
        await pilot.pause()

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        await pilot.press("p", "question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await palette(pilot, "Parameters")
        assert isinstance(app.screen, ParamsScreen)
        assert sum(isinstance(s, ParamsScreen) for s in app.screen_stack) == 1
        await palette(pilot, "Parameters")
        assert isinstance(app.screen, ParamsScreen)
        await pilot.press("escape", "g")
        await pilot.pause()
        assert isinstance(app.screen, GotoScreen)
        app.ask_goto()  # the palette's "Go to time"
        await pilot.pause()
        assert sum(isinstance(s, GotoScreen) for s in app.screen_stack) == 1
        assert app.is_running

    run_app(db, scenario)


def test_go_to_accepts_the_end_as_shown_to_two_decimals(db: Path) -> None:
    """The box shows times to 2 decimals: the run's end rounded up (as the
    prefill at the end may be) goes to the end, not "outside the run"."""
    import math

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        t1 = app.replay.t1  # type: ignore[union-attr]
        shown = f"{math.ceil(t1 * 100) / 100:.2f}"
        assert float(shown) > t1  # the fixture's end is not a whole hundredth
        await pilot.press("dollar_sign", "g")
        await pilot.pause()
        assert f"to {shown}:" in str(app.screen.query_one(Label).render())
        app.screen.query_one("#goto-input", Input).value = shown
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.dashboard
        assert app.cursor_t == app.replay.t1  # type: ignore[union-attr]

    run_app(db, scenario)


def test_a_nan_start_time_starts_at_the_beginning(db: Path) -> None:
    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        assert app.cursor_t == app.replay.t0  # type: ignore[union-attr]
        app.goto(float("nan"))  # ignored
        assert app.cursor_t == app.replay.t0  # type: ignore[union-attr]

    run_app(db, scenario, at=float("nan"))


def test_the_task_sort_title_keeps_its_brackets(db: Path) -> None:
    from textual.content import Content

    async def scenario(pilot: Any, app: ConsoleApp) -> None:
        tasks = app.dashboard.query_one(TaskList)
        await pilot.press("s")
        await pilot.pause()
        assert Content.from_markup(str(tasks.border_title)).plain.endswith("by E[remaining] ▼")

    run_app(db, scenario, at=60.0)


@pytest.mark.parametrize("keymap", [{}, {"console.help": "h", "params.apply": "ctrl+a",
                                        "console.params": "e"}])
def test_help_and_quit_stay_in_the_footer_of_a_narrow_terminal(
        db: Path, keymap: dict[str, str]) -> None:
    """The footer cuts what does not fit at the right: Help and Quit come first, as
    rebound by a keymap, and work from the dashboard."""
    from textual.widgets._footer import FooterKey

    from console.screens.help import HelpScreen

    async def main() -> None:
        app = ConsoleApp(replay=ReplaySource(db), keymap=keymap)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            shown = {k.description: k for k in app.screen.query(FooterKey)
                     if k.region.right <= 80}
            assert {"Help", "Quit", "Params", "Next"} <= set(shown)
            assert list(shown)[:3] == ["Help", "Quit", "Params"]  # rebound keys keep their place
            assert shown["Help"].key == keymap.get("console.help", "question_mark")
            await pilot.press(keymap.get("console.help", "question_mark"))
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press(keymap.get("console.help", "question_mark"))  # closes it too
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press(keymap.get("console.params", "p"))
            await pilot.pause()
            apply = app.screen.query_one("#apply", Button)
            assert str(apply.label) == f"Apply ({keymap.get('params.apply', 'ctrl+s')})"
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0

    asyncio.run(main())
