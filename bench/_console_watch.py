"""One console watching a daemon, for `bench/console_pairs.py`: runs the console
app (the `console` package on PYTHONPATH, so a scratch copy of another commit can
be measured beside this one) headless against URL at its default pacing, waits
until its decision feed is full, then measures the process's CPU over the
window [AT, AT + SECONDS] (epoch seconds) with no key pressed. Prints JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

from console.app import ConsoleApp
from console.sources import Target
from console.widgets.decisions import FEED_ROWS, DecisionFeed


async def cpu_watching(app: ConsoleApp, seconds: float) -> tuple[float, float, Counter[str]]:
    """The console process's CPU share over `seconds` of watching with no key
    pressed, the wall seconds, and the app's counters over them."""
    base = app.counters.copy()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return cpu / wall, wall, app.counters - base


async def watch(url: str, at: float, seconds: float, size: tuple[int, int]) -> dict[str, object]:
    app = ConsoleApp(Target(url))
    async with app.run_test(size=size) as pilot:
        feed = app.dashboard.query_one(DecisionFeed)
        while feed.row_count < FEED_ROWS and time.time() < at:
            await pilot.pause(0.1)
        full = feed.row_count >= FEED_ROWS
        await asyncio.sleep(max(0.0, at - time.time()))
        share, wall, got = await cpu_watching(app, seconds)
        late = time.time() - (at + seconds)
    return {"cpu_share": share, "wall_s": wall, "feed_full": full, "late_s": late,
            "states": got["states"], "renders": got["renders"], "decisions": got["decisions"]}


def main() -> None:
    url, at, seconds, size = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    cols, rows = (int(x) for x in size.split("x"))
    print(json.dumps(asyncio.run(watch(url, at, seconds, (cols, rows)))))


if __name__ == "__main__":
    main()
