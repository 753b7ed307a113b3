"""Built-in workloads: every sample fits the default KV pool; MetaGPT totals match their notes."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from topasd.model import Dist, Workflow
from topasd.profiles import DEFAULT_PROFILE, get_profile
from workflows.builtin import BUILTIN, builtin_workflows, load_workload
from workflows.trace import Trace, generate_trace

BUDGET = 18_000
TASKS = 300
SEED = 7

# Acceptance ranges for the 300-task sample means of per-task totals, written
# in each workload's `notes:` (prompt = prefix + input of every request).
TOTALS = {
    # expectation ~26,190 / ~6,060 (MetaGPT paper: 26,627 / 6,218)
    "metagpt-sop": {"prompt": (23_500, 29_000), "completion": (5_400, 6_700)},
    # expectation ~95,500 / ~3,690 (the revised, shorter ReAct loops)
    "metagpt-tl": {"prompt": (88_000, 103_000), "completion": (3_350, 4_050)},
}

# Largest single request the notes allow in the worst case (every draw at its clip).
WORST_CASE = {"metagpt-sop": 12_235, "metagpt-tl": 12_820}


def _trace(name: str) -> Trace:
    wl = load_workload(name)
    rate = wl.operating_points[0] if wl.operating_points else 0.1
    return generate_trace(list(wl.workflows), rate, TASKS, SEED, name=name)


def _upper(d: Dist) -> float:
    """The largest value a distribution can draw (inf if unbounded)."""
    if d.kind == "fixed":
        return d.value
    if d.kind == "choice":
        return max(d.values)
    return math.inf if d.high is None else float(d.high)


def _worst_request(wf: Workflow) -> float:
    """Largest prefix + input + output any sample can produce (trace.sample_task's rules)."""
    out_max: dict[str, float] = {}
    worst = 0.0
    for v in wf.topo_order:
        p = wf.stages[v].profile
        rounds = max(1, round(_upper(p.rounds)))
        base = max(1.0, _upper(p.input_tokens))
        if p.history == "parents":
            base += sum(out_max[u] for u in wf.preds[v])
        elif p.history == "ancestors":
            base += sum(out_max[u] for u in nx.ancestors(wf.graph, v))
        out = max(1.0, _upper(p.output_tokens))
        step = out + max(0.0, _upper(p.observation_tokens))
        carried = (rounds - 1) * step if p.carry_rounds else 0.0
        worst = max(worst, wf.prefix_tokens(v) + base + carried + out)
        out_max[v] = rounds * out
    return worst


def test_default_profile_budget_is_the_one_the_notes_assume() -> None:
    assert get_profile(DEFAULT_PROFILE).budget_tokens == BUDGET


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_trace_fits_the_kv_budget(name: str) -> None:
    trace = _trace(name)
    assert len(trace.tasks) == TASKS
    trace.check_fits(BUDGET)


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_workload_has_notes_and_increasing_operating_points(name: str) -> None:
    wl = load_workload(name)
    assert wl.notes.strip(), f"{name}: the notes must document the chosen numbers"
    points = list(wl.operating_points)
    assert points and points == sorted(points) and all(r > 0 for r in points)
    if name in TOTALS:
        assert len(points) == 3  # light, medium, heavy contention


@pytest.mark.parametrize("name", sorted(WORST_CASE))
def test_metagpt_worst_case_request_is_bounded(name: str) -> None:
    (wf,) = load_workload(name).workflows
    worst = _worst_request(wf)
    assert worst == pytest.approx(WORST_CASE[name], abs=1)
    assert worst <= 15_000 < BUDGET


@pytest.mark.parametrize("name", sorted(TOTALS))
def test_metagpt_per_task_totals_match_notes(name: str) -> None:
    trace = _trace(name)
    (wf,) = trace.workflows.values()
    prompt = completion = 0
    for task in trace.tasks:
        for stage, rounds in task.stages.items():
            prefix = wf.prefix_tokens(stage)
            prompt += sum(prefix + r.input_tokens for r in rounds)
            completion += sum(r.output_tokens for r in rounds)
    lo, hi = TOTALS[name]["prompt"]
    assert lo <= prompt / TASKS <= hi
    lo, hi = TOTALS[name]["completion"]
    assert lo <= completion / TASKS <= hi


def test_metagpt_tl_shape_and_ablation_rate() -> None:
    wl = load_workload("metagpt-tl")
    (wf,) = wl.workflows
    assert 0.0175 in wl.operating_points
    agents = [wf.stages[v].agent for v in wf.topo_order]
    assert agents == ["TeamLeader", "ProductManager", "TeamLeader", "Architect", "TeamLeader",
                      "ProjectManager", "TeamLeader", "Engineer", "TeamLeader"]
    assert wf.is_chain


def test_metagpt_sop_shape() -> None:
    (wf,) = load_workload("metagpt-sop").workflows
    agents = [wf.stages[v].agent for v in wf.topo_order]
    assert agents == ["ProductManager", "Architect", "ProjectManager", "Engineer",
                      "CodeReviewer", "QaEngineer"]
    assert wf.is_chain


def test_builtin_workloads_load_once_and_name_every_workflow() -> None:
    """Start-up reads the built-ins twice (the name-clash check and the
    service's registry): both get the same objects, parsed once."""
    assert all(load_workload(name) is load_workload(name) for name in BUILTIN)
    names = builtin_workflows()
    assert set(names) == {wf.name for w in BUILTIN for wf in load_workload(w).workflows}
    for name, (workload, wf) in names.items():
        assert wf in load_workload(workload).workflows and wf.name == name
    with pytest.raises(TypeError):
        names["chain3"] = names["dag4"]  # type: ignore[index]
