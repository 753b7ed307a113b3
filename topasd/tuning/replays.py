"""One replay as a pure function of (trace, policy, parameters, profile), and
the trace operations sweeps and tuning need: re-timing to an arrival rate and
splitting by arrival time.

`run_replay` is what every worker (a local process or a Ray task) runs; its
row holds only what the simulation determines, so a replay gives the same
numbers wherever it runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from topasd.model import TopasError
from topasd.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from workflows.trace import TaskRecord, Trace, check_rate, is_number

Row = dict[str, Any]

# a run's summary fields that measure this machine's wall time, not the schedule
WALL_CLOCK_FIELDS = ("decision_mean_ms", "decision_p99_ms", "wall_s")


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One replay: the trace's key in the pool's table, the policy and its
    parameters (field names or the paper's), and the simulator's profile."""

    trace: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()
    profile: str = DEFAULT_PROFILE
    budget: int | None = None

    @staticmethod
    def of(trace: str, policy: str, params: Mapping[str, Any] | None = None,
           profile: str = DEFAULT_PROFILE, budget: int | None = None) -> ReplayJob:
        """A job with `params` as a mapping (kept sorted, so equal jobs compare equal)."""
        return ReplayJob(trace, policy, tuple(sorted((params or {}).items())), profile, budget)

    def hardware(self) -> HardwareProfile:
        """The simulator's profile, with the budget override if any."""
        prof = get_profile(self.profile)
        return prof if self.budget is None else prof.with_overrides(budget_tokens=self.budget)


def run_replay(job: ReplayJob, trace: Trace) -> Row:
    """The replay's summary row (`RunResult.summary` without its wall-clock
    fields): a function of the job and the trace only."""
    from backends.sim.engine import SimBackend
    from topasd.runner import Run
    from topasd.scheduler import build_policy

    backend = SimBackend(job.hardware())
    try:
        result = Run(trace, build_policy(job.policy, dict(job.params)), backend).execute()
    finally:
        backend.close()
    row = {k: v for k, v in result.summary().items() if k not in WALL_CLOCK_FIELDS}
    if job.params:
        row["params"] = dict(job.params)
    return row


def trace_rate(trace: Trace) -> float:
    """The trace's arrival rate, task/s: its header's `rate`, else the tasks
    over the span of their arrivals."""
    rate: Any = trace.meta.get("rate")
    if is_number(rate) and rate > 0:
        return float(rate)
    first, last = trace.tasks[0].arrival, trace.tasks[-1].arrival
    if len(trace.tasks) < 2 or last <= first:
        raise TopasError(f"trace {trace.source or trace.meta.get('workload', '?')}: its tasks "
                         "arrive at one instant and its header gives no rate, so it has no "
                         "arrival rate to re-time")
    return (len(trace.tasks) - 1) / (last - first)


def retime(trace: Trace, rate: float) -> Trace:
    """The trace at `rate` task/s: every gap between arrivals scaled by
    (its rate / `rate`), the first arrival kept; tasks keep their sizes. A
    Poisson trace stays a Poisson trace (a scaled exponential gap is one)."""
    check_rate(rate, len(trace.tasks))
    scale = trace_rate(trace) / rate
    first = trace.tasks[0].arrival
    tasks = tuple(replace(t, arrival=round(first + (t.arrival - first) * scale, 6))
                  for t in trace.tasks)
    return replace(trace, tasks=tasks, meta={**trace.meta, "rate": rate})


def split_by_arrival(trace: Trace, train: float) -> tuple[Trace, Trace]:
    """(the first `train` fraction of the tasks by arrival, the rest): the
    training and held-out parts of a tuning run."""
    if not (math.isfinite(train) and 0 < train < 1):
        raise TopasError(f"--train must be a fraction between 0 and 1 (exclusive), got {train}")
    n = len(trace.tasks)
    cut = round(n * train)
    if cut < 1 or cut >= n:
        raise TopasError(f"--train {train} of {n} task(s) leaves "
                         f"{'no training' if cut < 1 else 'no held-out'} task; the trace needs "
                         "more tasks (two at least, twenty or more to mean something)")
    return _part(trace, trace.tasks[:cut], "train"), _part(trace, trace.tasks[cut:], "held-out")


def _part(trace: Trace, tasks: tuple[TaskRecord, ...], name: str) -> Trace:
    return replace(trace, tasks=tasks, meta={**trace.meta, "part": name, "tasks": len(tasks)})
