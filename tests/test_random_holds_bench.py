"""bench/random_holds.py: with p = 0 a run is TOPAS's own, with p = 1 every
contested decision takes another option, and the table names what it shows."""

from __future__ import annotations

from typing import Any

from backends.sim.engine import SimBackend
from tests.benchkit import load_bench
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.topas import TopasPolicy
from workflows.generator import case_trace, draw_workload

bench = load_bench("random_holds")


def _run(policy: Any) -> dict[str, Any]:
    trace = case_trace(draw_workload("chain", 6), "burst", 20, 0.05, 6)
    run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)))
    if isinstance(policy, bench.RandomPhases):
        policy.run = run
    result = run.execute()
    return {"finishes": result.finishes, **result.summary()}


def test_at_p_zero_a_run_is_topass_own() -> None:
    never = bench.RandomPhases(0.0, 1)
    assert _run(never)["finishes"] == _run(TopasPolicy())["finishes"]
    assert never.forks > 0 and never.changed == 0


def test_at_p_one_every_contested_decision_takes_another_option() -> None:
    always = bench.RandomPhases(1.0, 1)
    row = _run(always)
    assert always.changed == always.forks > 0
    assert len(row["finishes"]) == 20  # every task still finishes
    assert row["finishes"] != _run(TopasPolicy())["finishes"]


def test_the_table_gives_the_best_and_the_median_of_each_p() -> None:
    best = {"cost": 1698.0, "mean_jct_s": 604.0, "p99_jct_s": 1094.0, "changed": 23,
            "contested": 410}
    row = {"case": ("chain", 6, "burst"),
           "topas": {"cost": 1822.0, "mean_jct_s": 630.0, "p99_jct_s": 1192.0},
           "by_p": {0.05: {"best": best, "median": 1799.0}}}
    lines = bench.table([row], [0.05], 20)
    assert lines[0] == ("| case | TOPAS: mean + p99 (mean / p99) | p = 0.05: best of 20 "
                        "(mean / p99, changed) | median |")
    assert lines[2] == ("| `chain` #6 burst | 1822 s (630 / 1192) | 1698 s (604 / 1094, "
                        "23 of 410) | 1799 s |")
