"""E[LP] kept from one decision to the next (`PathMemo`): found again only
while nothing it depends on changed, so every value is the one a decision
without the memo computes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.topas_views import CHAIN, COSTS, FORK, request, task, view
from topasd.model import CostHints, TaskView, Workflow
from topasd.scheduler.params import PAPER, TopasParams
from topasd.scheduler.residual import PathMemo, ServiceModel, TaskPaths, quantile_rows
from topasd.scheduler.topas import TopasPolicy, _Search

U = quantile_rows(64, 64, 0)


def model() -> ServiceModel:
    m = ServiceModel()
    for agent, stage, values in (("A", "a", [1.0, 3.0]), ("B", "b", [0.0, 10.0, 4.0]),
                                 ("C", "c", [5.0, 6.0]), ("D", "d", [2.0])):
        for x in values:
            m.observe_stage((agent, stage), x)
    return m


def paths(m: ServiceModel, wf: Workflow, memo: PathMemo | None, costs: CostHints = COSTS,
          t: float = 0.0, quantiles: object = U) -> TaskPaths:
    return TaskPaths(m, costs, {wf.name: wf}, quantiles, t, memo)  # type: ignore[arg-type]


def waiting_task() -> TaskView:
    return task(1, FORK, a="done", b="active", c="active")


CUTS = [(), ((1, 2.0),), ((1, 2.0), (2, 1.0))]


def test_an_unchanged_set_is_found_again() -> None:
    m, memo = model(), PathMemo()
    first = paths(m, FORK, memo)
    before = first.lhat_many(waiting_task(), {}, CUTS)
    second = paths(m, FORK, memo)
    k = second._set_of(waiting_task(), {})
    assert second._memo[k].lhat == dict(zip(CUTS, before, strict=True))  # not priced again
    assert second.lhat_many(waiting_task(), {}, CUTS) == before


def test_a_new_observation_is_not_read_from_the_memo() -> None:
    """An observation of one pair changes the fresh path and a waiting
    task's E[LP]: the next decision must price them again."""
    m, memo = model(), PathMemo()
    first = paths(m, FORK, memo)
    stale = (first.fresh("fork"), first.lhat_many(waiting_task(), {}, CUTS))
    m.observe_stage(("C", "c"), 40.0)
    second = paths(m, FORK, memo)
    now = (second.fresh("fork"), second.lhat_many(waiting_task(), {}, CUTS))
    plain = paths(m, FORK, None)
    assert now == (plain.fresh("fork"), plain.lhat_many(waiting_task(), {}, CUTS))
    assert now[0] != stale[0] and now[1] != stale[1]


def test_a_started_stage_is_priced_at_its_elapsed_service() -> None:
    """A running request's residual moves with t: no E[LP] of its task is reused."""
    m, memo = model(), PathMemo()
    running = {"b": request(1, 1, FORK, "b", running=True, started_at=0.0)}
    t1 = task(1, FORK, a="done", b="active", c="active")
    at_1 = paths(m, FORK, memo, t=1.0).lhat_many(t1, running, CUTS)
    at_3 = paths(m, FORK, memo, t=3.0).lhat_many(t1, running, CUTS)
    assert at_3 == paths(m, FORK, None, t=3.0).lhat_many(t1, running, CUTS)
    assert at_3 != at_1


def test_priors_follow_the_costs_and_the_quantiles_their_rows() -> None:
    """Before any observation the path is the profiled one, priced again
    under other costs; other quantile rows drop every kept value."""
    memo, empty = PathMemo(), ServiceModel()
    assert paths(empty, CHAIN, memo).fresh("chain") == pytest.approx(3 * 0.1 * 256)
    slower = replace(COSTS, t_decode_s=0.2)
    assert paths(empty, CHAIN, memo, slower).fresh("chain") == pytest.approx(3 * 0.2 * 256)
    m = model()
    other = quantile_rows(64, 64, 1)
    paths(m, FORK, memo).fresh("fork")
    assert (paths(m, FORK, memo, quantiles=other).fresh("fork")
            == paths(m, FORK, None, quantiles=other).fresh("fork"))


def test_a_policy_prices_the_next_decision_with_the_new_observation() -> None:
    """The policy keeps one memo across decisions: after an observation its
    fresh paths and gains are those of a policy that starts with it."""
    def fed(extra: bool) -> TopasPolicy:
        pol = TopasPolicy(TopasParams(**{"reservation": "full", **PAPER}))
        pol.model = model()
        if extra:
            pol.model.observe_stage(("C", "c"), 40.0)
        return pol

    v = view(FORK, [waiting_task()], [], [request(1, 1, FORK, "b"), request(2, 1, FORK, "c")])
    kept = fed(False)
    before = TopasPolicy.fresh_paths(v, _Search(kept, v).paths)
    kept.decide(v)
    kept.model.observe_stage(("C", "c"), 40.0)
    new, ref = _Search(kept, v), _Search(fed(True), v)
    assert TopasPolicy.fresh_paths(v, new.paths) == TopasPolicy.fresh_paths(v, ref.paths) != before
    assert new.g == ref.g and [new.base_gain(r) for r in v.waiting] == [
        ref.base_gain(r) for r in v.waiting]


def test_sets_sampled_together_are_their_stages_rows() -> None:
    """Residual sets sampled at once (`_sample_sets`: started stages'
    X - e | X > e in one step) hold each stage's own `sampled` row, and
    [Z]_+ of them, float for float."""
    m = model()
    running = {"b": request(1, 1, FORK, "b", running=True, started_at=0.0)}
    tasks = [(task(1, FORK, a="done", b="active", c="active"), running),
             (task(2, FORK, a="active"), {"a": request(2, 2, FORK, "a", running=True,
                                                       started_at=0.5)}),
             (waiting_task(), {})]
    together = paths(m, FORK, None, t=2.0)
    sets = [together._set_of(t, r) for t, r in tasks]
    together._sample_sets(sets)
    alone = paths(m, FORK, None, t=2.0)
    for (t, r), k in zip(tasks, sets, strict=True):
        rows = [z.sampled(i, U) for i, z in enumerate(alone.residuals(t, r))]
        assert together._samples(k, False).tolist() == [row.tolist() for row in rows]
        assert together._samples(k, True).tolist() == [
            [max(x, 0.0) for x in row.tolist()] for row in rows]
