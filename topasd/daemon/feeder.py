"""The built-in driver (`--workload NAME --rate R`): Poisson task arrivals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from topasd.model import TopasError, Workflow
from workflows.builtin import Workload
from workflows.trace import TaskRecord, sample_task, trace_tasks


class Feeder:
    """Poisson arrivals of a workload's tasks (virtual time). With a task limit
    it plays exactly the trace `topasd trace gen` writes for the same workload,
    rate, seed and count (`trace_tasks`), so `topasd replay` can rerun the
    daemon's work; unbounded, it draws each task, then the gap to the next,
    from the seed."""

    def __init__(self, workload: Workload, rate: float, limit: int | None, seed: int) -> None:
        self.workload = workload
        self.rate = rate
        self.limit = limit
        self.generated = 0
        self.rng = np.random.default_rng(seed)
        self._trace = (None if limit is None
                       else trace_tasks(workload.workflows, rate, limit, seed))
        self._next: TaskRecord | None = None if self._trace is None else next(self._trace)
        self.next_arrival: float | None = 0.0 if self._next is None else self._next.arrival

    def pop(self, task_id: int, workflows: Mapping[str, Workflow]) -> TaskRecord:
        """The task arriving at `next_arrival` (with the daemon's `task_id`);
        schedules the next one."""
        assert self.next_arrival is not None
        self.generated += 1
        if self._trace is not None:
            assert self._next is not None
            record, self._next = self._next, next(self._trace, None)
            self.next_arrival = None if self._next is None else self._next.arrival
            return replace(record, id=task_id)
        wf = self.workload.workflows[(self.generated - 1) % len(self.workload.workflows)]
        record = sample_task(workflows[wf.name], task_id, self.next_arrival, self.rng)
        self.next_arrival += float(self.rng.exponential(1.0 / self.rate))
        return record

    def as_dict(self) -> dict[str, object]:
        """The driver as `/v1/state` shows it."""
        return {"workload": self.workload.name, "rate": self.rate,
                "generated": self.generated, "limit": self.limit,
                "next_arrival": self.next_arrival}


def middle_rate(workload: Workload) -> float:
    """The workload's middle operating point (the default `--rate`)."""
    points = workload.operating_points
    if not points:
        raise TopasError(f"workload {workload.name!r} lists no operating points; pass --rate")
    return points[len(points) // 2]
