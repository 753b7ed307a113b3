"""The SGLang plugin: SGLang's plugin loader (`sglang.srt.plugins.load_plugins`,
entry point group `sglang.srt.plugins`, name `topasd`) calls `register` early in
every SGLang process, the scheduler subprocesses included.

It registers nothing unless the daemon set `TOPASD_SGLANG_ENDPOINT`, so an
SGLang server that merely has topasd installed is unaffected. When set, one
AROUND hook on `Scheduler._get_new_batch_prefill_raw` runs TOPAS before each
prefill pass (adapter.PolicyExecutor.around_prefill).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from backends.sglang.adapter import Decider, EngineSnapshot, PolicyExecutor, RankSync
from backends.sglang.channel import (
    DEFAULT_TIMEOUT_S,
    ENDPOINT_ENV,
    T0_ENV,
    TIMEOUT_ENV,
    LeaderChannel,
)
from topasd.model import Decision

log = logging.getLogger("topasd.sglang")

PREFILL_TARGET = "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw"
FLUSH_TARGET = "sglang.srt.managers.scheduler.Scheduler.flush_cache"
ATTR = "_topasd"  # the PolicyExecutor attached to a Scheduler instance


def register() -> None:
    """Entry point: register the scheduler hook when topasd drives this engine."""
    if not os.environ.get(ENDPOINT_ENV):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(PREFILL_TARGET, prefill_hook, HookType.AROUND)
    HookRegistry.register(FLUSH_TARGET, flush_hook, HookType.AROUND)


def prefill_hook(original: Any, sched: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: TOPAS decides, SGLang's prefill pass admits the plan."""
    topas = getattr(sched, ATTR, None)
    if topas is None:
        topas = attach(sched)
    try:
        return topas.around_prefill(original, sched, *args, **kwargs)
    finally:
        channel = getattr(topas, "channel", None)
        if channel is not None:
            channel.send_events(topas.take_events())
        else:
            topas.take_events()


def flush_hook(original: Any, sched: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on `Scheduler.flush_cache` (`/flush_cache`, weight updates):
    SGLang resets the radix tree beneath the adapter's prefix locks, and
    releasing a lock of the old tree later would raise in the scheduler. The
    locks go first; the prefixes are pinned again once cached (and TOPAS
    decides again at the next pass)."""
    topas = getattr(sched, ATTR, None)
    if topas is not None:
        topas.release_for_flush(sched)
    return original(sched, *args, **kwargs)


def attach(sched: Any, decider: Decider | None = None) -> PolicyExecutor:
    """Attach a PolicyExecutor to a Scheduler (the daemon's remote decider by default)."""
    sync = RankSync.for_scheduler(sched)
    channel = None
    if decider is None:
        if sync is None or sync.is_leader:
            timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
            channel = LeaderChannel(os.environ[ENDPOINT_ENV], _replica(sched), timeout)
            decider = RemoteDecider(channel)
        else:
            decider = _follower
    t0 = float(os.environ.get(T0_ENV, "0") or 0)
    topas = PolicyExecutor(decider, clock=lambda: time.monotonic() - t0, sync=sync)
    topas.channel = channel  # type: ignore[attr-defined]
    if channel is not None and isinstance(decider, RemoteDecider):
        decider.topas = topas
    setattr(sched, ATTR, topas)
    log.info("topasd: TOPAS drives this scheduler (replica %d, %s)", _replica(sched),
             "leader" if sync is None or sync.is_leader else "follower")
    return topas


class RemoteDecider:
    """Ask the daemon (which holds the policy, task book and log) for a decision."""

    def __init__(self, channel: LeaderChannel) -> None:
        self.channel = channel
        self.topas: PolicyExecutor | None = None

    def __call__(self, snap: EngineSnapshot) -> Decision | None:
        events = self.topas.take_events() if self.topas is not None else []
        return self.channel.decide(snap.seq, snap, events)


def _follower(snap: EngineSnapshot) -> Decision | None:
    raise AssertionError("a follower rank never decides; it receives the leader's decision")


def _replica(sched: Any) -> int:
    """The data-parallel replica this scheduler serves (0 without DP)."""
    from sglang.srt.runtime_context import get_parallel

    dp = get_parallel().dp_rank
    return int(dp) if dp is not None else 0
