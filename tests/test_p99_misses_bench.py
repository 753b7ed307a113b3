"""bench/p99_misses.py: which cases of a generalization run miss the p99
bound, and a miss told apart as a throughput or an order loss by replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchkit import load_bench


def _row(case: list[object], p99: float, best_p99: float, mean: float = 10.0) -> dict[str, object]:
    return {"case": case, "policy": {"mean_jct_s": mean, "p99_jct_s": p99},
            "best_mean": ["spf", 8.0], "best_p99": ["lpm", best_p99]}


def test_the_misses_are_the_cases_over_the_bound_worst_first() -> None:
    bench = load_bench("p99_misses")
    rows = [_row(["chain", 1, "heavy"], 110.0, 100.0),  # exactly at the bound: not a miss
            _row(["chain", 2, "burst"], 120.0, 100.0),
            _row(["fork_join", 0, "overload"], 180.0, 100.0, mean=16.0)]
    found = bench.misses(rows, 1.10)
    assert [m.case for m in found] == [("fork_join", 0, "overload"), ("chain", 2, "burst")]
    assert found[0].p99_ratio == pytest.approx(1.8) and found[0].baseline == "lpm"
    assert found[0].mean_ratio == pytest.approx(2.0)


def test_a_call_log_case_is_refused_with_the_fix() -> None:
    bench = load_bench("p99_misses")
    with pytest.raises(SystemExit, match="not a generated family"):
        bench.misses([_row(["metagpt-log", 0, "heavy"], 200.0, 100.0)], 1.10)


def test_an_unreadable_run_names_the_file_and_how_to_make_one(tmp_path: Path) -> None:
    bench = load_bench("p99_misses")
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=r"run\.json.*--json FILE"):
        bench.main([str(bad)])


def test_a_diagnosed_miss_is_a_throughput_loss_exactly_when_its_makespan_is_longer() -> None:
    bench = load_bench("p99_misses")
    miss = bench.Miss(("fork_join", 0, "overload"), 1.8, "lpm", 1.59)
    row = bench.diagnose(miss, 20, 0.0234)
    assert row["topas"]["policy"] == "topas" and row["base"]["policy"] == "lpm"
    ratio = row["topas"]["makespan_s"] / row["base"]["makespan_s"]
    assert row["makespan_ratio"] == pytest.approx(ratio)
    assert row["kind"] == ("throughput" if ratio > bench.THROUGHPUT else "order")
    lines = bench.table([row, {**row, "kind": "order"}])
    assert lines[2].startswith("| `fork_join` #0 overload | 1.800x | lpm |")
    assert lines[-1].startswith(
        f"{int(row['kind'] == 'throughput')} throughput losses")
    assert f"{1 + int(row['kind'] == 'order')} order losses, of 2 cases" in lines[-1]
