"""Engine-agnostic scheduling policies."""

from __future__ import annotations

from typing import Any

from topasd.model import TopasError
from topasd.scheduler import native

native.load()  # the compiled search, if built for exactly these sources (native.py)

from topasd.scheduler.base import Policy  # noqa: E402
from topasd.scheduler.baselines import BASELINES, OrderPolicy  # noqa: E402
from topasd.scheduler.params import VARIANTS, TopasParams  # noqa: E402
from topasd.scheduler.topas import TopasPolicy  # noqa: E402

POLICY_NAMES: tuple[str, ...] = (*BASELINES, "topas")
ALL_POLICY_NAMES: tuple[str, ...] = (*BASELINES, *VARIANTS)


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy instance by name (`fcfs`, `lpm`, ..., `topas`)."""
    if name in BASELINES:
        if params:
            raise TopasError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return OrderPolicy(name, BASELINES[name])
    if name in VARIANTS:
        return TopasPolicy(TopasParams(**{**VARIANTS[name], **params}), name=name)
    raise TopasError(f"unknown policy {name!r}; choose one of {', '.join(ALL_POLICY_NAMES)}")
