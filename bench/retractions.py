"""Why the engine retracts: one generated case replayed through TOPAS and baselines,
with every admission's room and decode peak, and what is resident at each retraction.

    python bench/retractions.py [--family fork_join] [--draw 4] [--load light]
        [-p "topas decode_peak=backfill" -p lpm ...] [--tasks 100] [--write]

The case is `bench/generalization.py`'s (the same trace, capacity from its cache).
An admission *dooms* the batch when the KV its state holds at the decode peak
(`decode_peak` in topasd/scheduler/topas.py: the running requests, admitted ones
included, each growing to its whole output and freeing its KV when done, prefixes
held) exceeds the pool: the engine will retract unless something finishes early,
which outputs known to the simulator never do. Free KV is the engine's own
estimate after the admission (Eq. 2's d_r at the engine's new_token_ratio; new
requests their whole output), the room a policy filled. `--write` records the
table in docs/RESULTS.md (section "retractions").
"""

from __future__ import annotations

import statistics
from typing import Any

from _one_case import CaseBench  # bench/_one_case.py

from backends.sim.engine import SimBackend
from topasd.model import Decision, Location
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.topas import decode_peak
from workflows.generator import case_trace, draw_workload


class WatchedSim(SimBackend):
    """The simulator, noting each admitting decision and each retraction."""

    def __init__(self) -> None:
        super().__init__(get_profile(DEFAULT_PROFILE))
        self.admissions: list[dict[str, Any]] = []
        self.retracts: list[dict[str, float]] = []
        self._finished = 0

    def apply(self, decision: Decision) -> None:
        left = [r for r in self._waiting.values() if r.id not in set(decision.admit)]
        finished, self._finished = self._finished, 0
        super().apply(decision)
        if not decision.admit:
            return
        new = [self._running[r] for r in decision.admit]
        gpu = {a for a, p in self._prefixes.items() if p.location is Location.GPU}
        kept = [lv for lv in self._running.values() if lv not in new]
        free = self.profile.budget_tokens - self._demand(gpu, kept, [lv.req for lv in new],
                                                        decision.reservation)
        smallest = min(lv.req.input_tokens + lv.req.output_tokens for lv in new)
        self.admissions.append({
            "ratio": self.ratio, "free": free, "after_finish": finished > 0,
            "dooms": self._peak() > self.profile.budget_tokens,
            "passed_larger": any(r.input_tokens + r.output_tokens > smallest for r in left)})

    def _peak(self) -> float:
        busy = {lv.req.agent for lv in self._running.values()}
        held = sum(p.tokens for a, p in self._prefixes.items()
                   if p.location is Location.GPU and a in busy)
        return held + decode_peak([(lv.req.output_tokens - lv.generated, lv.kv)
                                   for lv in self._running.values()])

    def _finish(self, live: Any) -> None:
        super()._finish(live)
        self._finished += 1

    def _retract(self) -> None:
        busy = {lv.req.agent for lv in self._running.values()}
        idle = sum(p.tokens for a, p in self._prefixes.items()
                   if p.location is Location.GPU and a not in busy)
        self.retracts.append({"idle_prefix_kv": idle, "ratio": self.ratio})
        super()._retract()


def replay(family: str, draw: int, load: str, policy: str, params: dict[str, Any],
           tasks: int, capacity: float) -> dict[str, Any]:
    sim = WatchedSim()
    trace = case_trace(draw_workload(family, draw), load, tasks, capacity, draw)
    summary = Run(trace, make_policy(policy, **params), sim).execute().summary()
    adm, dooms = sim.admissions, [a for a in sim.admissions if a["dooms"]]
    med = statistics.median
    return {
        "mean": summary["mean_jct_s"], "retractions": summary["retractions"],
        "preemptions": summary["preemptions"], "again": summary["recomputed_tokens"],
        "admitting": len(adm), "dooming": len(dooms),
        "free": med(a["free"] for a in adm) if adm else 0.0,
        "ratio": med(a["ratio"] for a in adm) if adm else 0.0,
        "passed": sum(a["passed_larger"] for a in dooms),
        "no_finish": sum(not a["after_finish"] for a in dooms),
        "idle": med(r["idle_prefix_kv"] for r in sim.retracts) if sim.retracts else 0.0,
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| policy | mean JCT s | retractions | preemptions | tokens prefilled again | "
           "admitting decisions | of them dooming | median free KV after one (tokens) | "
           "median new_token_ratio then | dooming past a larger waiting request | "
           "dooming with no finish since the last decision | median idle prefix KV at a "
           "retraction |", "|---" * 12 + "|"]
    for r in rows:
        out.append(f"| {r['policy']} | {r['mean']:.1f} | {r['retractions']} | "
                   f"{r['preemptions']} | {r['again']:,} | {r['admitting']} | "
                   f"{r['dooming']} ({r['dooming'] / max(1, r['admitting']):.0%}) | "
                   f"{r['free']:.0f} | {r['ratio']:.3f} | {r['passed']} | {r['no_finish']} | "
                   f"{r['idle']:.0f} |")
    return out


BENCH = CaseBench(
    "retractions.py", "Why the engine retracts (`bench/retractions.py`)",
    "An admission dooms the batch when its state's decode peak (each running request "
    "growing to its whole output, a finished one freeing its KV) exceeds the pool.",
    "retractions", draw=4, load="light", replay=replay, table=table)


def main(argv: list[str] | None = None) -> None:
    BENCH.main(__doc__, argv)


if __name__ == "__main__":
    main()
