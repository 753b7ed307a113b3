"""The baselines' shared admission helper (SGLang's PrefillAdder behaviour) and
their orders."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.topas_views import request, task, view, workflow
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES, las_level, las_order, parrot_order

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


@pytest.mark.parametrize("policy", sorted(BASELINES))
def test_idle_prefixes_are_evicted_least_recently_used_first(policy: str) -> None:
    """Idle B (last used at t=2) and D (t=1) beside running C: A's request
    (100 + 100) fits once one of them leaves, and the LRU one, D, goes."""
    four = workflow("four", {"a": (), "b": (), "c": (), "d": ()}, prefix=100)
    tasks = [task(0, four, c="active"), task(1, four, a="active")]
    running = [request(0, 0, four, "c", running=True, generated=5, started_at=0.0)]
    waiting = [request(1, 1, four, "a", input_tokens=90, output_tokens=10)]
    v = view(four, tasks, running, waiting, t=3.0, budget=430, gpu=("B", "C", "D"))
    v = replace(v, prefixes={**v.prefixes, "B": replace(v.prefixes["B"], last_used=2.0),
                             "D": replace(v.prefixes["D"], last_used=1.0)})
    decision = make_policy(policy).decide(v)
    assert decision.admit == (1,) and decision.load == ("A",)
    assert decision.evict == ("D",)


def _two_resident_requests(**caps: int):
    """Two requests of A (prefix resident), 10 prompt tokens each, ample KV."""
    tasks = [task(i, THREE, a="active") for i in (1, 2)]
    waiting = [request(i, i, THREE, "a", input_tokens=10, output_tokens=10) for i in (1, 2)]
    return replace(view(THREE, tasks, [], waiting, budget=10_000, gpu=("A",)), **caps)


@pytest.mark.parametrize(("caps", "admitted"), [
    ({"max_prefill_tokens": 20}, (1,)),  # 10 left: the second's 10 does not fit below it
    ({"max_prefill_tokens": 21}, (1, 2)),
    ({"chunk_tokens": 10}, (1,)),  # the first used up the round's chunk
    ({"chunk_tokens": 11}, (1, 2)),
], ids=["input-20", "input-21", "chunk-10", "chunk-11"])
def test_one_admission_round_takes_the_prefill_sglang_allows(
        caps: dict[str, int], admitted: tuple[int, ...]) -> None:
    """SGLang's PrefillAdder stops a round (retry next step) once its chunk
    is used up (rem_chunk_tokens <= 0) or a further request's extend reaches
    the remaining input budget (input_tokens >= rem_input_tokens)."""
    decision = make_policy("fcfs").decide(_two_resident_requests(**caps))
    assert decision.admit == admitted
    assert decision.retry == (admitted == (1,)) and not decision.blocked


def test_las_serves_the_least_attained_service_first_and_fifo_within_a_level() -> None:
    """Autellix PLAS: levels [0, 2 s), [2, 4 s), [4, 8 s), ... of a task's
    attained service; the queue order inside a level."""
    served = {1: 5.0, 2: 0.5, 3: 1.5}  # levels 2, 0, 0
    tasks = []
    for tid, service in served.items():
        tk = task(tid, THREE, a="active")
        tasks.append(replace(tk, stages={**tk.stages,
                                         "a": replace(tk.stages["a"], service_s=service)}))
    waiting = [request(tid, tid, THREE, "a") for tid in (1, 3, 2)]
    v = view(THREE, tasks, [], waiting)
    assert [las_level(s) for s in (0.5, 1.99, 2.0, 5.0)] == [0, 0, 1, 2]
    assert [r.id for r in las_order(v)] == [3, 2, 1]


def test_parrot_serves_the_oldest_task_first() -> None:
    """Parrot-FCFS: task 1 arrived first (t=0) although its request became
    ready last (t=5); task 2 arrived at t=1 with two requests, ready at 1 and 2."""
    tasks = [task(1, THREE, arrival=0.0, a="active"),
             task(2, THREE, arrival=1.0, a="active", b="active")]
    waiting = [replace(request(21, 2, THREE, "b", arrival=1.0), ready_at=2.0),
               request(20, 2, THREE, "a", arrival=1.0),
               replace(request(10, 1, THREE, "a", arrival=0.0), ready_at=5.0)]
    v = view(THREE, tasks, [], waiting, t=5.0)
    assert [r.id for r in parrot_order(v)] == [10, 20, 21]
