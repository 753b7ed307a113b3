"""Does the console keep up with a busy daemon? 500 tasks in flight.

Starts `topasd start` (sim, paced at `--speed`, DAG-4 driver at `--rate`), puts
`--tasks` tasks in flight through `POST /v1/tasks`, then runs the real console
app headless (`run_test`, a `--size` terminal) against it for `--seconds` and
reports:

- the update rate the app sustains: snapshots of `/v1/state` (every task in
  flight, up to 2000) applied to every panel per second, and decisions taken
  from the event stream per second, at the app's default pacing (poll 2 s,
  render tick 1 s, decisions joining the feed every 3 s) and unthrottled
  (poll and render tick 0.02 s: as fast as the app can fetch, parse and
  redraw);
- the console process's CPU share while watching (process CPU time / wall
  time over `--seconds` with no key pressed, once the decision feed is full:
  its steady state; the daemon is another process);
- key latency: the wall time from a key press (`s`, re-sort the tasks table;
  the Key event a terminal's key becomes, posted without Pilot's waits for an
  idle process, which would time the harness) to the table showing the new
  order, p50 / max over `--keys` presses spread over a second window of
  `--seconds`, right after the first; the CPU share
  over that window too (watching plus the presses and their redraws);
- the parameter form: wall time from `p` to the form showing the daemon's
  answer to the `GET /v1/params` it sent, over `--forms` openings.

    python bench/console_load.py [--tasks 500] [--seconds 20] [--json] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _daemon import start_daemon as _start_daemon  # bench/_daemon.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _console_watch import cpu_watching  # noqa: E402  (bench/_console_watch.py)
from textual import events  # noqa: E402
from textual.widgets import Input  # noqa: E402

from bench._results import at_least, update_section  # noqa: E402
from console.app import ConsoleApp  # noqa: E402
from console.screens.params import ParamsScreen  # noqa: E402
from console.sources import Target  # noqa: E402
from console.widgets.decisions import FEED_ROWS, DecisionFeed  # noqa: E402
from console.widgets.tasks import TaskList  # noqa: E402


def start_daemon(workdir: Path, speed: float, rate: float) -> tuple[subprocess.Popen, str]:
    return _start_daemon(workdir, "--speed", str(speed), "--workload", "dag4",
                         "--rate", str(rate), "--grace", "0")


def fill(url: str, tasks: int) -> int:
    """Submit `tasks` DAG-4 tasks; the tasks in flight afterwards."""
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(tasks):
            http.post("/v1/tasks", json={"workflow": "dag4"}).raise_for_status()
        return int(http.get("/v1/state", params={"limit": 1}).json()["counts"]
                   ["tasks_in_flight"])


def press(app: ConsoleApp, key: str) -> None:
    """The key as a terminal sends it (the event Textual's Pilot posts), with
    none of Pilot's waits for an idle process: those sleep 20 ms at a time until
    the process is idle, so they would time the harness and any poll the
    console handles meanwhile, not the key."""
    app.post_message(events.Key(key, key if len(key) == 1 else None))


async def painted(app: ConsoleApp) -> None:
    """Return once the screen has been refreshed after this point (what the
    last change showed is drawn)."""
    done = asyncio.Event()
    app.call_after_refresh(done.set)
    await done.wait()


async def form_fill(pilot: Any, app: ConsoleApp) -> float:
    """Wall ms from the `p` key to the parameter form showing the daemon's answer
    to the `GET /v1/params` the key sent (not the values of an earlier visit),
    drawn."""
    form = next((s for s in app.screen_stack if isinstance(s, ParamsScreen)), None)
    kept = app.is_screen_installed("params")
    before = app.get_screen("params").fills if kept else (form.fills if form else 0)  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    press(app, "p")
    while not (isinstance(app.screen, ParamsScreen) and app.screen.fills > before
               and app.screen.query_one("#param-beta", Input).value):
        await asyncio.sleep(0.001)
    await painted(app)
    ms = (time.perf_counter() - t0) * 1e3
    await pilot.press("escape")
    while app.screen is not app.dashboard:
        await asyncio.sleep(0.01)
    return ms


async def watch(url: str, seconds: float, poll_s: float, render_s: float, keys: int,
                size: tuple[int, int], warm: float = 60.0, forms: int = 5) -> dict[str, Any]:
    """Once the app watches in its steady state: `seconds` with no key pressed
    (the counters and the CPU share while watching), then `seconds` with `keys`
    presses of `s` (their latencies and the CPU share with them), then the
    parameter form's fill times."""
    app = ConsoleApp(Target(url), poll_s=poll_s, render_s=render_s)
    latencies: list[float] = []
    async with app.run_test(size=size) as pilot:
        table = app.dashboard.query_one(TaskList)
        feed = app.dashboard.query_one(DecisionFeed)
        deadline = time.monotonic() + 60
        while table.row_count < 100 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        # watching: once the feed holds its FEED_ROWS (until then it grows, and each
        # growth costs a layout) or after `warm` seconds
        deadline = time.monotonic() + warm
        while feed.row_count < FEED_ROWS and time.monotonic() < deadline:
            await pilot.pause(0.1)
        rows_seen = table.row_count
        share, wall, got = await cpu_watching(app, seconds)  # no key pressed for `seconds`
        tasks_shown = len(app.snapshot.tasks) if app.snapshot else 0
        # then `keys` presses of `s` spread over another `seconds`
        cpu0, wall0 = time.process_time(), time.perf_counter()
        gap = seconds / (keys + 1)
        for _ in range(keys):
            await asyncio.sleep(gap)
            before = table.sort_index
            t0 = time.perf_counter()
            press(app, "s")
            while table.sort_index == before:
                await asyncio.sleep(0.001)
            await painted(app)
            latencies.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(max(0.0, seconds - (time.perf_counter() - wall0)))
        cpu_keys = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        forms = [await form_fill(pilot, app) for _ in range(forms)]
    return {"poll_s": poll_s, "render_s": render_s, "wall_s": wall,
            "states_per_s": got["states"] / wall, "renders_per_s": got["renders"] / wall,
            "decisions_per_s": got["decisions"] / wall, "lag_missed": got["lag"],
            "cpu_share": share, "cpu_share_keys": cpu_keys, "tasks_shown": tasks_shown,
            "rows_seen": rows_seen,
            "key_p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
            "key_max_ms": max(latencies) if latencies else None,
            "form_ms": forms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=at_least(1), default=500, help="tasks submitted up front")
    ap.add_argument("--seconds", type=float, default=20.0, help="each measured window "
                    "(watching; with the key presses) per mode")
    ap.add_argument("--speed", type=float, default=10.0, help="sim clock of the daemon")
    ap.add_argument("--rate", type=float, default=0.2, help="driver arrivals, task/s")
    ap.add_argument("--keys", type=at_least(1), default=10, help="key presses timed in the "
                    "second window")
    ap.add_argument("--size", default="160x48", help="terminal COLSxROWS")
    ap.add_argument("--warm", type=float, default=60.0, help="at most this many seconds for "
                    "the decision feed to fill before the window (steady state)")
    ap.add_argument("--forms", type=at_least(1), default=5, help="parameter form openings "
                    "timed per mode")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    cols, rows = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_daemon(Path(tmp), args.speed, args.rate)
        try:
            in_flight = fill(url, args.tasks)
            t0 = time.perf_counter()
            httpx.get(f"{url}/v1/state", params={"limit": 2000}, timeout=30)
            state_ms = (time.perf_counter() - t0) * 1e3
            modes = [asyncio.run(watch(url, args.seconds, p, r, args.keys, (cols, rows),
                                       args.warm, args.forms))
                     for p, r in ((2.0, 1.0), (0.02, 0.02))]
            after = httpx.get(f"{url}/v1/state", params={"limit": 1}).json()["counts"]
        finally:
            proc.terminate()
            proc.wait(60)
    res = {"tasks_submitted": args.tasks, "in_flight_start": in_flight,
           "in_flight_end": after["tasks_in_flight"], "speed": args.speed,
           "state_fetch_ms": state_ms, "modes": modes, "size": args.size,
           "python": platform.python_version(), "cpus": os.cpu_count(),
           "load_avg": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    text = report(args, res)
    print(text)
    if args.write:
        update_section("console_load", "## Console under load\n\n" + text)


def report(args: argparse.Namespace, res: dict[str, Any]) -> str:
    """The results page's section: one row per pacing, and the command."""
    lines = [
        f"The console (headless, {args.size}) on a daemon with {res['in_flight_start']}–"
        f"{res['in_flight_end']} tasks in flight (DAG-4, sim paced at {args.speed:g}x, "
        f"{args.seconds:g} s watching, then {args.seconds:g} s with {args.keys} presses of "
        f"`s`, per row; one `/v1/state?limit=2000` takes "
        f"{res['state_fetch_ms']:.0f} ms to fetch):",
        "",
        "| pacing (poll / render tick) | snapshots applied/s | decisions/s "
        "| console CPU watching | with the key presses | key → redraw p50 / max "
        "| `p` → form filled p50 / max |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in res["modes"]:
        lines.append(
            f"| {m['poll_s']:g} s / {m['render_s']:g} s | {m['renders_per_s']:.1f} "
            f"(polls {m['states_per_s']:.1f}/s, {m['tasks_shown']} tasks each) "
            f"| {m['decisions_per_s']:.0f} | {m['cpu_share']:.1%} | {m['cpu_share_keys']:.1%} "
            f"| {m['key_p50_ms']:.0f} / {m['key_max_ms']:.0f} ms "
            f"| {np.percentile(m['form_ms'], 50):.0f} / {max(m['form_ms']):.0f} ms |")
    lines += ["", f"`python bench/console_load.py --tasks {args.tasks} --seconds "
              f"{args.seconds:g} --speed {args.speed:g} --rate {args.rate:g} --keys "
              f"{args.keys} --size {args.size} --warm {args.warm:g} --forms {args.forms} "
              f"--write` ({platform.python_version()}, "
              f"{os.cpu_count()} CPUs, load average {res['load_avg']:.1f} at the end, the daemon "
              f"on the same machine)."]
    return "\n".join(lines)

if __name__ == "__main__":
    main()
