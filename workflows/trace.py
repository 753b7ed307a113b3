"""Workload traces: JSON Lines, versioned (see docs/trace-format.md).

A trace fully determines the work: the workflow definitions, then one record
per task arrival holding every stage's sampled rounds (input tokens, output
tokens, tool wait after the round).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from topasd.model import StageProfile, TopasError, Workflow, WorkflowError, is_int64
from workflows.lines import DEFAULT_MAX_LINE_BYTES, parse_file
from workflows.spec import (
    MAX_BRANCHES,
    MAX_TIME_S,
    MAX_TOKENS,
    agent_clash,
    newer_features,
    workflow_from_dict,
    workflow_to_dict,
)

TRACE_FORMAT = "topasd-trace"
TRACE_VERSION = 2  # the newest version this topasd reads and writes
TRACE_VERSIONS = (1, 2)  # what it reads; it writes the lowest that can say the trace


class TraceError(TopasError):
    """A trace is malformed; the message names the line and the problem."""


@dataclass(frozen=True, slots=True)
class RoundSpec:
    """One LLM round of a stage: dynamic input, exact output, tool wait after it,
    and which of the stage's parallel branches it belongs to (0 for most)."""

    input_tokens: int
    output_tokens: int
    tool_wait_s: float = 0.0
    branch: int = 0
    shared: tuple[str, ...] = ()  # the task's context segments its input starts with


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task: every stage's rounds (of all its branches, branch by branch in
    order), the waits before stages (`waits`: stage -> s; absent: none) and
    its shared context (`context`: segment name -> tokens; rounds name the
    segments their input starts with)."""

    id: int
    workflow: str
    arrival: float
    stages: Mapping[str, tuple[RoundSpec, ...]]
    line: int | None = field(default=None, compare=False)  # where a trace file had it
    waits: Mapping[str, float] = field(default_factory=dict)
    context: Mapping[str, int] = field(default_factory=dict)

    def branches(self, stage: str) -> tuple[tuple[RoundSpec, ...], ...]:
        """The rounds of each of `stage`'s branches, in branch order."""
        return branches_of(self.stages[stage])

    def oversized_round(self, wf: Workflow, limit: int) -> str | None:
        """The first round whose prefix + input + output exceeds `limit` tokens,
        as "stage S, round k: needs N KV tokens (prefix + input + output)", or None."""
        for stage, rounds in self.stages.items():
            prefix = wf.prefix_tokens(stage)
            for k, r in enumerate(rounds):
                need = prefix + r.input_tokens + r.output_tokens
                if need > limit:
                    return (f"stage {stage!r}, round {k}: needs {need} KV tokens (prefix "
                            f"{prefix} + input {r.input_tokens} + output {r.output_tokens})")
        return None


@dataclass(frozen=True)
class Trace:
    workflows: Mapping[str, Workflow]
    tasks: tuple[TaskRecord, ...]
    meta: Mapping[str, Any]
    source: str = field(default="", compare=False)  # the file it was read from

    def check_fits(self, budget_tokens: int,
                   context: tuple[int, str] | None = None) -> None:
        """Every request (prefix + input + output) must fit the KV budget alone,
        and an engine's context (`context`: its length in tokens, and the fix)."""
        limit, what, fix = budget_tokens, f"the KV budget is {budget_tokens}", (
            "give a larger --budget (or a profile with a larger one) or shorten the request")
        if context is not None and context[0] < budget_tokens:
            limit, what, fix = context[0], f"the engine's context is {context[0]}", context[1]
        for task in self.tasks:
            problem = task.oversized_round(self.workflows[task.workflow], limit)
            if problem is None:
                continue
            if task.line is not None:  # read from a trace file
                raise TraceError(f"{self.source}:{task.line}: task {task.id}, {problem} but "
                                 f"{what}; {fix}")
            raise TraceError(  # sampled from a workload's stage distributions
                f"workload {self.meta.get('workload', '?')!r}, workflow {task.workflow!r}: "
                f"sampled task {task.id}, {problem} but {what}; {fix}, or lower the stage's "
                "sizes (a prefix, or a distribution's high clip)")


# --------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------


def branches_of(rounds: Sequence[RoundSpec]) -> tuple[tuple[RoundSpec, ...], ...]:
    """Rounds grouped by branch (the rounds of a branch are consecutive)."""
    return tuple(tuple(group) for _, group in itertools.groupby(rounds, lambda r: r.branch))


def sample_task(wf: Workflow, task_id: int, arrival: float,
                rng: np.random.Generator) -> TaskRecord:
    """Draw every stage's rounds from the workflow's stage profiles. A profile
    field left at its default draws nothing, so the version-2 fields leave the
    draws of a version-1 workflow as they were."""
    outputs: dict[str, int] = {}
    stages: dict[str, tuple[RoundSpec, ...]] = {}
    waits: dict[str, float] = {}
    context: dict[str, int] = {}
    ancestors = {v: _ancestors(wf, v) for v in wf.stages}
    for i, v in enumerate(wf.topo_order):
        p = wf.stages[v].profile
        wait = round(max(0.0, p.wait_before_s.sample(rng)), 6)
        if wait:
            waits[v] = wait
        upstream = {"parents": wf.preds[v], "ancestors": ancestors[v]}.get(p.history, ())
        carried = sum(_carried(outputs[u], p, rng) for u in upstream)
        name = v if re.fullmatch(r"[A-Za-z0-9_.:-]{1,150}", v) else f"stage{i}"
        shared = (f"{name}.history",) if p.share_history and carried else ()
        if shared:
            context[shared[0]] = carried
        n_branches = max(1, round(p.branches.sample(rng)))
        branches = [_sample_branch(p, b, carried, rng, shared) for b in range(n_branches)]
        if p.share_rounds and p.carry_rounds:
            branches = [name_rounds(rounds, f"{name}.{b}", context)
                        for b, rounds in enumerate(branches)]
        stages[v] = tuple(r for rounds in branches for r in rounds)
        outputs[v] = sum(r.output_tokens for r in stages[v])
    return TaskRecord(task_id, wf.name, arrival, stages, waits=waits, context=context)


def _carried(output: int, p: StageProfile, rng: np.random.Generator) -> int:
    """What an upstream stage's `output` tokens add to a stage's input: all of
    them, or a summary of `summary_tokens` (at most the output)."""
    if p.summary_tokens is None:
        return output
    return min(output, max(0, round(p.summary_tokens.sample(rng))))


def _sample_branch(p: StageProfile, branch: int, upstream: int, rng: np.random.Generator,
                   shared: tuple[str, ...] = ()) -> list[RoundSpec]:
    """One branch's rounds: the `upstream` history (the `shared` segment, if
    named) plus a first input of its own, later rounds carrying the earlier
    ones (`carry_rounds`)."""
    n_rounds = max(1, round(p.rounds.sample(rng)))
    base = max(1, round(p.input_tokens.sample(rng))) + upstream
    carried = 0
    rounds = []
    for k in range(n_rounds):
        out = max(1, round(p.output_tokens.sample(rng)))
        wait = max(0.0, p.tool_wait_s.sample(rng)) if k < n_rounds - 1 else 0.0
        rounds.append(RoundSpec(base + carried, out, round(wait, 6), branch, shared))
        if p.carry_rounds:
            carried += out + max(0, round(p.observation_tokens.sample(rng)))
    return rounds


def name_rounds(rounds: list[RoundSpec], name: str,
                 context: dict[str, int]) -> list[RoundSpec]:
    """A branch's rounds with the conversation named (`share_rounds`): round k
    starts with the segments `NAME.1` ... `NAME.k`, segment j being round
    j-1's own input and output (added to `context`). Draws nothing."""
    out = [rounds[0]]
    for k in range(1, len(rounds)):
        prev = out[-1]
        seg = f"{name}.{k}"
        context[seg] = prev.input_tokens - sum(context[n] for n in prev.shared) \
            + prev.output_tokens
        out.append(dataclasses.replace(rounds[k], shared=(*prev.shared, seg)))
    return out


def _ancestors(wf: Workflow, v: str) -> tuple[str, ...]:
    import networkx as nx

    return tuple(sorted(nx.ancestors(wf.graph, v)))


def check_rate(rate: float, n_tasks: int) -> None:
    """Refuse an arrival rate that is not > 0 or whose `n_tasks` arrivals would be
    expected to span more than `MAX_TIME_S`."""
    if not (math.isfinite(rate) and rate > 0):
        raise TopasError(f"arrival rate must be a finite number > 0 task/s, got {rate}")
    gaps = max(n_tasks - 1, 1)
    if gaps / rate > MAX_TIME_S:
        raise TopasError(f"arrival rate {rate:g} task/s spreads {n_tasks} task(s) over "
                         f"~{gaps / rate:.3g} s, beyond the {MAX_TIME_S:g} s bound on arrival "
                         f"times; give a --rate of at least {gaps / MAX_TIME_S:.3g} task/s")


ARRIVAL_CHUNK = 1 << 16  # gaps drawn at once while `trace_tasks` skips them


def trace_tasks(workflows: Sequence[Workflow], rate: float, n_tasks: int,
                seed: int) -> Iterator[TaskRecord]:
    """The tasks of a Poisson arrival trace, one at a time in O(1) memory (the
    daemon's built-in driver plays them; `generate_trace` keeps them): `n_tasks`
    arrivals of `rate` tasks/s, the first at 0, rounded to the microsecond,
    cycling through `workflows`. The seed's generator draws every arrival gap,
    then every task's rounds; a second generator, advanced past the gaps,
    samples the tasks while the first yields the gaps."""
    if n_tasks < 1:
        raise TopasError(f"--tasks must be at least 1, got {n_tasks}")
    check_rate(rate, n_tasks)
    gaps, draws = np.random.default_rng(seed), np.random.default_rng(seed)
    last = np.zeros(1)  # the last arrival, summed in the order the arrivals are
    for first in range(0, n_tasks, ARRIVAL_CHUNK):
        chunk = draws.exponential(1.0 / rate, size=min(n_tasks - first, ARRIVAL_CHUNK))
        if first == 0:
            chunk[0] = 0.0
        last = np.cumsum(np.concatenate((last, chunk)))[-1:]
    if np.round(last[0], 6) > MAX_TIME_S:
        raise TopasError(f"arrival rate {rate:g} task/s put the last of {n_tasks} arrivals at "
                         f"{last[0]:.3g} s, beyond the {MAX_TIME_S:g} s bound on arrival "
                         "times; raise --rate or lower --tasks")
    t = 0.0
    for i in range(n_tasks):
        gap = gaps.exponential(1.0 / rate)
        t = t + gap if i else 0.0
        yield sample_task(workflows[i % len(workflows)], i, float(np.round(t, 6)), draws)


def generate_trace(workflows: Sequence[Workflow], rate: float, n_tasks: int, seed: int,
                   name: str | None = None,
                   progress: Callable[[int], None] | None = None) -> Trace:
    """A Poisson arrival trace of `n_tasks` tasks cycling through `workflows`
    (`trace_tasks`); `progress(k)` hears of every 1,000th task sampled."""
    tasks_: list[TaskRecord] = []
    for task in trace_tasks(workflows, rate, n_tasks, seed):
        tasks_.append(task)
        if progress is not None and len(tasks_) % 1000 == 0:
            progress(len(tasks_))
    tasks = tuple(tasks_)
    meta = {"workload": name or workflows[0].name, "rate": rate, "tasks": n_tasks, "seed": seed}
    return Trace({wf.name: wf for wf in workflows}, tasks, meta)


# --------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------


def trace_version(trace: Trace) -> int:
    """The lowest version that can say `trace`: 2 if a workflow uses a
    version-2 spec feature or a task a wait before a stage or branches, else 1."""
    newer = any(newer_features(wf) for wf in trace.workflows.values()) or any(
        task.waits or task.context
        or any(r.branch for rounds in task.stages.values() for r in rounds)
        for task in trace.tasks)
    return 2 if newer else 1


def write_trace(trace: Trace, out: TextIO) -> None:
    header = {"type": "header", "format": TRACE_FORMAT, "version": trace_version(trace),
              **trace.meta}
    out.write(json.dumps(header) + "\n")
    for wf in trace.workflows.values():
        out.write(json.dumps({"type": "workflow", "spec": workflow_to_dict(wf)}) + "\n")
    for task in trace.tasks:
        out.write(json.dumps(task_to_dict(task), separators=(",", ":")) + "\n")


def task_to_dict(task: TaskRecord) -> dict[str, Any]:
    out = {
        "type": "task",
        "id": task.id,
        "workflow": task.workflow,
        "arrival": task.arrival,
        "stages": {v: _stage_to_json(task, v) for v in task.stages},
    }
    return out | {"context": dict(task.context)} if task.context else out


def _round_to_json(r: RoundSpec) -> list[Any]:
    """[input, output, wait], and (version 2) the shared segments it names."""
    row: list[Any] = [r.input_tokens, r.output_tokens, r.tool_wait_s]
    return [*row, list(r.shared)] if r.shared else row


def _stage_to_json(task: TaskRecord, stage: str) -> list[list[Any]] | dict[str, Any]:
    """A stage of a task line: its rounds (version 1), or, with a wait before it
    or several branches, `{"wait_before_s": w, "rounds" | "branches": ...}`."""
    branches = [[_round_to_json(r) for r in rounds] for rounds in task.branches(stage)]
    wait = task.waits.get(stage, 0.0)
    if wait == 0 and len(branches) == 1:
        return branches[0]
    body: dict[str, Any] = {"wait_before_s": wait} if wait else {}
    return body | ({"rounds": branches[0]} if len(branches) == 1 else {"branches": branches})


def save_trace(trace: Trace, path: str | Path) -> None:
    try:
        with open(path, "w") as fh:
            write_trace(trace, fh)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path}: {exc.strerror}; give another -o") from None


def load_trace(path: str | Path, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Trace:
    """The trace file at `path`; `-` reads standard input (`trace gen ... -o - |`).
    A line longer than `max_line_bytes` is refused before it is read whole."""
    return parse_file(path, read_trace, TraceError, max_line_bytes)


@dataclass
class _Book:
    """What a trace reader has read so far."""

    version: int = 0  # 0: no header yet
    meta: dict[str, Any] = field(default_factory=dict)
    workflows: dict[str, Workflow] = field(default_factory=dict)
    defined_on: dict[str, int] = field(default_factory=dict)  # workflow -> its line
    agents: dict[str, tuple[int, str]] = field(default_factory=dict)  # -> (prefix, where)
    tasks: list[TaskRecord] = field(default_factory=list)
    seen_ids: dict[int, int] = field(default_factory=dict)  # task id -> its line

    def define(self, wf: Workflow, where: str, lineno: int) -> None:
        """A workflow line's workflow: named once, its agents' sizes agreeing with
        earlier workflows', and sayable in the header's version."""
        if wf.name in self.workflows:
            raise TraceError(f"{where}: workflow {wf.name!r} is defined twice (first on "
                             f"line {self.defined_on[wf.name]}); give each workflow its own "
                             "name")
        clash = agent_clash(wf, self.agents)
        if clash:
            raise TraceError(f"{where}: {clash}")
        newer = newer_features(wf)
        if newer and self.version < 2:
            raise _needs_v2(f"{where}: workflow {wf.name!r}", ", ".join(newer))
        for agent in wf.agents.values():
            self.agents.setdefault(agent.name, (agent.prefix_tokens,
                                                f"workflow {wf.name!r} (line {lineno})"))
        self.workflows[wf.name] = wf
        self.defined_on[wf.name] = lineno

    def add(self, task: TaskRecord, where: str, lineno: int) -> None:
        if task.id in self.seen_ids:
            raise TraceError(f"{where}: task id {task.id} appears twice (first on line "
                             f"{self.seen_ids[task.id]}); give each task its own id")
        self.seen_ids[task.id] = lineno
        self.tasks.append(task)


def read_trace(lines: Iterable[str], name: str = "trace") -> Trace:
    """Parse a trace; every error names `name:line` and what is wrong."""
    book = _Book()
    numbered = enumerate(lines, start=1)
    for lineno, line in numbered:
        where = f"{name}:{lineno}"
        if lineno == 1:
            line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark
        if not line.strip():
            continue
        if not book.version and line.strip() == "{":
            _refuse_multiline(line, numbered, where)
        rec = _record(line, where, name, first=not book.version)
        kind = rec["type"]
        if not book.version or kind == "header":
            book.version, book.meta = _header(rec, where, first=not book.version)
        elif kind == "workflow":
            book.define(_workflow(rec, where), where, lineno)
        elif kind == "task":
            book.add(_task(rec, where, book.workflows, lineno, book.version), where, lineno)
        else:
            raise TraceError(f"{where}: unknown record type {kind!r} "
                             "(expected header, workflow or task)")
    if not book.version:
        raise TraceError(f"{name}: empty trace (no header line)")
    if not book.tasks:
        raise TraceError(f"{name}: the trace has no task records")
    book.tasks.sort(key=lambda tk: (tk.arrival, tk.id))
    return Trace(book.workflows, tuple(book.tasks), book.meta, source=name)


# A first line that starts like YAML (a comment, `---`, `key:`) or a pretty-printed
# JSON object: a workflow spec, not JSON Lines.
_SPEC_START = re.compile(r"\s*(#|---|\{\s*$|[A-Za-z_][\w.-]*\s*:(\s|$))")
_SPEC_KEYS = {"stages", "agents", "workflows"}


def _record(line: str, where: str, name: str, first: bool) -> dict[str, Any]:
    """One line's JSON object, which must have a `type`; on the `first` line of
    content, a workflow spec is named as such."""
    spec_hint = f"{where}: {_spec_advice(name)}"
    try:
        rec = json.loads(line.rstrip("\r\n"))  # a column past the end, not 1 of the next line
    except json.JSONDecodeError as exc:
        if first and _SPEC_START.match(line):
            raise TraceError(spec_hint) from None
        raise TraceError(f"{where}: not valid JSON ({json_problem(exc)}); "
                         "is the line truncated?") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise TraceError(f"{where}: unreadable JSON number ({str(exc).split(':')[0]}); "
                         "write a smaller number") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to read; flatten the line") from None
    if not isinstance(rec, dict) or "type" not in rec:
        if first and isinstance(rec, dict) and _SPEC_KEYS & set(rec):
            raise TraceError(spec_hint)
        if first and isinstance(rec, list):
            raise TraceError(f"{where}: a trace is JSON Lines, one record object per line, "
                             "not a JSON array; write each record on its own line")
        raise TraceError(f"{where}: expected an object with a 'type' field")
    return rec


def json_problem(exc: json.JSONDecodeError) -> str:
    """The decoder's complaint and its column ("Unterminated string starting at
    column 5", not "... starting at at column 5")."""
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"


def _refuse_multiline(first: str, numbered: Iterator[tuple[int, str]], where: str) -> None:
    """A first line of just `{`: a pretty-printed trace record (say so) or a
    JSON workflow spec (the spec hint); reads on until the object closes."""
    text = first
    for _, line in itertools.islice(numbered, 10_000):
        text += line
        if line.strip().startswith("}"):
            try:
                rec = json.loads(text)
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict) and rec.get("type") in ("header", "workflow", "task"):
                raise TraceError(f"{where}: a trace is JSON Lines, one record per line, and "
                                 "this record is spread over several lines (pretty-printed); "
                                 "write each record on one line (json.dumps without indent)")
            break
    raise TraceError(f"{where}: {_spec_advice(where.rsplit(':', 1)[0])}")


def _spec_advice(name: str) -> str:
    """What to do with a workflow spec given where a trace was expected."""
    use = (f"use --workload {name}" if name not in ("-", "<stdin>") else
           "save it to a file and pass --workload FILE (--workload does not read standard "
           "input)")
    return f"this looks like a workflow spec (YAML or JSON), not a trace; {use}"


def _workflow(rec: dict[str, Any], where: str) -> Workflow:
    """A workflow line's spec; errors read `FILE:LINE: workflow 'NAME', ...`."""
    if "spec" not in rec:
        raise TraceError(f"{where}: workflow record lacks field 'spec' (a workflow spec "
                         "object: name, agents, stages; docs/trace-format.md)")
    if not isinstance(rec["spec"], dict):
        raise TraceError(f"{where}: workflow record's 'spec' must be an object (name, agents, "
                         f"stages), not {type(rec['spec']).__name__}")
    try:
        return workflow_from_dict(rec["spec"], where=where)
    except WorkflowError as exc:
        msg = str(exc)
        raise TraceError(msg if msg.startswith(f"{where}:") else f"{where}: {msg}") from None


def _header(rec: dict[str, Any], where: str, first: bool) -> tuple[int, dict[str, Any]]:
    """The header's version and its metadata."""
    if not first or rec.get("type") != "header":
        raise TraceError(f"{where}: the header must be the first line (blank lines aside) "
                         "and only there")
    if rec.get("format") != TRACE_FORMAT:
        got = "lacks \"format\"" if "format" not in rec else \
            f"has format {json.dumps(rec['format'])}"
        raise TraceError(f"{where}: not a topasd trace: the header {got}; a topasd trace's "
                         f"header has \"format\": \"{TRACE_FORMAT}\"")
    version = rec.get("version")
    if "version" not in rec:
        raise TraceError(f"{where}: the header lacks \"version\"; add \"version\": "
                         f"{TRACE_VERSION}")
    if not _is_int(version) or version not in TRACE_VERSIONS:
        raise TraceError(f"{where}: trace version {json.dumps(version)} is not supported "
                         f"(this topasd reads versions {', '.join(map(str, TRACE_VERSIONS))})")
    return version, {k: v for k, v in rec.items() if k not in ("type", "format", "version")}


def _needs_v2(where: str, what: str) -> TraceError:
    """A version-1 trace that says something only version 2 can."""
    return TraceError(f"{where}: {what} needs trace version 2, but the header says version "
                      "1; set \"version\": 2 in the header")


def _task(rec: dict[str, Any], where: str, workflows: Mapping[str, Workflow],
          lineno: int, version: int = TRACE_VERSION) -> TaskRecord:
    try:
        tid, wf_name, arrival, stages = rec["id"], rec["workflow"], rec["arrival"], rec["stages"]
    except KeyError as exc:
        raise TraceError(f"{where}: task record lacks field {exc.args[0]!r}") from None
    if not isinstance(wf_name, str):
        raise TraceError(f"{where}: task workflow must be a name (a string), got {wf_name!r}")
    if wf_name not in workflows:
        raise TraceError(f"{where}: task {tid} uses workflow {wf_name!r}, which no earlier "
                         "'workflow' line defines")
    wf = workflows[wf_name]
    if not _is_int(tid) or not is_int64(tid):
        raise TraceError(f"{where}: task id must be an integer from -2**63 to 2**63-1, got "
                         f"{json.dumps(tid)}; renumber the task")
    if not is_number(arrival) or not 0 <= arrival <= MAX_TIME_S:
        raise TraceError(f"{where}: task {tid} needs arrival a finite number >= 0 and at most "
                         f"{MAX_TIME_S:g} s (the bound on trace times), got "
                         f"{json.dumps(arrival)}")
    if not isinstance(stages, dict) or set(stages) != set(wf.stages):
        got = sorted(stages) if isinstance(stages, dict) else stages
        raise TraceError(f"{where}: task {tid} must give rounds for exactly the stages "
                         f"{sorted(wf.stages)} of {wf_name!r}, got {got}")
    parsed: dict[str, tuple[RoundSpec, ...]] = {}
    waits: dict[str, float] = {}
    context = _context(rec, f"{where}: task {tid}", version)
    for v, body in stages.items():
        at = f"{where}: task {tid}, stage {v!r}"
        if isinstance(body, dict) and version < 2:
            raise _needs_v2(at, "a stage given as an object (wait_before_s, branches)")
        parsed[v], wait = _stage(body, at) if isinstance(body, dict) else (_rounds(body, at), 0.0)
        _check_shared(parsed[v], context, at, version)
        if wait:
            waits[v] = wait
    return TaskRecord(tid, wf_name, float(arrival), parsed, line=lineno, waits=waits,
                      context=context)


_SEGMENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def _context(rec: dict[str, Any], where: str, version: int) -> dict[str, int]:
    """A task line's `context`: shared segment name -> tokens (version 2)."""
    if "context" not in rec:
        return {}
    if version < 2:
        raise _needs_v2(where, "shared task context (\"context\")")
    ctx = rec["context"]
    if not isinstance(ctx, dict) or not all(
            isinstance(k, str) and _SEGMENT_NAME.fullmatch(k) and _is_int(n)
            and 1 <= n <= MAX_TOKENS for k, n in ctx.items()):
        raise TraceError(f"{where}: context must be an object of segment name -> tokens (names "
                         f"of letters, digits and _.:-; tokens 1 to {MAX_TOKENS:g}), got "
                         f"{_shown(ctx)}")
    return dict(ctx)


def _check_shared(rounds: Sequence[RoundSpec], context: Mapping[str, int], where: str,
                  version: int) -> None:
    """The segments each round names are the task's, once each, within its input."""
    for k, r in enumerate(rounds):
        if not r.shared:
            continue
        at = f"{where}, round {k}"
        if version < 2:
            raise _needs_v2(at, "a round naming shared context")
        if unknown := [n for n in r.shared if n not in context]:
            raise TraceError(f"{at}: names shared context {unknown} that the task's "
                             f"\"context\" does not define (it has {sorted(context)})")
        if len(set(r.shared)) != len(r.shared):
            raise TraceError(f"{at}: names a shared segment twice ({list(r.shared)})")
        total = sum(context[n] for n in r.shared)
        if total > r.input_tokens:
            raise TraceError(f"{at}: its shared context {list(r.shared)} is {total} tokens, "
                             f"more than its input_tokens {r.input_tokens} (the input "
                             "includes the shared segments it names)")


STAGE_KEYS = ("wait_before_s", "rounds", "branches")


def _stage(body: dict[str, Any], where: str) -> tuple[tuple[RoundSpec, ...], float]:
    """A version-2 stage object: its rounds (of every branch) and wait before it."""
    unknown = sorted(set(body) - set(STAGE_KEYS))
    if unknown or ("rounds" in body) == ("branches" in body):
        got = f"unknown key(s) {unknown}" if unknown else f"keys {sorted(body)}"
        raise TraceError(f"{where}: a stage object takes \"rounds\" (one branch) or "
                         f"\"branches\" (a list of round lists), and optionally "
                         f"\"wait_before_s\"; got {got}")
    wait = body.get("wait_before_s", 0.0)
    if not is_number(wait) or not 0 <= wait <= MAX_TIME_S:
        raise TraceError(f"{where}: wait_before_s must be a number from 0 to {MAX_TIME_S:g} s, "
                         f"got {json.dumps(wait)}")
    if "rounds" in body:
        return _rounds(body["rounds"], where), float(wait)
    branches = body["branches"]
    if not isinstance(branches, list) or not 1 <= len(branches) <= MAX_BRANCHES:
        raise TraceError(f"{where}: branches must be a list of 1 to {MAX_BRANCHES} round lists, "
                         f"got {_shown(branches)}")
    return tuple(r for b, rounds in enumerate(branches)
                 for r in _rounds(rounds, f"{where}, branch {b}", b)), float(wait)


def _shown(x: Any) -> str:
    """A value in an error message, cut short if long."""
    text = json.dumps(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _rounds(rounds: Any, where: str, branch: int = 0) -> tuple[RoundSpec, ...]:
    if not isinstance(rounds, list) or not rounds:
        raise TraceError(f"{where}: expected a non-empty list of [input, output, wait] rounds")
    out = []
    for k, r in enumerate(rounds):
        names = r[3] if isinstance(r, list) and len(r) == 4 else []
        ok = (isinstance(r, list) and len(r) in (3, 4) and _is_int(r[0]) and _is_int(r[1])
              and is_number(r[2]) and isinstance(names, list)
              and all(isinstance(n, str) for n in names))
        if not ok or r[0] < 0 or r[1] < 1 or r[2] < 0:
            raise TraceError(f"{where}, round {k}: expected [input_tokens >= 0, output_tokens "
                             f">= 1, tool_wait_s >= 0] as integers and a finite number (and, "
                             f"version 2, a list of shared segment names), got {_shown(r)}")
        if max(r[0], r[1]) > MAX_TOKENS:
            raise TraceError(f"{where}, round {k}: {max(r[0], r[1])} tokens is beyond the "
                             f"{MAX_TOKENS:g}-token bound on a round's input and output; "
                             "is the size a typo?")
        if r[2] > MAX_TIME_S:
            raise TraceError(f"{where}, round {k}: tool_wait_s {json.dumps(r[2])} is beyond the "
                             f"{MAX_TIME_S:g} s bound on trace times; shorten the wait")
        out.append(RoundSpec(r[0], r[1], float(r[2]), branch, tuple(names)))
    return tuple(out)


def _is_int(x: Any) -> bool:
    """A JSON integer (true and false are not, though Python says bool is int)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite JSON number (not a boolean)."""
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))
