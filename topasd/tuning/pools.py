"""Where replays run: this process, a local process pool (the default, one
worker per core), or Ray tasks on a cluster (`--ray ADDRESS|auto`).

A pool holds a fixed table of traces, shipped to each worker once (Ray: once
to the object store); `run(jobs)` returns one row per job, in job order,
whatever order they finish in. Every job is `replays.run_replay`, so the
rows do not depend on the pool.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType, TracebackType
from typing import Any

from topasd.model import TopasError
from topasd.tuning.replays import ReplayJob, Row, run_replay
from workflows.trace import Trace

Done = Callable[[], None]  # hears of each job that finishes
INSTALL_TUNE = "pip install 'topasd[tune]'"


def require(module: str, what: str) -> ModuleType:
    """`module` imported; TopasError saying how to install it when it is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise TopasError(f"{what} needs {module}, which is not installed: {INSTALL_TUNE}"
                         ) from None


def default_workers() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


class ReplayPool(ABC):
    """Runs `ReplayJob`s against a fixed table of traces."""

    def __init__(self, traces: Mapping[str, Trace]) -> None:
        self.traces = dict(traces)

    @property
    @abstractmethod
    def where(self) -> str:
        """Where the replays run, for the user ("2 local processes")."""

    @abstractmethod
    def run(self, jobs: Sequence[ReplayJob], done: Done | None = None) -> list[Row]:
        """One row per job, in job order; `done()` after each job finishes."""

    def close(self) -> None:  # noqa: B027 (a pool in this process holds nothing)
        """Release the workers."""

    def check(self, jobs: Sequence[ReplayJob]) -> None:
        """TopasError for a job whose trace the pool does not hold."""
        missing = sorted({j.trace for j in jobs} - set(self.traces))
        if missing:
            raise TopasError(f"replay pool: no trace {missing[0]!r}; it holds "
                             f"{sorted(self.traces)}")

    def __enter__(self) -> ReplayPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class InlinePool(ReplayPool):
    """Every replay in this process, one after another (`--workers 1`)."""

    where = "this process"

    def run(self, jobs: Sequence[ReplayJob], done: Done | None = None) -> list[Row]:
        self.check(jobs)
        rows = []
        for job in jobs:
            rows.append(run_replay(job, self.traces[job.trace]))
            if done is not None:
                done()
        return rows


_WORKER_TRACES: dict[str, Trace] = {}  # a pool worker's copy of the table


def _install(traces: Mapping[str, Trace]) -> None:
    _WORKER_TRACES.clear()
    _WORKER_TRACES.update(traces)


def _run_indexed(item: tuple[int, ReplayJob]) -> tuple[int, Row]:
    index, job = item
    return index, run_replay(job, _WORKER_TRACES[job.trace])


class LocalPool(ReplayPool):
    """A pool of `workers` processes on this machine."""

    def __init__(self, traces: Mapping[str, Trace], workers: int) -> None:
        super().__init__(traces)
        self.workers = workers
        self._pool = multiprocessing.get_context("fork").Pool(
            workers, initializer=_install, initargs=(self.traces,))

    @property
    def where(self) -> str:
        return f"{self.workers} local process{'es' if self.workers > 1 else ''}"

    def run(self, jobs: Sequence[ReplayJob], done: Done | None = None) -> list[Row]:
        self.check(jobs)
        rows: list[Row | None] = [None] * len(jobs)
        finished = self._pool.imap_unordered(_run_indexed, enumerate(jobs), chunksize=1)
        for index, row in finished:
            rows[index] = row
            if done is not None:
                done()
        return [r for r in rows if r is not None]

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


def _ray_replay(job: ReplayJob, trace: Trace) -> Row:
    """A Ray task's body: the replay (Ray resolves the trace's object ref)."""
    return run_replay(job, trace)


def _check_answers(address: str, timeout: float = 5.0) -> None:
    """TopasError unless something accepts a connection at `address`'s
    HOST:PORT (`ray://HOST:PORT` too; `auto` is Ray's to find), so that a
    wrong address fails in seconds, not after Ray's minutes of retries."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise TopasError(f"--ray {address}: nothing answers at {host}:{port} "
                         f"({exc.strerror or exc}); is the cluster's head running there "
                         "(`ray status` on it)?") from None


class RayPool(ReplayPool):
    """Ray tasks on the cluster at `address` ("auto": the one this machine is
    part of), or on the Ray instance this process already started. Every node
    needs the same topasd installed."""

    def __init__(self, traces: Mapping[str, Trace], address: str) -> None:
        super().__init__(traces)
        self.ray = require("ray", "--ray")
        self.address = address
        self._owned = not self.ray.is_initialized()
        if self._owned:
            self._connect(address)
        self._refs = {key: self.ray.put(t) for key, t in self.traces.items()}
        self._task = self.ray.remote(num_cpus=1)(_ray_replay)

    def _connect(self, address: str) -> None:
        _check_answers(address)
        try:
            self.ray.init(address=address, logging_level=logging.WARNING,
                          configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise TopasError(f"--ray {address}: cannot reach a Ray cluster ({exc}); start one "
                             "with `ray start --head` and pass its address (or auto)"
                             ) from None

    @property
    def where(self) -> str:
        cpus = int(self.ray.cluster_resources().get("CPU", 0))
        return f"Ray cluster {self.address} ({cpus} CPUs)"

    def run(self, jobs: Sequence[ReplayJob], done: Done | None = None) -> list[Row]:
        self.check(jobs)
        futures = [self._task.remote(job, self._refs[job.trace]) for job in jobs]
        index = {f: i for i, f in enumerate(futures)}
        rows: list[Row | None] = [None] * len(jobs)
        pending = list(futures)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for f in ready:
                rows[index[f]] = self._result(f)
                if done is not None:
                    done()
        return [r for r in rows if r is not None]

    def _result(self, future: Any) -> Row:
        """A task's row; its own error (a TopasError) as raised in the task."""
        try:
            row: Row = self.ray.get(future)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            raise (cause or exc) from None
        return row

    def close(self) -> None:
        if self._owned:
            self.ray.shutdown()


def open_pool(traces: Mapping[str, Trace], workers: int | None = None,
              ray: str | None = None) -> ReplayPool:
    """The pool a command asked for: Ray tasks with `ray`, else `workers`
    local processes (default: one per core; 1: this process)."""
    if ray is not None:
        if workers is not None:
            raise TopasError("--workers sets the local pool; with --ray the cluster's CPUs run "
                             "the replays (drop one of them)")
        return RayPool(traces, ray)
    n = default_workers() if workers is None else workers
    if n < 1:
        raise TopasError(f"--workers must be at least 1, got {n}")
    return InlinePool(traces) if n == 1 else LocalPool(traces, n)
