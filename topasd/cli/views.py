"""`topasd console` and `topasd gantt`: the readers of a daemon or a store file."""

from __future__ import annotations

import math

import click

from topasd.cli.options import daemon_lookup_options, token_file_option
from topasd.model import TopasError


@click.command("console")
@click.option("--url", default=None, metavar="URL",
              help="The daemon's address (default: found through its runtime file).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help="Replay a recorded run of this decision log instead of watching a daemon.")
@click.option("--run", "run_id", type=int, default=None,
              help="With --db: the run to replay (default: the latest).")
@click.option("--at", "at", type=float, default=None,
              help="With --db: start the time cursor here, in seconds (default: the start).")
@daemon_lookup_options()
@click.option("--token", default=None, envvar="TOPAS_TOKEN", show_envvar=True,
              help="Bearer token of a daemon that needs one (on the command line other "
                   "users see it in `ps`: prefer TOPAS_TOKEN or --token-file).")
@token_file_option
@click.option("--keymap", type=click.Path(dir_okay=False), default=None,
              help="TOML file rebinding keys by binding id (see the help screen, `?`).")
@click.option("--poll", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between state polls of a live daemon.")
def console_cmd(url: str | None, db_path: str | None, run_id: int | None, at: float | None,
                runtime_file: str | None, config_path: str | None, token: str | None,
                token_file: str | None, keymap: str | None, poll: float) -> None:
    """The operator console (TUI): watch and steer the local daemon, or replay a log.

    Panels: KV residency, tasks in flight, the decision feed with every
    candidate's score terms, headline numbers; `p` edits the parameters
    (PATCH /v1/params), `?` lists the keys, ctrl+p opens the command palette.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3 --detach
      topasd console
      topasd console --db topasd.db --run 1
    """
    from console.app import ConsoleApp
    from console.keys import load_keymap
    from console.sources import ReplaySource, find_daemon

    if db_path is not None and url is not None:
        raise TopasError("give --url (a live daemon) or --db (a recorded run), not both")
    if db_path is None and (run_id is not None or at is not None):
        raise TopasError("--run and --at need --db FILE (the decision log to replay)")
    if at is not None and not math.isfinite(at):
        raise TopasError(f"--at {at}: give a finite time in seconds")
    keys = load_keymap(keymap) if keymap else None
    if db_path is not None:
        source = ReplaySource(db_path, run_id)
        ConsoleApp(replay=source, keymap=keys, at=at).run()
        return
    if token is None or token_file is not None:
        from topasd.config import client_token

        token = client_token(token_file, config=config_path)
    target = find_daemon(url, runtime_file, token, config_path)
    ConsoleApp(target, keymap=keys, poll_s=poll).run()


# ----------------------------------------------------------------- gantt


@click.command()
@click.argument("db", type=click.Path(dir_okay=False), required=False)
@click.option("--db", "db_option", type=click.Path(dir_okay=False), default=None,
              help="The decision log DB, as the positional DB (as `topasd console --db`).")
@click.option("--run", "run_id", type=int, default=None,
              help="Run id in DB (default: the latest; `topasd replay --db` prints them).")
@click.option("--view", type=click.Choice(["agents", "tasks"]), default="agents",
              show_default=True, help="One lane per agent, or one lane per task.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True,
              help="The HTML file to write (works offline: plotly.js is embedded).")
@click.option("--window", metavar="START:END", default=None,
              help="Only this time window, in seconds.")
@click.option("--max-bars", type=click.IntRange(min=1), default=None,
              help="Aggregate or window past this many bars and preemption marks "
                   "(default 4000); the tasks view also shows at most 200 task lanes.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Also save a screenshot (needs Debian's chromium).")
def gantt(db: str | None, db_option: str | None, run_id: int | None, view: str, output: str,
          window: str | None, max_bars: int | None, png: str | None) -> None:
    """Export a run of a decision log DB as a Plotly Gantt chart (HTML).

    \b
    Try:
      topasd replay --workload chain3 --policy lpm --tasks 20 --db run.db
      topasd gantt run.db -o gantt.html
    """
    from console.gantt import (
        DEFAULT_MAX_BARS,
        export_gantt,
        figure_height,
        png_file,
        screenshot,
    )

    if db and db_option and db != db_option:
        raise TopasError(f"two decision logs given ({db} and --db {db_option}): give one")
    db = db or db_option
    if not db:
        raise TopasError("give the decision log: `topasd gantt run.db -o gantt.html` (or --db)")
    if png:
        png_file(png)  # a bad path is named before the work, not after it
    g = export_gantt(db, output, run_id=run_id, view=view, window=_window(window),
                     max_bars=max_bars or DEFAULT_MAX_BARS)
    click.echo(g.summary(output), err=True)
    for note in g.notes:
        click.echo(f"  note: {note}", err=True)
    if png:
        screenshot(output, png, height=figure_height(g) + 20)
        click.echo(f"wrote {png}", err=True)


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise TopasError(f"--window: expected START:END in seconds, got {text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise TopasError(f"--window: START and END must be finite numbers of seconds, got "
                         f"{text!r}")
    if not a < b:
        raise TopasError(f"--window: START must be below END, got {text!r}")
    return a, b


COMMANDS = [console_cmd, gantt]
