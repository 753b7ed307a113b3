"""The baselines' shared admission helper (SGLang's PrefillAdder behaviour)."""

from __future__ import annotations

import pytest

from tests.topas_views import request, task, view, workflow
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES

THREE = workflow("three", {"a": (), "b": (), "c": ()}, prefix=100)


def _idle_b_running_c(input_tokens: int):
    """B idle and C running on the GPU (100 + 100 + C's request of 20 = 220 of
    330 tokens); one request for A (prefix 100 on the host) waits."""
    tasks = [task(0, THREE, c="active"), task(1, THREE, a="active")]
    running = [request(0, 0, THREE, "c", running=True, generated=5, started_at=0.0)]
    waiting = [request(1, 1, THREE, "a", input_tokens=input_tokens, output_tokens=10)]
    return view(THREE, tasks, running, waiting, t=1.0, budget=330, gpu=("B", "C"))


@pytest.mark.parametrize("policy", sorted(BASELINES))
def test_a_request_that_cannot_fit_evicts_nothing(policy: str) -> None:
    """A needs 100 (prefix) + 200 (its request) = 300 beside C's 120: 420 >
    330 even with B evicted, so the walk blocks and B stays resident."""
    decision = make_policy(policy).decide(_idle_b_running_c(input_tokens=190))
    assert decision.blocked and decision.admit == ()
    assert decision.evict == () and decision.load == ()


@pytest.mark.parametrize("policy", sorted(BASELINES))
def test_an_idle_prefix_is_evicted_for_a_request_that_then_fits(policy: str) -> None:
    """A needs 100 + 100 = 200: 420 > 330 beside B, 320 once idle B leaves."""
    decision = make_policy(policy).decide(_idle_b_running_c(input_tokens=90))
    assert decision.admit == (1,) and not decision.blocked
    assert decision.evict == ("B",) and decision.load == ("A",)
