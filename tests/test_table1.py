"""Table I of the paper on the default profile (bench/table1.py's checks).

The simulator is deterministic, so the calibration is a behaviour to keep:
Grouped vs Alternating makespans, mean and peak batches against the paper's
values, with SGLang 0.5.3's admission and retraction."""

from __future__ import annotations

import pytest

from backends.sim.engine import SimBackend
from tests.benchkit import load_bench
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import RoundSpec, TaskRecord, Trace


@pytest.mark.parametrize("n", [100, 200])
def test_table1_checks_pass_on_the_default_profile(n: int) -> None:
    t1 = load_bench("table1")
    failed = [text for text, ok in t1.checks([t1.table_row(n, DEFAULT_PROFILE)]) if not ok]
    assert not failed, failed


def test_a_fixed_generation_length_keeps_alternating_in_lockstep() -> None:
    """Why the workload spreads its generation lengths: with one length every
    Alternating batch is admitted together and finishes together, so the peak
    batch never rises above the mean (the paper's peak is well above it)."""
    t1 = load_bench("table1")
    trace = t1.table1_trace(60, False)
    fixed = tuple(TaskRecord(t.id, t.workflow, t.arrival,
                             {v: tuple(RoundSpec(r.input_tokens, 850, r.tool_wait_s)
                                       for r in rounds) for v, rounds in t.stages.items()})
                  for t in trace.tasks)
    runs = {}
    for name, tasks in (("spread", trace.tasks), ("fixed", fixed)):
        summary = Run(Trace(trace.workflows, tasks, trace.meta), make_policy("fcfs"),
                      SimBackend(get_profile(DEFAULT_PROFILE))).execute().summary()
        runs[name] = (summary["peak_batch"], summary["mean_batch"])
    assert runs["fixed"][0] <= runs["fixed"][1] + 0.5
    assert runs["spread"][0] >= runs["spread"][1] + 1.5
    assert load_workload("table1").workflows[0].stages["call"].profile.output_tokens.kind \
        == "uniform_int"
