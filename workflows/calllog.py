"""Call logs: one LLM call per record, as agent frameworks and tracing tools
write them (docs/trace-format.md, "Importing a call log").

A log is JSON Lines (one object per call) or CSV (a header row, then one row
per call). Each call names its task, its own id, its agent (or role), the
calls it depends on (`parents`) or its position (`order`), its prompt and
completion tokens, and optionally its agent's prefix, start and end times
and shared-content hints. `read_calls` checks every field and names the line
of the first problem.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from topasd.model import TopasError
from workflows.lines import DEFAULT_MAX_LINE_BYTES, parse_file
from workflows.spec import MAX_TOKENS


class CallLogError(TopasError):
    """A call log is malformed; the message names the line and the fix."""


# canonical field -> the names a log may give it (the first is documented)
ALIASES: Mapping[str, tuple[str, ...]] = {
    "task": ("task", "task_id", "trace_id"),
    "call": ("call", "call_id", "id", "span_id"),
    "agent": ("agent", "role"),
    "parents": ("parents", "parent_ids", "parent"),
    "order": ("order", "step"),
    "prompt_tokens": ("prompt_tokens", "input_tokens"),
    "completion_tokens": ("completion_tokens", "output_tokens"),
    "prefix_tokens": ("prefix_tokens", "system_tokens"),
    "start": ("start", "start_time"),
    "end": ("end", "end_time"),
    "shared": ("shared",),
}
REQUIRED = ("task", "call", "agent", "prompt_tokens", "completion_tokens")
LIST_SEPARATORS = re.compile(r"[;\s]+")  # a CSV cell listing call ids or hints


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call of a log. `parents` None: the log gives none (then `order`
    or the file order places the call); times in seconds on the log's clock;
    `shared`: (content id, tokens) the prompt holds that other calls of the
    task hold too."""

    task: str
    id: str
    agent: str
    prompt_tokens: int
    completion_tokens: int
    line: int
    parents: tuple[str, ...] | None = None
    order: int | None = None
    prefix_tokens: int | None = None
    start: float | None = None
    end: float | None = None
    shared: tuple[tuple[str, int], ...] = ()


def load_calls(path: str | Path, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
               ) -> tuple[Call, ...]:
    """The calls of the log at `path` (`-`: standard input), JSON Lines or CSV."""
    return parse_file(path, read_calls, CallLogError, max_line_bytes, "call log")


def read_calls(lines: Iterable[str], name: str = "calls") -> tuple[Call, ...]:
    """Parse a call log: JSON Lines when its first non-blank line is an object,
    else CSV with a header row; every error names `name:LINE`."""
    it = iter(lines)
    head: list[str] = []
    for line in it:
        head.append(line.removeprefix("\ufeff") if not head else line)
        if line.strip():
            break
    if not any(x.strip() for x in head):
        raise CallLogError(f"{name}: empty call log (no calls); see docs/trace-format.md, "
                           "\"Importing a call log\"")
    rest = _chain(head, it)
    records = _json_records(rest, name) if head[-1].lstrip().startswith("{") else \
        _csv_records(rest, name)
    calls = tuple(_call(rec, f"{name}:{line}", line) for line, rec in records)
    if not calls:
        raise CallLogError(f"{name}: the call log has a header row but no calls")
    return calls


def _chain(head: list[str], it: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from it


def _json_records(lines: Iterable[str], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise CallLogError(f"{name}:{lineno}: not valid JSON ({str(exc).split(':')[0]}); "
                               "a JSON Lines call log has one call object per line") from None
        if not isinstance(rec, dict):
            raise CallLogError(f"{name}:{lineno}: expected a call object, got "
                               f"{type(rec).__name__}")
        if rec.get("type") == "header" and rec.get("format") == "topasd-trace":
            raise CallLogError(f"{name}:{lineno}: this is a topasd trace, not a call log; "
                               f"replay it as it is (`topasd replay {name}`)")
        yield lineno, rec


def _csv_records(lines: Iterable[str], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows under the header row, one call per line (a cell holds no line break)."""
    header: list[str] | None = None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = next(csv.reader([line]))
        except csv.Error as exc:
            raise CallLogError(f"{name}:{lineno}: not valid CSV ({exc})") from None
        if header is None:
            header = [h.strip() for h in row]
            continue
        if len(row) != len(header):
            raise CallLogError(f"{name}:{lineno}: {len(row)} cells but the header row has "
                               f"{len(header)} ({', '.join(header)})")
        yield lineno, {k: v.strip() for k, v in zip(header, row, strict=True) if v.strip()}


def _field(rec: Mapping[str, Any], key: str) -> Any:
    """The value of canonical field `key` under any of its names (None: absent)."""
    for alias in ALIASES[key]:
        if alias in rec and rec[alias] not in (None, ""):
            return rec[alias]
    return None


def _call(rec: Mapping[str, Any], where: str, line: int) -> Call:
    missing = [k for k in REQUIRED if _field(rec, k) is None]
    if missing:
        names = "; ".join(f"{k} (or {', '.join(ALIASES[k][1:])})" if len(ALIASES[k]) > 1
                          else k for k in missing)
        raise CallLogError(f"{where}: the call lacks {names}; every call names its task, "
                           "call id, agent, prompt_tokens and completion_tokens")
    call = Call(
        task=_ident(_field(rec, "task"), where, "task"),
        id=_ident(_field(rec, "call"), where, "call"),
        agent=_ident(_field(rec, "agent"), where, "agent"),
        prompt_tokens=_count(_field(rec, "prompt_tokens"), where, "prompt_tokens", 0),
        completion_tokens=_count(_field(rec, "completion_tokens"), where, "completion_tokens",
                                 1),
        line=line,
        parents=_parents(_field(rec, "parents"), where),
        order=_opt(_field(rec, "order"), lambda v: _count(v, where, "order", 0)),
        prefix_tokens=_opt(_field(rec, "prefix_tokens"),
                           lambda v: _count(v, where, "prefix_tokens", 0)),
        start=_opt(_field(rec, "start"), lambda v: _time(v, where, "start")),
        end=_opt(_field(rec, "end"), lambda v: _time(v, where, "end")),
        shared=_shared(_field(rec, "shared"), where),
    )
    _check_call(call, where)
    return call


def _check_call(call: Call, where: str) -> None:
    """What one call's fields must agree on."""
    if call.prefix_tokens is not None and call.prefix_tokens > call.prompt_tokens:
        raise CallLogError(f"{where}: prefix_tokens {call.prefix_tokens} exceeds prompt_tokens "
                           f"{call.prompt_tokens}; the prefix is part of the prompt")
    if (call.start is None) != (call.end is None):
        raise CallLogError(f"{where}: give both start and end, or neither")
    if call.start is not None and call.end is not None and call.end < call.start:
        raise CallLogError(f"{where}: end {call.end:g} is before start {call.start:g}")
    if sum(tokens for _, tokens in call.shared) > call.prompt_tokens:
        raise CallLogError(f"{where}: the shared-content hints hold more tokens than "
                           f"prompt_tokens {call.prompt_tokens}; a hint names part of the prompt")


def _opt(value: Any, parse: Any) -> Any:
    return None if value is None else parse(value)


def _ident(value: Any, where: str, what: str) -> str:
    """An id or a name: a non-empty string, or an integer (kept as its text)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise CallLogError(f"{where}: {what} must be a non-empty string or an integer, got "
                           f"{json.dumps(value)}")
    return str(value)


def _count(value: Any, where: str, what: str, least: int) -> int:
    """A whole number from `least` to MAX_TOKENS (CSV cells are text)."""
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_TOKENS:
        raise CallLogError(f"{where}: {what} must be a whole number from {least} to "
                           f"{MAX_TOKENS:g}, got {json.dumps(value)}")
    return value


def _time(value: Any, where: str, what: str) -> float:
    """Seconds on the log's clock: a number, or an ISO 8601 time (with a zone,
    or read as UTC)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                stamp = datetime.fromisoformat(value.strip())
            except ValueError:
                raise CallLogError(f"{where}: {what} {json.dumps(value)} is neither a number "
                                   "of seconds nor an ISO 8601 time (2025-01-31T12:00:00.5Z)"
                                   ) from None
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
            return stamp.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or abs(value) > 1e12:
        raise CallLogError(f"{where}: {what} must be a finite number of seconds (at most 1e12, "
                           f"a Unix time) or an ISO 8601 time, got {json.dumps(value)}")
    return float(value)


def _parents(value: Any, where: str) -> tuple[str, ...] | None:
    """Parent call ids: a list (JSON), or text listing them (CSV: `a;b`)."""
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(p for p in LIST_SEPARATORS.split(value.strip()) if p)
    if isinstance(value, int) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, list):
        return tuple(_ident(p, where, "a parent call id") for p in value)
    raise CallLogError(f"{where}: parents must be a list of call ids, got {json.dumps(value)}")


def _shared(value: Any, where: str) -> tuple[tuple[str, int], ...]:
    """Shared-content hints: {id: tokens} (JSON) or `id:tokens;id:tokens` (CSV)."""
    if value is None:
        return ()
    if isinstance(value, str):
        pairs = [p.rsplit(":", 1) for p in LIST_SEPARATORS.split(value.strip()) if p]
        if any(len(p) != 2 for p in pairs):
            raise CallLogError(f"{where}: shared must list id:tokens pairs (codebase:3500;"
                               f"plan:400), got {json.dumps(value)}")
        value = dict(pairs)
    if not isinstance(value, dict):
        raise CallLogError(f"{where}: shared must map content ids to tokens "
                           f"({{\"codebase\": 3500}}), got {json.dumps(value)}")
    return tuple((str(k), _count(v, where, f"shared {k!r}", 0)) for k, v in value.items())

