"""The daemon process: bind, start the engine loop and the HTTP server,
record the runtime file, and on SIGTERM/SIGINT drain and stop cleanly."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from topasd import version
from topasd.api.app import create_app
from topasd.config import Settings
from topasd.daemon.runtime import RuntimeFile
from topasd.daemon.service import Service
from topasd.model import TopasError
from topasd.scheduler import native

log = logging.getLogger("topasd")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port); TopasError naming the fix."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections (with proto
    # 0 it does not, and keep-alive replies stall 40 ms on Nagle + delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise TopasError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                         "--port (0 picks a free one) or --host") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def url(host: str, port: int) -> str:
    """The address clients use: a wildcard bind by its loopback, an IPv6
    literal in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


class _Signals:
    """SIGTERM/SIGINT: the first stops the daemon gracefully (drain), a second
    cuts the grace period short. Installed before the engine starts (vLLM takes
    seconds), so a signal meanwhile stops the daemon cleanly once it is up."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.received: list[int] = []
        self.service: Service | None = None
        self._old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def install(self) -> None:
        for s in self._old:
            signal.signal(s, self._handle)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def attach(self, service: Service) -> None:
        self.service = service
        if len(self.received) > 1:
            service.drain(0.0)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1 and self.service is not None:  # a second signal: stop now
            log.warning("received %s again: the grace period is cut short, running work "
                        "stops now", signal.Signals(signum).name)
            self.service.drain(0.0)
        self.stop.set()


class _WithoutQuery(logging.Filter):
    """uvicorn's access-log lines (debug level) without the query string: a
    client may put a secret there, and the log is no place for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:  # (client, method, path, http, status)
            record.args = (*args[:2], str(args[2]).partition("?")[0], *args[3:])
        return True


WITHOUT_QUERY = _WithoutQuery()


class _HttpServer:
    """uvicorn in a thread over an already bound socket."""

    def __init__(self, service: Service, sock: socket.socket, settings: Settings) -> None:
        logging.getLogger("uvicorn.access").addFilter(WITHOUT_QUERY)
        config = uvicorn.Config(create_app(service), log_config=None, lifespan="off",
                                access_log=settings.log_level == "debug",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="topasd-http", daemon=True)

    def start(self, stop: threading.Event) -> None:
        """Start serving; returns once it listens (or failed, or a stop came)."""
        self.thread.start()
        while not self.server.started and self.thread.is_alive() and not stop.is_set():
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def serve(settings: Settings, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns the exit code.

    On a signal: stop admitting new tasks, let running work finish up to
    `settings.grace` seconds (the HTTP server keeps answering meanwhile), stop
    the server, flush the store, remove the runtime file, return 0.
    """
    runtime = RuntimeFile(settings.runtime_file)
    runtime.check_free()
    signals = _Signals()
    signals.install()
    try:
        sock = bind(settings.host, settings.port)
        try:
            service = Service(settings)
        except BaseException:
            sock.close()
            raise
    except BaseException:
        signals.restore()
        raise
    signals.install()  # again: an engine may have installed its own while starting
    service.start()
    signals.attach(service)
    try:
        code = _run(settings, service, sock, runtime, signals, on_ready)
    finally:
        service.close()
        signals.restore()
        runtime.remove_if_ours()
        with contextlib.suppress(OSError):
            sock.close()
    if service.crash is not None or service.store_problem is not None:
        code = 1
    if service.store_problem is None:
        log.info("topasd stopped (store %s flushed, exit %d)", settings.db, code)
    else:
        log.error("topasd stopped (store %s NOT fully written: %s; exit %d)", settings.db,
                  service.store_problem, code)
    return code


def _run(settings: Settings, service: Service, sock: socket.socket, runtime: RuntimeFile,
         signals: _Signals, on_ready: Callable[[dict[str, Any]], None] | None) -> int:
    """Serve until a signal or a failure, then drain; the exit code."""
    http = _HttpServer(service, sock, settings)
    try:
        http.start(signals.stop)
        info = _record(settings, service, sock.getsockname()[1], runtime)
        if on_ready is not None:
            on_ready(info)
        code = 0
        while not signals.stop.wait(0.2):
            if not http.thread.is_alive() or service.stopped.is_set():
                log.error("the %s stopped unexpectedly; shutting down",
                          "HTTP server" if not http.thread.is_alive() else "engine loop")
                code = 1
                break
        if signals.received:
            log.info("received %s: draining (running work may finish for up to %.0fs; send "
                     "it again, e.g. Ctrl-C, to stop now)",
                     signal.Signals(signals.received[0]).name, settings.grace)
        service.drain()
        service.wait_stopped(settings.grace + 10)
        return code
    finally:
        http.close()


def _record(settings: Settings, service: Service, port: int,
            runtime: RuntimeFile) -> dict[str, Any]:
    """Write the runtime file and log where the daemon listens; the record."""
    address = url(settings.host, port)
    info = {"pid": os.getpid(), "url": address, "host": settings.host, "port": port,
            "db": str(Path(settings.db).resolve()), "run_id": service.run_id,
            "started_ts": service.started_wall, "version": version(),
            "auth": not (settings.loopback and not settings.token),
            "backend": settings.backend, "search": native.status().reason}
    runtime.write(info)
    log.info("topasd %s listening on %s (policy %s, %s backend, profile %s, speed %s, "
             "db %s run %s; TOPAS search: %s)", info["version"], address, settings.policy,
             settings.backend, settings.profile, settings.speed, settings.db,
             service.run_id, native.status().reason)
    return info
