"""`topasd trace gen` (sample a workload trace) and `topasd trace import`
(a call log into a trace); JSON Lines, docs/trace-format.md."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from topasd.cli.options import BUILTIN_NAMES, sampling_options, workload_option
from topasd.model import TopasError

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
    """Write workload traces (JSON Lines, docs/trace-format.md): sampled from a
    workload (gen) or imported from a call log (import)."""


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


@trace.command("import")
@click.argument("log_file", metavar="LOG_FILE",
                type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["calls"]), default="calls",
              show_default=True,
              help="What LOG_FILE holds. calls: one LLM call per JSON line or CSV row (task, "
                   "call, agent or role, parents or order, prompt_tokens, completion_tokens; "
                   "optionally prefix_tokens, start, end, shared).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              required=True, help="Where to write the trace (.jsonl); '-': standard output.")
@click.option("--rate", "-r", type=float, default=None,
              help="Place the tasks as Poisson arrivals at this rate (task/s) instead of at "
                   "their logged start times; needed when the log has no times.")
@click.option("--seed", "-s", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of --rate's arrivals.")
@click.option("--name", default=None,
              help="Workload name [default: LOG_FILE's name without its suffix]; with "
                   "several task shapes, the workflows are NAME-1, NAME-2, ... (most tasks "
                   "first).")
@max_line_bytes_option("call log")
def trace_import(log_file: str, fmt: str, output: str, rate: float | None, seed: int,
                 name: str | None, max_line_bytes: int) -> None:
    """Turn a call log (LangSmith, OpenTelemetry GenAI spans, ChatDev or MetaGPT
    logs, exported as JSON Lines or CSV) into a trace for `topasd replay`.

    Each task's calls form a graph (their parents, their order, or the file
    order). A chain of one agent's calls becomes one stage of several rounds
    (the tool waits read from the times); calls of one agent with the same
    parents and children become one stage of several branches (a map). Tasks
    of the same shape share a workflow whose sizes are distributions fitted
    over all of them, so a policy estimating from the workflow is not handed
    any task's exact sizes; the task lines keep every call's tokens exactly
    (input = prompt_tokens - the agent's prefix_tokens). The format, with
    examples: docs/trace-format.md, "Importing a call log".

    \b
    Try:
      topasd trace import docs/examples/calls.jsonl -o imported.jsonl
      topasd replay imported.jsonl --policy all
    """
    from workflows.calllog import load_calls
    from workflows.importer import default_name, import_calls
    from workflows.trace import save_trace, write_trace

    if seed and rate is None:
        raise TopasError("--seed only seeds --rate's arrivals; give --rate or drop --seed")
    calls = load_calls(log_file, max_line_bytes)
    imported = import_calls(calls, name or default_name(log_file), log_file, rate, seed)
    if output == "-":
        write_trace(imported.trace, sys.stdout)
    else:
        save_trace(imported.trace, output)
    click.echo(import_summary(imported, len(calls),
                              "standard output" if output == "-" else output), err=True)


def import_summary(imported: Any, n_calls: int, where: str) -> str:
    """What `trace import` made: tasks per workflow, where the trace went, and
    a note on the shared-content hints a trace does not carry yet."""
    from workflows.trace import trace_version

    tr = imported.trace
    shapes = ", ".join(
        f"{wf} ({_count(n, 'task')}, {_count(len(tr.workflows[wf].stages), 'stage')})"
        for wf, n in imported.shapes)
    text = (f"imported {n_calls} calls of {len(tr.tasks)} tasks into "
            f"{_count(len(imported.shapes), 'workflow')}: {shapes}; wrote trace version "
            f"{trace_version(tr)} to {where}")
    if imported.shared_hints:
        text += (f"\nnote: {imported.shared_hints} calls give shared-content hints; they were "
                 "checked, but a trace does not carry shared task context yet, so each call "
                 "holds its own copy")
    return text


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


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
