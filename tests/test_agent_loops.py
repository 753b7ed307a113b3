"""The `agent_loop` family of workflows/generator.py: ReAct agents that keep
their conversation across tool waits (`share_rounds`), as tool-calling agent
frameworks run them; its draws are valid workflows whose traces replay under
every policy with every task finishing, keeping conversations through
heavy-tailed tool waits."""

from __future__ import annotations

import io
from collections import Counter

import pytest

from tests.simkit import run_checked
from topasd.model import EventKind, TopasError
from topasd.profiles import DEFAULT_PROFILE
from topasd.scheduler import POLICY_NAMES
from workflows.generator import (
    DEFAULT_BUDGET,
    FAMILIES,
    case_trace,
    conversation_clips,
    draw_workload,
    sample_tasks,
)
from workflows.trace import Trace, read_trace, write_trace

SEEDS = range(40)


def _trace(seed: int, tasks: int = 20, load: str = "heavy") -> Trace:
    return case_trace(draw_workload("agent_loop", seed), load, tasks, 0.05, seed)


def test_agent_loop_comes_after_the_original_families() -> None:
    assert FAMILIES.index("agent_loop") == len(FAMILIES) - 1 == 8
    for s in SEEDS:  # `mixed` keeps drawing only from the shapes it always drew from
        assert not any("agent_loop" in wf.name for wf in draw_workload("mixed", s).workflows)


def test_every_loop_keeps_its_conversation_and_waits_for_heavy_tailed_tools() -> None:
    seen: Counter[str] = Counter()
    waits: list[float] = []
    rounds: list[int] = []
    for s in SEEDS:
        trace = _trace(s)
        wf = next(iter(trace.workflows.values()))
        loops = [v for v in wf.stages if v != "doc"]
        assert all(wf.stages[v].profile.share_rounds for v in loops)
        seen["doc"] += "doc" in wf.stages
        seen["doc read twice"] += sum("doc" in wf.stages[v].after for v in loops) >= 2
        for task in trace.tasks:
            for v in loops:
                for branch in task.branches(v):
                    rounds.append(len(branch))
                    waits += [r.tool_wait_s for r in branch[:-1]]
                    # round k starts with the conversation of rounds 1..k-1
                    for k, r in enumerate(branch):
                        conv = [n for n in r.shared if not n.endswith(".history")]
                        assert len(conv) == k
                        assert sum(task.context[n] for n in r.shared) <= r.input_tokens
                seen["fan-out"] += len(task.branches(v)) > 1
                seen["shared document"] += any(n == f"{v}.history" for rs in task.branches(v)
                                               for r in rs for n in r.shared)
    assert min(rounds) == 1 and max(rounds) == 8
    assert min(waits) < 0.5 and max(waits) > 100  # far shorter and far longer than a round
    assert all(seen[k] >= 5 for k in ("doc", "doc read twice", "fan-out", "shared document")), \
        seen


def test_a_loop_draw_fits_the_budget_uncut_and_round_trips_as_a_trace() -> None:
    for s in SEEDS:
        trace = _trace(s, load="overload")
        big = sample_tasks(draw_workload("agent_loop", s), [t.arrival for t in trace.tasks], s,
                           budget=10 * DEFAULT_BUDGET)
        assert big == trace.tasks  # nothing was cut to fit
        out = io.StringIO()
        write_trace(trace, out)
        again = read_trace(io.StringIO(out.getvalue()))
        assert again.tasks == trace.tasks


def test_clips_keep_the_longest_conversation_within_the_room() -> None:
    for room in (900, 4000, 8000, 17_000):
        for rounds in range(1, 9):
            first, out, obs = conversation_clips(room, rounds)
            assert first >= 1 and out >= 1 and obs >= 0
            assert first + rounds * out + (rounds - 1) * obs <= room
    assert conversation_clips(17_000, 1) == (4250, 2048, 1062)  # `stage`'s clips where they fit


def test_a_kept_conversation_too_long_for_the_budget_is_refused_not_cut() -> None:
    wl = draw_workload("agent_loop", 0)
    with pytest.raises(TopasError, match="starts with shared segments exceeds the 3000-token "
                                         "budget"):
        sample_tasks(wl, [0.0] * 5, 0, budget=3000)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_replays_agent_loops_to_the_end(policy: str) -> None:
    kinds: Counter[EventKind] = Counter()
    for seed in (0, 3):
        trace = _trace(seed, tasks=8, load="overload")
        result, sink, _ = run_checked(trace, policy, {}, False, False, profile=DEFAULT_PROFILE)
        assert sorted(result.jct) == sorted(t.id for t in trace.tasks)  # every task finishes
        kinds.update(ev.kind for ev in sink.events)
    assert kinds[EventKind.TOOL_CALL_START] > 0 and kinds[EventKind.CONTEXT_KEEP] > 0, kinds
