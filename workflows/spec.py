"""The workflow spec: a documented YAML/JSON shape parsed into `topasd.model.Workflow`.

    name: chain3
    description: A -> B -> C
    agents:
      A: {prefix_tokens: 4000}
    stages:
      - name: a
        agent: A
        after: []              # predecessor stages
        rounds: 1              # LLM rounds (ReAct iterations) per stage
        input_tokens: 256      # dynamic input of the first round (beyond the prefix)
        output_tokens: 300     # generated tokens per round
        tool_wait_s: 0         # tool wait between rounds
        observation_tokens: 0  # tool output appended per round
        history: none          # none | parents | ancestors: upstream outputs carried in
        carry_rounds: true     # later rounds carry earlier rounds' outputs
        wait_before_s: 0       # wait before the stage's first round (trace version 2)
        branches: 1            # parallel copies per task, a map (trace version 2)
        summary_tokens: ...    # each carried upstream output summarized (version 2)
        share_history: false   # the carried history is shared task context (version 2)
        share_rounds: false    # each round's conversation so far is kept as context (v2)
    operating_points: [0.1, 0.15, 0.2]   # arrival rates (task/s) for benchmarks

A number is a fixed value; a distribution is one of
`{uniform: [lo, hi]}`, `{uniform_int: [lo, hi]}`, `{choice: [...]}`,
`{lognormal: {median: m, sigma: s, low: lo, high: hi}}`,
`{exponential: {mean: m, low: lo, high: hi}}`. Every value a stage
field can take must make sense: rounds and branches 1-10,000, input,
observation and summary tokens >= 0, output tokens >= 1, waits 0 to
`MAX_TIME_S` (a lognormal or exponential is bounded by its clip). An agent
is one cached prefix: workflows that share an agent name must give it the
same `prefix_tokens` (`agent_clash`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from topasd.model import (
    DIST_KINDS,
    HISTORY_MODES,
    Agent,
    Dist,
    Stage,
    StageProfile,
    Workflow,
    WorkflowError,
)

DistSpec = float | int | dict[str, Any]
MAX_ROUNDS = 10_000  # LLM rounds of one stage
MAX_BRANCHES = 10_000  # parallel copies of one stage in one task
MAX_TOKENS = 10_000_000  # tokens of one round's input, output or observation
# Bound on arrival times and tool waits, s (~32 years). Beyond ~1e16 s adding an
# engine step to the clock changes nothing (a replay never ends) and well before
# that times lose the resolution a step needs; 1e9 s keeps it below 1e-6 s.
MAX_TIME_S = 1e9


def parse_dist(spec: DistSpec, where: str,
               bounds: tuple[float, float] = (-math.inf, math.inf), whole: bool = False
               ) -> Dist:
    """Turn a number or a one-key mapping into a `Dist`, naming `where` on error;
    every value it can take must lie within `bounds` (and, with `whole`, a fixed
    value or choice must be a whole number: a count)."""
    dist = _parse_dist(spec, where)
    given = (dist.mean(),) if dist.kind == "fixed" else dist.values or ()
    if whole and any(not float(v).is_integer() for v in given):
        raise WorkflowError(f"{where}: {spec!r} is not a whole number; counts are whole "
                            "(a distribution such as lognormal rounds its draws)")
    lo, hi = _support(dist)
    if not (bounds[0] <= lo and hi <= bounds[1]) or math.isnan(lo) or math.isnan(hi):
        clip = (f"; give the {dist.kind} clips within the range (low: {bounds[0]:g}, high: at "
                f"most {bounds[1]:g})" if dist.kind in ("lognormal", "exponential") else "")
        raise WorkflowError(f"{where}: values must lie in [{bounds[0]:g}, {bounds[1]:g}], "
                            f"but {json.dumps(spec)} reaches [{lo:g}, {hi:g}]{clip}")
    return dist


def _support(dist: Dist) -> tuple[float, float]:
    """The least and largest value `dist` can give (a clip bounds a lognormal)."""
    if dist.kind == "fixed":
        return dist.mean(), dist.mean()
    if dist.kind == "choice":
        return min(dist.values), max(dist.values)
    if dist.kind in ("lognormal", "exponential"):
        lo = 0.0 if dist.low is None else max(dist.low, 0.0)
        return lo, math.inf if dist.high is None else dist.high
    return float(dist.low), float(dist.high)  # type: ignore[arg-type]


def _parse_dist(spec: DistSpec, where: str) -> Dist:
    try:
        if isinstance(spec, bool):
            raise WorkflowError("a boolean is not a distribution")
        if isinstance(spec, (int, float)):
            return Dist.fixed(spec)
        if not isinstance(spec, dict) or len(spec) != 1:
            got = (f"the text {spec!r} (write it without quotes)" if isinstance(spec, str)
                   else json.dumps(spec, default=str))
            raise WorkflowError("expected a number or a mapping with exactly one kind key "
                                f"({', '.join(DIST_KINDS)}), got {got}")
        (kind, arg), = spec.items()
        if kind == "fixed":
            return Dist.fixed(float(arg))
        if kind in ("uniform", "uniform_int"):
            low, high = arg
            return Dist(kind, low=float(low), high=float(high))
        if kind == "choice":
            return Dist("choice", values=tuple(float(v) for v in arg))
        if kind == "lognormal":
            return Dist("lognormal", median=float(arg["median"]), sigma=float(arg["sigma"]),
                        low=_opt(arg.get("low")), high=_opt(arg.get("high")))
        if kind == "exponential":
            _only_keys(arg, ("mean", "low", "high"))
            return Dist("exponential", scale=float(arg["mean"]), low=_opt(arg.get("low")),
                        high=_opt(arg.get("high")))
        raise WorkflowError(f"unknown distribution kind {kind!r}")
    except WorkflowError as exc:
        raise WorkflowError(f"{where}: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise WorkflowError(f"{where}: malformed distribution {spec!r} ({exc})") from None


def _only_keys(arg: Any, keys: tuple[str, ...]) -> None:
    """A distribution's parameters: a mapping of only `keys`."""
    if not isinstance(arg, dict):
        raise WorkflowError(f"expected a mapping of {', '.join(keys)}, got {json.dumps(arg)}")
    unknown = sorted(set(arg) - set(keys))
    if unknown:
        raise WorkflowError(f"unknown parameter(s) {unknown}; give {', '.join(keys)}")


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def _no_bool(v: Any) -> Any:
    """JSON/YAML true and false are not numbers (Python would take them as 1 and 0)."""
    if isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v)):
        raise ValueError(f"expected numbers, got {json.dumps(v)}; true and false are not "
                         "numbers")
    return v


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix_tokens: int = Field(ge=0, le=MAX_TOKENS)  # more could take the engine forever

    @field_validator("prefix_tokens", mode="before")
    @classmethod
    def _prefix_not_bool(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(f"expected a whole number of tokens, got the text {v!r} (write "
                             "it without quotes)")
        return _no_bool(v)


class StageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    agent: str = Field(min_length=1)
    after: list[str] = Field(default_factory=list)
    # Distributions stay raw here: parse_dist validates them and names the place.
    rounds: Any = 1
    input_tokens: Any = 256
    output_tokens: Any = 256
    tool_wait_s: Any = 0
    observation_tokens: Any = 0
    history: str = "none"
    carry_rounds: bool = True
    wait_before_s: Any = 0
    branches: Any = 1
    summary_tokens: Any = None
    share_history: bool = False
    share_rounds: bool = False

    @field_validator("history")
    @classmethod
    def _history(cls, v: str) -> str:
        if v not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}")
        return v


class WorkflowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    description: str = ""
    notes: str = ""
    agents: dict[str, AgentSpec]
    stages: list[StageSpec] = Field(min_length=1)
    operating_points: list[float] = Field(default_factory=list)

    @field_validator("operating_points", mode="before")
    @classmethod
    def _points_not_bool(cls, v: Any) -> Any:
        return _no_bool(v)


def _plain(msg: str) -> str:
    """Pydantic's message without this module's class names ("a valid
    dictionary or instance of StageSpec" -> "a valid mapping")."""
    return re.sub(r"a valid dictionary or instance of \w+", "a mapping (key: value)", msg)


def workflow_from_dict(data: dict[str, Any], where: str = "") -> Workflow:
    """Validate a spec mapping and build the `Workflow` (acyclic, agents known);
    errors read `WHERE: workflow 'NAME', stage 'S', FIELD: ...`."""
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {_plain(e['msg'])}"
            for e in exc.errors()
        )
        raise WorkflowError(f"{where}: {problems}" if where else problems) from None
    source = where
    where = f"{where}: workflow {spec.name!r}" if where else f"workflow {spec.name!r}"
    seen: set[str] = set()
    stages: dict[str, Stage] = {}
    for s in spec.stages:
        if s.name in seen:
            raise WorkflowError(f"{where}: stage {s.name!r} is defined twice; rename one")
        seen.add(s.name)
        at = f"{where}, stage {s.name!r}"
        profile = StageProfile(
            rounds=parse_dist(s.rounds, f"{at}, rounds", (1, MAX_ROUNDS), whole=True),
            input_tokens=parse_dist(s.input_tokens, f"{at}, input_tokens", (0, MAX_TOKENS),
                                    whole=True),
            output_tokens=parse_dist(s.output_tokens, f"{at}, output_tokens", (1, MAX_TOKENS),
                                     whole=True),
            tool_wait_s=parse_dist(s.tool_wait_s, f"{at}, tool_wait_s", (0, MAX_TIME_S)),
            observation_tokens=parse_dist(s.observation_tokens, f"{at}, observation_tokens",
                                          (0, MAX_TOKENS), whole=True),
            history=s.history,
            carry_rounds=s.carry_rounds,
            wait_before_s=parse_dist(s.wait_before_s, f"{at}, wait_before_s", (0, MAX_TIME_S)),
            branches=parse_dist(s.branches, f"{at}, branches", (1, MAX_BRANCHES), whole=True),
            summary_tokens=None if s.summary_tokens is None else parse_dist(
                s.summary_tokens, f"{at}, summary_tokens", (0, MAX_TOKENS), whole=True),
            share_history=s.share_history,
            share_rounds=s.share_rounds,
        )
        stages[s.name] = Stage(s.name, s.agent, tuple(s.after), profile)
    agents = {name: Agent(name, a.prefix_tokens) for name, a in spec.agents.items()}
    try:
        return Workflow(spec.name, agents, stages, spec.description)
    except WorkflowError as exc:  # a cycle, an unknown agent or predecessor: name the file
        raise WorkflowError(f"{source}: {exc}" if source else str(exc)) from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading numbers as YAML 1.2 and JSON do: `1e3` and
    `1.5e12` are numbers (YAML 1.1 needs a dot and a sign: `1.0e+3`)."""


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's complaint in one line, at its line and column of the file."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = ": ".join(x for x in (exc.context, exc.problem) if x)
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return " ".join(str(exc).split())


def spec_dict(path_or_name: str | Path) -> dict[str, Any]:
    """Read a spec file (YAML or JSON) as a mapping."""
    path = Path(path_or_name)
    try:
        text = path.read_text(encoding="utf-8")
        if _looks_like_trace(text):
            raise WorkflowError(f"{path}: this looks like a trace (JSON Lines with a header), "
                                "not a workflow spec; pass it as TRACE_FILE (`topasd replay "
                                f"{path}`), not --workload")
        data = yaml.load(text, Loader=_SpecLoader)
    except RecursionError:
        raise WorkflowError(f"{path}: nested too deeply to read; flatten the spec") from None
    except OSError as exc:
        raise WorkflowError(f"cannot read workflow spec {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WorkflowError(f"{path}: not UTF-8 text (byte {exc.start}); a spec is YAML or "
                            "JSON in UTF-8") from None
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{path}: not valid YAML/JSON ({_yaml_problem(exc)})") from None
    if not isinstance(data, dict):
        raise WorkflowError(f"{path}: a workflow spec must be a mapping")
    return data


def _looks_like_trace(text: str) -> bool:
    """Whether the first line is a trace record (a JSON object with a trace `type`)."""
    first = text.lstrip("\ufeff \t\r\n").split("\n", 1)[0]
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(rec, dict) and rec.get("type") in ("header", "workflow", "task")


def agent_clash(wf: Workflow, seen: Mapping[str, tuple[int, str]]) -> str | None:
    """Why `wf` cannot run beside workflows whose agents have the sizes `seen`
    (agent -> (prefix_tokens, where that size was given)), or None."""
    for agent in wf.agents.values():
        size, other = seen.get(agent.name, (agent.prefix_tokens, ""))
        if size != agent.prefix_tokens:
            return (f"agent {agent.name!r} has prefix_tokens {agent.prefix_tokens} in workflow "
                    f"{wf.name!r} but {size} in {other}; an agent is one cached prefix "
                    "shared by every workflow, so give it one size or rename it in one "
                    "workflow")
    return None


def load_workflow(path: str | Path) -> Workflow:
    return workflow_from_dict(spec_dict(path), where=str(path))


def workflow_to_dict(wf: Workflow) -> dict[str, Any]:
    """The inverse of `workflow_from_dict` (used to embed workflows in traces)."""
    return {
        "name": wf.name,
        "description": wf.description,
        "agents": {a.name: {"prefix_tokens": a.prefix_tokens} for a in wf.agents.values()},
        "stages": [_stage_dict(s) for s in wf.stages.values()],
    }


def _stage_dict(s: Stage) -> dict[str, Any]:
    p = s.profile
    return {
        "name": s.name,
        "agent": s.agent,
        "after": list(s.after),
        "rounds": dist_to_spec(p.rounds),
        "input_tokens": dist_to_spec(p.input_tokens),
        "output_tokens": dist_to_spec(p.output_tokens),
        "tool_wait_s": dist_to_spec(p.tool_wait_s),
        "observation_tokens": dist_to_spec(p.observation_tokens),
        "history": p.history,
        "carry_rounds": p.carry_rounds,
        **{key: dist_to_spec(d) for key, d in newer_profile_fields(p).items()},
        **({"share_history": True} if p.share_history else {}),
        **({"share_rounds": True} if p.share_rounds else {}),
    }


def newer_profile_fields(p: StageProfile) -> dict[str, Dist]:
    """The stage keys of trace version 2 that `p` sets (`wait_before_s`,
    `branches`, `summary_tokens`, when not their defaults)."""
    given = {"wait_before_s": p.wait_before_s, "branches": p.branches,
             "summary_tokens": p.summary_tokens}
    default = StageProfile()
    return {k: d for k, d in given.items()
            if d is not None and d != getattr(default, k)}


def newer_features(wf: Workflow) -> list[str]:
    """What in `wf` a version-1 trace cannot say: a version-2 stage key, or an
    exponential distribution ("stage 'b': branches", "stage 'b', tool_wait_s:
    exponential")."""
    found = []
    for s in wf.stages.values():
        p = s.profile
        found += [f"stage {s.name!r}: {k}" for k in newer_profile_fields(p)]
        found += [f"stage {s.name!r}: {k}" for k in ("share_history", "share_rounds")
                  if getattr(p, k)]
        found += [f"stage {s.name!r}, {k}: exponential" for k in DIST_FIELDS
                  if getattr(p, k).kind == "exponential"]
    return found


DIST_FIELDS = ("rounds", "input_tokens", "output_tokens", "tool_wait_s", "observation_tokens")


def dist_to_spec(d: Dist) -> DistSpec:
    if d.kind == "fixed":
        return int(d.value) if float(d.value).is_integer() else d.value
    if d.kind in ("uniform", "uniform_int"):
        return {d.kind: [d.low, d.high]}
    if d.kind == "choice":
        return {"choice": list(d.values)}
    body: dict[str, Any] = ({"mean": d.scale} if d.kind == "exponential" else
                            {"median": d.median, "sigma": d.sigma})
    if d.low is not None:
        body["low"] = d.low
    if d.high is not None:
        body["high"] = d.high
    return {d.kind: body}
