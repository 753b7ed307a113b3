"""bench/p99_misses.py: which cases of a generalization run miss the p99
bound, and a miss told apart as a throughput or an order loss by replays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchkit import load_bench


def _row(case: list[object], p99: float, best_p99: float, mean: float = 10.0) -> dict[str, Any]:
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


@pytest.mark.parametrize("text, why", [
    ("{not json", "not JSON"),
    ('{"case": 1}', "row 0 is not a case's row"),
    ("[]", "it holds no case"),
])
def test_a_file_that_is_not_a_run_names_itself_and_the_fix(tmp_path: Path, text: str,
                                                           why: str) -> None:
    bench = load_bench("p99_misses")
    bad = tmp_path / "run.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as exc:
        bench.main([str(bad)])
    assert "run.json" in str(exc.value) and "--json FILE" in str(exc.value)
    assert why in str(exc.value)


def test_a_bound_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    bench = load_bench("p99_misses")
    run = tmp_path / "run.json"
    run.write_text(json.dumps([_row(["chain", 2, "burst"], 120.0, 100.0)]))
    with pytest.raises(SystemExit):
        bench.main([str(run), "--bound", "0"])


def _fake_replay(makespans: dict[str, float]) -> Any:
    def replay(family: str, draw: int, load: str, policy: str, params: dict[str, Any],
               tasks: int, capacity: float) -> dict[str, Any]:
        return {"policy": policy, "makespan_s": makespans[policy], "mean_batch": 4.0,
                "pinned_kv": 3000.0 if policy == "topas" else 2000.0,
                "running_kv": 7000.0, "prefix_loads": 5,
                "p99_jct_s": 1.2 * makespans[policy] if policy == "topas" else makespans[policy]}
    return replay


@pytest.mark.parametrize("makespan, kind", [(105.0, "order"), (105.5, "throughput")])
def test_a_miss_is_a_throughput_loss_only_past_five_percent_more_makespan(
        monkeypatch: pytest.MonkeyPatch, makespan: float, kind: str) -> None:
    bench = load_bench("p99_misses")
    monkeypatch.setattr(bench, "replay", _fake_replay({"topas": makespan, "lpm": 100.0}))
    miss = bench.Miss(("chain", 6, "burst"), 1.229, "lpm", 0.952)
    row = bench.diagnose(miss, 100, 0.1)
    assert row["kind"] == kind
    assert row["makespan_ratio"] == pytest.approx(makespan / 100.0)
    assert row["replayed_p99_ratio"] == pytest.approx(1.2 * makespan / 100.0)


def test_each_table_cell_sits_under_its_heading(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench("p99_misses")
    monkeypatch.setattr(bench, "replay", _fake_replay({"topas": 110.0, "lpm": 100.0}))
    rows = [bench.diagnose(bench.Miss(("chain", 6, "burst"), 1.229, "lpm", 0.952), 100, 0.1)]
    lines = bench.table(rows)
    cells = dict(zip([h.strip() for h in lines[0].strip("|").split("|")],
                     [c.strip() for c in lines[2].strip("|").split("|")], strict=True))
    assert cells == {
        "case": "`chain` #6 burst", "p99 over the best (run)": "1.229x",
        "replayed": "1.320x", "best-p99 baseline": "lpm", "makespan ratio": "1.100",
        "mean batch": "4.00 / 4.00", "prefix KV pinned by running agents": "3,000 / 2,000",
        "KV of running requests": "7,000 / 7,000", "prefix loads": "5 / 5",
        "mean over the best mean": "0.952x", "loss": "throughput"}
    assert lines[-1] == ("1 throughput losses (TOPAS's makespan more than 5% longer), "
                         "0 order losses, of 1 cases over the bound.")


def test_a_real_replay_gives_each_side_its_own_run() -> None:
    bench = load_bench("p99_misses")
    row = bench.diagnose(bench.Miss(("fork_join", 0, "overload"), 1.8, "lpm", 1.59), 20, 0.0234)
    assert row["topas"]["policy"] == "topas" and row["base"]["policy"] == "lpm"
    assert row["makespan_ratio"] == pytest.approx(
        row["topas"]["makespan_s"] / row["base"]["makespan_s"])
    assert row["replayed_p99_ratio"] == pytest.approx(
        row["topas"]["p99_jct_s"] / row["base"]["p99_jct_s"])
    assert 0.0 < row["topas"]["pinned_kv"] <= 18_000
