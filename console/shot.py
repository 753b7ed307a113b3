"""A screenshot of the console on a running daemon (the README's picture).

    topasd start --workload dag4 --rate 0.3 --speed 10 --detach
    python -m console.shot --seconds 20 -o docs/console.png

Runs the app headless at a fixed terminal size, waits `--seconds` for the
panels to fill, saves Textual's SVG screenshot and renders it to PNG with
headless Chromium (`console.gantt.screenshot`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from console.app import ConsoleApp
from console.gantt import screenshot
from console.sources import find_daemon


async def shoot(app: ConsoleApp, seconds: float, size: tuple[int, int], svg: Path,
                keys: list[str]) -> None:
    async with app.run_test(size=size) as pilot:
        await pilot.pause(seconds)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.5)
        app.save_screenshot(svg.name, str(svg.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="the daemon (default: its runtime file)")
    ap.add_argument("--runtime-file", default=None)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", default="160x46", help="terminal COLSxROWS")
    ap.add_argument("--press", action="append", default=[], help="keys to press first")
    ap.add_argument("-o", "--output", required=True, help="PNG (or .svg) to write")
    args = ap.parse_args()
    cols, rows = (int(x) for x in args.size.split("x"))
    out = Path(args.output)
    app = ConsoleApp(find_daemon(args.url, args.runtime_file))
    with tempfile.TemporaryDirectory() as tmp:
        svg = out if out.suffix == ".svg" else Path(tmp) / "console.svg"
        asyncio.run(shoot(app, args.seconds, (cols, rows), svg, args.press))
        if out.suffix != ".svg":
            # the SVG's canvas is about 12.2 x 24.4 px per cell plus the window frame
            screenshot(svg, out, width=int(cols * 12.25) + 40, height=int(rows * 24.45) + 90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
