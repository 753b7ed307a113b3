"""bench/fig2_optimal.py's dynamic program: hand-computed optima on the
room-1 Fig. 2 machine, schedules that respect the machine, and no policy
replayed on the simulator below it."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.benchkit import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("fig2_optimal")


def test_three_tasks_at_once_are_best_served_one_after_another(bench: ModuleType) -> None:
    # T0 A 1-5, B 6-10, C 11-15; T1 16-30; T2 31-45: (15 + 30 + 45) / 3
    mean, steps = bench.optimal((0.0, 0.0, 0.0))
    assert mean == pytest.approx(30.0)
    assert [s.task for s in steps] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_pairing_two_tasks_saves_setups_for_the_tasks_behind(bench: ModuleType) -> None:
    # SRPT's order ends T0 at 15 and T1 at 30; pairing them (A, A, B, B, C, C) ends
    # them at 23 and 27 but saves two setups for each of the three tasks behind
    mean, steps = bench.optimal((0.0, 1.0, 4.0, 8.0, 11.0))
    assert mean == pytest.approx(39.4)
    assert [(s.task, s.agent) for s in steps[:6]] == [
        (0, "A"), (1, "A"), (0, "B"), (1, "B"), (0, "C"), (1, "C")]
    two, _ = bench.optimal((0.0, 0.0))
    assert two == pytest.approx((15 + 30) / 2)  # pairing two alone costs: (23 + 27) / 2


def test_a_schedule_respects_the_machine(bench: ModuleType) -> None:
    arrivals = (0.0, 2.0, 3.0, 9.0)
    mean, steps = bench.optimal(arrivals)
    done = [0] * len(arrivals)
    free, resident = 0.0, ""
    ends = {}
    for s in steps:  # one request at a time, each stage after its task's previous one
        assert bench.AGENTS[done[s.task]] == s.agent
        setup = 0.0 if s.agent == resident else bench.SETUP
        assert s.start >= max(free, arrivals[s.task]) + setup - 1e-9
        assert s.end == pytest.approx(s.start + bench.SERVICE)
        done[s.task] += 1
        free, resident, ends[s.task] = s.end, s.agent, s.end
    assert done == [3] * len(arrivals)
    assert mean == pytest.approx(sum(ends[i] - a for i, a in enumerate(arrivals)) / len(arrivals))


def test_no_policy_on_the_simulator_beats_the_optimum(bench: ModuleType) -> None:
    lists = bench.scenarios(6, 0)
    rows = bench.measure(lists)
    for row in rows:
        assert all(row[p] >= row["optimum"] - 1e-9 for p in bench.POLICIES)
    # the optimum is reached: SRPT is at it on some list of these
    assert any(abs(row["spf"] - row["optimum"]) < 1e-9 for row in rows)


@pytest.mark.parametrize("batch", [2, 3])
def test_topas_trails_neither_lpm_nor_srpt_on_the_fig2_grid(batch: int) -> None:
    """bench/fig2_grid.py's 60 arrival lists (seed 0) with room for two and
    three requests: TOPAS's mean is at most the better of LPM's and SRPT's
    in every list, and its average at most SRPT's (docs/RESULTS.md, "Fig. 2
    machines"; a phase's end and the exchange test's reload, docs/topas.md)."""
    grid = load_bench("fig2_grid")
    verdicts, topas_sum, srpt_sum = [], 0.0, 0.0
    for arrivals in grid.scenarios(60, 0):
        topas, lpm, srpt = (grid.mean_jct(p, arrivals, batch) for p in ("topas", "lpm", "spf"))
        verdicts.append(grid.verdict(topas, lpm, srpt))
        topas_sum, srpt_sum = topas_sum + topas, srpt_sum + srpt
    assert "loss" not in verdicts
    assert topas_sum <= srpt_sum + 1e-9
