"""What each TOPAS parameter is, for the people who set them: the paper's
symbol, a one-line meaning, what "unset" (None) means, the choices of a
string parameter, and whether it is one of topasd's extensions beyond the
paper. The HTTP API (PATCH /v1/params: its body, ranges and names), the CLI's
`--param` and the console's parameter form all read this table.

Names, types and defaults come from `params.TopasParams`, ranges from
`params.PARAM_RANGES`; this module adds only the words, and checks at import
that it describes every field exactly once.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from topasd.model import TopasError
from topasd.scheduler.params import (
    AGE_CURVES,
    DECODE_PEAKS,
    PACK_ORDERS,
    PARAM_RANGES,
    RESERVATIONS,
    TopasParams,
)

Kind = Literal["float", "int", "bool", "choice"]


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One TOPAS parameter as users see it."""

    name: str  # the TopasParams field
    symbol: str  # the paper's name (H_age, M, K, B_swap); the field name where it has none
    help: str  # what it does, with the equation it enters
    kind: Kind = "float"  # from the field's type
    unset: str | None = None  # what None means ("observed", "off", ...); None: not nullable
    choices: tuple[str, ...] = ()
    extension: bool = False  # beyond the paper (docs/topas.md, "Extensions")
    range: tuple[float, float] | None = None  # [low, high] of a number

    @property
    def nullable(self) -> bool:
        return self.unset is not None


def _spec(name: str, help: str, *, symbol: str | None = None, unset: str | None = None,
          choices: tuple[str, ...] = (), extension: bool = False) -> ParamSpec:
    return ParamSpec(name, symbol or name, help, unset=unset, choices=choices,
                     extension=extension)


# in the console form's order
_WORDS: tuple[ParamSpec, ...] = (
    _spec("beta", "V_reuse pressure (Eq. 11)"),
    _spec("rho", "aging strength (Eq. 12)"),
    _spec("h_age", "age scale, s (empty: observed)", symbol="H_age", unset="observed"),
    _spec("m", "enumerate every prefix set when |A_t| <= M", symbol="M"),
    _spec("k", "cap on admissions/preemptions per decision (0: none)", symbol="K"),
    _spec("b_swap", "host link, bytes/s (empty: the backend's)", symbol="B_swap",
          unset="the backend's"),
    _spec("mu", "KV bytes per prefix token (empty: the backend's)", unset="the backend's"),
    _spec("samples", "E[LP] samples on non-chain DAGs"),
    _spec("seed", "seed of the sample quantiles"),
    _spec("reuse", "V_reuse term"),
    _spec("aging", "task aging"),
    _spec("reservation", "decode KV reservation d_r", choices=RESERVATIONS),
    _spec("preempt", "allow preemption (extension: off keeps Q_t)", extension=True),
    _spec("preempt_margin",
          "a preemption's score must be this many times its cost (extension; 0: off)",
          extension=True),
    _spec("hol_age", "hold KV for the oldest request after this wait, s (extension; empty: "
          "off)", unset="off", extension=True),
    _spec("pack_order", "GreedyPack order: progress per KV token, or task arrival (extension)",
          choices=PACK_ORDERS, extension=True),
    _spec("longest_first", "a task's own requests packed longest first (LPT; extension)",
          extension=True),
    _spec("start_gate", "start no new task in a preemption, past a started one or in its "
          "room (extension)",
          extension=True),
    _spec("fresh_hol", "no new task passes a new task waiting this x its expected path "
          "(extension; empty: off)", unset="off", extension=True),
    _spec("started_hol", "no new task starts beside a started task's request left waiting "
          "this x its expected path (extension; empty: off)", unset="off", extension=True),
    _spec("age_curve", "task weight g_i: log (Eq. 12) or linear in the slowdown so far "
          "(extension)", choices=AGE_CURVES, extension=True),
    _spec("srpt", "weight x (H_age / L_hat_i)^srpt: tasks near their end first (extension; "
          "0: off)", extension=True),
    _spec("keep_idle", "idle prefixes stay on the GPU while there is room (extension)",
          extension=True),
    _spec("preempt_exchange", "preempt only when the admissions gain more time than the "
          "preemption costs (extension)", extension=True),
    _spec("swap_only", "preempt only to swap prefixes, never for KV (extension)",
          extension=True),
    _spec("decode_peak", "admissions leave the running requests' decode peak free: never, "
          "past a request that did not fit, or always (extension)", choices=DECODE_PEAKS,
          extension=True),
    _spec("head_reserve", "past a started task's request that did not fit, admit only what "
          "leaves it room when the running requests free it, or a heavier task's (EASY "
          "backfilling by g_i; extension)", extension=True),
    _spec("overdue", "serve next a task older than this x its workflow's mean JCT (extension; "
          "empty: off)", unset="off", extension=True),
    _spec("lot_size", "under a backlog, an agent's requests wait until their summed wait is "
          "this x the room its prefix takes from the backlog (extension; empty: off)",
          unset="off", extension=True),
    _spec("phases", "while the resident agents' waiting work of started tasks is over this x "
          "the room their prefixes leave, no other prefix comes in; once it is none, new "
          "tasks wait on them while started work elsewhere fills this x its room "
          "(extension; empty: off)",
          unset="off", extension=True),
    _spec("tandem", "a resident agent's request one stage behind the started tasks waiting "
          "off the GPU goes first and follows them, while its saved setups times the tasks "
          "behind outweigh their delay (extension)", extension=True),
    _spec("final_reserve", "while fewer requests wait than this x those running (lately), "
          "every candidate keeps room for the oldest started task's last request "
          "(experiment; empty: off)", unset="off", extension=True),
    _spec("window", "past window_cap waiting: each agent's first tasks a fill into this x "
          "the free KV reaches (extension; empty: all)", unset="all", extension=True),
    _spec("window_cap", "a decision weighs at most this many waiting requests, oldest tasks "
          "first (extension; 0: the window always, no cap)", extension=True),
    _spec("search_budget", "GreedyPack fills per decision (x samples/64), then the best "
          "found; enumerate only while 2^|A_t| fits (extension; 0: none)", extension=True),
)


def _kind(hint: Any) -> tuple[Kind, bool]:
    """The kind of a TopasParams field's type, and whether it may be None."""
    args = set(typing.get_args(hint)) or {hint}
    nullable = type(None) in args
    args.discard(type(None))
    kinds: dict[Any, Kind] = {bool: "bool", int: "int", float: "float", str: "choice"}
    (only,) = args
    return kinds[only], nullable


def _complete(words: tuple[ParamSpec, ...]) -> tuple[ParamSpec, ...]:
    """`words` with each field's kind and range; TopasError unless they describe
    every TopasParams field once, nullable exactly where the field may be None."""
    hints = typing.get_type_hints(TopasParams)
    names = [f.name for f in fields(TopasParams)]
    given = [w.name for w in words]
    if sorted(given) != sorted(names):
        missing, extra = sorted(set(names) - set(given)), sorted(set(given) - set(names))
        raise TopasError(f"param_specs describes {given}: missing {missing}, unknown {extra} "
                         "(describe each TopasParams field once)")
    out = []
    for w in words:
        kind, nullable = _kind(hints[w.name])
        if nullable != w.nullable or (kind == "choice") != bool(w.choices):
            raise TopasError(f"param_specs: {w.name} is {hints[w.name]}; give `unset` exactly "
                             "for a field that may be None, `choices` for a string")
        rng = PARAM_RANGES.get(w.name)
        out.append(ParamSpec(w.name, w.symbol, w.help, kind, w.unset, w.choices, w.extension,
                             rng))
    return tuple(out)


PARAM_SPECS: tuple[ParamSpec, ...] = _complete(_WORDS)
SPEC_BY_NAME: Mapping[str, ParamSpec] = {s.name: s for s in PARAM_SPECS}
# The paper's names of TOPAS parameters (Eq. 11-12, Algorithm 1) -> TopasParams fields.
PARAM_ALIASES: Mapping[str, str] = {s.symbol: s.name for s in PARAM_SPECS if s.symbol != s.name}


def canonical_param(name: str) -> str:
    """A policy parameter's field name (`H_age` -> `h_age`, `M` -> `m`)."""
    return PARAM_ALIASES.get(name, name)


def canonical_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` under their field names; TopasError if two name one parameter."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in params.items():
        name = canonical_param(key)
        if given.setdefault(name, key) != key:
            raise TopasError(f"{given[name]} and {key} name the same parameter; give one")
        out[name] = value
    return out


def spec_dict(spec: ParamSpec) -> dict[str, Any]:
    """A spec as JSON (GET /v1/params `specs`)."""
    return {"name": spec.name, "symbol": spec.symbol, "help": spec.help, "kind": spec.kind,
            "unset": spec.unset, "choices": list(spec.choices), "extension": spec.extension,
            "range": None if spec.range is None else list(spec.range)}
