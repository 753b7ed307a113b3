"""bench/oracle_rollout.py: a fork of the simulated world is an exact copy (run
to the end under TOPAS's own choice it finishes every task when the real run
does), and the oracle decides the choice whose fork cost least."""

from __future__ import annotations

import math
from typing import Any

import pytest

from backends.sim.engine import SimBackend
from tests.benchkit import load_bench
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler.topas import TopasPolicy
from workflows.generator import case_trace, draw_workload
from workflows.trace import Trace

bench = load_bench("oracle_rollout")


def _trace(family: str, seed: int, load: str, tasks: int) -> Trace:
    wl = draw_workload(family, seed)
    return case_trace(wl, load, tasks, 0.05, seed)


class _ForkOnce(bench.OraclePolicy):  # type: ignore[name-defined,misc]
    """At its `at`-th contested decision, forks with TOPAS's own choice and
    runs the fork to the end; otherwise plain TOPAS."""

    def __init__(self, at: int) -> None:
        super().__init__(TopasPolicy(), bench.Oracle(horizon=1.0))
        self.at, self.seen = at, 0
        self.fork_finishes: dict[int, float] | None = None

    def _pick(self, t: float, options: list[Any]) -> Any:
        self.seen += 1
        if self.seen == self.at:
            fork, _ = self.fork(bench.OWN)
            bench.advance(fork, math.inf)
            self.fork_finishes = dict(fork.loop.book.finishes)
        return bench.OWN


def test_a_fork_under_topass_own_choice_replays_the_run_exactly() -> None:
    trace = _trace("chain", 6, "burst", 30)
    policy = _ForkOnce(at=3)
    run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)))
    policy.run = run
    result = run.execute()
    assert policy.fork_finishes is not None, "the run reached its third contested decision"
    assert len(result.finishes) == len(trace.tasks)
    assert policy.fork_finishes == result.finishes


class _Recorded(bench.OraclePolicy):  # type: ignore[name-defined,misc]
    """The oracle, recording each contested decision's fork costs, its pick
    and the decision the engine was told."""

    def __init__(self, oracle: Any) -> None:
        super().__init__(TopasPolicy(), oracle)
        self.picks: list[tuple[dict[Any, float], Any]] = []
        self.told: list[Any] = []

    def _pick(self, t: float, options: list[Any]) -> Any:
        batch = max(self.run.backend.stats.mean_batch, 1.0)
        costs = {}
        for option in options:
            fork, twin = self.fork(option)
            bench.advance(fork, t + self.oracle.horizon)
            costs[option] = bench.fork_cost(fork, twin.topas, self.oracle.objective, batch)
        pick = super()._pick(t, options)
        self.picks.append((costs, pick))
        return pick

    def decide(self, view: Any) -> Any:
        n = len(self.picks)
        out = super().decide(view)
        if len(self.picks) > n:
            self.told.append((out, self.take(view, self.picks[-1][1])))
        return out


@pytest.mark.parametrize(("space", "objective", "horizon"),
                         [("states", "plain", 20.0), ("states", "queue", 20.0),
                          ("phases", "plain", 20.0)])
def test_the_oracle_decides_the_cheapest_fork(space: str, objective: str,
                                              horizon: float) -> None:
    trace = _trace("chain", 4, "heavy", 40)
    policy = _Recorded(bench.Oracle(horizon=horizon, objective=objective, space=space))
    run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)))
    policy.run = run
    result = run.execute()
    assert len(result.finishes) == len(trace.tasks)
    assert policy.forks == len(policy.picks) > 0
    assert policy.changed == sum(pick != bench.OWN for _, pick in policy.picks) > 0
    assert policy.holds <= sum(not (told.admit or told.load) for told, _ in policy.told)
    for (costs, pick), (told, option) in zip(policy.picks, policy.told, strict=True):
        assert costs[pick] == min(costs.values())
        assert pick == bench.OWN or costs[pick] < costs[bench.OWN]  # a tie keeps TOPAS's
        assert (told.admit, told.preempt, told.load) == (option.admit, option.preempt,
                                                          option.load)


def test_the_tail_cost_needs_whole_runs() -> None:
    trace = _trace("chain", 4, "heavy", 10)
    policy = bench.OraclePolicy(TopasPolicy(), bench.Oracle(horizon=5.0, objective="tail"))
    run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)))
    policy.run = run
    with pytest.raises(ValueError, match="every task finished"):
        run.execute()


def test_case_arguments_name_the_fix() -> None:
    assert bench.parse_case("chain:4:heavy") == ("chain", 4, "heavy")
    with pytest.raises(Exception, match="FAMILY:DRAW:LOAD"):
        bench.parse_case("chain-4-heavy")


def test_a_forks_events_reach_only_its_own_copy_of_the_sink() -> None:
    """The real run's prefix-room sink sees the same events with a fork run
    to the end beside it as a plain TOPAS run's sink does."""
    room = load_bench("prefix_room")
    trace = _trace("chain", 6, "burst", 30)
    prefixes = {a.name: a.prefix_tokens for w in trace.workflows.values()
                for a in w.agents.values()}
    sinks = []
    forking = _ForkOnce(at=3)
    for policy in (forking, TopasPolicy()):
        sink = room.PrefixRoom(prefixes)
        run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)), sink=sink)
        if isinstance(policy, _ForkOnce):
            policy.run = run
        run.execute()
        sinks.append(sink)
    assert forking.fork_finishes is not None, "a fork ran to the end beside the run"
    forked, plain = sinks
    assert forked.t == plain.t and forked.averages() == plain.averages()
    assert forked.loads == plain.loads
