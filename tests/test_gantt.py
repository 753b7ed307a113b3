"""The Gantt export: store queries on a hand-made log, the chart's bars, large
runs, the CLI, and the HTML rendered by headless Chromium (skipped only when
no chromium is installed)."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from console.gantt import (
    Gantt,
    GanttError,
    build_gantt,
    dump_dom,
    export_gantt,
    find_chromium,
    screenshot,
)
from store import Store
from store import queries as q
from tests.benchkit import load_bench
from topasd.cli import main
from topasd.model import EngineEvent, EventKind
from topasd.runner import RunInfo

K = EventKind
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def req(t: float, kind: EventKind, rid: int, task: int, stage: str, agent: str,
        tokens: int = 0, value: float = 0.0) -> EngineEvent:
    return EngineEvent(t, kind, rid, task, agent, stage, tokens, value)


def pre(t: float, kind: EventKind, agent: str, value: float = 0.0,
        note: str = "") -> EngineEvent:
    return EngineEvent(t, kind, agent=agent, tokens=10, value=value, note=note)


# Two tasks, agents A then B. r0 is preempted once, r1 retracted once; r0's second
# admission reports a prefill end; A's prefix is loaded and backed up, then evicted;
# B's is recomputed by prefill.
EVENTS = [
    EngineEvent(0.0, K.TASK_ARRIVE, task_id=0, note="wf"),
    EngineEvent(0.0, K.TASK_ARRIVE, task_id=1, note="wf"),
    req(0.0, K.REQUEST_READY, 0, 0, "a", "A"),
    req(0.0, K.REQUEST_READY, 1, 1, "a", "A"),
    pre(0.0, K.PREFIX_LOAD_START, "A", value=1.0),
    req(0.0, K.REQUEST_ADMIT, 0, 0, "a", "A", tokens=3),
    req(0.0, K.REQUEST_ADMIT, 1, 1, "a", "A", tokens=3),
    pre(1.0, K.PREFIX_LOAD_END, "A"),
    pre(1.0, K.PREFIX_OFFLOAD_START, "A", value=1.0),
    req(1.0, K.REQUEST_START, 0, 0, "a", "A"),
    req(1.0, K.REQUEST_START, 1, 1, "a", "A"),
    pre(2.0, K.PREFIX_OFFLOAD_END, "A"),
    req(2.0, K.RETRACT, 1, 1, "a", "A", tokens=1),
    req(3.0, K.PREEMPT, 0, 0, "a", "A", tokens=2),
    req(4.0, K.REQUEST_ADMIT, 0, 0, "a", "A", tokens=5),
    req(4.0, K.REQUEST_START, 0, 0, "a", "A"),
    req(4.5, K.PREFILL_END, 0, 0, "a", "A"),
    req(5.0, K.REQUEST_ADMIT, 1, 1, "a", "A", tokens=4),
    req(5.0, K.REQUEST_START, 1, 1, "a", "A"),
    req(8.0, K.REQUEST_FINISH, 0, 0, "a", "A", tokens=6, value=4.0),
    req(8.0, K.REQUEST_READY, 2, 0, "b", "B"),
    req(9.0, K.REQUEST_FINISH, 1, 1, "a", "A", tokens=6, value=4.0),
    EngineEvent(9.0, K.TASK_FINISH, task_id=1, value=9.0),
    pre(9.0, K.PREFIX_EVICT, "A", note="policy"),
    pre(9.0, K.PREFIX_COMPUTE_START, "B"),
    req(9.0, K.REQUEST_ADMIT, 2, 0, "b", "B", tokens=3),
    pre(10.0, K.PREFIX_COMPUTE_END, "B"),
    req(10.0, K.REQUEST_START, 2, 0, "b", "B"),
    req(12.0, K.REQUEST_FINISH, 2, 0, "b", "B", tokens=6, value=2.0),
    EngineEvent(12.0, K.TASK_FINISH, task_id=0, value=12.0),
]


def write_log(path: Path, events: list[EngineEvent], policy: str = "hand",
              workload: str = "synthetic") -> int:
    """A run of hand-made events, recorded through the store's own sink."""
    with Store(path) as store:
        sink = store.sink()
        sink.run_started(RunInfo(policy, "sim", "unit", {}, workload, 0, {}))
        for ev in events:
            sink.event(ev)
        sink.run_finished(None, None)
        assert sink.run_id is not None
        return sink.run_id


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "hand.db"
    write_log(path, EVENTS)
    return path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def png_is_not_blank(path: Path) -> bool:
    """Distinct byte values in the decompressed image data (a blank page has few)."""
    data, pos, idat = path.read_bytes(), 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat))) > 32


# ------------------------------------------------------------ queries


def test_queries_rebuild_admissions_prefix_spans_and_marks(log: Path) -> None:
    with Store(log) as store:
        db = store.db
        assert q.agents(db, 1) == ["A", "B"]
        assert q.time_span(db, 1) == (0.0, 12.0)
        segs = [(s.request_id, s.attempt, s.admitted, s.started, s.prefill_end, s.end,
                 s.end_kind) for s in q.request_segments(db, 1)]
        assert segs == [(0, 1, 0.0, 1.0, None, 3.0, "preempt"),
                        (1, 1, 0.0, 1.0, None, 2.0, "retract"),
                        (0, 2, 4.0, 4.0, 4.5, 8.0, "finish"),
                        (1, 2, 5.0, 5.0, None, 9.0, "finish"),
                        (2, 1, 9.0, 10.0, None, 12.0, "finish")]
        spans = [(s.agent, s.kind, s.start, s.end, s.note) for s in q.prefix_spans(db, 1)]
        assert spans == [("A", "load", 0.0, 1.0, ""), ("A", "resident", 0.0, 9.0, "policy"),
                         ("A", "offload", 1.0, 2.0, ""), ("B", "compute", 9.0, 10.0, ""),
                         ("B", "resident", 9.0, 12.0, "still resident")]
        assert [(m.t, m.kind, m.request_id) for m in q.preemptions(db, 1)] == [
            (2.0, "retract", 1), (3.0, "preempt", 0)]
        reqs = {r["request_id"]: r for r in db.query("SELECT * FROM requests")}
        assert (reqs[0]["ready"], reqs[0]["admitted"], reqs[0]["started"],
                reqs[0]["finished"]) == (0.0, 0.0, 1.0, 8.0)
        assert (reqs[0]["preemptions"], reqs[1]["retractions"]) == (1, 1)
        assert reqs[0]["input_tokens"] == 3 and reqs[0]["output_tokens"] == 6
        assert [(t.task_id, t.workflow, t.jct) for t in q.tasks(db, 1)] == [
            (0, "wf", 12.0), (1, "wf", 9.0)]


def test_agents_view_bars_tell_waiting_prefill_and_service_apart(log: Path) -> None:
    with Store(log) as store:
        g = build_gantt(store, view="agents")
    assert g.lanes == ["A", "B"] and g.mode == "detailed" and not g.notes
    by_kind: dict[str, list[tuple[float, float]]] = {}
    for trace in g.figure.data:
        if trace.type == "bar":
            spans = [(b, b + x) for b, x in zip(trace.base, trace.x, strict=True)]
            by_kind.setdefault(trace.meta, []).extend(spans)
            assert trace.orientation == "h" and len(trace.hovertext) == len(spans)
    # queued: r1 retracted at 2 until its admission at 5, r0 preempted at 3 until
    # 4, r2 ready at 8 until 9 (the zero-length waits at 0 draw nothing)
    assert sorted(by_kind["queued"]) == [(2.0, 5.0), (3.0, 4.0), (8.0, 9.0)]
    assert sorted(by_kind["waiting"]) == [(0.0, 1.0), (0.0, 1.0), (9.0, 10.0)]
    assert by_kind["prefill"] == [(4.0, 4.5)]
    assert sorted(by_kind["service"]) == [(1.0, 2.0), (1.0, 3.0), (4.5, 8.0), (5.0, 9.0),
                                          (10.0, 12.0)]
    assert sorted(by_kind["resident"]) == [(0.0, 9.0), (9.0, 12.0)]
    assert by_kind["load"] == [(0.0, 1.0)] and by_kind["offload"] == [(1.0, 2.0)]
    assert by_kind["compute"] == [(9.0, 10.0)]
    assert g.bars == 17 and g.marks == 2
    marks = {t.meta: list(t.x) for t in g.figure.data if t.type == "scatter"}
    assert marks == {"preempt": [3.0], "retract": [2.0]}
    hover = next(t for t in g.figure.data if t.meta == "prefill").hovertext[0]
    assert "request 0" in hover and "task 0, stage a, agent A" in hover


def test_aggregating_the_requests_keeps_the_preemption_marks(log: Path) -> None:
    with Store(log) as store:
        g = build_gantt(store, max_bars=16)  # 17 bars: the requests are aggregated
    assert g.mode == "aggregated" and g.marks == 2
    marks = {t.meta: list(t.x) for t in g.figure.data if t.type == "scatter"}
    assert marks == {"preempt": [3.0], "retract": [2.0]}


def test_a_load_cut_short_ends_where_it_stopped(tmp_path: Path) -> None:
    """A load planned for 1 s ends at its load end; one evicted mid-way ends
    at the eviction, marked cancelled (not at its planned end)."""
    path = tmp_path / "loads.db"
    write_log(path, [pre(0.0, K.PREFIX_LOAD_START, "A", value=1.0),
                     pre(0.8, K.PREFIX_LOAD_END, "A"),
                     pre(2.0, K.PREFIX_LOAD_START, "B", value=1.0),
                     pre(2.3, K.PREFIX_EVICT, "B", note="policy"),
                     req(3.0, K.REQUEST_ADMIT, 0, 0, "s", "A")])
    with Store(path) as store:
        loads = [(s.agent, s.start, s.end, s.note) for s in q.prefix_spans(store.db, 1)
                 if s.kind == "load"]
    assert loads == [("A", 0.0, 0.8, ""), ("B", 2.0, 2.3, "cancelled")]


def test_tasks_view_has_one_lane_per_task(log: Path) -> None:
    with Store(log) as store:
        g = build_gantt(store, view="tasks")
    assert g.lanes == ["task 0", "task 1"]
    tasks = next(t for t in g.figure.data if t.meta == "task")
    assert sorted(zip(tasks.base, tasks.x, strict=True)) == [(0.0, 9.0), (0.0, 12.0)]
    names = {t.name for t in g.figure.data if t.meta == "service"}
    assert names == {"agent A", "agent B"}  # coloured, and listed, by agent


def test_a_large_run_is_aggregated_then_windowed_and_says_so(tmp_path: Path) -> None:
    events: list[EngineEvent] = []
    for i in range(3000):  # batches of 3 overlapping requests, 3 batches in a row
        t0 = (i // 3) * 2.0 + (i % 3) * 0.1
        agent = "A" if (i // 9) % 2 == 0 else "B"
        events += [EngineEvent(t0, K.TASK_ARRIVE, task_id=i, note="wf"),
                   req(t0, K.REQUEST_ADMIT, i, i, "s", agent),
                   req(t0 + 0.1, K.REQUEST_START, i, i, "s", agent),
                   req(t0 + 1.5, K.REQUEST_FINISH, i, i, "s", agent),
                   EngineEvent(t0 + 1.5, K.TASK_FINISH, task_id=i)]
    path = tmp_path / "big.db"
    write_log(path, events)
    with Store(path) as store:
        g = build_gantt(store, max_bars=2000)
        assert g.mode == "aggregated" and g.bars == 1000  # one busy span per batch
        assert "aggregated" in g.figure.layout.title.text
        g = build_gantt(store, max_bars=300)
        assert g.mode == "aggregated+windowed" and g.bars <= 300
        assert "showing 0–" in g.figure.layout.title.text
        assert g.window[1] < 2000
        g = build_gantt(store, window=(100.0, 120.0))
        assert g.mode == "windowed" and g.bars == 60 and g.window == (100.0, 120.0)
        assert list(g.figure.layout.xaxis.range) == [100.0, 120.0]
        # the tasks view keeps a lane only for the tasks in the window (not 3,000)
        g = build_gantt(store, view="tasks", window=(100.0, 120.0))
        assert g.lanes == [f"task {i}" for i in range(150, 180)]
        ys = {int(y) for t in g.figure.data if t.meta == "task" for y in t.y}
        assert ys == set(range(30))  # renumbered from the top
        # two notes: one line each, the legend under the axis, clear of the title
        g = build_gantt(store, window=(100.0, 120.0), max_bars=20)
        assert len(g.notes) == 2
        assert g.figure.layout.title.text.count("<br><sup>") == 2
        assert g.figure.layout.legend.yref == "container" and g.figure.layout.legend.y == 0
        with pytest.raises(GanttError, match=r"--window 7000:8000 lies outside run 1 .*"
                                             r"\(0–1999.7 s\)"):
            build_gantt(store, window=(7000.0, 8000.0))


# ------------------------------------------------------------ CLI


def test_gantt_cli_writes_offline_html(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.html"
    res = CliRunner().invoke(main, ["gantt", str(log), "-o", str(out), "--view", "tasks"])
    assert res.exit_code == 0, res.output
    assert "2 lanes" in res.output
    html = out.read_text()
    assert 'id="gantt"' in html and "<script src=\"http" not in html
    assert len(html) > 1_000_000  # plotly.js itself is embedded
    again = CliRunner().invoke(main, ["gantt", "--db", str(log), "-o", str(out)])  # as console
    assert again.exit_code == 0 and again.output.startswith(f"wrote {out}: run 1"), again.output


@pytest.mark.parametrize(("args", "message"), [
    (["missing.db"], "no such decision log"),
    (["{log}", "--run", "9"], "no run 9 in the decision log; runs: 1 (hand)"),
    (["{log}", "--window", "5:1"], "--window: START must be below END"),
    (["{log}", "--window", "abc"], "--window: expected START:END"),
    (["{log}", "--window", "nan:5"], "--window: START and END must be finite"),
    (["{log}", "--png", "{log}.d/x.png"], ".d does not exist"),  # before any work
    ([], "give the decision log: `topasd gantt run.db -o gantt.html` (or --db)"),
    (["{log}", "--db", "other.db"], "two decision logs given"),
])
def test_gantt_cli_errors_are_one_line(log: Path, tmp_path: Path, args: list[str],
                                       message: str) -> None:
    argv = ["gantt", *(a.format(log=log) for a in args), "-o", str(tmp_path / "x.html")]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2
    assert not (tmp_path / "x.html").exists()
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


# ------------------------------------------------------------ in a browser


@needs_chromium
def test_the_chart_draws_in_headless_chromium(log: Path, tmp_path: Path) -> None:
    html = tmp_path / "agents.html"
    g = export_gantt(log, html, view="agents")
    dom = dump_dom(html)
    assert re.findall(r'class="ytick"><text[^>]*>([^<]*)<', dom) == ["A", "B"]
    bars = re.findall(r'<g class="point"><path d="M[^"]+"', dom)
    assert len(bars) == g.bars == 17
    assert len(re.findall(r'<path class="point"', dom)) == 2  # the two marks
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    assert {"prefix on GPU", "prefill", "preempted (policy: #decision)", "retracted (engine)",
            "queued (ready → admitted)"} <= set(legend)
    png = screenshot(html, tmp_path / "agents.png", width=1000, height=600)
    assert png_size(png) == (1000, 600) and png_is_not_blank(png)


@needs_chromium
def test_fig2_lpm_and_srpt_render_with_their_lanes(tmp_path: Path) -> None:
    fig2 = load_bench("fig2_gantt")
    db = tmp_path / "fig2.db"
    runs = fig2.replay_fig2(db)
    assert {p: s["mean_jct_s"] for p, (_, s) in runs.items()} == {"lpm": 35.0, "spf": 30.0}
    loads = {}
    for policy, (run_id, _) in runs.items():
        html = tmp_path / f"{policy}.html"
        g = export_gantt(db, html, run_id=run_id)
        dom = dump_dom(html)
        assert re.findall(r'class="ytick"><text[^>]*>([^<]*)<', dom) == ["A", "B", "C"]
        assert len(re.findall(r'<g class="point"><path d="M[^"]+"', dom)) == g.bars
        labels = set(re.findall(r'class="bartext[^"]*"[^>]*>(T\d\.[abc])<', dom))
        assert labels == {f"T{i}.{s}" for i in range(3) for s in "abc"}
        loads[policy] = sum(len(t.x) for t in g.figure.data if t.meta == "load")
        png = screenshot(html, tmp_path / f"{policy}.png", height=500)
        assert png_is_not_blank(png)
    assert loads == {"lpm": 3, "spf": 9}  # SRPT pays a prefix setup at every stage


@needs_chromium
def test_gantt_cli_png_of_an_aggregated_chart(tmp_path: Path) -> None:
    events = [e for i in range(400) for e in (
        req(i * 0.5, K.REQUEST_ADMIT, i, i, "s", "A"),
        req(i * 0.5 + 0.1, K.REQUEST_START, i, i, "s", "A"),
        req(i * 0.5 + 1.0, K.REQUEST_FINISH, i, i, "s", "A"))]
    path = tmp_path / "agg.db"
    write_log(path, events)
    out, png = tmp_path / "agg.html", tmp_path / "agg.png"
    res = CliRunner().invoke(main, ["gantt", str(path), "-o", str(out), "--max-bars", "100",
                                    "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert "aggregated" in res.output and png_is_not_blank(png)
    dom = dump_dom(out)
    assert "requests aggregated" in dom  # the title says so on the page


# ------------------------------------------------------------ review fixes


def replay_db(tmp_path: Path, *args: str) -> Path:
    """A real decision log: `topasd replay --workload chain3 --policy topas ... --db`."""
    db = tmp_path / "replay.db"
    res = CliRunner().invoke(main, ["replay", "--workload", "chain3", "--policy", "topas",
                                    *args, "--db", str(db)])
    assert res.exit_code == 0, res.output
    return db


def drawn_bars(g: Gantt) -> list[tuple[float, float]]:
    """(start, end) of every bar in the figure."""
    return [(b, b + x) for t in g.figure.data if t.type == "bar"
            for b, x in zip(t.base, t.x, strict=True)]


def test_max_bars_window_is_filled_up_to_the_cap(tmp_path: Path) -> None:
    """The reviewer's run: every cap gets that many bars, from the run's start,
    in a window of real width (not 4 bars for 20, nor 0–1e-06 s for 1)."""
    # idle prefixes leave at each decision: the agents' busy spans break up (over 20)
    db = replay_db(tmp_path, "--tasks", "20", "--param", "keep_idle=false")
    with Store(db) as store:
        start = q.time_span(store.db, 1)[0]
        for cap in (1, 5, 20):
            g = build_gantt(store, max_bars=cap)
            assert g.mode == "aggregated+windowed" and g.bars == cap
            assert len(drawn_bars(g)) == cap
            assert g.window[0] == start and g.window[1] - g.window[0] > 1.0
            assert all(g.window[0] <= a <= b <= g.window[1] for a, b in drawn_bars(g))
            assert list(g.figure.layout.xaxis.range) == list(g.window)
            assert "1e-06" not in g.figure.layout.title.text


def test_bars_tied_at_the_window_end_fill_the_cap_and_are_noted(tmp_path: Path) -> None:
    """Six agents' requests admitted at once: cap 2 draws two, in a window
    up to the next start, and says four are left out (no 0–1e-06 s window)."""
    events = [e for i in range(6) for e in (
        req(0.0, K.REQUEST_ADMIT, i, i, "s", f"A{i}"),
        req(0.0, K.REQUEST_START, i, i, "s", f"A{i}"),
        req(4.0 + i, K.REQUEST_FINISH, i, i, "s", f"A{i}"))]
    events += [req(3.0, K.REQUEST_ADMIT, 9, 9, "s", "B"),
               req(3.0, K.REQUEST_START, 9, 9, "s", "B"),
               req(9.0, K.REQUEST_FINISH, 9, 9, "s", "B")]
    path = tmp_path / "ties.db"
    write_log(path, events)
    with Store(path) as store:
        g = build_gantt(store, max_bars=2)
    assert g.window == (0.0, 3.0) and g.bars == 2
    assert sorted(drawn_bars(g)) == [(0.0, 3.0), (0.0, 3.0)]
    assert "4 more bars starting at 0 s not drawn" in g.figure.layout.title.text


def test_preemption_marks_inside_the_window_are_drawn(tmp_path: Path) -> None:
    """Marks count toward --max-bars: the window holds the first 40 bars and
    marks; marks tied at its cut and those past it are counted as not drawn."""
    db = replay_db(tmp_path, "--tasks", "60", "--rate", "1.5")
    with Store(db) as store:
        every = q.preemptions(store.db, 1)
        g = build_gantt(store, max_bars=40)
    assert len(every) > 10 and g.mode == "aggregated+windowed"
    assert g.bars + g.marks == 40 and g.marks > 0
    inside = [m.t for m in every if g.window[0] <= m.t < g.window[1]]
    drawn = sorted(x for t in g.figure.data if t.type == "scatter" for x in t.x)
    assert len(drawn) == g.marks and set(drawn) <= set(inside)
    tied = len(inside) - len(drawn)
    if tied:
        assert f"{tied} more mark{'s' if tied > 1 else ''} starting at" in g.notes[1]
    assert f"{len(every) - len(inside)} preemption marks outside the window shown not drawn" \
        in g.notes


def test_preemption_marks_count_toward_max_bars(tmp_path: Path) -> None:
    """Eight preempted requests, cap 4: merged into one busy span they still
    draw 1 bar + 8 marks, so the chart is windowed to its first 4 items (it
    drew all 9 past the cap); apart, the first two spans with their marks."""
    def preempted(gap: float) -> list[EngineEvent]:
        return [e for i in range(8) for e in (
            req(i * gap, K.REQUEST_ADMIT, i, i, "s", "A"),
            req(i * gap, K.REQUEST_START, i, i, "s", "A"),
            req(i * gap + 1.0, K.PREEMPT, i, i, "s", "A"))]

    write_log(tmp_path / "close.db", preempted(0.5))
    write_log(tmp_path / "apart.db", preempted(2.0))
    with Store(tmp_path / "close.db") as store:
        g = build_gantt(store, max_bars=4)
    assert g.mode == "aggregated+windowed" and g.window == (0.0, 2.5)
    assert (g.bars, g.marks) == (1, 3)
    assert [x for t in g.figure.data if t.type == "scatter" for x in t.x] == [1.0, 1.5, 2.0]
    assert g.notes[0].startswith("8 bars and 8 marks exceed --max-bars 4")
    assert "5 preemption marks outside the window shown not drawn" in g.notes
    with Store(tmp_path / "apart.db") as store:
        g = build_gantt(store, max_bars=4)
    assert g.mode == "aggregated+windowed" and g.window == (0.0, 4.0)
    assert (g.bars, g.marks) == (2, 2)
    marks = [x for t in g.figure.data if t.type == "scatter" for x in t.x]
    assert marks == [1.0, 3.0]
    assert "6 preemption marks outside the window shown not drawn" in g.notes


def staggered(n: int, gap: float = 1.0) -> list[EngineEvent]:
    """`n` one-request tasks arriving `gap` s apart, each running 2 s (task i on agent
    A or B); with gap 0 they all arrive at once."""
    return [e for i in range(n) for e in (
        EngineEvent(i * gap, K.TASK_ARRIVE, task_id=i, note="wf"),
        req(i * gap, K.REQUEST_ADMIT, i, i, "s", "AB"[i % 2]),
        req(i * gap, K.REQUEST_START, i, i, "s", "AB"[i % 2]),
        req(i * gap + 2.0, K.REQUEST_FINISH, i, i, "s", "AB"[i % 2]),
        EngineEvent(i * gap + 2.0, K.TASK_FINISH, task_id=i, value=2.0))]


def lanes_with_bars(g: Gantt) -> set[int]:
    return {int(y) for t in g.figure.data if t.type == "bar" for y in t.y}


def test_the_tasks_view_caps_its_lanes_and_says_how_many(tmp_path: Path) -> None:
    """12 tasks, at most 5 lanes: the first 5 in a window up to where the 6th
    arrives (not 12 lanes, as 3,000 drew 3,000), and a note with the count."""
    write_log(tmp_path / "t.db", staggered(12))
    with Store(tmp_path / "t.db") as store:
        g = build_gantt(store, view="tasks", max_lanes=5)
    assert g.lanes == [f"task {i}" for i in range(5)] and g.window == (0.0, 5.0)
    assert g.mode == "windowed" and len(g.figure.layout.yaxis.ticktext) == 5
    assert lanes_with_bars(g) == set(range(5))
    assert all(0.0 <= a <= b <= 5.0 for a, b in drawn_bars(g))
    assert "over 5 task lanes: showing 0–5 s of 0–13 s" in g.notes[0]
    assert "5 of 12 tasks shown" in g.notes[-1] and "--window" in g.notes[-1]
    assert g.figure.layout.title.text.count("<br><sup>") == len(g.notes) == 2
    assert g.summary("g.html") == ("wrote g.html: run 1 (hand, synthetic, done), 5 lanes, "
                                   "10 bars, 0 preemption marks (windowed)")
    with Store(tmp_path / "t.db") as store:  # a window with 7 tasks in it: 5 of them
        g = build_gantt(store, view="tasks", window=(3.5, 9.5), max_lanes=5)
    assert g.lanes == [f"task {i}" for i in range(2, 7)] and g.window == (3.5, 7.0)
    assert "5 of 12 tasks shown" in g.notes[-1]


def test_tasks_past_the_lane_cap_at_one_instant_are_left_out(tmp_path: Path) -> None:
    """8 tasks arriving at once, at most 5 lanes: no narrower window helps, so
    the first 5 by arrival are drawn over the whole run, and the note says so."""
    write_log(tmp_path / "t.db", staggered(8, gap=0.0))
    with Store(tmp_path / "t.db") as store:
        g = build_gantt(store, view="tasks", max_lanes=5)
    assert g.lanes == [f"task {i}" for i in range(5)] and g.window == (0.0, 2.0)
    assert g.mode == "detailed" and lanes_with_bars(g) == set(range(5))
    assert g.notes == ["5 of 8 tasks shown: those in the window, at most 5 "
                       "(see others with --window START:END)"]


def test_an_automatic_window_drops_the_task_lanes_it_leaves_empty(tmp_path: Path) -> None:
    """--max-bars windows the tasks view: only the tasks in that window keep a
    lane (all 12 were drawn, 9 of them empty)."""
    write_log(tmp_path / "t.db", staggered(12))
    with Store(tmp_path / "t.db") as store:
        g = build_gantt(store, view="tasks", max_bars=3)
    assert g.mode == "aggregated+windowed" and g.window == (0.0, 3.0)
    assert g.lanes == ["task 0", "task 1", "task 2"] and g.bars == 3
    assert lanes_with_bars(g) == {0, 1, 2}
    assert list(g.figure.layout.yaxis.range) == [3, 0]
    assert "3 of 12 tasks shown" in g.notes[-1]


def test_one_of_each_is_singular(tmp_path: Path) -> None:
    write_log(tmp_path / "one.db", staggered(1))
    with Store(tmp_path / "one.db") as store:
        g = build_gantt(store, view="agents")
    assert g.summary("x.html").endswith("1 lane, 1 bar, 0 preemption marks (detailed)")


NAMES = [  # a workflow, agent and stage named with Plotly's pseudo-HTML
    EngineEvent(0.0, K.TASK_ARRIVE, task_id=0, note="<b>wf</b>"),
    req(0.0, K.REQUEST_ADMIT, 0, 0, "<u>a</u>", "<i>B</i>"),
    req(0.0, K.REQUEST_START, 0, 0, "<u>a</u>", "<i>B</i>"),
    req(1.0, K.PREEMPT, 0, 0, "<u>a</u>", "<i>B</i>"),
    req(2.0, K.REQUEST_ADMIT, 0, 0, "<u>a</u>", "<i>B</i>"),
    req(2.0, K.REQUEST_START, 0, 0, "<u>a</u>", "<i>B</i>"),
    req(3.0, K.REQUEST_FINISH, 0, 0, "<u>a</u>", "<i>B</i>"),
    EngineEvent(3.0, K.TASK_FINISH, task_id=0, value=3.0),
]


def chart_texts(g: Gantt) -> list[str]:
    """Every text the figure shows: title, ticks, legend names, labels, hovers."""
    out = [g.figure.layout.title.text, *g.figure.layout.yaxis.ticktext]
    for t in g.figure.data:
        out += [t.name, *(t.hovertext or ()), *(getattr(t, "text", None) or ())]
    return out


@pytest.mark.parametrize("view", ["agents", "tasks"])
def test_names_with_markup_are_shown_as_text(tmp_path: Path, view: str) -> None:
    write_log(tmp_path / "n.db", NAMES, workload="<sup>w</sup>")
    with Store(tmp_path / "n.db") as store:
        g = build_gantt(store, view=view)
    texts = "\n".join(chart_texts(g))
    for tag in ("i", "u", "sup>w", "b>wf"):
        assert f"<{tag}" not in texts
    assert "&lt;i&gt;B&lt;/i&gt;" in texts and "&lt;u&gt;a&lt;/u&gt;" in texts
    assert "&lt;sup&gt;w&lt;/sup&gt;" in g.figure.layout.title.text
    if view == "tasks":
        assert "&lt;b&gt;wf&lt;/b&gt;" in texts
        assert {t.name for t in g.figure.data if t.meta == "service"} == {
            "agent &lt;i&gt;B&lt;/i&gt;"}
    else:
        assert g.lanes == ["&lt;i&gt;B&lt;/i&gt;"]
    assert "<b>request 0</b>" in texts  # the chart's own markup stays


def test_the_html_page_has_a_title(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.html"
    export_gantt(log, out, view="tasks")
    head = out.read_text()[:500]
    assert "<title>run 1 (hand, synthetic): tasks view</title>" in head
    write_log(tmp_path / "n.db", NAMES, workload="a<b>&c")
    export_gantt(tmp_path / "n.db", out)
    assert "<title>run 1 (hand, a&lt;b&gt;&amp;c): agents view</title>" in out.read_text()


@needs_chromium
def test_markup_in_names_renders_as_text_in_chromium(tmp_path: Path) -> None:
    write_log(tmp_path / "n.db", NAMES, workload="w")
    html = tmp_path / "n.html"
    export_gantt(tmp_path / "n.db", html)
    dom = dump_dom(html)
    assert re.findall(r'class="ytick"><text[^>]*>([^<]*)<', dom) == ["&lt;i&gt;B&lt;/i&gt;"]
    assert not re.search(r"<tspan[^>]*font-style: ?italic", dom)  # no <i> drawn in italics
    assert "<title>run 1 (hand, w): agents view</title>" in dom


@pytest.mark.parametrize("kind", ["existing", "slash"])
def test_gantt_cli_refuses_a_folder_as_output(log: Path, tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "out"
    if kind == "existing":
        folder.mkdir()
        with pytest.raises(GanttError, match=f"{folder}: is a folder, not a file; name "
                                             f"the HTML file, e.g. -o {folder}/gantt.html"):
            export_gantt(log, folder)
    res = CliRunner().invoke(main, ["gantt", str(log), "-o", f"{folder}/"])
    assert res.exit_code == 2
    assert not folder.is_file() and list(tmp_path.glob("out*")) == (
        [folder] if kind == "existing" else [])
    if kind == "slash":
        lines = res.output.strip().splitlines()
        assert lines == [f"error: {folder}/: is a folder, not a file; name the HTML file, "
                         f"e.g. -o {folder}/gantt.html"]


# ------------------------------------------------------------ queueing


def test_a_request_never_admitted_fills_its_agents_lane_with_its_wait(tmp_path: Path) -> None:
    """The operator's case: a request that waited to the end of the log is a
    queued bar across its agent's lane, not an idle lane."""
    path = tmp_path / "starved.db"
    write_log(path, [*EVENTS, EngineEvent(1.0, K.TASK_ARRIVE, task_id=7, note="wf"),
                     req(1.0, K.REQUEST_READY, 7, 7, "a", "C")])
    with Store(path) as store:
        g = build_gantt(store, view="agents")
        t = build_gantt(store, view="tasks")
    assert g.lanes == ["A", "C", "B"]
    queued = next(tr for tr in g.figure.data if tr.meta == "queued")
    lane_c = [(b, b + x, y) for b, x, y in zip(queued.base, queued.x, queued.y, strict=True)
              if 1 <= y < 2]
    assert [(a, b) for a, b, _ in lane_c] == [(1.0, 12.0)]
    hover = next(h for h, y in zip(queued.hovertext, queued.y, strict=True) if 1 <= y < 2)
    assert "request 7</b> queued 11.000 s" in hover
    assert "still waiting at the end of the log" in hover
    task_queued = next(tr for tr in t.figure.data if tr.meta == "queued")
    assert (1.0, 12.0) in [(b, b + x) for b, x in zip(task_queued.base, task_queued.x,
                                                      strict=True)]
    task7 = next(tr for tr in t.figure.data if tr.meta == "task")
    assert any("queued 11.00 s in all" in h for h in task7.hovertext)


def test_preemption_marks_name_their_decision(tmp_path: Path) -> None:
    db = replay_db(tmp_path, "--tasks", "60", "--rate", "1.5")
    with Store(db) as store:
        logged = {(r["request_id"], r["t"]): r for r in store.db.query(
            "SELECT * FROM preemption_log WHERE by = 'policy'")}
        first = min(t for _, t in logged)
        g = build_gantt(store, window=(first - 5, first + 5))
    (marks,) = [tr for tr in g.figure.data if tr.meta == "preempt"]
    assert marks.mode == "markers+text" and len(marks.x) >= 1
    for t, text, hover in zip(marks.x, marks.text, marks.hovertext, strict=True):
        rid = int(re.search(r"request (\d+)", hover).group(1))  # type: ignore[union-attr]
        row = logged[(rid, t)]
        assert text == f"#{row['decision']}"
        assert f"by decision #{row['decision']}" in hover
        if row["best_rejected_total"] is not None:
            assert "the highest total wins" in hover
