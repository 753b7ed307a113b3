"""`topasd trace gen`: sample a workload trace (JSON Lines, docs/trace-format.md)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from topasd.cli.options import BUILTIN_NAMES, sampling_options, workload_option

Tick = Callable[[int, int, float], None]
F = Callable[..., Any]


def max_line_bytes_option(what: str) -> Callable[[F], F]:
    """--max-line-bytes: the bound on one line of a file read line by line."""
    from workflows.lines import DEFAULT_MAX_LINE_BYTES

    return click.option(
        "--max-line-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_LINE_BYTES,
        show_default=True, metavar="N",
        help=f"Refuse a {what} line longer than N bytes before reading it whole (the default "
             "is far above any real line; a longer one is a damaged file or not a "
             f"{what}).")


@click.group()
def trace() -> None:
    """Write workload traces (JSON Lines, docs/trace-format.md)."""


@trace.command("gen")
@workload_option(f"A built-in workload ({BUILTIN_NAMES}) or the path of a workflow spec file.",
                 required=True)
@click.option("--rate", "-r", type=float, required=True, help="Poisson arrival rate, task/s.")
@sampling_options("Number of task arrivals.", "Sampling seed.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              required=True, help="Where to write the trace (.jsonl); '-': standard output.")
def trace_gen(workload: str, rate: float, tasks: int, seed: int, output: str) -> None:
    """Sample a trace of TASKS arrivals of a workload at RATE task/s."""
    from workflows.trace import save_trace, write_trace

    with progress(tasks, "sampling", False) as tick:
        tr = generated_trace(workload, rate, tasks, seed,
                             progress=lambda k: tick(k, tasks, math.nan))
    if output == "-":
        write_trace(tr, sys.stdout)
    else:
        save_trace(tr, output)
    n_req = sum(len(r) for t in tr.tasks for r in t.stages.values())
    click.echo(f"wrote {len(tr.tasks)} tasks, {n_req} requests, last arrival at "
               f"{tr.tasks[-1].arrival:.1f}s to {'standard output' if output == '-' else output}",
               err=True)


def generated_trace(workload: str, rate: float, tasks: int, seed: int,
                    progress: Callable[[int], None] | None = None) -> Any:
    """A freshly sampled trace of a built-in workload or a spec file."""
    from workflows.builtin import load_workload
    from workflows.trace import generate_trace

    wl = load_workload(workload)
    try:
        return generate_trace(wl.workflows, rate, tasks, seed, name=wl.name, progress=progress)
    except KeyboardInterrupt:  # Ctrl-C while sampling: nothing ran or was written
        click.echo("\ninterrupted while sampling the trace; nothing was run or written",
                   err=True)
        sys.exit(130)


@contextmanager
def progress(total: int, label: str, hidden: bool) -> Iterator[Tick]:
    """A progress bar on a terminal's stderr: tasks done, and the engine time
    (it moves on when no task finishes); a no-op elsewhere or when `hidden`."""
    if hidden or not sys.stderr.isatty():
        yield lambda done, n, t: None
        return
    bar_cm: Any = click.progressbar(
        length=total, label=label, file=sys.stderr, show_pos=True,
        item_show_func=lambda t: None if t is None or math.isnan(t) else f"engine t={t:,.0f}s")
    with bar_cm as bar:
        shown = [0.0]

        def tick(done: int, n: int, t: float) -> None:
            bar.current_item = t
            if done > bar.pos:
                bar.update(done - bar.pos)
            elif time.monotonic() - shown[0] > 0.5:
                bar.render_progress()
            else:
                return
            shown[0] = time.monotonic()

        yield tick


COMMANDS = [trace]
