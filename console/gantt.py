"""The Gantt export: one run of a decision log as an offline Plotly chart.

Reads only a store file, through `store.queries`. Horizontal bars with a base
on a seconds axis (not the date-only timeline helper):

- `agents` view: one lane per agent. Its top band shows the agent's prefix on
  the GPU (light green; dark green while recomputed by prefill), the band
  below it host transfers (blue: host -> GPU load, purple: GPU -> host
  backup); below them one row per request from when it became ready to its
  end, stacked in as many rows as were in the engine at once: orange dotted
  while it waited in the queue (ready -> admitted, again after a preemption;
  a request never admitted waits to the end of the log, so a lane with
  waiting work never reads as idle; the hover counts the decisions that held
  it out of W_t, TOPAS's `phases`, `tandem` and `lot_size`), grey hatched from admission to its
  first prefill chunk (waiting for its prefix or the prefill queue),
  crosshatched from start to prefill end when the backend reports one, then
  solid (service), coloured by task. Red x: preempted by the policy,
  labelled with its decision (`#41`; the hover gives the chosen and best
  rejected totals); orange triangle: retracted by the engine. Hover shows
  task, stage, request and times.
- `tasks` view: one lane per task (by arrival): the task's span (its hover
  sums its requests' queueing), then its requests as in the agents view
  (queued orange dotted, service coloured by agent). Only tasks with a bar or
  mark in the window shown get a lane, and at most `max_lanes` (`MAX_LANES`)
  of them: past that the window ends where the next task starts.

Large runs stay usable: past `max_bars` bars and marks the requests are
aggregated (agents: merged into spans per agent where requests queued and where
they ran; tasks: one bar per task)
and, if still too many, the chart shows the run's first `max_bars` bars and
marks in a window from its start. The title says which. The HTML embeds
plotly.js, so it works offline. Names from the log (agents, stages,
workflows, workload) are shown as text: Plotly's `<b>`-style markup in them is
escaped.
"""

from __future__ import annotations

import heapq
import html
import math
import os
import shutil
import subprocess
import tempfile
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import plotly.graph_objects as go
from plotly.colors import qualitative

from store import Store
from store import queries as q
from topasd.model import TopasError

View = Literal["agents", "tasks"]
VIEWS: tuple[str, ...] = ("agents", "tasks")
DEFAULT_MAX_BARS = 4000
MAX_LANES = 200  # tasks view: more lanes overlap their labels and take Chromium minutes
LABEL_BARS = 300  # request bars carry a "T<task>.<stage>" label up to this many bars
LEGEND_PER_ROW = 5  # legend entries a row holds at the default width (for the margin)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")

TASK_COLOURS: tuple[str, ...] = tuple(qualitative.Dark24)
AGENT_COLOURS: tuple[str, ...] = tuple(qualitative.Plotly) + tuple(qualitative.D3)
STYLE = {  # legend name, colour, pattern
    "queued": ("queued (ready → admitted)", "#fdae6b", "."),
    "queued_busy": ("requests queued (merged)", "#fdae6b", "."),
    "waiting": ("admitted, waiting (prefix / prefill queue)", "#c8c8c8", "/"),
    "prefill": ("prefill", None, "x"),
    "service": ("request (colour = task)", None, ""),
    "busy": ("requests running (merged)", "#4c78a8", ""),
    "resident": ("prefix on GPU", "#b7e4c7", ""),
    "compute": ("prefix recompute", "#2d6a4f", ""),
    "load": ("host → GPU load", "#1f77b4", ""),
    "offload": ("GPU → host backup", "#9467bd", ""),
    "task": ("task (arrival → completion)", "#e6e6e6", ""),
    "tool": ("tool call (between ReAct rounds)", "#e377c2", "-"),
}
# Bands of a lane [0, 1): (top, height)
RESIDENT_BAND = (0.04, 0.13)
TRANSFER_BAND = (0.19, 0.09)
REQUEST_BAND = (0.32, 0.64)
TASK_BAND = (0.04, 0.16)
TASK_REQUEST_BAND = (0.26, 0.70)


class GanttError(TopasError):
    """The Gantt chart cannot be made; the message says why."""


@dataclass(slots=True)
class _Bar:
    kind: str
    y: float  # top of the bar, in lane units (lane i spans [i, i+1))
    h: float
    start: float
    end: float
    hover: str
    colour: str | None = None
    group: str = ""  # legend entry of its own (tasks view: the agent)
    label: str = ""  # text inside the bar on small charts


@dataclass(slots=True)
class _Mark:
    kind: str  # preempt | retract
    y: float
    t: float
    hover: str
    decision: int | None = None  # a preemption's decision (its label on small charts)


_Item = TypeVar("_Item", _Bar, _Mark)


@dataclass
class Gantt:
    """What was drawn: the figure and how it was reduced."""

    figure: go.Figure
    run: q.RunRow
    view: str
    lanes: list[str]
    bars: int
    marks: int
    mode: str  # detailed | aggregated | windowed | aggregated+windowed
    window: tuple[float, float]
    notes: list[str] = field(default_factory=list)

    def summary(self, output: str | Path) -> str:
        """The line the CLI prints after writing `output`."""
        return (f"wrote {output}: {self.run.label}, {_count(len(self.lanes), 'lane')}, "
                f"{_count(self.bars, 'bar')}, {_count(self.marks, 'preemption mark')} "
                f"({self.mode})")


# --------------------------------------------------------------------- API


def export_gantt(db_path: str | Path, out_html: str | Path, *, run_id: int | None = None,
                 view: str = "agents", window: tuple[float, float] | None = None,
                 max_bars: int = DEFAULT_MAX_BARS, max_lanes: int = MAX_LANES) -> Gantt:
    """Write the Gantt chart of one run (default: the latest) to `out_html`."""
    out = _output_file(out_html)
    store = Store(db_path, create=False)
    try:
        gantt = build_gantt(store, run_id=run_id, view=view, window=window, max_bars=max_bars,
                            max_lanes=max_lanes)
    finally:
        store.close()
    page = gantt.figure.to_html(include_plotlyjs=True, full_html=True, div_id="gantt",
                                config={"displaylogo": False, "responsive": True})
    try:
        out.write_text(_with_title(page, page_title(gantt.run, gantt.view)), encoding="utf-8")
    except OSError as exc:
        raise GanttError(f"{out}: cannot write ({exc.strerror})") from None
    return gantt


def page_title(run: q.RunRow, view: str) -> str:
    """The HTML page's <title> (plain text): "run 2 (topas, metagpt-sop): tasks view"."""
    return f"run {run.id} ({run.policies_text}, {run.workload or 'no workload'}): {view} view"


def _with_title(page: str, title: str) -> str:
    """`page` (Plotly's full HTML) with a <title> in its head."""
    return page.replace("<head>", f"<head>\n    <title>{html.escape(title)}</title>", 1)


def build_gantt(store: Store, *, run_id: int | None = None, view: str = "agents",
                window: tuple[float, float] | None = None,
                max_bars: int = DEFAULT_MAX_BARS, max_lanes: int = MAX_LANES) -> Gantt:
    """The figure for one run of `store`: the view's bars and marks, narrowed
    to the user's window, to `max_lanes` task lanes and to `max_bars`."""
    _check_limits(view, window, max_bars, max_lanes)
    run = q.get_run(store.db, run_id)
    span = q.time_span(store.db, run.id)
    if span == (0.0, 0.0) and not q.tasks(store.db, run.id):
        raise GanttError(f"{run.label} has no events to draw")
    d = _Drawing(*(_agents_view if view == "agents" else _tasks_view)(store, run.id),
                 view=view, span=span, win=window or span)
    tasks = len(d.lanes)
    if window is not None:
        d.user_window(window, run.label)
    if view == "tasks" and len(d.lanes) > max_lanes:
        d.cap_lanes(max_lanes)
    if len(d.bars) + len(d.marks) > max_bars:
        d.cap_bars(max_bars)
    if view == "tasks" and len(d.lanes) < tasks:
        d.notes.append(f"{len(d.lanes)} of {_count(tasks, 'task')} shown: those in the window, "
                       f"at most {max_lanes} (see others with --window START:END)")
    fig = _figure(run, view, d.lanes, d.bars, d.marks, d.win, d.notes)
    return Gantt(fig, run, view, d.lanes, len(d.bars), len(d.marks), d.mode, d.win, d.notes)


def _check_limits(view: str, window: tuple[float, float] | None, max_bars: int,
                  max_lanes: int) -> None:
    if view not in VIEWS:
        raise GanttError(f"unknown view {view!r}; choose {' or '.join(VIEWS)}")
    if max_bars < 1:
        raise GanttError(f"--max-bars must be at least 1, got {max_bars}")
    if max_lanes < 1:
        raise GanttError(f"max_lanes must be at least 1, got {max_lanes}")
    if window is not None and not window[0] < window[1]:
        raise GanttError(f"--window must be START:END with START < END, got {window}")


@dataclass
class _Drawing:
    """What the figure will draw, narrowed step by step (`build_gantt`)."""

    lanes: list[str]
    bars: list[_Bar]
    marks: list[_Mark]
    agg: list[_Bar]  # the aggregated bars, drawn instead of `bars` past --max-bars
    view: str
    span: tuple[float, float]
    win: tuple[float, float]
    mode: str = "detailed"
    notes: list[str] = field(default_factory=list)

    def renumber(self) -> None:
        """Tasks view: only lanes that hold something, renumbered."""
        self.lanes, (self.bars, self.marks, self.agg) = _lanes_used(
            self.lanes, self.bars, self.marks, self.agg)

    def user_window(self, window: tuple[float, float], label: str) -> None:
        span = self.span
        if window[1] < span[0] or window[0] > span[1]:
            raise GanttError(f"--window {window[0]:g}:{window[1]:g} lies outside {label} "
                             f"({span[0]:g}–{span[1]:g} s): choose times within it")
        self.bars, self.agg = _clip(self.bars, window), _clip(self.agg, window)
        self.marks = [m for m in self.marks if window[0] <= m.t <= window[1]]
        if self.view == "tasks":  # only the tasks that show in the window keep a lane
            self.renumber()
        self.mode = "windowed"
        self.notes.append(f"window {window[0]:g}–{window[1]:g} s of {span[0]:g}–{span[1]:g} s")

    def cap_lanes(self, max_lanes: int) -> None:
        """The first `max_lanes` task lanes, and the time they span if shorter."""
        cut, keep = _first_lanes(self.bars, self.marks, max_lanes, self.win)
        self.bars, self.marks = _in_lanes(self.bars, keep), _in_lanes(self.marks, keep)
        self.agg = _in_lanes(self.agg, keep)
        if cut[1] < self.win[1]:
            self.bars, self.agg = _clip(self.bars, cut), _clip(self.agg, cut)
            self.marks = _marks_in(self.marks, cut)
            span = self.span
            self.notes.append(f"over {max_lanes} task lanes: showing {cut[0]:g}–{cut[1]:g} s "
                              f"of {span[0]:g}–{span[1]:g} s (choose another with --window "
                              "START:END)")
            self.win, self.mode = cut, _with_step(self.mode, "windowed")
        self.renumber()

    def cap_bars(self, max_bars: int) -> None:
        """Aggregated requests, then the first window that fits `max_bars`."""
        how = "busy spans per agent" if self.view == "agents" else "one bar per task"
        self.notes.append(f"{_things(len(self.bars), len(self.marks))} exceed --max-bars "
                          f"{max_bars}: requests aggregated ({how})")
        self.bars = self.agg  # preemption marks stay: each sits in its lane at its time
        self.mode = _with_step(self.mode, "aggregated")
        if len(self.bars) + len(self.marks) <= max_bars:
            return
        n_marks = len(self.marks)
        self.bars, self.marks, self.win, left = _first_window(self.bars, self.marks, max_bars,
                                                              self.win)
        self.notes.append(_window_note(self.win, self.span, left))
        self.mode = _with_step(self.mode, "windowed")
        outside = n_marks - len(self.marks) - left[1]
        if outside:
            self.notes.append(f"{_count(outside, 'preemption mark')} outside the window shown "
                              "not drawn")
        if self.view == "tasks":  # the tasks after the window lose their lanes
            self.agg = _clip(self.agg, self.win)
            self.renumber()


def _with_step(mode: str, step: str) -> str:
    """`mode` after one more reduction step ("windowed", "aggregated")."""
    if mode == "detailed":
        return step
    return mode if step in mode.split("+") else f"{mode}+{step}"


# ------------------------------------------------------------------ views


@dataclass
class _Requests:
    """A run's request history: admission episodes and stays in the queue by
    request, and the preemption marks by (request, time)."""

    segs: list[q.Segment]
    waits: list[q.Wait]
    marks: dict[tuple[int, float], q.Mark]
    holds: dict[int, list[float]]  # the times of the decisions that held each request

    @staticmethod
    def of(store: Store, run_id: int) -> _Requests:
        db = store.db
        return _Requests(q.request_segments(db, run_id), q.request_waits(db, run_id),
                         {(m.request_id or 0, m.t): m for m in q.preemptions(db, run_id)},
                         q.request_holds(db, run_id))

    def lanes(self, key: Any) -> dict[Any, tuple[list[q.Segment], list[q.Wait]]]:
        """Segments and waits by lane (`key` of a segment or wait; None: none)."""
        out: dict[Any, tuple[list[q.Segment], list[q.Wait]]] = defaultdict(lambda: ([], []))
        for s in self.segs:
            if key(s) is not None:
                out[key(s)][0].append(s)
        for w in self.waits:
            if key(w) is not None:
                out[key(w)][1].append(w)
        return out

    def draw(self, segs: list[q.Segment], waits: list[q.Wait], top: float, band: float,
             colour: Any, group: Any = lambda s: "") -> tuple[list[_Bar], list[_Mark]]:
        """One lane's requests, each in a row of its own from ready to its end:
        queued (ready → admitted), then its admission episodes; marks where it
        was preempted (naming the decision) or retracted."""
        lives: dict[int, list[float]] = {}
        for start, end, rid in [(w.start, w.end, w.request_id) for w in waits] + [
                (s.admitted, s.end, s.request_id) for s in segs]:
            life = lives.setdefault(rid, [start, end])
            life[0], life[1] = min(life[0], start), max(life[1], end)
        order = sorted(lives, key=lambda r: (lives[r][0], r))
        rows, n = _slots([(lives[r][0], lives[r][1]) for r in order])
        h = band / n
        y_of = {rid: top + k * h for rid, k in zip(order, rows, strict=True)}
        bars = [_Bar("queued", y_of[w.request_id], h * 0.9, w.start, w.end,
                     _wait_hover(w, self.holds.get(w.request_id, ())))
                for w in waits if w.end > w.start or w.end_kind == "open"]
        marks: list[_Mark] = []
        for s in segs:
            y = y_of[s.request_id]
            bars.extend(_segment_bars(s, y, h * 0.9, colour(s), group(s)))
            if s.end_kind in ("preempt", "retract"):
                mark = self.marks.get((s.request_id, s.end))
                marks.append(_Mark(s.end_kind, y + h * 0.45, s.end, _seg_hover(s, mark),
                                   None if mark is None else mark.decision))
        return bars, marks


def _agents_view(store: Store, run_id: int) -> tuple[list[str], list[_Bar], list[_Mark],
                                                     list[_Bar]]:
    db = store.db
    agents = q.agents(db, run_id)
    row = {a: i for i, a in enumerate(agents)}
    bars: list[_Bar] = []
    for span in q.prefix_spans(db, run_id):
        if span.agent not in row:
            continue
        top, h = RESIDENT_BAND if span.kind in ("resident", "compute") else TRANSFER_BAND
        what = {"resident": "prefix on GPU", "compute": "prefix recomputed by prefill",
                "load": "prefix load host → GPU", "offload": "prefix backup GPU → host"
                }[span.kind]
        extra = f"<br>{_esc(span.note)}" if span.note else ""
        bars.append(_Bar(span.kind, row[span.agent] + top, h, span.start, span.end,
                         f"<b>{_esc(span.agent)}</b>: {what}<br>{_span(span.start, span.end)}"
                         f"<br>{span.tokens} tokens{extra}"))
    prefix_bars = list(bars)
    reqs = _Requests.of(store, run_id)
    marks: list[_Mark] = []
    by_agent = reqs.lanes(lambda s: s.agent if s.agent in row else None)
    for agent, (segs, waits) in by_agent.items():
        top, band = REQUEST_BAND
        got_bars, got_marks = reqs.draw(segs, waits, row[agent] + top, band, lambda s: TASK_COLOURS[
            (s.task_id or 0) % len(TASK_COLOURS)])
        bars += got_bars
        marks += got_marks
    tools = _tool_bars(db, run_id, lambda c: row.get(c.agent or ""), TRANSFER_BAND)
    agg = prefix_bars + tools + _busy_spans(by_agent, row)
    return [_esc(a) for a in agents], bars + tools, marks, agg


def _tool_bars(db: Any, run_id: int, lane: Any, band: tuple[float, float]) -> list[_Bar]:
    """Tool calls (`store.queries.tool_calls`) as bars in `band` of the lane
    `lane(call)` gives (None: not shown)."""
    out = []
    for c in q.tool_calls(db, run_id):
        y = lane(c)
        if y is not None:
            out.append(_Bar("tool", y + band[0], band[1], c.start, c.end,
                            f"<b>tool call</b> after request {c.request_id} ({_esc(c.note)})"
                            f"<br>task {c.task_id}, stage {_esc(c.stage)}, agent "
                            f"{_esc(c.agent)}<br>{_span(c.start, c.end)}"))
    return out


def _tasks_view(store: Store, run_id: int) -> tuple[list[str], list[_Bar], list[_Mark],
                                                    list[_Bar]]:
    db = store.db
    tasks = q.tasks(db, run_id)
    row = {t.task_id: i for i, t in enumerate(tasks)}
    lanes = [f"task {t.task_id}" for t in tasks]
    _, t_end = q.time_span(db, run_id)
    reqs = _Requests.of(store, run_id)
    by_task = reqs.lanes(lambda s: s.task_id if s.task_id in row else None)
    bars: list[_Bar] = []
    for t in tasks:
        end = t.completion if t.completion is not None else t_end
        start = t.arrival if t.arrival is not None else end
        jct = f"JCT {end - start:.2f} s" if t.completion is not None else "unfinished"
        queued = sum(w.end - w.start for w in by_task.get(t.task_id, ([], []))[1])
        bars.append(_Bar("task", row[t.task_id] + TASK_BAND[0], TASK_BAND[1], start, end,
                         f"<b>task {t.task_id}</b> ({_esc(t.workflow or '?')})<br>"
                         f"{_span(start, end)}<br>{jct}<br>its requests queued "
                         f"{queued:.2f} s in all"))
    task_bars = list(bars)
    agents = sorted({s.agent or "" for s in reqs.segs if s.task_id in row})
    colour = {a: AGENT_COLOURS[i % len(AGENT_COLOURS)] for i, a in enumerate(agents)}
    marks: list[_Mark] = []
    for task_id, (segs, waits) in by_task.items():
        top, band = TASK_REQUEST_BAND
        got_bars, got_marks = reqs.draw(segs, waits, row[task_id] + top, band,
                                        lambda s: colour[s.agent or ""],
                                        lambda s: f"agent {_esc(s.agent)}")
        bars += got_bars
        marks += got_marks
    agg = [_Bar("task", b.y, TASK_BAND[1] + TASK_REQUEST_BAND[1], b.start, b.end, b.hover)
           for b in task_bars]
    tools = _tool_bars(db, run_id, lambda c: row.get(c.task_id), (TASK_BAND[0] + 0.04, 0.08))
    return lanes, bars + tools, marks, agg + tools


def _lanes_used(lanes: list[str], bars: list[_Bar], marks: list[_Mark], agg: list[_Bar]
                ) -> tuple[list[str], tuple[list[_Bar], list[_Mark], list[_Bar]]]:
    """The lanes that hold a bar or mark, renumbered from the top (tasks view)."""
    used = sorted({int(b.y) for b in bars} | {int(m.y) for m in marks} | {int(b.y) for b in agg})
    new = {old: i for i, old in enumerate(used)}

    def move(y: float) -> float:
        return new[int(y)] + (y - int(y))

    return [lanes[i] for i in used], ([replace(b, y=move(b.y)) for b in bars],
                                      [replace(m, y=move(m.y)) for m in marks],
                                      [replace(b, y=move(b.y)) for b in agg])


def _segment_bars(s: q.Segment, y: float, h: float, colour: str,
                  group: str = "") -> list[_Bar]:
    hover = _seg_hover(s)
    out: list[_Bar] = []
    start = s.started if s.started is not None else s.end
    if start > s.admitted:
        out.append(_Bar("waiting", y, h, s.admitted, start, hover))
    if s.started is not None:
        service_from = s.started
        if s.prefill_end is not None and s.prefill_end > s.started:
            out.append(_Bar("prefill", y, h, s.started, s.prefill_end, hover, colour))
            service_from = s.prefill_end
        if s.end > service_from or not out:
            out.append(_Bar("service", y, h, service_from, s.end, hover, colour, group,
                            f"T{s.task_id}.{_esc(s.stage)}"))
    return out


def _seg_hover(s: q.Segment, mark: q.Mark | None = None) -> str:
    lines = [f"<b>request {s.request_id}</b> (admission {s.attempt})",
             f"task {s.task_id}, stage {_esc(s.stage)}, agent {_esc(s.agent)}",
             f"admitted {s.admitted:.3f} s"]
    if s.started is not None:
        lines.append(f"started {s.started:.3f} s")
    if s.prefill_end is not None:
        lines.append(f"prefill end {s.prefill_end:.3f} s")
    ends = {"finish": "finished", "preempt": "preempted", "retract": "retracted by the engine "
            "(out of KV)", "withdraw": "withdrawn (its client went away)",
            "open": "still running at the end of the log"}
    lines.append(f"{ends.get(s.end_kind, s.end_kind)} {s.end:.3f} s")
    if mark is not None and mark.decision is not None:
        lines.append(f"by decision #{mark.decision}" + (
            f": chosen total {mark.chosen_total:.3f} vs best rejected "
            f"{mark.best_rejected_total:.3f} (the highest total wins)"
            if mark.chosen_total is not None and mark.best_rejected_total is not None else ""))
    return "<br>".join(lines)


def _wait_hover(w: q.Wait, holds: Sequence[float]) -> str:
    """A stay in the queue, and how many decisions in it held the request out
    of W_t (`holds`: their times, ascending)."""
    since = {"ready": "ready", "preempt": "preempted", "retract": "retracted"}[w.after]
    until = {"admit": "admitted", "withdraw": "withdrawn (its client went away)",
             "open": "still waiting at the end of the log"}.get(w.end_kind, w.end_kind)
    held = bisect_right(holds, w.end) - bisect_left(holds, w.start)
    why = (f"<br>held out of the queue by {held} decision{'s' if held != 1 else ''} "
           "(phases / tandem / lot_size: its agent's turn had not come, its task was "
           "new at the end of its agent's phase, or a task one stage behind ran first "
           "to follow it)") if held else ""
    return (f"<b>request {w.request_id}</b> queued {w.end - w.start:.3f} s<br>"
            f"task {w.task_id}, stage {_esc(w.stage)}, agent {_esc(w.agent)}<br>"
            f"{since} {w.start:.3f} s → {until} {w.end:.3f} s{why}")


def _slots(spans: Sequence[tuple[float, float]]) -> tuple[list[int], int]:
    """Rows for overlapping (start, end) spans, sorted by start: lowest free row first."""
    free: list[int] = []
    busy: list[tuple[float, int]] = []
    out: list[int] = []
    n = 0
    for start, end in spans:
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        k = heapq.heappop(free) if free else n
        n = max(n, k + 1)
        heapq.heappush(busy, (end, k))
        out.append(k)
    return out, max(n, 1)


def _busy_spans(by_agent: dict[str, tuple[list[q.Segment], list[q.Wait]]],
                row: dict[str, int]) -> list[_Bar]:
    """Each agent's requests merged: spans where at least one waited in the queue
    (the band's top third) and where at least one was admitted (below)."""
    out: list[_Bar] = []
    top, band = REQUEST_BAND
    for agent, (segs, waits) in by_agent.items():
        for kind, spans, y, h in (
                ("queued_busy", [(w.start, w.end) for w in waits if w.end > w.start], top,
                 band / 3),
                ("busy", [(s.admitted, s.end) for s in segs], top + band / 3, band * 2 / 3)):
            for start, end, n in _merge(spans):
                what = "waited in the queue" if kind == "queued_busy" else "admitted"
                out.append(_Bar(kind, row[agent] + y, h * 0.95, start, end,
                                f"<b>{_esc(agent)}</b>: {n} request(s) {what}<br>"
                                f"{_span(start, end)}"))
    return out


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float, int]]:
    """Overlapping spans merged: (start, end, how many)."""
    out: list[list[Any]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
            out[-1][2] += 1
        else:
            out.append([start, end, 1])
    return [(a, b, n) for a, b, n in out]


def _clip(bars: list[_Bar], window: tuple[float, float]) -> list[_Bar]:
    t0, t1 = window
    return [_Bar(b.kind, b.y, b.h, max(b.start, t0), min(b.end, t1), b.hover, b.colour,
                 b.group, b.label) for b in bars if b.end > t0 and b.start < t1]


def _first_window(bars: list[_Bar], marks: list[_Mark], max_items: int,
                  span: tuple[float, float],
                  ) -> tuple[list[_Bar], list[_Mark], tuple[float, float],
                             tuple[int, int, float]]:
    """The first `max_items` bars and marks (by start) and the window from
    `span[0]` holding them.

    The window ends where the next bar or mark starts, so it holds just these;
    when some tie at the last start taken, it ends at the next later start and
    the tied ones past the cap are left out (the last value: how many bars,
    how many marks, and their start)."""
    items = sorted([(b.start, b.y, b.end, 0, i) for i, b in enumerate(bars)]
                   + [(m.t, m.y, m.t, 1, i) for i, m in enumerate(marks)])
    chosen, rest = items[:max_items], items[max_items:]
    t0 = span[0]
    last = chosen[-1][0] if chosen else t0
    later = [it[0] for it in rest if it[0] > last]
    t1 = later[0] if later else max([span[1], *(it[2] for it in chosen)])
    if t1 <= t0:  # every bar is a point at t0: any width will do
        t1 = t0 + 1.0
    tied = [it[3] for it in rest if it[0] <= last]
    taken = {(it[3], it[4]) for it in chosen}
    kept_bars = [b for i, b in enumerate(bars) if (0, i) in taken]
    kept_marks = [m for i, m in enumerate(marks) if (1, i) in taken]
    return (_clip(kept_bars, (t0, t1)), kept_marks, (t0, t1),
            (tied.count(0), tied.count(1), last))


def _window_note(win: tuple[float, float], span: tuple[float, float],
                 left_out: tuple[int, int, float]) -> str:
    """The title note of an automatic window (`left_out`: bars, marks left out
    at the start where the cap fell)."""
    note = (f"still too many bars: showing {win[0]:g}–{win[1]:g} s of "
            f"{span[0]:g}–{span[1]:g} s (choose another with --window START:END)")
    bars, marks, tie = left_out
    if bars or marks:
        note += (f"; {_things(bars, marks, 'more ')} starting at {tie:g} s not drawn "
                 "(--max-bars)")
    return note


def _first_lanes(bars: list[_Bar], marks: list[_Mark], cap: int, win: tuple[float, float],
                 ) -> tuple[tuple[float, float], set[int]]:
    """The first `cap` lanes by their first bar or mark, and the window from
    `win[0]` that ends where the next lane starts (`win` if none starts later:
    lanes tied at the cut past the cap are left out)."""
    first: dict[int, float] = {}
    for lane, t in [(int(b.y), b.start) for b in bars] + [(int(m.y), m.t) for m in marks]:
        first[lane] = min(t, first.get(lane, t))
    order = sorted(first, key=lambda i: (first[i], i))
    chosen = order[:cap]
    later = [first[i] for i in order[cap:] if chosen and first[i] > first[chosen[-1]]]
    return (win[0], later[0] if later else win[1]), set(chosen)


def _in_lanes(items: list[_Item], lanes: set[int]) -> list[_Item]:
    """The bars or marks in `lanes`."""
    return [x for x in items if int(x.y) in lanes]


def _marks_in(marks: list[_Mark], win: tuple[float, float]) -> list[_Mark]:
    """The marks inside `win`, from its start up to (not at) its end."""
    return [m for m in marks if win[0] <= m.t < win[1]]


def _count(n: int, word: str) -> str:
    """ "1 lane", "2 lanes"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _things(bars: int, marks: int, more: str = "") -> str:
    """ "5 bars", "5 bars and 1 mark", "1 more mark" (`more`: "more ")."""
    parts = [_count(n, more + word) for n, word in ((bars, "bar"), (marks, "mark")) if n]
    return " and ".join(parts) or _count(0, more + "bar")


def _output_file(out_html: str | Path, what: str = "HTML", flag: str = "-o",
                 example: str = "gantt.html") -> Path:
    """The file to write; a folder (existing, or a name ending in a slash), a
    missing folder or one this process cannot write to is refused."""
    text = str(out_html)
    out = Path(out_html)
    if out.is_dir() or text.endswith(("/", os.sep)):
        named = Path(text.rstrip("/" + os.sep) or ".") / example
        raise GanttError(f"{text}: is a folder, not a file; name the {what} file, "
                         f"e.g. {flag} {named}")
    if not out.parent.is_dir():
        raise GanttError(f"{out}: the folder {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise GanttError(f"{out}: the folder {out.parent} is not writable; give another {flag}")
    return out


def png_file(png: str | Path) -> Path:
    """The PNG file `--png` names, checked as the HTML output is."""
    return _output_file(png, "PNG", "--png", "gantt.png")


def _esc(text: object) -> str:
    """A name from the log as text in Plotly's pseudo-HTML (`<i>B</i>` stays literal)."""
    return html.escape(str(text), quote=False)


def _span(start: float, end: float) -> str:
    return f"{start:.3f} → {end:.3f} s ({end - start:.3f} s)"


# ----------------------------------------------------------------- figure


def _figure(run: q.RunRow, view: str, lanes: list[str], bars: list[_Bar], marks: list[_Mark],
            window: tuple[float, float], notes: list[str]) -> go.Figure:
    fig = go.Figure()
    by_kind: dict[str, list[_Bar]] = defaultdict(list)
    for b in bars:
        by_kind[b.kind].append(b)
    for kind, (name, colour, pattern) in STYLE.items():
        groups: dict[str, list[_Bar]] = defaultdict(list)
        for b in by_kind.get(kind, ()):
            groups[b.group].append(b)
        for group_name, group in sorted(groups.items()):
            trace = _bar_trace(kind, group_name or name, group, colour, pattern)
            if kind == "service" and len(bars) <= LABEL_BARS:
                trace.update(text=[b.label for b in group], textposition="inside",
                             insidetextanchor="middle", textfont={"color": "white"})
            fig.add_trace(trace)
    for kind, symbol, colour, name in (("preempt", "x", "#d62728", "preempted (policy: #decision)"),
                                       ("retract", "triangle-down", "#ff7f0e",
                                        "retracted (engine)")):
        group_m = [m for m in marks if m.kind == kind]
        if group_m:
            labelled = kind == "preempt" and len(bars) + len(marks) <= LABEL_BARS
            fig.add_trace(go.Scatter(
                name=name, mode="markers+text" if labelled else "markers",
                x=[m.t for m in group_m], y=[m.y for m in group_m],
                text=[f"#{m.decision}" if m.decision is not None else "" for m in group_m],
                textposition="middle right", textfont={"color": colour, "size": 10},
                marker={"symbol": symbol, "color": colour, "size": 10,
                        "line": {"width": 1, "color": "#333333"}},
                hovertext=[m.hover for m in group_m], hoverinfo="text", meta=kind,
            ))
    n = max(len(lanes), 1)
    lane_px = 90 if view == "agents" else 28
    title = (f"{_esc(run.label)}: {_esc(run.workload or 'trace')}, "
             f"profile {_esc(run.profile or '?')}, {view} view")
    if run.summary and "mean_jct_s" in run.summary:
        title += f", mean JCT {run.summary['mean_jct_s']:.3g} s"
        if run.summary.get("tasks_unfinished"):  # a daemon stopped with tasks in flight
            title += (f" over {run.summary['tasks']} finished tasks "
                      f"({run.summary['tasks_unfinished']} unfinished)")
    title += "".join(f"<br><sup>{note}</sup>" for note in notes)  # one line each
    legend_rows = math.ceil(len(fig.data) / LEGEND_PER_ROW)
    bottom = 60 + 22 * legend_rows  # the legend sits under the time axis, clear of the title
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        barmode="overlay", bargap=0, template="plotly_white",
        height=min(120 + bottom + 18 * len(notes) + n * lane_px, 4000), hovermode="closest",
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        margin={"l": 90, "r": 20, "t": 70 + 18 * len(notes), "b": bottom},
        uniformtext={"minsize": 9, "mode": "hide"},  # no label shrunk past reading
        xaxis={"title": {"text": "time (s)"}, "range": list(window), "zeroline": False,
               "showgrid": True},
        yaxis={"range": [n, 0], "tickmode": "array",
               "tickvals": [i + 0.5 for i in range(len(lanes))], "ticktext": lanes,
               "showgrid": False, "zeroline": False, "fixedrange": False},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": i, "y1": i,
                 "line": {"color": "#dddddd", "width": 1}} for i in range(1, len(lanes))],
    )
    return fig


def _bar_trace(kind: str, name: str, group: list[_Bar], colour: str | None,
               pattern: str) -> go.Bar:
    marker: dict[str, Any] = {
        "color": [b.colour or "#888888" for b in group] if colour is None else colour,
        "line": {"width": 0},
    }
    if pattern:
        marker["pattern"] = {"shape": pattern, "fillmode": "overlay", "size": 6,
                             "solidity": 0.3, "fgcolor": "#555555"}
    return go.Bar(
        name=name, orientation="h", base=[b.start for b in group],
        x=[max(b.end - b.start, 0.0) for b in group], y=[b.y + b.h / 2 for b in group],
        width=[b.h for b in group], marker=marker, hovertext=[b.hover for b in group],
        hoverinfo="text", meta=kind,
    )


# ---------------------------------------------------------------- browser


def find_chromium() -> str | None:
    """A headless-capable Chromium on PATH (Debian's `chromium` first)."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium(args: list[str], chromium: str | None, timeout: float) -> str:
    exe = chromium or find_chromium()
    if exe is None:
        raise GanttError("no Chromium found; install Debian's `chromium` package "
                         "(apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="topasd-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise GanttError(f"chromium did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise GanttError(f"chromium failed (status {done.returncode}): "
                         f"{err[-1] if err else 'no message'}")
    return done.stdout.decode(errors="replace")


def dump_dom(html: str | Path, *, chromium: str | None = None, timeout: float = 120.0,
             offline: bool = False) -> str:
    """The page's DOM after its scripts ran (headless Chromium `--dump-dom`):
    a file, or an http(s) URL; `offline`: no host but 127.0.0.1 resolves."""
    text = str(html)
    url = text if text.startswith(("http://", "https://")) else Path(html).resolve().as_uri()
    rules = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"] if offline else []
    return _chromium([*rules, "--virtual-time-budget=10000", "--dump-dom", url], chromium,
                     timeout)


def screenshot(html: str | Path, png: str | Path, *, width: int = 1400, height: int = 800,
               chromium: str | None = None, timeout: float = 120.0) -> Path:
    """A PNG screenshot of the page (headless Chromium `--screenshot`)."""
    out = Path(png).resolve()
    url = Path(html).resolve().as_uri()
    _chromium(["--virtual-time-budget=10000", f"--window-size={width},{height}",
               f"--screenshot={out}", url], chromium, timeout)
    if not out.is_file() or out.stat().st_size == 0:
        raise GanttError(f"chromium wrote no screenshot to {out}")
    return out


def figure_height(gantt: Gantt) -> int:
    """The chart's pixel height (for a screenshot that shows all of it)."""
    return int(gantt.figure.layout.height or 600)

