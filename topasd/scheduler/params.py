"""TOPAS's parameters (paper sections IV-B to IV-E, and the extensions of
docs/topas.md): defaults, validated ranges and the ablation variants.

Kept apart from the search (`topas.py`), which `topasd native build` may
compile: parameters stay plain Python objects either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topasd.model import TopasError, replace_known


@dataclass(frozen=True, slots=True)
class TopasParams:
    """TOPAS parameters; every one may change between decisions."""

    beta: float = 20.0  # V_reuse pressure (Eq. 11)
    rho: float = 1.0  # aging strength (Eq. 12)
    h_age: float | None = None  # age scale H_age in s; None: observed (see `age_scale`)
    m: int = 6  # enumerate every prefix set when |A_t| <= M
    k: int = 0  # cap on admissions and on preemptions per decision; 0: no cap
    b_swap: float | None = None  # host link B_swap in bytes/s; None: the backend's
    mu: float | None = None  # KV bytes per prefix token; None: the backend's
    samples: int = 64  # E[LP] samples on non-chain DAGs (common random numbers)
    seed: int = 0  # seed of the sample quantiles
    reuse: bool = True  # V_reuse term (off in topas-base / topas-noreuse)
    aging: bool = True  # task aging (off in topas-base / topas-noaging)
    # Extensions beyond the paper (docs/topas.md, "Extensions"); `topas-paper` turns
    # off every one that is on by default (PAPER, below):
    preempt: bool = True  # False: every candidate keeps every running request
    # a candidate that preempts must score at least this times its J_redo + J_revoke
    # (J_admit - J_move + V_reuse >= (1 + m) times that cost); 0: off
    preempt_margin: float = 1.0
    hol_age: float | None = None  # reserve KV for the oldest task's waiting request once
    # that task is this old (s since its arrival), as EASY backfilling does; None: off
    # d_r's decode reservation (Eq. 2): "optimistic" uses the engine's estimate
    # (SGLang's new_token_ratio, the paper's implementation base; the engine may
    # retract), "full" reserves every remaining output token (never retracted).
    reservation: str = "optimistic"
    # with "optimistic": where admissions also leave free the KV that the running
    # requests reach at their decode peak (each grows to its whole output, a finished
    # one frees its KV): "off" nowhere; "backfill" past the first request of a fill
    # that did not fit (the engine's own admission stops there); "always" everywhere
    # (decoding then never outgrows the pool)
    decode_peak: str = "backfill"
    # EASY backfilling by task weight: past the first request of a started task that did
    # not fit in a fill (the head), admit only what leaves the head its room once the kept
    # running requests free enough, what is expected to end before then, or a request of
    # a task weighing more than the head's (g_i)
    head_reserve: bool = True
    # GreedyPack's admission order: "ratio" (the paper: age-weighted progress per KV
    # token) or "arrival" (task arrival first, ratio among a task's requests)
    pack_order: str = "arrival"
    # a task's own waiting requests are packed longest expected service first (LPT:
    # its parallel requests end when the longest does), before the ratio orders them
    longest_first: bool = True
    # started tasks' requests first; no new task in a candidate that preempts for KV
    # (more than the prefixes leaving), nor once a started task's request did not fit
    start_gate: bool = True
    # a new task that has waited this many times its workflow's expected fresh path
    # is passed by no later new task: once its request did not fit, a fill admits no
    # new task after it; None: off
    fresh_hol: float | None = 1.0
    # with `start_gate`: no new task starts, in any candidate that leaves it waiting,
    # while a started task's request (anywhere in the queue) has waited this many
    # times its workflow's expected fresh path; None: off
    started_hol: float | None = 1.0
    # task weight g_i: "log" is Eq. 12; "linear" grows with the task's slowdown so far,
    # 1 + rho * age / (its workflow's expected path of a fresh task), so no task starves
    age_curve: str = "linear"
    # g_i is also scaled by (H_age / L_hat_i)^srpt: a task near its end is worth more
    # per second of path it gains (SRPT on the expected remaining path, Eq. 5); 0: off
    srpt: float = 1.0
    # idle prefixes stay on the GPU while free KV holds them; evicted only for room
    keep_idle: bool = True
    # a preemption must gain its admissions more time than it costs the preempted
    # requests and, through the work redone, every other task (an exchange argument)
    preempt_exchange: bool = True
    swap_only: bool = True  # preempt only to swap prefixes, never for running requests' KV
    # a task older than this many times its workflow's mean recent JCT is overdue;
    # the oldest overdue task is served next: every candidate covers its waiting
    # request's agent and keeps its room
    overdue: float | None = 2.0
    # while the other agents' waiting work is more than the pool holds, an agent's
    # waiting requests join W_t only once their summed wait reaches this times the
    # room their prefix would take from that backlog (an economic lot; lots.py);
    # None: off
    lot_size: float | None = None
    # while the agents on the GPU have more waiting work of started tasks than this times
    # the room their prefixes leave, no other agent's prefix comes in: its waiting
    # requests leave W_t (LPM's phases under TOPAS's order; lots.py); once they have none,
    # while the started tasks' work for an agent that needs a resident prefix out is at
    # least this times its room, new tasks' requests of the resident agents leave W_t
    # (the phase's end); None: off
    phases: float | None = 1.0
    # a resident agent's waiting request whose task is one stage behind the started
    # tasks waiting on an agent off the GPU goes before them, and follows them on their
    # path, while the setups it saves times the tasks waiting behind (and, where it fits
    # in their batch, its service at each stage) outweigh the delay it gives them (an
    # exchange on the tasks present; lots.py, `tandem_holds`)
    tandem: bool = True
    # while fewer requests have waited than this times those running (smoothed over time,
    # `LOAD_WINDOW_S`), every candidate keeps EASY's reservation for the oldest started
    # task's last request if its d_r is more than its prefix; None: off (experiment)
    final_reserve: float | None = None
    # once more than `window_cap` requests wait, a decision weighs each agent's first
    # tasks that a fill into this times the free KV reaches, at most `window_cap`
    # requests of them in task order (scheduler/window.py); None: every request
    window: float | None = 1.0
    window_cap: int = 64  # 0: the window at every decision, with no cap
    # at most this many GreedyPack fills per decision (each weighted by samples / 64),
    # and full enumeration only while 2^|A_t| fits it; then the best state found; 0: none
    search_budget: int = 256

    def __post_init__(self) -> None:
        for name, (lo, hi) in PARAM_RANGES.items():
            value = getattr(self, name)
            if value is None and name in ("h_age", "b_swap", "mu", "hol_age", "overdue",
                                          "fresh_hol", "started_hol", "window", "lot_size",
                                          "phases", "final_reserve"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TopasError(f"TOPAS parameter {name}={value!r} is not a number: "
                                 f"use a number in [{lo}, {hi}]")
            if not lo <= value <= hi:
                raise TopasError(f"TOPAS parameter {name}={value!r} is out of range: "
                                 f"use a number in [{lo}, {hi}]")
        for name in ("reuse", "aging", "preempt", "start_gate", "keep_idle", "tandem",
                     "preempt_exchange", "swap_only", "head_reserve"):
            if not isinstance(getattr(self, name), bool):
                raise TopasError(f"TOPAS parameter {name}={getattr(self, name)!r} must be "
                                 "true or false")
        if self.reservation not in RESERVATIONS:
            raise TopasError("TOPAS parameter reservation must be 'full' or 'optimistic'")
        if self.decode_peak not in DECODE_PEAKS:
            raise TopasError("TOPAS parameter decode_peak must be 'off', 'backfill' or "
                             "'always'")
        if self.pack_order not in PACK_ORDERS:
            raise TopasError("TOPAS parameter pack_order must be 'ratio' or 'arrival'")
        if self.age_curve not in AGE_CURVES:
            raise TopasError("TOPAS parameter age_curve must be 'log' or 'linear'")
        for name in ("m", "k", "samples", "seed", "window_cap", "search_budget"):
            value = getattr(self, name)
            if not float(value).is_integer():
                lo, hi = PARAM_RANGES[name]
                raise TopasError(f"TOPAS parameter {name}={value!r} must be a whole number: "
                                 f"use an integer in [{lo}, {hi}]")
            object.__setattr__(self, name, int(value))  # 2.0 (JSON, --param) -> 2

    def changed(self, **changes: Any) -> TopasParams:
        """A validated copy with `changes` applied (unknown names are errors)."""
        return replace_known(self, "TOPAS parameter(s)", **changes)


RESERVATIONS = ("optimistic", "full")
DECODE_PEAKS = ("off", "backfill", "always")
PACK_ORDERS = ("ratio", "arrival")
AGE_CURVES = ("log", "linear")
PARAM_RANGES: dict[str, tuple[float, float]] = {
    "beta": (0.0, 1000.0),
    "rho": (0.0, 1000.0),
    "h_age": (1e-3, 1e7),
    "hol_age": (0.0, 1e7),
    "preempt_margin": (0.0, 1000.0),
    "m": (0, 16),
    "k": (0, 100_000),
    "b_swap": (1e3, 1e13),
    "mu": (1.0, 1e9),
    "samples": (1, 4096),
    "srpt": (0.0, 4.0),
    "overdue": (0.1, 1000.0),
    "lot_size": (0.0, 1000.0),
    "phases": (0.0, 1000.0),
    "final_reserve": (0.0, 1000.0),
    "fresh_hol": (0.0, 1000.0),
    "started_hol": (0.0, 1000.0),
    "window": (0.1, 1000.0),
    "window_cap": (0, 1_000_000),
    "search_budget": (0, 1_000_000),
    "seed": (0, 2**31 - 1),
}
# Section IV as the paper gives it: every default beyond it turned off
PAPER: dict[str, Any] = {"start_gate": False, "preempt_margin": 0.0, "pack_order": "ratio",
                         "longest_first": False,
                         "age_curve": "log", "srpt": 0.0, "keep_idle": False,
                         "preempt_exchange": False, "swap_only": False, "overdue": None,
                         "fresh_hol": None, "started_hol": None,
                         "decode_peak": "off", "head_reserve": False,
                         "phases": None, "tandem": False, "window": None, "search_budget": 0}
VARIANTS: dict[str, dict[str, Any]] = {
    "topas": {},
    "topas-paper": PAPER,
    "topas-base": {"reuse": False, "aging": False},
    "topas-noreuse": {"reuse": False},
    "topas-noaging": {"aging": False},
}


def check_variant(name: str, params: Mapping[str, Any]) -> None:
    """TopasError if `params` undo what defines the variant `name` (topas-base
    with reuse=true would run as another variant under its name)."""
    fixed = VARIANTS.get(name, {})
    undone = sorted(k for k, v in fixed.items() if k in params and params[k] != v)
    if undone:
        raise TopasError(f"{name} runs with {', '.join(f'{k}={fixed[k]}' for k in undone)}; "
                         f"{', '.join(f'{k}={params[k]}' for k in undone)} would make it "
                         f"another variant: choose that policy ({', '.join(VARIANTS)}) "
                         "instead")
    if name in VARIANTS and name != "topas":  # nor may it become another one
        identity = _identity({**fixed, **params})
        other = next((v for v, f in VARIANTS.items() if v != name and _identity(f) == identity),
                     None)
        if other is not None:
            given = ", ".join(f"{k}={params[k]}" for k in sorted(identity) if k in params)
            raise TopasError(f"{name} with {given} would run as {other}: choose that policy "
                             "instead")


_DEFAULTS = TopasParams()
_IDENTITY_KEYS = ("reuse", "aging", *PAPER)


def _identity(params: Mapping[str, Any]) -> dict[str, Any]:
    """What tells the variants apart, as `params` leave it (defaults elsewhere)."""
    return {k: params.get(k, getattr(_DEFAULTS, k)) for k in _IDENTITY_KEYS}
