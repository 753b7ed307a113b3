"""Workflow metadata that travels with each request into SGLang's scheduler.

topasd attaches a `WorkflowMeta` to every generate call. It reaches the
scheduler-side `Req` through SGLang's `kv_hints` envelope (0.5.23: an action of
type `topasd.workflow`, version 1) and, as a fallback for callers that cannot
set `kv_hints`, through `sampling_params.custom_params["topasd"]`. This module
is plain Python: the daemon and the scheduler plugin both import it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

ACTION_TYPE = "topasd.workflow"
ACTION_VERSION = "1"
PROTOCOL_VERSION = "1"
CUSTOM_PARAMS_KEY = "topasd"
CACHE_ATTR = "_topasd_meta"  # the parsed metadata, kept on the scheduler's Req
_UNSET = object()
log = logging.getLogger("topasd.sglang")


@dataclass(frozen=True, slots=True)
class WorkflowMeta:
    """What the scheduler needs to know about a request beyond its tokens."""

    request_id: int
    task_id: int
    workflow: str
    stage: str
    agent: str
    round: int
    prefix_tokens: int  # the agent's static prefix: the first tokens of the prompt
    task_arrival: float
    ready_at: float

    def payload(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> WorkflowMeta:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(payload))
        if missing:
            raise ValueError(f"topasd workflow metadata lacks {missing}")
        return cls(
            request_id=int(payload["request_id"]), task_id=int(payload["task_id"]),
            workflow=str(payload["workflow"]), stage=str(payload["stage"]),
            agent=str(payload["agent"]), round=int(payload["round"]),
            prefix_tokens=int(payload["prefix_tokens"]),
            task_arrival=float(payload["task_arrival"]), ready_at=float(payload["ready_at"]),
        )


def kv_hints_envelope(meta: WorkflowMeta) -> dict[str, Any]:
    """The `kv_hints` value of a generate request carrying `meta` (a plain dict:
    SGLang converts it into its `KvHintsEnvelope`)."""
    return {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": f"topasd-{meta.request_id}",
        "actions": [{
            "action_id": f"topasd-{meta.request_id}",
            "action_type": ACTION_TYPE,
            "action_version": ACTION_VERSION,
            "payload": meta.payload(),
        }],
    }


def custom_params(meta: WorkflowMeta) -> dict[str, Any]:
    """The `sampling_params.custom_params` fallback carrying `meta`."""
    return {CUSTOM_PARAMS_KEY: meta.payload()}


def read_meta(req: Any) -> WorkflowMeta | None:
    """The metadata on a scheduler-side `Req` (kv_hints first, then
    custom_params), or None for a request topasd did not send or whose
    metadata is malformed (logged once; SGLang serves it as untracked).
    Parsed once per `Req` (kept on it as `_topasd_meta`)."""
    cached = getattr(req, CACHE_ATTR, _UNSET)
    if cached is not _UNSET:
        return cast(WorkflowMeta | None, cached)
    try:
        meta = _parse_meta(req)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("topasd: request %s has malformed topasd metadata (%s); SGLang "
                    "serves it without TOPAS", getattr(req, "rid", "?"), exc)
        meta = None
    with contextlib.suppress(AttributeError):  # a Req without a __dict__: parse again
        setattr(req, CACHE_ATTR, meta)
    return meta


def _parse_meta(req: Any) -> WorkflowMeta | None:
    hints = getattr(req, "kv_hints", None)
    for action in getattr(hints, "actions", None) or ():
        if action.action_type == ACTION_TYPE and action.action_version == ACTION_VERSION:
            return WorkflowMeta.from_payload(action.payload)
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    if isinstance(params, Mapping) and isinstance(params.get(CUSTOM_PARAMS_KEY), Mapping):
        return WorkflowMeta.from_payload(params[CUSTOM_PARAMS_KEY])
    return None
