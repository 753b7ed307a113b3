"""Built-in workloads of the paper (section V-A), sized in `builtin/*.yaml`."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from topasd.model import TopasError, Workflow
from workflows.spec import spec_dict, workflow_from_dict

BUILTIN = ("table1", "chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")


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
    """A built-in workload by name, or a spec file by path."""
    if name_or_path in BUILTIN:
        path = _spec_path(name_or_path)
    elif Path(name_or_path).exists():
        path = Path(name_or_path)
    else:
        raise TopasError(f"unknown workload {name_or_path!r}: use one of {', '.join(BUILTIN)} "
                         "or the path of a workflow spec file")
    data = spec_dict(path)
    return workload_from_dict(data, str(path))


def workload_from_dict(data: dict[str, Any], where: str) -> Workload:
    points = tuple(float(r) for r in data.get("operating_points", ()))
    if "workflows" in data:
        wfs = tuple(workflow_from_dict(w, where) for w in data["workflows"])
        return Workload(data["name"], wfs, points, data.get("notes", ""),
                        data.get("description", ""))
    wf = workflow_from_dict(data, where)
    return Workload(wf.name, (wf,), points, data.get("notes", ""), wf.description)
