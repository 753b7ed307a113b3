"""bench/random_holds.py: with p = 0 a run is TOPAS's own, with p = 1 every
contested decision takes another option, and the table names what it shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def _runs(costs: list[float], p99s: list[float]) -> list[dict[str, Any]]:
    own = {"p": 0.0, "seed": 0, "cost": 1822.0, "mean_jct_s": 630.0, "p99_jct_s": 1192.0,
           "changed": 0, "contested": 410}
    return [own] + [{"p": 0.05, "seed": i, "cost": c, "mean_jct_s": c - q, "p99_jct_s": q,
                     "changed": 20 + i, "contested": 410}
                    for i, (c, q) in enumerate(zip(costs, p99s, strict=True))]


def test_a_case_row_counts_the_runs_cheaper_than_topass_own() -> None:
    row = bench.case_row(("chain", 6, "burst"),
                         _runs([1698.0, 1900.0, 1821.0, 1822.0], [1094.0, 1250.0, 1150.0, 1100.0]),
                         [0.05], 1000.0)
    by = row["by_p"][0.05]
    assert row["topas"]["cost"] == 1822.0 and by["best"]["cost"] == 1698.0
    assert by["cheaper"] == 2  # 1698 and 1821; a tie with TOPAS's is not cheaper
    assert by["median"] == 1821.5 and by["median_p99"] == 1125.0


def test_the_table_gives_the_best_the_median_and_the_cheaper_runs() -> None:
    row = bench.case_row(("chain", 6, "burst"), _runs([1698.0, 1900.0], [1094.0, 1250.0]),
                         [0.05], None)
    lines = bench.table([row], [0.05], 2)
    assert lines[0] == ("| case | TOPAS: mean + p99 (mean / p99) | p = 0.05: best of 2 "
                        "(mean / p99, changed) | median | runs cheaper than TOPAS |")
    assert lines[1].count("---") == 5
    assert lines[2] == ("| `chain` #6 burst | 1822 s (630 / 1192) | 1698 s (604 / 1094, "
                        "20 of 410) | 1799 s | 1 of 2 |")


def test_with_a_runs_best_p99_the_table_gives_the_ratios_and_the_runs_within() -> None:
    rows = [bench.case_row(("chain", 6, "burst"), _runs([1698.0, 1900.0], [1094.0, 1250.0]),
                           [0.05], 1000.0),
            bench.case_row(("chain", 3, "burst"), _runs([1698.0, 1900.0], [1094.0, 1250.0]),
                           [0.05], None)]
    lines = bench.table(rows, [0.05], 2, bound=1.10)
    assert lines[0].endswith("| p99 over the best baseline's: TOPAS / median run | runs "
                             "within 1.1x |")
    assert lines[1].count("---") == 7
    # 1192 / 1000; the median run's p99 1172 / 1000; only 1094 is within 1100
    assert lines[2].endswith("| 1.192x / 1.172x | 1 of 2 |")
    assert lines[3].endswith("| - | - |")  # a case the run does not hold


def test_best_p99s_reads_a_generalization_file_and_names_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "run.json"
    good.write_text(json.dumps([{"case": ["chain", 6, "burst"],
                                 "policy": {"mean_jct_s": 630.0, "p99_jct_s": 1192.0},
                                 "best_mean": ["spf", 662.0], "best_p99": ["lpm", 970.0]}]))
    assert bench.best_p99s(good) == {("chain", 6, "burst"): 970.0}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"bad\.json: give a file an earlier"):
        bench.best_p99s(bad)
