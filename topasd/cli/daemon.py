"""`topasd start`, `status` and `stop`: the daemon's command line. `start`'s
flags are the settings (`topasd.config.Settings`), one per field."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from topasd.cli.options import (
    daemon_lookup_options,
    settings_flags,
    settings_options,
    token_file_option,
)
from topasd.config import Settings
from topasd.daemon.runtime import RuntimeFile
from topasd.model import TopasError, pid_alive

DETACHED_ENV = "TOPASD_DETACHED"  # set for the foreground child `start --detach` runs


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file (default: $TOPAS_CONFIG, else ./topasd.toml if present).")
@settings_options
@click.option("--detach", is_flag=True, help="Start in the background and return.")
@click.option("--print-config", is_flag=True, help="Print the merged settings and exit.")
def start(config_path: str | None, detach: bool, print_config: bool, **given: Any) -> None:
    """Run the daemon: the engine, the TOPAS scheduler and the HTTP API.

    Settings: flag > TOPAS_* environment variable > topasd.toml > default.
    Runs in the foreground (logs on stderr) until SIGTERM/SIGINT, which stop
    admitting tasks, let running work finish (--grace), flush the store and
    exit 0.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3
      topasd start --port 0 --speed max --print-config
      topasd start --backend vllm --model-path tiny-model --workload chain3 --rate 2
      topasd start --backend sglang --model-path Qwen/Qwen2.5-7B-Instruct --hicache
    """
    from topasd.config import load_settings, render

    loaded = load_settings(settings_flags(given), config=config_path)
    for warning in loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    if print_config:
        click.echo(render(loaded))
        return
    if detach:
        _detach(loaded.settings)
        return
    from topasd.daemon.process import serve

    _setup_logging(loaded.settings.log_level,
                   None if os.environ.get(DETACHED_ENV) else loaded.settings.log_file)
    code = serve(loaded.settings, on_ready=lambda info: click.echo(
        f"topasd listening on {info['url']} (pid {info['pid']}, runtime file "
        f"{loaded.settings.runtime_file})", nl=True))
    sys.exit(code)


def _setup_logging(level: str, log_file: str | None = None) -> None:
    """Log to stderr, and to `log_file` too when given (a detached daemon's stderr
    already is its log file); the file is opened as `files.open_append` does."""
    from topasd.daemon.files import open_append

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            raw = open_append(log_file, "daemon log")
        except TopasError as exc:
            raise type(exc)(f"{exc}; give another --log-file") from None
        stream = io.TextIOWrapper(raw, line_buffering=True)
        handlers.append(logging.StreamHandler(stream))
    logging.basicConfig(level=level.upper(), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _detach(settings: Settings) -> None:
    """Start this command again without --detach in a new session; wait until it listens."""
    from topasd.daemon.files import open_append

    runtime = RuntimeFile(settings.runtime_file)
    runtime.check_free()
    log_path = Path(settings.log_file or runtime.path.with_suffix(".log"))
    # the same command in the foreground; a token given as a flag goes by the environment,
    # so that the daemon's command line does not show it for its whole life
    args, token = _without_token([a for a in sys.argv[1:] if a != "--detach"])
    env = {**os.environ, DETACHED_ENV: "1", **({"TOPAS_TOKEN": token} if token else {})}
    flag = "--log-file" if settings.log_file else "--runtime-file (the log sits beside it)"
    try:
        log_fh = open_append(log_path, "daemon log")
    except TopasError as exc:
        raise type(exc)(f"{exc}; give another {flag}") from None
    with log_fh:
        proc = subprocess.Popen([sys.executable, "-m", "topasd.cli", *args],
                                stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh,
                                start_new_session=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = runtime.read()
        if info is not None and info.get("pid") == proc.pid:
            click.echo(f"topasd started in the background: {info['url']} (pid {proc.pid}, "
                       f"log {log_path})")
            return
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            raise TopasError(f"the daemon exited with status {proc.returncode}: {tail[0]} "
                             f"(log {log_path})")
        time.sleep(0.05)
    raise TopasError(f"the daemon did not start listening within 60 s (pid {proc.pid}, log "
                     f"{log_path})")


def _without_token(args: list[str]) -> tuple[list[str], str | None]:
    """`args` without `--token T` / `--token=T`, and the token they gave."""
    out: list[str] = []
    token = None
    items = iter(args)
    for arg in items:
        if arg == "--token":
            token = next(items, None)
        elif arg.startswith("--token="):
            token = arg.removeprefix("--token=")
        else:
            out.append(arg)
    return out, token


@click.command()
@daemon_lookup_options()
@token_file_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the daemon's state as JSON ({\"running\": false, ...} and exit "
                   "status 2 when none runs).")
def status(runtime_file: str | None, config_path: str | None, token_file: str | None,
           as_json: bool) -> None:
    """Show whether a daemon runs, where, and what it is doing."""
    from topasd.config import client_token

    runtime = RuntimeFile.configured(runtime_file, config_path)
    info = runtime.read()
    if info is None:
        why = (f"no daemon running (no live runtime file at {runtime}); start one with "
               "`topasd start`")
        if as_json:  # a script gets JSON either way (and the exit status)
            click.echo(json.dumps({"running": False, "daemon": None, "error": why}))
        raise TopasError(why)
    state = _daemon_state(info, client_token(token_file, config=config_path))
    if as_json:
        click.echo(json.dumps({"running": True, "daemon": info, "state": state}, indent=2))
        return
    c = state.get("counts", {})
    backend = info.get("backend", "sim")  # the speed paces the simulator only
    paced = f", speed {state.get('speed')}" if backend == "sim" else f", {backend} backend"
    click.echo(f"topasd {info.get('version', '?')} running: {info['url']} (pid {info['pid']})\n"
               f"  policy {state.get('policy')}, engine t={state.get('t', 0):.1f}s{paced}"
               f"{', draining' if state.get('draining') else ''}\n"
               f"  TOPAS search: {info.get('search', '?')}\n"
               f"  tasks: {c.get('tasks_in_flight', 0)} in flight, {c.get('tasks_finished', 0)} "
               f"finished; requests: {c.get('requests_running', 0)} running, "
               f"{c.get('requests_waiting', 0)} waiting; decisions {c.get('decisions', 0)}\n"
               f"  store: {info.get('db')} (run {info.get('run_id')})")


def _daemon_state(info: dict[str, Any], token: str | None) -> Any:
    """GET /v1/state of the daemon `info` names; TopasError when it fails."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        reply = httpx.get(f"{info['url']}/v1/state", params={"limit": 1}, timeout=10,
                          headers=headers)
        state = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise TopasError(f"daemon pid {info['pid']} at {info['url']} does not answer ({exc})"
                         ) from None
    if reply.status_code != 200:
        message = (state.get("error") or {}).get("message") if isinstance(state, dict) else None
        fix = ("give `topasd status` the daemon's token: --token-file FILE or TOPAS_TOKEN"
               if reply.status_code in (401, 403) else "see its log")
        raise TopasError(f"daemon pid {info['pid']} at {info['url']} answered GET /v1/state "
                         f"with {reply.status_code}: {message or reply.text[:200]}; {fix}")
    return state


@click.command()
@daemon_lookup_options()
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the daemon to exit.")
def stop(runtime_file: str | None, config_path: str | None, timeout: float) -> None:
    """Stop the daemon (SIGTERM: running work finishes within its grace period)."""
    runtime = RuntimeFile.configured(runtime_file, config_path)
    info = runtime.read()
    if info is None:
        raise TopasError(f"no daemon running (no live runtime file at {runtime})")
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    again = runtime.stop_command
    deadline = time.monotonic() + timeout
    told = False
    while time.monotonic() < deadline:
        if exited(pid):  # not just its runtime file gone: the engine may still be closing
            click.echo(f"topasd (pid {pid}) stopped")
            return
        if not told and time.monotonic() > deadline - timeout + 1.0:
            told = True  # still draining after a second: say why this waits
            click.echo(f"topasd (pid {pid}) is letting running work finish (its grace "
                       f"period); `{again}` again stops it now", err=True)
        time.sleep(0.1)
    raise TopasError(f"topasd (pid {pid}) did not exit within {timeout:.0f} s; it is still "
                     f"finishing work (see its log): `{again}` again stops it now and keeps "
                     "its log whole (SIGKILL would lose the last moments of it)")


def exited(pid: int) -> bool:
    """The process is gone, or a zombie waiting for its parent to reap it."""
    if not pid_alive(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


COMMANDS = [start, status, stop]
