"""`topasd tune`'s search: Optuna's TPE over the space of `space.py`, each
trial one replay of the training part, then the best parameters replayed on
the held-out part beside the defaults and every baseline.

Trials are asked `batch` at a time, replayed in parallel and told in trial
order, so the trials depend on the seed and the batch only: the same on one
core, a process pool or a Ray cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topasd.model import TopasError
from topasd.profiles import DEFAULT_PROFILE
from topasd.tuning.pools import Done, ReplayPool, require
from topasd.tuning.replays import ReplayJob, Row
from topasd.tuning.space import Dim, defaults_point, rounded, search_space

TRAIN, HELD_OUT = "train", "held-out"  # the keys of the two parts in the pool's table


@dataclass(frozen=True, slots=True)
class Objective:
    """What the search minimises: (1 - w) x mean JCT + w x p99 JCT."""

    p99_weight: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p99_weight <= 1.0:
            raise TopasError(f"--p99-weight must be in [0, 1], got {self.p99_weight}")

    def of(self, row: Row) -> float:
        w = self.p99_weight
        return float((1 - w) * row["mean_jct_s"] + w * row["p99_jct_s"])

    @property
    def label(self) -> str:
        w = self.p99_weight
        if w in (0.0, 1.0):
            return "p99 JCT" if w else "mean JCT"
        return f"{1 - w:g} x mean + {w:g} x p99 JCT"


@dataclass(frozen=True)
class TuneSetup:
    """What to tune and how: the policy and its fixed parameters (--param),
    the searched names, trials, batch, seed, objective and simulator."""

    policy: str
    names: tuple[str, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    trials: int = 30
    batch: int = 4
    seed: int = 0
    objective: Objective = Objective()
    profile: str = DEFAULT_PROFILE
    budget: int | None = None
    baselines: tuple[str, ...] = ()

    def job(self, part: str, params: Mapping[str, Any] | None = None,
            policy: str | None = None) -> ReplayJob:
        """The replay of `part` under `policy` (default: the tuned one) with the
        fixed parameters and `params` (none for a baseline)."""
        name = policy or self.policy
        given = {} if name != self.policy else {**self.fixed, **(params or {})}
        return ReplayJob.of(part, name, given, self.profile, self.budget)


@dataclass(frozen=True)
class Trial:
    number: int
    params: Mapping[str, Any]  # the searched parameters
    value: float  # the objective on the training part
    row: Row


@dataclass(frozen=True)
class TuneResult:
    """The trials, the best, and the reference replays of both parts."""

    setup: TuneSetup
    space: tuple[Dim, ...]
    trials: tuple[Trial, ...]
    best: Trial
    train: Mapping[str, Row]  # "defaults", each baseline
    held_out: Mapping[str, Row]  # "tuned", "defaults", each baseline

    @property
    def best_baseline(self) -> str | None:
        """The baseline with the lowest training objective (a user's pick on this trace)."""
        names = [b for b in self.setup.baselines if b in self.train]
        return min(names, key=lambda b: self.setup.objective.of(self.train[b]), default=None)


def tune(pool: ReplayPool, setup: TuneSetup, done: Done | None = None) -> TuneResult:
    """Reference replays, the search, the best on the held-out part."""
    refs = [("defaults", None), *((b, b) for b in setup.baselines)]
    jobs = [setup.job(part, policy=policy) for _, policy in refs for part in (TRAIN, HELD_OUT)]
    rows = pool.run(jobs, done)
    train = {label: rows[2 * i] for i, (label, _) in enumerate(refs)}
    held = {label: rows[2 * i + 1] for i, (label, _) in enumerate(refs)}
    space = search_space(setup.policy, setup.names, time_scale=train["defaults"]["mean_jct_s"])
    trials = search(pool, setup, space, done)
    best = min(trials, key=lambda t: (t.value, t.number))
    (held["tuned"],) = pool.run([setup.job(HELD_OUT, best.params)], done)
    return TuneResult(setup, space, tuple(trials), best, train, held)


def search(pool: ReplayPool, setup: TuneSetup, space: Sequence[Dim],
           done: Done | None = None) -> list[Trial]:
    """`setup.trials` trials of TPE (seeded), the first the defaults."""
    optuna = require("optuna", "topasd tune")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=setup.seed))
    study.enqueue_trial(_as_optuna(space, defaults_point(setup.policy, space)))
    trials: list[Trial] = []
    while len(trials) < setup.trials:
        asked = [study.ask() for _ in range(min(setup.batch, setup.trials - len(trials)))]
        points = [{d.name: suggest(t, d) for d in space} for t in asked]
        rows = pool.run([setup.job(TRAIN, p) for p in points], done)
        for trial, point, row in zip(asked, points, rows, strict=True):
            value = setup.objective.of(row)
            study.tell(trial, value)
            trials.append(Trial(trial.number, point, value, row))
    return trials


def suggest(trial: Any, dim: Dim) -> Any:
    """The trial's value of `dim` (Optuna's define-by-run suggestions); a real
    number to `FIGURES` significant figures."""
    if dim.nullable and not trial.suggest_categorical(f"{dim.name}:set", [True, False]):
        return None
    if dim.choices:
        return trial.suggest_categorical(dim.name, list(dim.choices))
    if dim.kind == "int":
        return trial.suggest_int(dim.name, int(dim.low), int(dim.high))
    return rounded(trial.suggest_float(dim.name, dim.low, dim.high, log=dim.log))


def _as_optuna(space: Sequence[Dim], point: Mapping[str, Any]) -> dict[str, Any]:
    """`point` as Optuna's parameters (a nullable one as `NAME:set` and its value)."""
    out: dict[str, Any] = {}
    for d in space:
        value = point[d.name]
        if d.nullable:
            out[f"{d.name}:set"] = value is not None
        if value is not None:
            out[d.name] = value
    return out
