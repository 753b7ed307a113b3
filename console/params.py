"""The parameter form's model: the fields, their parsing and validation against
the daemon's ranges, and the change set sent to `PATCH /v1/params`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Field:
    """One editable TOPAS parameter."""

    name: str  # TopasParams field
    label: str  # the paper's name
    kind: str  # float | int | bool | choice
    nullable: bool = False  # empty input allowed: it means `empty`
    choices: tuple[str, ...] = ()
    help: str = ""
    empty: str = ""  # what an empty input means (the placeholder)


FIELDS: tuple[Field, ...] = (
    Field("beta", "beta", "float", help="V_reuse pressure (Eq. 11)"),
    Field("rho", "rho", "float", help="aging strength (Eq. 12)"),
    Field("h_age", "H_age", "float", nullable=True, help="age scale, s (empty: observed)",
          empty="observed"),
    Field("m", "M", "int", help="enumerate every prefix set when |A_t| <= M"),
    Field("k", "K", "int", help="cap on admissions/preemptions per decision (0: none)"),
    Field("b_swap", "B_swap", "float", nullable=True,
          help="host link, bytes/s (empty: the backend's)", empty="the backend's"),
    Field("mu", "mu", "float", nullable=True,
          help="KV bytes per prefix token (empty: the backend's)", empty="the backend's"),
    Field("samples", "samples", "int", help="E[LP] samples on non-chain DAGs"),
    Field("seed", "seed", "int", help="seed of the sample quantiles"),
    Field("reuse", "reuse", "bool", help="V_reuse term"),
    Field("aging", "aging", "bool", help="task aging"),
    Field("reservation", "reservation", "choice", choices=("optimistic", "full"),
          help="decode KV reservation d_r"),
    Field("preempt", "preempt", "bool", help="allow preemption (extension: off keeps Q_t)"),
    Field("preempt_margin", "preempt_margin", "float",
          help="a preemption's score must be this many times its cost (extension; 0: off)"),
    Field("hol_age", "hol_age", "float", nullable=True,
          help="hold KV for the oldest request after this wait, s (extension; empty: off)",
          empty="off"),
    Field("pack_order", "pack_order", "choice", choices=("ratio", "arrival"),
          help="GreedyPack order: progress per KV token, or task arrival (extension)"),
    Field("start_gate", "start_gate", "bool",
          help="start no new task in a preemption or past a started one (extension)"),
)
BY_NAME = {f.name: f for f in FIELDS}


def parse(field: Field, text: str, ranges: Mapping[str, tuple[float, float]]) -> Any:
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
             policies: tuple[str, ...] | list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(changes, errors) of a filled form: `values` holds text for number fields,
    bools and strings for the others. Only parameters the current policy has and
    whose value differs are sent; a switch to another policy resets the rest to
    its defaults (the daemon's rule), and baselines take no parameters."""
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
                errors[name] = f"{field.label}: {exc}"
                continue
        elif field.kind == "bool":
            value = bool(raw)
        elif raw in field.choices:
            value = raw
        else:
            errors[name] = f"{field.label}: one of {', '.join(field.choices)}"
            continue
        if value != current[name] and policy.startswith("topas"):
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
