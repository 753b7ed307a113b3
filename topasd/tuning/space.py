"""The search space of `topasd tune`, derived from the parameter specs
(`scheduler/param_specs.py`: kind, range, what None means) and the policy's
defaults; nothing here repeats a range.

A number is searched within `WINDOW` times its default, inside its range:
from 0 when its range starts at 0 (0 turns the term off), on a log scale
otherwise. A time in seconds that defaults to unset (H_age, hol_age) is
searched around the trace's time scale instead (the defaults' mean JCT on
the training part). A parameter that may be None (unset) also tries None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topasd.model import TopasError
from topasd.scheduler.param_specs import PARAM_SPECS, SPEC_BY_NAME, ParamSpec, canonical_param
from topasd.scheduler.params import VARIANTS, TopasParams

# Bounds on a decision's cost (the candidate window): a JCT objective never sees the
# decision time they bound, so they are searched only when `--search` names them
COST_BOUNDS = ("window", "window_cap", "search_budget")
# The paper's parameters (Eq. 11-12, Algorithm 1), then every other extension
SEARCHED: tuple[str, ...] = ("beta", "rho", "h_age", "m", "k",
                             *(s.name for s in PARAM_SPECS
                               if s.extension and s.name not in COST_BOUNDS))
HARDWARE = "the backend's"  # the spec's `unset` of a hardware fact (b_swap, mu): never searched
SECONDS = ("h_age", "hol_age")  # times, whose scale is the trace's when unset by default
WINDOW = 10.0
FIGURES = 3  # significant figures of a searched real number (what is run is what is shown)


@dataclass(frozen=True, slots=True)
class Dim:
    """One searched parameter: a number in [low, high] (`log`: log-uniform),
    or one of `choices`; `nullable`: None (the spec's `unset`) is a choice too."""

    name: str
    kind: str  # the spec's: float, int, bool, choice
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()
    nullable: bool = False

    def describe(self) -> str:
        """"beta in [0, 200]", "h_age in [12.1, 1.21e+03] (log) or unset", ..."""
        if self.choices:
            text = f"{self.name} in {{{', '.join(map(_show, self.choices))}}}"
        else:
            text = f"{self.name} in [{self.low:g}, {self.high:g}]" + (" (log)" if self.log else "")
        return text + (f" or unset ({SPEC_BY_NAME[self.name].unset})" if self.nullable else "")


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def search_names(text: str | None, policy: str, fixed: Iterable[str]) -> tuple[str, ...]:
    """The parameters to search: `--search a,b,...` (the paper's names too),
    else `SEARCHED`; less those `fixed` (--param) or fixed by the variant."""
    held = {canonical_param(n) for n in fixed} | set(VARIANTS[policy])
    if text is None:
        return tuple(n for n in SEARCHED if n not in held)
    names = [canonical_param(n.strip()) for n in text.split(",") if n.strip()]
    for name in names:
        if name not in SPEC_BY_NAME:
            raise TopasError(f"--search {text}: {name!r} is not a TOPAS parameter; "
                             f"choose from {', '.join(SPEC_BY_NAME)}")
        if SPEC_BY_NAME[name].unset == HARDWARE:
            raise TopasError(f"--search {text}: {name} is the hardware's (unset: the "
                             "backend's), not a preference; set it with --param if it is wrong")
        if name in held:
            why = "--param fixes it" if name not in VARIANTS[policy] else \
                f"{policy} fixes it (choose another policy)"
            raise TopasError(f"--search {text}: {name} cannot be searched: {why}")
    if not names:
        raise TopasError(f"--search {text!r}: name at least one parameter")
    return tuple(dict.fromkeys(names))


def search_space(policy: str, names: Iterable[str], time_scale: float) -> tuple[Dim, ...]:
    """A `Dim` per name, around `policy`'s defaults; `time_scale` (s) centres
    the times that are unset by default."""
    defaults = TopasParams(**VARIANTS[policy])
    return tuple(_dim(SPEC_BY_NAME[n], getattr(defaults, n), time_scale) for n in names)


def _dim(spec: ParamSpec, default: Any, time_scale: float) -> Dim:
    if spec.kind == "bool":
        return Dim(spec.name, spec.kind, choices=(True, False))
    if spec.kind == "choice":
        return Dim(spec.name, spec.kind, choices=spec.choices, nullable=spec.nullable)
    assert spec.range is not None, spec.name
    lo, hi = spec.range
    centre = time_scale if default is None and spec.name in SECONDS else (
        float(default) if default else 1.0)
    low = lo if lo == 0 else max(lo, centre / WINDOW)
    high = min(hi, centre * WINDOW)
    if spec.kind == "int":
        low, high = math.ceil(low), math.floor(high)
    if not low < high:
        raise TopasError(f"--search: {spec.name} has no range to search around "
                         f"{default!r}; fix it with --param {spec.name}=VALUE instead")
    return Dim(spec.name, spec.kind, low, high, log=lo > 0, nullable=spec.nullable)


def rounded(value: float) -> float:
    """`value` to `FIGURES` significant figures."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, FIGURES - 1 - math.floor(math.log10(abs(value))))


def within(dim: Dim, value: Any) -> bool:
    """Whether `value` is a point of `dim` (the defaults are enqueued as one)."""
    if value is None:
        return dim.nullable
    if dim.choices:
        return value in dim.choices
    return dim.low <= value <= dim.high


def defaults_point(policy: str, space: Iterable[Dim]) -> Mapping[str, Any]:
    """`policy`'s defaults of the searched parameters (the first trial)."""
    defaults = TopasParams(**VARIANTS[policy])
    point = {d.name: getattr(defaults, d.name) for d in space}
    for d in space:
        if not within(d, point[d.name]):  # a window is built around the default
            raise TopasError(f"search space: {d.name}={point[d.name]!r} is outside "
                             f"{d.describe()}")
    return point
