"""Fig. 2 of the paper, reproduced exactly on the `unit` profile.

The abstract machine of Fig. 2's caption: every engine step costs 1 time unit
(`t_weights_s=1`, everything else 0), so a request with 4 output tokens takes
4 units (1 prefill step producing the first token + 3 decode steps), and a
100-token prefix moves over the host link in 1 unit (1 byte/token at 100
B/unit, `workflows.fig2.fig2_profile`).
`SimBackend(..., warm_host=True)` gives every prefix a host copy from the
start, so each prefix setup is a 1-unit host load.

Workflow A -> B -> C (stages a, b, c on agents A, B, C), every prefix 100
tokens, every request 1 input token + 4 output tokens (5 KV tokens).

The timelines below were computed by hand from the engine's documented rules
(before running the simulator):

- The baselines' admission helper walks the waiting queue in policy order,
  loads the prefix a request needs, evicts idle prefixes LRU when room is
  needed, stops at the first request that does not fit (`blocked`, which then
  holds further admission until a running request finishes).
- A new request is charged input + output (5) at admission; a running one
  input + generated + ratio * remaining with ratio in [0.098, 0.7].
- A prefill step and decode steps never overlap (`mixed_chunk=False`): a
  request admitted while another decodes delays it by its prefill step.
- Task ids 0, 1, 2 are T0, T1, T2; "T0.a" is task 0's stage a.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim.engine import SimBackend
from tests.simkit import RecordingSink
from topasd.model import Decision, EngineView, EventKind
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.fig2 import (
    MAX_BATCH,
    PREFIX_TOKENS,
    REQUEST_TOKENS,
    fig2_budget,
    fig2_profile,
    fig2_trace,
)


@pytest.mark.parametrize("batch", range(1, MAX_BATCH + 1))
def test_the_machine_holds_one_prefix_and_batch_requests(batch: int) -> None:
    """Every batch size keeps the caption: one prefix at a time (two never fit
    beside a request), `batch` requests beside it, a 1-unit prefix setup."""
    profile = fig2_profile(batch)
    assert profile.budget_tokens == PREFIX_TOKENS + batch * REQUEST_TOKENS
    assert profile.budget_tokens < 2 * PREFIX_TOKENS + REQUEST_TOKENS
    assert profile.t_swap(PREFIX_TOKENS) == 1.0


@pytest.mark.parametrize("batch", [0, MAX_BATCH + 1, 2.5])
def test_a_batch_outside_the_machine_is_refused(batch: float) -> None:
    with pytest.raises(ValueError, match=f"1 to {MAX_BATCH}"):
        fig2_budget(batch)  # type: ignore[arg-type]


def run_fig2(policy: str, arrivals: list[float], batch: int, closed_form: bool,
             **params: object):
    backend = SimBackend(fig2_profile(batch), warm_host=True, closed_form=closed_form)
    sink = RecordingSink()
    result = Run(fig2_trace(arrivals), make_policy(policy, **params), backend,
                 sink=sink).execute()
    return result, sink, backend


def timeline(sink: RecordingSink):
    """(task, stage) -> (start, finish); prefix loads as (agent, start, end);
    task -> completion time; the largest number of prefixes on the GPU at once."""
    spans: dict[tuple[int, str], list[float]] = defaultdict(list)
    loads: list[list] = []
    completion: dict[int, float] = {}
    on_gpu: set[str] = set()
    most_on_gpu = 0
    for ev in sink.events:
        if ev.kind is EventKind.REQUEST_START or ev.kind is EventKind.REQUEST_FINISH:
            spans[(ev.task_id, ev.stage)].append(ev.t)
        elif ev.kind is EventKind.PREFIX_LOAD_START:
            loads.append([ev.agent, ev.t, None])
            on_gpu.add(ev.agent)
        elif ev.kind is EventKind.PREFIX_LOAD_END:
            pending = [ld for ld in loads if ld[0] == ev.agent and ld[2] is None]
            assert len(pending) == 1, f"load end of {ev.agent} without one open load"
            pending[0][2] = ev.t
        elif ev.kind in (EventKind.PREFIX_COMPUTE_START,):
            on_gpu.add(ev.agent)
        elif ev.kind is EventKind.PREFIX_EVICT:
            on_gpu.discard(ev.agent)
        elif ev.kind is EventKind.TASK_FINISH:
            completion[ev.task_id] = ev.t
        most_on_gpu = max(most_on_gpu, len(on_gpu))
    return ({k: tuple(v) for k, v in spans.items()}, [tuple(ld) for ld in loads], completion,
            most_on_gpu)


# --------------------------------------------------------------------------
# Scenario 1: Fig. 2 literally. Three tasks at t=0; the GPU holds one prefix
# and one request: budget 105 = prefix 100 + request 5. A second request never
# fits (100 + a running request's >= 1.39 + 5 > 105), nor a second prefix (200).
#
# LPM (longest resident prefix first; a non-resident agent's first request
# keeps its FCFS place, its later ones go last):
#   t=0   T0.a,T1.a,T2.a ready. Admit T0.a (needs 100+5=105), load A; T1.a blocked.
#   0-1   load A.   1: T0.a prefill (start 1), decode 2-5, finish 5.
#   t=5   T0.b ready. Queue T1.a(A resident), T2.a, T0.b -> admit T1.a: 5-9.
#   t=9   T1.b ready. T2.a (resident) first: 9-13.
#   t=13  T2.b ready; all waiting are B. Admit T0.b: evict idle A, load B 13-14.
#         T0.b 14-18, then T1.b 18-22 and T2.b 22-26 (B resident, ahead of C).
#   t=26  only C waits: evict B, load C 26-27; T0.c 27-31, T1.c 31-35, T2.c 35-39.
#   Completion: T0 31, T1 35, T2 39 (mean JCT 35); 3 prefix loads.
#
# SRPT (`spf`, deepest stage first, FCFS inside a depth):
#   0-1 load A; T0.a 1-5.
#   t=5   T0.b (depth 1) before T1.a, T2.a: evict A, load B 5-6; T0.b 6-10.
#   t=10  T0.c (depth 2) first: evict B, load C 10-11; T0.c 11-15.  T0 done 15.
#   t=15  T1.a: evict C, load A 15-16; T1.a 16-20.
#   t=20  T1.b: load B 20-21; 21-25.  t=25 T1.c: load C 25-26; 26-30.  T1 done 30.
#   t=30  T2.a: load A 30-31; 31-35. T2.b: load B 35-36; 36-40.
#         T2.c: load C 40-41; 41-45.  T2 done 45 (mean JCT 30); 9 prefix loads.
# --------------------------------------------------------------------------

S1_ARRIVALS = [0.0, 0.0, 0.0]
S1_BATCH = 1

S1_EXPECTED = {
    "lpm": {
        "spans": {
            (0, "a"): (1, 5), (1, "a"): (5, 9), (2, "a"): (9, 13),
            (0, "b"): (14, 18), (1, "b"): (18, 22), (2, "b"): (22, 26),
            (0, "c"): (27, 31), (1, "c"): (31, 35), (2, "c"): (35, 39),
        },
        "loads": [("A", 0, 1), ("B", 13, 14), ("C", 26, 27)],
        "completion": {0: 31, 1: 35, 2: 39},
    },
    "spf": {
        "spans": {
            (0, "a"): (1, 5), (0, "b"): (6, 10), (0, "c"): (11, 15),
            (1, "a"): (16, 20), (1, "b"): (21, 25), (1, "c"): (26, 30),
            (2, "a"): (31, 35), (2, "b"): (36, 40), (2, "c"): (41, 45),
        },
        "loads": [("A", 0, 1), ("B", 5, 6), ("C", 10, 11),
                  ("A", 15, 16), ("B", 20, 21), ("C", 25, 26),
                  ("A", 30, 31), ("B", 35, 36), ("C", 40, 41)],
        "completion": {0: 15, 1: 30, 2: 45},
    },
}


# --------------------------------------------------------------------------
# Scenario 2: batching and a staggered arrival. Tasks at t=0, 0, 3; budget
# 110 = one prefix + two requests. A third request never fits beside two
# running ones (their optimistic charge is >= 3.6 each while ratio >= 0.65,
# which holds for the few dozen steps here: 100 + 7.2 + 5 > 110), and two
# prefixes never fit beside a request (100 + 100 + 5 > 110).
#
# LPM:
#   t=0   admit T0.a, T1.a (105, then 110), load A 0-1. Both prefill at 1 (start 1).
#   t=3   T2.a arrives mid-decode: 100 + 2 x (3 + 0.7 x 2) + 5 > 110 -> blocked.
#   t=5   T0.a, T1.a finish; T0.b, T1.b ready. Queue: T2.a (A resident) first,
#         admitted (105); T0.b needs 105 more and A is now in use -> blocked.
#         T2.a 5-9 runs alone while both B requests wait.
#   t=9   T2.b ready. Admit T0.b (evict idle A, load B 9-10) and T1.b (110);
#         T2.b blocked. T0.b, T1.b 10-14.
#   t=14  T0.c, T1.c ready; T2.b (B resident) first, alone: 14-18; C blocked.
#   t=18  T2.c ready. Admit T0.c (evict B, load C 18-19), T1.c; T2.c blocked.
#         T0.c, T1.c 19-23.   t=23: T2.c 23-27.
#   Completion: T0 23, T1 23, T2 27 (JCT 23, 23, 24; mean 23.33); 3 loads.
#
# SRPT (`spf`):
#   t=0-5 as LPM (T2.a blocked at 3).
#   t=5   T0.b, T1.b (depth 1) before T2.a: evict A, load B 5-6; both 6-10.
#   t=10  T0.c, T1.c: evict B, load C 10-11; both 11-15. T0, T1 done 15.
#   t=15  T2.a: evict C, load A 15-16; 16-20. T2.b: load B 20-21; 21-25.
#         T2.c: load C 25-26; 26-30. T2 done 30 (JCT 15, 15, 27; mean 19); 6 loads.
# --------------------------------------------------------------------------

S2_ARRIVALS = [0.0, 0.0, 3.0]
S2_BATCH = 2

S2_EXPECTED = {
    "lpm": {
        "spans": {
            (0, "a"): (1, 5), (1, "a"): (1, 5), (2, "a"): (5, 9),
            (0, "b"): (10, 14), (1, "b"): (10, 14), (2, "b"): (14, 18),
            (0, "c"): (19, 23), (1, "c"): (19, 23), (2, "c"): (23, 27),
        },
        "loads": [("A", 0, 1), ("B", 9, 10), ("C", 18, 19)],
        "completion": {0: 23, 1: 23, 2: 27},
    },
    "spf": {
        "spans": {
            (0, "a"): (1, 5), (1, "a"): (1, 5),
            (0, "b"): (6, 10), (1, "b"): (6, 10),
            (0, "c"): (11, 15), (1, "c"): (11, 15),
            (2, "a"): (16, 20), (2, "b"): (21, 25), (2, "c"): (26, 30),
        },
        "loads": [("A", 0, 1), ("B", 5, 6), ("C", 10, 11),
                  ("A", 15, 16), ("B", 20, 21), ("C", 25, 26)],
        "completion": {0: 15, 1: 15, 2: 30},
    },
}

SCENARIOS = {
    "one-request": (S1_ARRIVALS, S1_BATCH, S1_EXPECTED),
    "batch-of-two": (S2_ARRIVALS, S2_BATCH, S2_EXPECTED),
}


@pytest.mark.parametrize("closed_form", [True, False], ids=["closed-form", "stepwise"])
@pytest.mark.parametrize("policy", ["lpm", "spf"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fig2_timeline(scenario: str, policy: str, closed_form: bool) -> None:
    arrivals, batch, expected = SCENARIOS[scenario]
    want = expected[policy]
    result, sink, backend = run_fig2(policy, arrivals, batch, closed_form)
    spans, loads, completion, most_on_gpu = timeline(sink)

    assert spans == want["spans"]
    assert loads == want["loads"]
    assert completion == want["completion"]
    assert result.finishes == want["completion"]
    assert result.jct == {i: want["completion"][i] - arrivals[i] for i in want["completion"]}
    # the Fig. 2 machine: one prefix on the GPU at a time, and nothing preempted
    assert most_on_gpu == 1
    assert backend.stats.prefix_loads == len(want["loads"])
    assert backend.stats.prefix_computes == 0
    assert backend.stats.preemptions == 0 and backend.stats.retractions == 0


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fig2_conflict(scenario: str) -> None:
    """The caption's point, on the hand-computed numbers: SRPT finishes the
    first task sooner but pays a prefix setup at every stage transition;
    LPM amortises setups over same-prefix requests and holds service upstream."""
    arrivals, batch, _ = SCENARIOS[scenario]
    lpm, _, lpm_backend = run_fig2("lpm", arrivals, batch, True)
    spf, _, spf_backend = run_fig2("spf", arrivals, batch, True)
    assert min(spf.finishes.values()) < min(lpm.finishes.values())
    assert lpm_backend.stats.prefix_loads == 3  # one setup per agent
    assert spf_backend.stats.prefix_loads > lpm_backend.stats.prefix_loads


def _mean_jct(completion: dict[int, float], arrivals: list[float]) -> float:
    return sum(completion[i] - arrivals[i] for i in completion) / len(completion)


@pytest.mark.parametrize(("arrivals", "batch", "srpt_mean"), [
    ([0.0, 3.0, 4.0, 6.0, 8.0], 2, 24.8),  # a new task would keep A past its phase
    ([4.0, 6.0, 9.0, 10.0], 3, 19.5),  # and a preemption would cost A's way back
])
def test_topas_ends_a_phase_with_its_started_work(
        arrivals: list[float], batch: int, srpt_mean: float) -> None:
    """Once the started tasks' A rounds are done and their B rounds fill B's
    next batch, a new task's A round waits (`phases`, the phase's end) and no
    running A round is preempted for a swap its task would then wait a whole
    B and C phase for (`preempt_exchange`'s reload): TOPAS's mean is SRPT's.
    Before both, 28.8 and 21.25."""
    topas, _, _ = run_fig2("topas", arrivals, batch, True)
    spf, _, _ = run_fig2("spf", arrivals, batch, True)
    assert _mean_jct(topas.finishes, arrivals) == pytest.approx(srpt_mean)
    assert _mean_jct(spf.finishes, arrivals) == pytest.approx(srpt_mean)


def test_topas_pairs_a_new_task_with_a_started_one_when_tasks_wait_behind() -> None:
    """Room for one request, arrivals 0, 1, 1, 1: at t = 5 task 0 needs B while
    three new tasks wait on the resident A. Task 1's A round first saves
    task 1 three setups, worth 3 units to each of the three tasks waiting,
    and delays task 0 by 4 units at B and at C (`tandem`): TOPAS then runs
    A, A, B, B, C, C, the present plan's order (bench/fig2_optimal.py), for a
    mean of 36.5 against SRPT's 36.75."""
    arrivals = [0.0, 1.0, 1.0, 1.0]
    topas, _, _ = run_fig2("topas", arrivals, 1, True)
    spf, _, _ = run_fig2("spf", arrivals, 1, True)
    assert _mean_jct(topas.finishes, arrivals) == pytest.approx(36.5)
    assert _mean_jct(spf.finishes, arrivals) == pytest.approx(36.75)
    off, _, _ = run_fig2("topas", arrivals, 1, True, tandem=False)
    assert _mean_jct(off.finishes, arrivals) == pytest.approx(36.75)


def test_topas_is_no_later_than_lpm_and_srpt_when_the_gpu_batches_two() -> None:
    """Fig. 2 with room for one prefix and two requests: TOPAS finishes tasks
    no later on average than both LPM and SRPT (spf)."""
    arrivals, batch, expected = SCENARIOS["batch-of-two"]
    topas, _, _ = run_fig2("topas", arrivals, batch, True)
    mean = _mean_jct(topas.finishes, arrivals)
    assert mean <= _mean_jct(expected["lpm"]["completion"], arrivals)
    assert mean <= _mean_jct(expected["spf"]["completion"], arrivals)


def test_topas_on_the_literal_fig2_finishes_the_started_task_first() -> None:
    """Fig. 2 literally (one request fits): every stage has the same expected
    service and all tasks the same age, so Eq. 13 values T0.b and T1.a alike
    and, in the paper's score, J_move decides for the resident prefix: LPM's
    timeline (mean JCT 35). The srpt weight (H_age / L_i, L_i the task's
    remaining expected path) values T0.b, which ends its task, over T1.a,
    which starts one, by the ratio of their remaining paths: TOPAS runs SRPT's
    timeline (mean 30), paying the two extra prefix swaps."""
    arrivals, batch, expected = SCENARIOS["one-request"]
    topas, _, backend = run_fig2("topas", arrivals, batch, True)
    assert topas.finishes == expected["spf"]["completion"]
    assert backend.stats.preemptions == 0
    paper, _, backend = run_fig2("topas-paper", arrivals, batch, True)
    assert paper.finishes == expected["lpm"]["completion"]
    assert backend.stats.prefix_loads == 3 and backend.stats.preemptions == 0


def test_topas_does_not_thrash_between_prefixes_that_are_still_loading() -> None:
    """With T1.a running at t=6, V_reuse values B for T1.b only in states that
    keep T1.a's prefix resident (reuse needs the running predecessor's prefix
    too); valuing it in the state that preempts T1.a swaps A and B at every
    load end for ~1,600 units (2,436 preemptions)."""
    arrivals = [0.0, 3.0, 6.0]
    topas, _, backend = run_fig2("topas", arrivals, S2_BATCH, True)
    lpm, _, _ = run_fig2("lpm", arrivals, S2_BATCH, True)
    assert _mean_jct(topas.finishes, arrivals) <= _mean_jct(lpm.finishes, arrivals)
    assert backend.stats.preemptions <= 1 and backend.stats.prefix_loads <= 6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.integers(0, 12), min_size=2, max_size=5).map(sorted),
       batch=st.integers(1, 5), closed_form=st.booleans())
def test_topas_finishes_within_serial_time_on_the_fig2_machine(
        arrivals: list[int], batch: int, closed_form: bool) -> None:
    """On the Fig. 2 machine any sane schedule ends within running every
    request alone after the last arrival, each behind a prefix swap (4 + 2
    units), and preempts each request at most once on average."""
    times = [float(a) for a in arrivals]
    topas, _, backend = run_fig2("topas", times, batch, closed_form)
    n_requests = 3 * len(times)
    assert set(topas.finishes) == set(range(len(times)))
    assert max(topas.finishes.values()) <= max(times) + n_requests * (4 + 2)
    assert backend.stats.preemptions <= n_requests


class _Views:
    """A policy that records, per decision, its time and the tasks waiting."""

    def __init__(self, policy: str) -> None:
        self.policy = make_policy(policy)
        self.seen: list[tuple[float, frozenset[int]]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.policy, name)

    def decide(self, view: EngineView) -> Decision:
        self.seen.append((view.t, frozenset(r.task_id for r in view.waiting)))
        return self.policy.decide(view)


@pytest.mark.parametrize("policy", ["spf", "topas"])
def test_a_decision_sees_every_event_of_its_instant(policy: str) -> None:
    # T0's A round ends at t = 10 as T1 arrives: the one decision at that end sees
    # T1's A round waiting beside T0's B round (not a decision before the arrival)
    views = _Views(policy)
    Run(fig2_trace((5.0, 10.0)), views, SimBackend(fig2_profile(2), warm_host=True)).execute()  # type: ignore[arg-type]
    at_ten = [tasks for t, tasks in views.seen if t == 10.0]
    assert at_ten == [frozenset({0, 1})]
