"""Admission control: the daemon takes a new task only while it is below its
bounds on tasks in flight (`max_tasks`) and on waiting requests
(`max_waiting`); beyond them a new task is refused with 429 and a
Retry-After from the rate at which work finishes. Calls of tasks already in
flight are always taken, so that admitted work can finish."""

from __future__ import annotations

import math
from dataclasses import dataclass

from topasd.daemon.errors import Busy

MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True, slots=True)
class Load:
    """What admission looks at: the work in the engine, and how fast it finishes."""

    tasks_in_flight: int
    requests_waiting: int
    tasks_finished: int
    requests_finished: int
    uptime_s: float  # wall seconds the engine has run


def retry_after(excess: int, finished: int, uptime_s: float) -> int:
    """Whole seconds until `excess` more items have likely finished at the rate
    `finished / uptime_s` (1 at least, MAX_RETRY_AFTER_S at most)."""
    if finished <= 0 or uptime_s <= 0:
        return 1
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(excess * uptime_s / finished)))


def refusal(load: Load, max_tasks: int, max_waiting: int) -> Busy | None:
    """Busy when a new task would exceed a bound (0: no bound), else None."""
    if max_tasks and load.tasks_in_flight >= max_tasks:
        excess = load.tasks_in_flight - max_tasks + 1
        wait = retry_after(excess, load.tasks_finished, load.uptime_s)
        what = f"{load.tasks_in_flight} tasks in flight (max_tasks {max_tasks})"
    elif max_waiting and load.requests_waiting >= max_waiting:
        excess = load.requests_waiting - max_waiting + 1
        wait = retry_after(excess, load.requests_finished, load.uptime_s)
        what = f"{load.requests_waiting} requests waiting (max_waiting {max_waiting})"
    else:
        return None
    return Busy(f"the daemon is at capacity: {what}; retry after {wait} s (calls of tasks "
                "in flight are still taken)", wait)
