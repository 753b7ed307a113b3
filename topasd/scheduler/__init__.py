"""Engine-agnostic scheduling policies, and the one registry of their names.

    policy = build_policy("topas", {"M": 4})      # user input: aliases, checks
    policy = make_policy("lpm")                   # code: field names as given
    POLICIES["topas-paper"].tunable               # what a policy can do
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from topasd.model import TopasError
from topasd.scheduler import native

native.load()  # the compiled search, if built for exactly these sources (native.py)

from topasd.scheduler.base import Policy, PolicyKind, TunablePolicy  # noqa: E402
from topasd.scheduler.baselines import BASELINES, OrderPolicy  # noqa: E402
from topasd.scheduler.param_specs import canonical_params  # noqa: E402
from topasd.scheduler.params import VARIANTS, TopasParams, check_variant  # noqa: E402
from topasd.scheduler.peers import PEER_POLICIES, PEERS  # noqa: E402
from topasd.scheduler.topas import TopasPolicy  # noqa: E402

POLICIES: Mapping[str, PolicyKind] = {
    **{name: PolicyKind(name, tunable=False, searches=False, in_all=True)
       for name in BASELINES},  # the paper's baselines (baselines.py)
    **{name: PolicyKind(name, tunable=False, searches=False, in_all=name in PEERS)
       for name in PEER_POLICIES},  # published peers and their oracle variants (peers/)
    **{name: PolicyKind(name, tunable=True, searches=True, in_all=name == "topas")
       for name in VARIANTS},  # TOPAS and its variants (params.py)
}
ALL_POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
POLICY_NAMES: tuple[str, ...] = tuple(n for n, k in POLICIES.items() if k.in_all)  # `all`
TUNABLE_NAMES: tuple[str, ...] = tuple(n for n, k in POLICIES.items() if k.tunable)


def policy_kind(name: str) -> PolicyKind:
    """The registry's entry for `name`; TopasError naming the known ones."""
    kind = POLICIES.get(name)
    if kind is None:
        raise TopasError(f"unknown policy {name!r}; choose one of {', '.join(ALL_POLICY_NAMES)}")
    return kind


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy instance by name (`fcfs`, `lpm`, ..., `continuum`, ...,
    `topas`), its parameters under their field names."""
    if not policy_kind(name).tunable:
        if params:
            raise TopasError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        if name in PEER_POLICIES:
            return PEER_POLICIES[name]()
        return OrderPolicy(name, BASELINES[name])
    return TopasPolicy(TopasParams(**{**VARIANTS[name], **params}), name=name)


def build_policy(name: str, params: Mapping[str, Any]) -> Policy:
    """A fresh policy `name` with `params` as a user gives them (paper aliases
    accepted); TopasError if a parameter is unknown, out of range, would turn a
    variant into another, or is given to a baseline (which has none)."""
    params = canonical_params(params)
    if policy_kind(name).tunable and params:
        TopasParams(**VARIANTS[name]).changed(**params)  # names the unknown or bad one
        check_variant(name, params)
    return make_policy(name, **params)


def policy_params(policy: Policy) -> dict[str, Any]:
    """The parameters `policy` runs with, by field name ({} for a baseline)."""
    return asdict(policy.params) if isinstance(policy, TunablePolicy) else {}


__all__ = ["ALL_POLICY_NAMES", "POLICIES", "POLICY_NAMES", "TUNABLE_NAMES", "Policy",
           "PolicyKind", "TunablePolicy", "build_policy", "make_policy", "policy_kind",
           "policy_params"]
