"""Side-by-side console CPU: this tree's console and another tree's (a scratch
copy of an earlier commit) watching the same busy daemon in the same window.

Each pair: a fresh `topasd start` daemon (sim paced at `--speed`, DAG-4 driver
at `--rate`) with `--tasks` tasks in flight; two console processes
(`bench/_console_watch.py`, one with PYTHONPATH=BASE, one with this tree; the
order of their start alternates) each watch it headless at the default pacing,
and once `--warm` seconds have passed (their decision feeds full) both measure
their process's CPU time over the same `--seconds` window, with no key pressed.
The machine's load is shared by both, so the pair's difference is the number to
read; prints one line per pair and the means.

    python bench/console_pairs.py --base /tmp/base [--pairs 5] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _daemon import start_daemon  # bench/_daemon.py
from console_load import fill  # bench/console_load.py

ROOT = Path(__file__).resolve().parent.parent
WATCH = Path(__file__).resolve().parent / "_console_watch.py"


def pair(base: Path, args: argparse.Namespace, flip: bool) -> tuple[dict, dict, float]:
    """(base's result, this tree's result, load average) of one pair."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_daemon(Path(tmp), "--speed", str(args.speed), "--workload", "dag4",
                                 "--rate", str(args.rate), "--grace", "0")
        try:
            fill(url, args.tasks)
            at = time.time() + args.warm
            trees = [base, ROOT][::-1] if flip else [base, ROOT]
            kids = {tree: subprocess.Popen(
                [sys.executable, str(WATCH), url, str(at), str(args.seconds), args.size],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE)
                for tree in trees}
            out = {tree: json.loads(k.communicate(timeout=args.warm + args.seconds + 120)[0])
                   for tree, k in kids.items()}
            load = os.getloadavg()[0]
        finally:
            proc.terminate()
            proc.wait(60)
    return out[base], out[ROOT], load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree's root")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window")
    ap.add_argument("--warm", type=float, default=60.0, help="seconds before the window")
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--size", default="160x48")
    args = ap.parse_args()
    before, after = [], []
    for i in range(args.pairs):
        b, a, load = pair(args.base.resolve(), args, flip=bool(i % 2))
        before.append(b["cpu_share"])
        after.append(a["cpu_share"])
        print(f"pair {i + 1}: base {b['cpu_share']:.2%} this {a['cpu_share']:.2%} "
              f"(diff {a['cpu_share'] - b['cpu_share']:+.2%}; load {load:.2f}; feeds full "
              f"{b['feed_full']}/{a['feed_full']}; renders {b['renders']}/{a['renders']})",
              flush=True)
    print(f"mean: base {statistics.mean(before):.2%} this {statistics.mean(after):.2%} "
          f"(diff {statistics.mean(after) - statistics.mean(before):+.2%})")


if __name__ == "__main__":
    main()
