"""The parameter form's model: the fields, their parsing and validation against
the daemon's ranges, and the change set sent to `PATCH /v1/params`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from topasd.scheduler.param_specs import PARAM_SPECS, SPEC_BY_NAME, ParamSpec

FIELDS: tuple[ParamSpec, ...] = PARAM_SPECS  # the form's rows, in order
BY_NAME: Mapping[str, ParamSpec] = SPEC_BY_NAME


def parse(field: ParamSpec, text: str, ranges: Mapping[str, tuple[float, float]]) -> Any:
    """The value of one text input; ValueError with a short reason if invalid."""
    text = text.strip()
    if not text:
        if field.nullable:
            return None
        raise ValueError("required")
    if field.kind == "int":
        try:
            value: Any = int(text)
        except ValueError:
            raise ValueError("an integer") from None
    else:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("a finite number")
    lo, hi = ranges.get(field.name, (float("-inf"), float("inf")))
    if not lo <= value <= hi:
        raise ValueError(f"in [{_num(lo)}, {_num(hi)}]")
    return value


def validate(policy: str, values: Mapping[str, Any], current_policy: str,
             current: Mapping[str, Any], ranges: Mapping[str, tuple[float, float]],
             policies: Collection[str], tunable: Collection[str],
             ) -> tuple[dict[str, Any], dict[str, str]]:
    """(changes, errors) of a filled form: `values` holds text for number fields,
    bools and strings for the others. Only parameters the current policy has and
    whose value differs are sent; a switch to another policy resets the rest to
    its defaults (the daemon's rule), and policies not `tunable` (baselines)
    take no parameters."""
    errors: dict[str, str] = {}
    changes: dict[str, Any] = {}
    if policy not in policies:
        errors["policy"] = f"policy: one of {', '.join(policies)}"
    elif policy != current_policy:
        changes["policy"] = policy
    for name, raw in values.items():
        if name not in current:
            continue  # the current policy has no such parameter (a baseline)
        field = BY_NAME[name]
        if field.kind in ("int", "float"):
            try:
                value = parse(field, str(raw), ranges)
            except ValueError as exc:
                errors[name] = f"{field.symbol}: {exc}"
                continue
        elif field.kind == "bool":
            value = bool(raw)
        elif raw in field.choices:
            value = raw
        else:
            errors[name] = f"{field.symbol}: one of {', '.join(field.choices)}"
            continue
        if value != current[name] and policy in tunable:
            changes[name] = value
    return changes, errors


def text_of(value: Any) -> str:
    """A parameter value as the form shows it."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # exactly: what is shown is sent back unchanged
    return str(value)


def _num(x: float) -> str:
    """A range bound as typed: integers in full (seed's 2147483647), others short."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e10 else f"{x:g}"
