"""Built-in workloads of the paper (section V-A), sized in `builtin/*.yaml`."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from topasd.model import TopasError, Workflow, WorkflowError
from workflows.spec import agent_clash, spec_dict, workflow_from_dict

BUILTIN = ("table1", "chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")  # a name ending so is a file, not a workload


@dataclass(frozen=True)
class Workload:
    """One or more workflows; tasks cycle through them in order."""

    name: str
    workflows: tuple[Workflow, ...]
    operating_points: tuple[float, ...]
    notes: str = ""
    description: str = ""


def _spec_path(name: str) -> Path:
    return Path(str(resources.files("workflows") / "builtin" / f"{name}.yaml"))


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name (loaded once per process), or a spec file by path."""
    if name_or_path in BUILTIN:
        return _builtin_workload(name_or_path)
    if Path(name_or_path).exists():
        path = Path(name_or_path)
    elif Path(name_or_path).suffix in SPEC_SUFFIXES or os.sep in name_or_path:
        raise TopasError(f"workflow spec file {name_or_path!r} does not exist: check the path, "
                         f"or use a built-in workload ({', '.join(BUILTIN)})")
    else:
        raise TopasError(f"unknown workload {name_or_path!r}: use one of {', '.join(BUILTIN)} "
                         "or the path of a workflow spec file")
    return _from_file(path)


@functools.cache
def _builtin_workload(name: str) -> Workload:
    return _from_file(_spec_path(name))


def _from_file(path: Path) -> Workload:
    return workload_from_dict(spec_dict(path), str(path))


@functools.cache
def builtin_workflows() -> Mapping[str, tuple[str, Workflow]]:
    """Workflow name -> (the built-in workload that defines it, the workflow)."""
    return MappingProxyType({wf.name: (w, wf) for w in BUILTIN
                             for wf in load_workload(w).workflows})


MULTI_KEYS = ("name", "description", "notes", "operating_points", "workflows")


def workload_from_dict(data: dict[str, Any], where: str) -> Workload:
    """A workload spec: one workflow spec, or `workflows:` (a list of them) with
    a name; both may give `operating_points` (arrival rates, task/s)."""
    points = _operating_points(data.get("operating_points", ()), where)
    if "workflows" not in data:
        wf = workflow_from_dict(data, where)
        return Workload(wf.name, (wf,), points, data.get("notes", ""), wf.description)
    unknown = sorted(set(data) - set(MULTI_KEYS))
    if unknown:
        raise WorkflowError(f"{where}: unknown key(s) {unknown}; a workload of several "
                            f"workflows takes {', '.join(MULTI_KEYS)}")
    name, items = data.get("name"), data["workflows"]
    if not isinstance(name, str) or not name:
        raise WorkflowError(f"{where}: a workload of several workflows needs a name")
    if not isinstance(items, list) or not items:
        raise WorkflowError(f"{where}: workflows must be a non-empty list of workflow specs")
    wfs = tuple(workflow_from_dict(w, f"{where}, workflows[{i}]") for i, w in enumerate(items))
    names = [wf.name for wf in wfs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise WorkflowError(f"{where}: workflow name(s) {twice} used twice; give each workflow "
                            "its own name")
    _check_agents(wfs, where)
    return Workload(name, wfs, points, str(data.get("notes", "")),
                    str(data.get("description", "")))


def _check_agents(wfs: tuple[Workflow, ...], where: str) -> None:
    """Workflows that share an agent name must agree on its prefix size."""
    seen: dict[str, tuple[int, str]] = {}
    for i, wf in enumerate(wfs):
        clash = agent_clash(wf, seen)
        if clash:
            raise WorkflowError(f"{where}, workflows[{i}]: {clash}")
        for agent in wf.agents.values():
            seen.setdefault(agent.name, (agent.prefix_tokens, f"workflow {wf.name!r}"))


def _operating_points(points: Any, where: str) -> tuple[float, ...]:
    ok = isinstance(points, (list, tuple)) and all(
        isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r > 0
        for r in points)
    if not ok:
        raise WorkflowError(f"{where}: operating_points must be a list of arrival rates "
                            f"(finite numbers > 0, task/s), got {points!r}")
    return tuple(float(r) for r in points)
