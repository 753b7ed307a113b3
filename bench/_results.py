"""Write one benchmark's section of docs/RESULTS.md, keeping the others.

Each bench owns the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`;
a missing section is appended.
"""

from __future__ import annotations

import argparse
import fcntl
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import Pool
from pathlib import Path
from typing import Any, TypeVar

J = TypeVar("J")

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "RESULTS.md"
HEADER = """# Results

Every number on this page comes from a script in `bench/`; each section names
the command that produced it. Rerun the command to refresh the section.
"""


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command a section names: `python bench/<script>` and its arguments
    (`argv`, else the process's), without `--write`."""
    args = argv if argv is not None else sys.argv[1:]
    return " ".join(["python", f"bench/{script}", *(shlex.quote(a) for a in args
                                                   if a != "--write")])


def progress(items: Sequence[J], label: str) -> Iterator[J]:
    """Each item in turn, with `label n/N` on stderr after each; a newline at the end."""
    for n, item in enumerate(items, 1):
        yield item
        print(f"\r{label} {n}/{len(items)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def publish(section: str, heading: str, intro: str, lines: Sequence[str],
            write: bool) -> None:
    """Print a section (`## heading`, its intro, its lines) and, with `write`,
    record it in docs/RESULTS.md."""
    body = "\n".join([f"## {heading}", "", intro, "", *lines])
    print(body)
    if write:
        print(f"wrote {update_section(section, body)}", file=sys.stderr)


def update_section(name: str, body: str, path: Path = RESULTS) -> Path:
    """Replace (or append) the section `name` of the results page with `body`,
    under an exclusive lock on `path`.lock, so benches run side by side keep
    each other's sections."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else HEADER
        text = pattern.sub(lambda _: block, text) if pattern.search(text) else (
            text.rstrip() + "\n\n" + block + "\n")
        path.write_text(text)
    return path


class Enough(Exception):
    """Raised by `TimedPolicy.decide` once `max_decisions` were timed."""


class TimedPolicy:
    """A policy as given, with every decide() timed by `clock` (ms in `times`):
    wrapped, since a compiled policy's methods cannot be replaced. With
    `max_decisions`, raises `Enough` after that many."""

    def __init__(self, policy: Any, clock: Callable[[], float] = time.perf_counter,
                 max_decisions: int | None = None) -> None:
        self.policy, self.clock, self.max_decisions = policy, clock, max_decisions
        self.times: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def decide(self, view: Any) -> Any:
        t0 = self.clock()
        decision = self.policy.decide(view)
        self.times.append((self.clock() - t0) * 1e3)
        if self.max_decisions is not None and len(self.times) >= self.max_decisions:
            raise Enough
        return decision


def trace_parser(doc: str, rate: float, tasks: int) -> argparse.ArgumentParser:
    """A bench's parser with the trace it replays (--workload, --rate, --tasks,
    --seed) and --write; `parse_trace_args` checks the rate."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--workload", default="dag10wide")
    ap.add_argument("--rate", type=float, default=rate, help=f"task/s ({rate:g})")
    ap.add_argument("--tasks", type=at_least(1), default=tasks)
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    return ap


def parse_trace_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    args = ap.parse_args()
    if not args.rate > 0:
        ap.error("--rate: use a positive number of task/s")
    return args


def at_least(lo: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= `lo` (counts >= 1, seeds >= 0), so a
    bad value is one usage line instead of a traceback or an empty table."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{value} is below {lo}")
        return value

    parse.__name__ = f"integer >= {lo}"
    return parse


def run_all(run: Callable[[J], dict[str, Any]], jobs: Sequence[J],
            workers: int) -> list[dict[str, Any]]:
    """Every job's row, run in a pool of `workers` processes (finish order),
    with a "done/total runs" line on stderr."""
    rows = []
    with Pool(workers) as pool:
        for i, row in enumerate(pool.imap_unordered(run, jobs), start=1):
            rows.append(row)
            print(f"\r{i}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows
