"""Published peers of TOPAS as one-engine policies on the shared vocabulary
(docs/topas.md, "Peers"): each a module, their estimators in `estimates.py`.

    continuum   KV time-to-live across tool calls (Continuum / CacheTTL)
    astraea     Stateful-MLFQ with HRRN; keep, discard or swap in tool waits
    kairos      workflow-aware priority; time-slot memory-aware admission
    saga        Agent Fair Share; tool-call TTL; workflow-aware LRU eviction
    tokencake   memory partitions for critical agents; offload in tool waits
"""

from __future__ import annotations

from collections.abc import Callable

from topasd.scheduler.base import Policy
from topasd.scheduler.peers.astraea import AstraeaPolicy
from topasd.scheduler.peers.continuum import ContinuumPolicy
from topasd.scheduler.peers.kairos import KairosPolicy
from topasd.scheduler.peers.saga import SagaPolicy
from topasd.scheduler.peers.tokencake import TokencakePolicy

PEERS: dict[str, Callable[[], Policy]] = {  # in `--policy all`
    "continuum": ContinuumPolicy,
    "astraea": AstraeaPolicy,
    "kairos": KairosPolicy,
    "saga": SagaPolicy,
    "tokencake": TokencakePolicy,
}
# where a paper's own evaluation used an oracle: reported separately, named one by one
PEER_ORACLES: dict[str, Callable[[], Policy]] = {
    "astraea-oracle": lambda: AstraeaPolicy("astraea-oracle", oracle=True),
}
PEER_POLICIES: dict[str, Callable[[], Policy]] = {**PEERS, **PEER_ORACLES}

__all__ = ["PEERS", "PEER_ORACLES", "PEER_POLICIES", "AstraeaPolicy", "ContinuumPolicy",
           "KairosPolicy", "SagaPolicy", "TokencakePolicy"]
