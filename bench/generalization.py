"""TOPAS on workloads nobody tuned it for: seeded random workflow families.

    python bench/generalization.py [--draws 10] [--tasks 100] [--jobs N] [--fresh-seed]
        [--family F]... [--load L]... [-p POLICY]... [--param NAME=VALUE]... [--write]
        [--json NOW.json] [--against EARLIER.json] [--seeds N] [--engine NAME=VALUE]...
    python bench/generalization.py --ablation --draws 3 [--write]
    python bench/generalization.py --calls LOG [--calls LOG2]... [--draws 10] [--write]
    python bench/generalization.py --holdout [--draws 10] [--write]

A case is (family draw, load, seed): a workload drawn by
`workflows/generator.py` from one of 9 families (chains, fork/joins, ReAct
loops with tool waits, a recurring central agent, one agent serving
parallel branches, debates, coding rounds, mixes of them sharing agents,
and `agent_loop`: tool-calling agents keeping their conversation across
tool waits), replayed at a load relative to its measured capacity (light
0.5x, heavy 0.85x, overload 1.3x; Poisson arrivals) or as a burst (every
task within a tenth of the time the capacity needs). Capacity is the best
baseline's throughput on the same tasks all arriving at once. Every
policy replays the same trace of each case on the default profile; the
comparator of a case is its best baseline
(lowest mean, and separately lowest p99, of fcfs, lpm, parrot-fcfs,
autellix-las and spf: issue 25's reading). With `--versus all` the peers
(continuum, astraea, kairos, saga, tokencake) replay every case too, and the
report sets TOPAS against both comparators: the best paper baseline and the
best of all (peers included); capacity stays the paper baselines', so the
cases are the same.

The fixed case list (draw seeds 0..draws-1; 9 families x 4 loads, 360 cases
at the default 10 draws; `--family agent_loop` for one family) keeps runs
comparable: a family's draws never change when one is added;
`--fresh-seed` draws a new list (its base seed is printed, to rerun it).
Results are cached per job under `.bench-cache/generalization` keyed by the
sources that decide them, so rerunning after a change to TOPAS replays only
TOPAS, and after a change to one peer only that peer. Writes the
`generalization` section of docs/RESULTS.md with `--write` (`--versus all`:
the `generalization-peers` section; `--ablation`: the
`generalization-ablation` section, each of TOPAS's extensions beyond the
paper turned off alone; with `--calls` or `--holdout` each name ends in
`-calls` or `-holdout`, so no run overwrites another list's). An
experiment is judged against the run before it: `--json NOW.json` keeps a
run's ratios, and `--against EARLIER.json` prints every bound before and
now, the cases that crossed one and the largest moves.
A real workload is judged the same way with `--calls LOG`: a call log
(docs/trace-format.md, "Importing a call log"; `bench/external_calls.py`
writes one from ChatDev's and MetaGPT's call records) is imported once,
and each case draws `--tasks` of its tasks by the seed (each task's calls
exactly as logged) at the same four loads relative to the capacity
measured on them; the family of its cases is `calls:` and the log's name
(section `generalization-calls`).
`--holdout` judges five shapes that are never in the fixed list
(`workflows/generator.py`, `HOLDOUT`: two-level map-reduce, validation
loops, wide fan-outs merged by a long answer, a long middle stage, binary
trees) the same way (section `generalization-holdout`): they are for
checking that a change holds beyond the shapes it was made on, never for
tuning.
`--engine NAME=VALUE` replays every case on the default profile with that
field changed (a larger or smaller KV pool, a slower host link, no host
tier as on vLLM): the same families, each draw keeping its requests within
the engine's pool and its prefixes within the same share of a pool smaller
than the default one, at loads relative to the capacity measured on that
engine (section `generalization-engine-...`, named by the fields changed).
The judged TOPAS's only random input is the seed of its E[LP] quantiles:
`--seeds 3` replays it under seeds 0, 1 and 2 too, so that a move can be set
against how far the numbers move by chance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import lru_cache
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from _results import at_least, update_section  # bench/_results.py
from _waits import Waits  # bench/_waits.py

from backends.sim.engine import SimBackend
from topasd.model import TopasError
from topasd.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from topasd.runner import Run, StalledRun
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.params import PAPER
from topasd.scheduler.peers import PEERS
from workflows.calllog import load_calls
from workflows.generator import (
    ALL_FAMILIES,
    FAMILIES,
    HOLDOUT,
    LOADS,
    burst_trace,
    case_trace,
    check_budget,
    draw_workload,
    log_case_trace,
)
from workflows.importer import import_calls
from workflows.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-cache" / "generalization"
KEEP = ("mean_jct_s", "p99_jct_s", "makespan_s", "mean_batch", "prefix_loads",
        "prefix_computes", "preemptions", "retractions", "recomputed_tokens", "decisions",
        "decision_p99_ms", "wall_s")
TIE = 0.02  # a ratio within 2% of 1 is a tie
# the acceptance bounds: (what, ratio, share of cases that must be at or below it)
BOUNDS = (("mean", 1.02, 0.95), ("mean", 1.10, 1.0), ("p99", 1.10, 0.95), ("p99", 1.25, 1.0))
GEOMEAN_BOUND = 0.93
RATIO = {"mean": 0, "p99": 1}  # where a bound's measure sits in a (mean, p99) ratio pair
PACKAGES = ("topasd", "backends", "workflows")  # whose imported modules decide a result
TOPAS_ONLY = ("topas.py", "residual.py", "bounds.py", "params.py", "param_specs.py", "native.py",
              "lots.py")
PEER_SHARED = ("estimates.py", "__init__.py", "residual.py")  # what every peer's replay reads


@dataclass(frozen=True)
class Job:
    """One replay: a policy on a case (`load` "capacity": the burst that measures it)."""

    family: str
    seed: int
    load: str
    policy: str
    tasks: int
    params: tuple[tuple[str, Any], ...] = ()
    capacity: float = 0.0
    waits: bool = False  # keep per-stage waits (the worst cases' diagnosis)
    log: str = ""  # a call log whose tasks the case draws (`--calls`) ...
    log_sha: str = ""  # ... and its content's hash, so that an edited log replays again
    engine: tuple[tuple[str, Any], ...] = ()  # fields of the default profile changed (`--engine`)

    @property
    def case(self) -> tuple[str, int, str]:
        return (self.family, self.seed, self.load)


def kind_of(policy: str) -> str:
    """Whose sources decide a replay of `policy`: "baseline", a peer's name, or "topas"."""
    return "baseline" if policy in BASELINES else policy if policy in PEERS else "topas"


def decides(kind: str, path: Path) -> bool:
    """Whether the source `path` can change a replay of a `kind` policy: TOPAS's
    own search modules only TOPAS's (residual.py also the peers', whose
    estimators read it), a peer's module only that peer's."""
    scheduler = ROOT / "topasd" / "scheduler"
    if path.parent == scheduler / "peers":
        return kind in PEERS and (path.stem == kind or path.name in PEER_SHARED)
    if path.parent == scheduler and path.name in TOPAS_ONLY:
        return kind == "topas" or (kind in PEERS and path.name in PEER_SHARED)
    return True


def fingerprint(kind: str) -> str:
    """A hash of the project's modules this process imported that can decide
    a replay of a `kind` policy (`kind_of`)."""
    files = sorted({_source(m.__name__, m.__file__) for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) and m.__name__.split(".")[0] in PACKAGES})
    h = hashlib.sha256()
    for f in files:
        if decides(kind, f):
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _source(module: str, file: str) -> Path:
    """The source a module was loaded from: its file, or for the compiled
    search (`topasd native build`, a cache outside the tree) the source it
    was built from, which decides the same."""
    path = Path(file).resolve()
    if path.is_relative_to(ROOT):
        return path
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


@lru_cache(maxsize=8)
def engine_profile(engine: tuple[tuple[str, Any], ...]) -> HardwareProfile:
    """The default profile with the fields `engine` changes (`--engine`); built
    once per engine and process (a replay's trace and backend read the same one)."""
    return get_profile(DEFAULT_PROFILE).with_overrides(**dict(engine))


def run_job(job: Job) -> tuple[Job, dict[str, Any]]:
    """Replay one job; the row keeps `KEEP` (and per-stage waits if asked)."""
    trace = job_trace(job)
    sink = Waits() if job.waits else None
    policy = make_policy(job.policy, **dict(job.params))
    try:
        result = Run(trace, policy, SimBackend(engine_profile(job.engine)),
                     sink=sink).execute()
    except StalledRun as exc:  # a scheduler bug: reported as the case's failure
        return job, {**dict.fromkeys(KEEP, math.inf), "error": str(exc)}
    summary = result.summary()
    row = {k: summary[k] for k in KEEP}
    if sink is not None:
        row["stage_waits"] = sink.per_stage()
        row["longest_wait"] = sink.longest()
        slowest = max(result.jct, key=result.jct.__getitem__)
        row["slowest"] = (slowest, result.jct[slowest],
                          trace.tasks[[t.id for t in trace.tasks].index(slowest)].workflow)
    return job, row


def job_trace(job: Job) -> Trace:
    """The trace a job replays: its case's, or (load "capacity") the burst at
    t=0 that measures the capacity of its draw or log. A draw keeps each
    request within the engine's pool (`--engine budget_tokens=`)."""
    if job.log:
        return log_case_trace(logged(job.log), job.load, job.tasks, job.capacity, job.seed)
    budget = engine_profile(job.engine).budget_tokens
    wl = draw_workload(job.family, job.seed, budget)
    if job.load == "capacity":
        return burst_trace(wl, job.tasks, job.seed, budget)
    return case_trace(wl, job.load, job.tasks, job.capacity, job.seed, budget)


@lru_cache(maxsize=8)
def logged(path: str) -> Trace:
    """The trace of a call log, imported once per process (its arrivals are
    replaced by each case's)."""
    return import_calls(load_calls(path), Path(path).stem, source=path, rate=1.0).trace


class Cache:
    """Job results on disk, one JSON file per fingerprint (appended lines)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        # taken now: the sources this process imported, even if edited while it runs
        self._prints = {kind: fingerprint(kind) for kind in ("baseline", "topas", *PEERS)}
        self._rows: dict[str, dict[str, dict[str, Any]]] = {}
        self.hits = self.misses = 0  # replays found in the cache, and replayed

    def _key(self, job: Job) -> tuple[Path | None, str]:
        kind = kind_of(job.policy)
        fp = self._prints[kind]
        fields = asdict(job)
        if not job.engine:  # the default engine's keys as they were before `--engine`
            del fields["engine"]
        return (None if self.root is None else self.root / f"{kind}-{fp}.jsonl",
                json.dumps(fields, sort_keys=True))

    def get(self, job: Job) -> dict[str, Any] | None:
        path, key = self._key(job)
        if path is None:
            return None
        rows = self._rows.get(str(path))
        if rows is None:
            rows = self._rows[str(path)] = {}
            if path.exists():
                for line in path.read_text().splitlines():
                    rec = json.loads(line)
                    rows[rec["key"]] = rec["row"]
        row = rows.get(key)
        self.hits += row is not None
        self.misses += row is None
        return row

    def put(self, job: Job, row: dict[str, Any]) -> None:
        path, key = self._key(job)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._rows.setdefault(str(path), {})[key] = row
        with path.open("a") as f:
            f.write(json.dumps({"key": key, "row": row}) + "\n")


def execute(jobs: Sequence[Job], cache: Cache, workers: int, label: str) -> dict[Job, dict]:
    """Every job's row: from the cache, else replayed in a process pool, with a
    progress line on stderr (done/total, elapsed, estimated time left)."""
    out: dict[Job, dict[str, Any]] = {}
    todo = []
    for job in jobs:
        hit = cache.get(job)
        if hit is None:
            todo.append(job)
        else:
            out[job] = hit
    t0 = time.monotonic()
    if todo:
        with Pool(workers) as pool:
            for i, (job, row) in enumerate(pool.imap_unordered(run_job, todo), 1):
                cache.put(job, row)
                out[job] = row
                _progress(label, i, len(todo), time.monotonic() - t0)
        print(file=sys.stderr)
    return out


def _progress(label: str, done: int, total: int, elapsed: float) -> None:
    left = elapsed / done * (total - done)
    print(f"\r{label}: {done}/{total} replays, {elapsed:.0f} s, about {left:.0f} s left   ",
          end="", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- cases


Logs = Mapping[str, tuple[str, str]]  # a `--calls` family -> (its log's path, content hash)


def read_logs(paths: Sequence[Path]) -> dict[str, tuple[str, str]]:
    """Each `--calls` log as a family of cases, `calls:` and its name; imported
    here once, so that a log that is no call log fails before any replay."""
    logs: dict[str, tuple[str, str]] = {}
    for path in paths:
        family = f"calls:{path.stem}"
        if family in logs:
            raise ValueError(f"{path}: a second log named {path.stem!r}; rename one")
        logged(str(path))  # raises CallLogError naming the line and the fix
        logs[family] = (str(path), hashlib.sha256(path.read_bytes()).hexdigest()[:16])
    return logs


def _job(family: str, seed: int, load: str, policy: str, tasks: int, logs: Logs,
         params: tuple[tuple[str, Any], ...] = (), capacity: float = 0.0,
         engine: tuple[tuple[str, Any], ...] = ()) -> Job:
    path, sha = logs.get(family, ("", ""))
    return Job(family, seed, load, policy, tasks, params, capacity, log=path, log_sha=sha,
               engine=engine)


def cases(families: Iterable[str], loads: Iterable[str], draws: int,
          base: int) -> list[tuple[str, int, str]]:
    return [(f, base + d, load) for f in families for d in range(draws) for load in loads]


def capacities(cases_: Sequence[tuple[str, int, str]], tasks: int, cache: Cache,
               workers: int, logs: Logs | None = None,
               engine: tuple[tuple[str, Any], ...] = ()) -> dict[tuple[str, int], float]:
    """Per workload draw: tasks / the shortest baseline makespan of a burst at t=0."""
    draws = sorted({(f, s) for f, s, _ in cases_})
    jobs = {(f, s, p): _job(f, s, "capacity", p, tasks, logs or {}, engine=engine)
            for f, s in draws for p in BASELINES}
    rows = execute(list(jobs.values()), cache, workers, "capacity")
    caps = {(f, s): tasks / min(rows[jobs[(f, s, p)]]["makespan_s"] for p in BASELINES)
            for f, s in draws}
    for (f, s), cap in caps.items():
        if not cap:  # every baseline stalled: the engine cannot serve the draw's requests
            why = rows[jobs[(f, s, next(iter(BASELINES)))]].get("error", "")
            raise SystemExit(f"generalization.py: error: no baseline finished {f} #{s} on "
                             f"this engine ({why}); its requests need a larger KV pool "
                             "(--engine budget_tokens=)")
    return caps


def case_jobs(cases_: Sequence[tuple[str, int, str]], policies: Sequence[str], tasks: int,
              caps: dict[tuple[str, int], float],
              params: dict[str, tuple[tuple[str, Any], ...]],
              logs: Logs | None = None, engine: tuple[tuple[str, Any], ...] = ()) -> list[Job]:
    return [_job(f, s, load, p, tasks, logs or {}, params.get(p, ()), caps[(f, s)], engine)
            for f, s, load in cases_ for p in policies]


@dataclass(frozen=True)
class CaseResult:
    """TOPAS against the best baseline on one case."""

    job: Job  # the policy's replay of the case
    topas: dict[str, Any]
    best_mean: tuple[str, float]  # (baseline, its mean JCT)
    best_p99: tuple[str, float]
    comparator: dict[str, Any]  # the best-mean baseline's row

    @property
    def case(self) -> tuple[str, int, str]:
        return self.job.case

    @property
    def mean_ratio(self) -> float:
        return self.topas["mean_jct_s"] / self.best_mean[1]

    @property
    def p99_ratio(self) -> float:
        return self.topas["p99_jct_s"] / self.best_p99[1]

    @property
    def ratios(self) -> tuple[float, float]:
        """(mean ratio, p99 ratio), indexed by `RATIO` of a bound's measure."""
        return self.mean_ratio, self.p99_ratio


def compare(rows: dict[Job, dict[str, Any]], policy: str,
            versus: Sequence[str] = tuple(BASELINES)) -> list[CaseResult]:
    """Per case: `policy` against the best of `versus` (the paper's baselines
    unless told) by mean and by p99."""
    out = []
    for _, jobs in sorted(by_case(rows).items()):
        base = {p: rows[jobs[p]] for p in versus}
        bm = min(base, key=lambda p: (base[p]["mean_jct_s"], p))
        bp = min(base, key=lambda p: (base[p]["p99_jct_s"], p))
        out.append(CaseResult(jobs[policy], rows[jobs[policy]], (bm, base[bm]["mean_jct_s"]),
                              (bp, base[bp]["p99_jct_s"]), base[bm]))
    return out


def by_case(rows: dict[Job, dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Job]]:
    """Each case's jobs by policy."""
    out: dict[tuple[str, int, str], dict[str, Job]] = defaultdict(dict)
    for job in rows:
        out[job.case][job.policy] = job
    return out


# ----------------------------------------------------------------- analysis


def geomean(xs: Iterable[float]) -> float:
    arr = np.array(list(xs), dtype=float)
    return float(np.exp(np.log(arr).mean())) if arr.size else math.nan


def counts(ratios: Sequence[float]) -> tuple[int, int, int]:
    """(wins, ties, losses): below, within, above 1 +- TIE."""
    wins = sum(r < 1 - TIE for r in ratios)
    losses = sum(r > 1 + TIE for r in ratios)
    return wins, len(ratios) - wins - losses, losses


def ratio_criteria(ratios: Sequence[tuple[float, float]]) -> list[tuple[str, str, bool]]:
    """(criterion, measured, holds) for each bound on the (mean, p99) ratios
    of the cases: the shares within each bound, and the geometric mean."""
    out = []
    for what, bound, share in BOUNDS:
        xs = [pair[RATIO[what]] for pair in ratios]
        held = sum(x <= bound for x in xs) / len(xs)
        rule = "every case" if share == 1.0 else f"at least {share:.0%} of cases"
        out.append((f"{what} JCT <= {bound:.2f}x the best baseline's in {rule}",
                    f"{held:.1%} of cases (worst {max(xs):.3f}x)", held >= share))
    gm = geomean(m for m, _ in ratios)
    out.append((f"geometric mean of mean-JCT ratios <= {GEOMEAN_BOUND}", f"{gm:.3f}",
                gm <= GEOMEAN_BOUND))
    return out


def criteria(results: Sequence[CaseResult]) -> list[tuple[str, str, bool]]:
    """(criterion, measured, holds) for each acceptance bound."""
    out = ratio_criteria([r.ratios for r in results])
    recomputed = waste_ratio(results, "recomputed_tokens")
    out.append(("median case: tokens prefilled again <= 1.5x the best baseline's",
                f"{recomputed:.2f}x", recomputed <= 1.5))
    loads = light_loads(results)
    out.append(("light load, median case: prefix loads <= 2x the best baseline's",
                f"{loads:.2f}x", loads <= 2.0))
    return out


def waste_table(results: Sequence[CaseResult], policy: str) -> list[str]:
    """Medians over cases of the work each side redid or moved."""
    keys = (("preemptions", "preemptions"), ("retractions", "retractions (engine)"),
            ("recomputed_tokens", "tokens prefilled again"), ("prefix_loads", "prefix loads"))
    lines = [f"| median over cases | {policy} | best-mean baseline |", "|---|---|---|"]
    for key, label in keys:
        ours = np.median([r.topas[key] for r in results])
        theirs = np.median([r.comparator[key] for r in results])
        lines.append(f"| {label} | {ours:.0f} | {theirs:.0f} |")
    return lines


def light_loads(results: Sequence[CaseResult]) -> float:
    """`waste_ratio` of prefix loads over the light-load cases (nan: none)."""
    light = [r for r in results if r.case[2] == "light"]
    return waste_ratio(light, "prefix_loads") if light else math.nan


def waste_ratio(results: Sequence[CaseResult], key: str) -> float:
    """The median over cases of (TOPAS's + 1) / (the best-mean baseline's + 1)."""
    return float(np.median([(r.topas[key] + 1) / (r.comparator[key] + 1) for r in results]))


def distribution(ratios: Sequence[float]) -> str:
    qs = np.percentile(ratios, [0, 5, 25, 50, 75, 95, 100])
    return " | ".join(f"{q:.3f}" for q in qs)


def family_table(results: Sequence[CaseResult], loads: Sequence[str]) -> list[str]:
    """Geometric mean (and worst) of the mean-JCT ratio per family and load."""
    lines = ["| family | " + " | ".join(loads) + " | all |",
             "|---|" + "---|" * (len(loads) + 1)]
    for fam in sorted({r.case[0] for r in results}, key=family_order):
        cells = []
        for load in (*loads, None):
            rs = [r.mean_ratio for r in results
                  if r.case[0] == fam and (load is None or r.case[2] == load)]
            cells.append(f"{geomean(rs):.3f} ({max(rs):.2f})" if rs else "-")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    return lines


def family_order(family: str) -> tuple[int, str]:
    """The generated families in `ALL_FAMILIES` order, then the call logs by name."""
    return (ALL_FAMILIES.index(family) if family in ALL_FAMILIES else len(ALL_FAMILIES),
            family)


def diagnose(topas: dict[str, Any], base: dict[str, Any], name: str) -> str:
    """What the two runs' decision data say went wrong, in one line."""
    parts = []
    span = topas["makespan_s"] / base["makespan_s"] - 1
    if abs(span) > 0.02:
        parts.append(f"makespan {span:+.0%} (batch {topas['mean_batch']:.1f} vs "
                     f"{base['mean_batch']:.1f})")
    if topas["preemptions"]:
        parts.append(f"{topas['preemptions']} preemptions")
    if topas["recomputed_tokens"] > 1.5 * base["recomputed_tokens"] + 1000:
        parts.append(f"{topas['recomputed_tokens'] / 1e3:.0f}k tokens prefilled again vs "
                     f"{base['recomputed_tokens'] / 1e3:.0f}k")
    if topas["prefix_loads"] > 2 * base["prefix_loads"] + 10:
        parts.append(f"{topas['prefix_loads']} prefix loads vs {base['prefix_loads']}")
    tw, bw = topas.get("stage_waits", {}), base.get("stage_waits", {})
    worse = sorted(((tw[s] - bw.get(s, 0.0), s) for s in tw), reverse=True)[:1]
    if worse and worse[0][0] > 1.0:
        s = worse[0][1]
        parts.append(f"stage {s} waits {tw[s]:.0f} s vs {bw.get(s, 0.0):.0f} s")
    (lw, ls), (blw, bls) = topas["longest_wait"], base["longest_wait"]
    parts.append(f"longest wait {lw:.0f} s ({ls}) vs {blw:.0f} s ({bls})")
    sid, sj, swf = topas["slowest"]
    parts.append(f"slowest task {sid} ({swf}) {sj:.0f} s vs {name}'s {base['slowest'][1]:.0f} s")
    return "; ".join(parts)


def worst_cases(results: Sequence[CaseResult], policy: str, n: int, cache: Cache,
                workers: int) -> list[tuple[CaseResult, str]]:
    """The `n` highest mean-JCT ratios, each with a diagnosis from replays that
    keep per-stage waits (TOPAS and that case's best baseline)."""
    worst = sorted(results, key=lambda r: -r.mean_ratio)[:n]
    jobs = []
    for r in worst:
        j = r.job
        jobs += [replace(j, policy=p, params=j.params if p == policy else (), waits=True)
                 for p in (policy, r.best_mean[0])]
    rows = execute(jobs, cache, workers, "diagnosis")
    out = []
    for r, (a, b) in zip(worst, zip(jobs[::2], jobs[1::2], strict=True), strict=True):
        stalled = rows[a].get("error")
        out.append((r, f"stalled: {stalled}" if stalled else
                    diagnose(rows[a], rows[b], r.best_mean[0])))
    return out


# ------------------------------------------------------------ --against

Case = tuple[str, int, str]


def read_ratios(path: Path) -> dict[Case, tuple[float, float]]:
    """Each case's (mean, p99) ratio from an earlier run's `--json` file;
    ValueError naming the file and the fix if it is not one."""
    fix = f"{path}: give a file an earlier `bench/generalization.py --json FILE` wrote"
    try:
        rows = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{fix} (cannot read it: {exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{fix} (not JSON: line {exc.lineno}, column {exc.colno})") from None
    out: dict[Case, tuple[float, float]] = {}
    for i, row in enumerate(rows if isinstance(rows, list) else [None]):
        try:
            family, seed, load = row["case"]
            out[(str(family), int(seed), str(load))] = (
                row["policy"]["mean_jct_s"] / row["best_mean"][1],
                row["policy"]["p99_jct_s"] / row["best_p99"][1])
        except (TypeError, KeyError, ValueError, IndexError, ZeroDivisionError):
            raise ValueError(f"{fix} (row {i} is not a case's row)") from None
    if not out:
        raise ValueError(f"{fix} (it holds no case)")
    return out


def _case_name(case: Case) -> str:
    return f"{case[0]} #{case[1]} {case[2]}"


def crossings(before: dict[Case, tuple[float, float]],
              now: dict[Case, tuple[float, float]]) -> list[str]:
    """Per bound of BOUNDS: the cases of both runs that moved inside it and
    those that moved outside it, each with its ratio before and now."""
    lines = []
    for what, bound, _ in BOUNDS:
        k = RATIO[what]
        moved = {True: [], False: []}  # now inside: cases
        for case in sorted(before.keys() & now.keys()):
            was, is_ = before[case][k], now[case][k]
            if (was <= bound) != (is_ <= bound):
                moved[is_ <= bound].append(f"{_case_name(case)} {was:.3f} -> {is_:.3f}")
        lines.append(f"- {what} <= {bound:.2f}x: {len(moved[True])} in "
                     f"({'; '.join(moved[True]) or '-'}), {len(moved[False])} out "
                     f"({'; '.join(moved[False]) or '-'})")
    return lines


def render_against(results: Sequence[CaseResult], before: dict[Case, tuple[float, float]],
                   path: Path, top: int = 5) -> str:
    """This run against an earlier one's `--json`, on the cases both hold:
    every ratio bound before and now, the cases that crossed one, and the
    largest moves of the mean ratio each way."""
    now = {r.case: r.ratios for r in results}
    common = sorted(before.keys() & now.keys())
    if not common:
        return f"No case of this run is in {path}: nothing to compare.\n"
    lines = [f"## Against `{path}`", "",
             f"{len(common)} cases in both runs ({len(now.keys() - before.keys())} only in "
             f"this one, {len(before.keys() - now.keys())} only in the earlier one).", "",
             "| criterion | earlier | now |", "|---|---|---|"]
    for (c, was, ok_was), (_, is_, ok) in zip(ratio_criteria([before[c] for c in common]),
                                              ratio_criteria([now[c] for c in common]),
                                              strict=True):
        lines.append(f"| {c} | {was} ({_yes(ok_was)}) | {is_} ({_yes(ok)}) |")
    lines += ["", "Cases across a bound (mean ratio or p99 ratio, earlier -> now):", "",
              *crossings(before, now), ""]
    by_move = sorted(common, key=lambda c: (now[c][0] / before[c][0], c))
    better = [c for c in by_move if now[c][0] < before[c][0]][:top]
    worse = [c for c in by_move[::-1] if now[c][0] > before[c][0]][:top]
    for label, picked in (("improved", better), ("worsened", worse)):
        lines.append(f"Mean ratio most {label}: " + ("; ".join(
            f"{_case_name(c)} {before[c][0]:.3f} -> {now[c][0]:.3f}" for c in picked) or "-"))
    return "\n".join(lines) + "\n"


def render_seeds(by_seed: dict[int, Sequence[CaseResult]]) -> str:
    """`--seeds`: every ratio bound under each quantile seed of the judged
    policy (its only random input), and the cases over a bound under every
    seed (the policy's doing) or under some only (chance)."""
    seeds = sorted(by_seed)
    lines = ["## Across the quantile seeds (`--seeds`)", "",
             "| criterion | " + " | ".join(f"seed {x}" for x in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    measured = [ratio_criteria([r.ratios for r in by_seed[x]]) for x in seeds]
    for i, (label, _, _) in enumerate(measured[0]):
        lines.append(f"| {label} | " + " | ".join(
            f"{m[i][1]} ({_yes(m[i][2])})" for m in measured) + " |")
    lines.append("")
    for what, bound, _ in BOUNDS:
        over: dict[Case, int] = defaultdict(int)
        for x in seeds:
            for r in by_seed[x]:
                over[r.case] += r.ratios[RATIO[what]] > bound
        every = sorted(c for c, n in over.items() if n == len(seeds))
        some = sum(0 < n < len(seeds) for n in over.values())
        lines.append(f"- {what} > {bound:.2f}x under every seed: {len(every)} "
                     f"({'; '.join(_case_name(c) for c in every) or '-'}); "
                     f"under some seeds only: {some}")
    return "\n".join(lines) + "\n"


def seed_results(results: list[CaseResult], rows: dict[Job, dict[str, Any]],
                 args: argparse.Namespace, cases_: Sequence[Case],
                 caps: dict[tuple[str, int], float], cache: Cache,
                 others: Sequence[str]) -> dict[int, list[CaseResult]]:
    """The judged policy against the same baselines' rows under quantile
    seeds 1..`--seeds`-1; seed 0 is `results`, the run of `rows`."""
    given = dict(results[0].job.params)  # every case's --param, as the replays took them
    base = {job: row for job, row in rows.items() if job.policy != args.policy}
    out = {0: results}
    for seed in range(1, args.seeds):
        params = {args.policy: tuple(sorted({**given, "seed": seed}.items()))}
        mine = execute(case_jobs(cases_, [args.policy], args.tasks, caps, params, args.logs,
                                 args.engine),
                       cache, args.jobs, f"seed {seed}")
        out[seed] = compare({**base, **mine}, args.policy, others)
    return out


def json_rows(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """What `--json` writes and `--against` reads: each case's row of the
    judged policy and its best baselines by mean and by p99."""
    return [{"case": r.case, "policy": r.topas, "best_mean": r.best_mean,
             "best_p99": r.best_p99} for r in results]


# ----------------------------------------------------------------- report


def timing(wall: float, cache: Cache) -> str:
    """How long the run took, and how much of it an earlier run's cache saved."""
    if not cache.hits:
        return f"{wall / 60:.1f} min on this machine"
    return (f"{wall / 60:.1f} min on this machine, {cache.hits} of "
            f"{cache.hits + cache.misses} replays taken from an earlier run's cache")


def render(results: Sequence[CaseResult], worst: Sequence[tuple[CaseResult, str]],
           args: argparse.Namespace, policy: str, took: str) -> str:
    means = [r.mean_ratio for r in results]
    p99s = [r.p99_ratio for r in results]
    loads = [load for load in LOADS if any(r.case[2] == load for r in results)]
    title = TITLES[case_list(args)]
    lines = [f"## {title} (`bench/generalization.py`)", "",
             f"Command: `{command(args)}` ({took}). "
             f"{len(results)} cases: {sources(results, args)} x {len(loads)} loads, "
             f"{args.tasks} tasks each, "
             f"{profile_label(args)}. `{policy}` against the best baseline of each "
             "case (lowest mean, and separately lowest p99, of "
             f"{', '.join(BASELINES)}); ratio = {policy} / best baseline.", "",
             "| criterion | measured | holds |", "|---|---|---|"]
    lines += [f"| {c} | {m} | {_yes(ok)} |" for c, m, ok in criteria(results)]
    (mw, mt, ml), (pw, pt, pl) = counts(means), counts(p99s)
    lines += ["", "| ratio | wins / ties / losses (2%) | min | p5 | p25 | median | p75 | p95 "
              "| max | geometric mean |", "|---|---|---|---|---|---|---|---|---|---|",
              f"| mean JCT | {mw} / {mt} / {ml} | {distribution(means)} | {geomean(means):.3f} |",
              f"| p99 JCT | {pw} / {pt} / {pl} | {distribution(p99s)} | {geomean(p99s):.3f} |",
              "", *waste_table(results, policy),
              "", "Mean-JCT ratio by family and load: geometric mean (worst case).", "",
              *family_table(results, loads), "",
              *worst_table(worst, "best baseline")]
    return "\n".join(lines) + "\n"


def sources(results: Sequence[CaseResult], args: argparse.Namespace) -> str:
    """Where the cases come from: generated families' draws, call logs' seeds."""
    names = {r.case[0] for r in results}
    logs = sorted(n for n in names if n in args.logs)
    parts = []
    if len(names) > len(logs):
        parts.append(f"{args.draws} draw(s) of each of {len(names) - len(logs)} workflow "
                     "families (`workflows/generator.py`)")
    if logs:
        parts.append(f"{args.draws} arrival seed(s) of each of {len(logs)} call log(s) ("
                     + ", ".join(f"`{n}`: {logged(args.logs[n][0]).meta.get('tasks')} "
                                 "logged tasks" for n in logs) + ")")
    return " and ".join(parts)


def worst_table(worst: Sequence[tuple[CaseResult, str]], comparator: str) -> list[str]:
    """The worst cases with their diagnoses, one row each."""
    lines = [f"The {len(worst)} worst cases (mean-JCT ratio), with what their replays show:",
             "", f"| case | mean ratio | p99 ratio | {comparator} | what went wrong |",
             "|---|---|---|---|---|"]
    for r, why in worst:
        f, s, load = r.case
        lines.append(f"| {f} #{s} {load} | {r.mean_ratio:.3f} | {r.p99_ratio:.3f} "
                     f"| {r.best_mean[0]} {r.best_mean[1]:.0f} s | {why} |")
    return lines


def standings(rows: dict[Job, dict[str, Any]], policy: str,
              others: Sequence[str]) -> list[str]:
    """Per policy of `others`: the cases where it is the best of them by mean,
    its mean over the best paper baseline's, and `policy`'s over its (both
    geometric means over cases), with `policy`'s wins / ties / losses."""
    cases = [{p: rows[j]["mean_jct_s"] for p, j in jobs.items()}
             for _, jobs in sorted(by_case(rows).items())]
    lines = [f"| policy | best of all in (cases) | its mean / best paper baseline's "
             f"| {policy} / it | {policy}: wins / ties / losses (2%) |", "|---|---|---|---|---|"]
    for other in others:
        best = sum(min(others, key=lambda p, c=c: (c[p], p)) == other for c in cases)
        vs_paper = [c[other] / min(c[p] for p in BASELINES) for c in cases]
        ours = [c[policy] / c[other] for c in cases]
        w, t, lo = counts(ours)
        lines.append(f"| {other} | {best} | {geomean(vs_paper):.3f} | {geomean(ours):.3f} "
                     f"| {w} / {t} / {lo} |")
    return lines


def render_versus(paper: Sequence[CaseResult], every: Sequence[CaseResult],
                  rows: dict[Job, dict[str, Any]], worst: Sequence[tuple[CaseResult, str]],
                  args: argparse.Namespace, took: str) -> str:
    """`--versus all`: the policy against each case's best paper baseline
    (issue 25's reading) and against the best of all, peers included."""
    policy, others = args.policy, everyone_but(args.policy)
    loads = [load for load in LOADS if any(r.case[2] == load for r in every)]
    lines = ["## Workloads nobody tuned for, against the peers too "
             "(`bench/generalization.py --versus all`)", "",
             f"Command: `{command(args)}` ({took}). {len(every)} cases: "
             f"{sources(every, args)} x {len(loads)} loads, {args.tasks} tasks each, "
             f"{profile_label(args)}. "
             "Two comparators per case: the best paper "
             f"baseline ({', '.join(BASELINES)}; the bounds of issue 25 are stated against "
             f"it) and the best of all, the peers included ({', '.join(PEERS)}).", "",
             "| criterion | vs best paper baseline | holds | vs best of all | holds |",
             "|---|---|---|---|---|"]
    for (c, m, ok), (_, m2, ok2) in zip(criteria(paper), criteria(every), strict=True):
        lines.append(f"| {c} | {m} | {_yes(ok)} | {m2} | {_yes(ok2)} |")
    lines += ["", "| ratio | comparator | wins / ties / losses (2%) | min | p5 | p25 | median "
              "| p75 | p95 | max | geometric mean |", "|---|---|" + "---|" * 9]
    for what in ("mean", "p99"):
        for label, res in (("best paper baseline", paper), ("best of all", every)):
            xs = [r.ratios[RATIO[what]] for r in res]
            w, t, lo = counts(xs)
            lines.append(f"| {what} JCT | {label} | {w} / {t} / {lo} | {distribution(xs)} "
                         f"| {geomean(xs):.3f} |")
    lines += ["", "Every other policy on these cases (mean JCT; geometric means over cases):",
              "", *standings(rows, policy, others), "",
              "Mean-JCT ratio to the best of all, by family and load: geometric mean "
              "(worst case).", "", *family_table(every, loads), "",
              *worst_table(worst, "best of all")]
    return "\n".join(lines) + "\n"


def everyone_but(policy: str) -> tuple[str, ...]:
    """The comparators of `--versus all`: the paper's baselines and the peers."""
    return tuple(p for p in (*BASELINES, *PEERS) if p != policy)


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def ablation(cases_: Sequence[tuple[str, int, str]], args: argparse.Namespace,
             caps: dict[tuple[str, int], float], cache: Cache) -> str:
    """`topas` with every default, with each of its extensions beyond the
    paper set to the paper's value alone (`PAPER`), and `topas-paper`
    (all of them), each against the best baseline of every case."""
    variants: list[tuple[str, str, tuple[tuple[str, Any], ...]]] = [
        ("topas (every default)", "topas", ())]
    variants += [(f"without {k} (`{k}={json.dumps(v)}`)", "topas", ((k, v),))
                 for k, v in PAPER.items()]
    earlier = ("start_gate", "preempt_margin", "pack_order")  # chosen on the built-in five
    variants.append(("only the three chosen on the built-in workloads", "topas",
                     tuple(sorted((k, v) for k, v in PAPER.items() if k not in earlier))))
    variants.append(("topas-paper (none of them)", "topas-paper", ()))
    base = execute(case_jobs(cases_, BASELINES, args.tasks, caps, {}, args.logs, args.engine),
                   cache, args.jobs, "baselines")
    lines = ["| variant | geometric mean of mean ratios | mean <= 1.02x | p99 <= 1.10x "
             "| worst mean | wins / ties / losses | prefilled again (median) "
             "| light load: prefix loads (median) |", "|---|---|---|---|---|---|---|---|"]
    for label, policy, params in variants:
        rows = execute(case_jobs(cases_, [policy], args.tasks, caps, {policy: params}, args.logs,
                                 args.engine),
                       cache, args.jobs, label)
        res = compare({**base, **rows}, policy)
        means, p99s = [r.mean_ratio for r in res], [r.p99_ratio for r in res]
        w, t, lo = counts(means)
        lines.append(f"| {label} | {geomean(means):.3f} "
                     f"| {sum(x <= 1.02 for x in means) / len(means):.1%} "
                     f"| {sum(x <= 1.10 for x in p99s) / len(p99s):.1%} | {max(means):.3f} "
                     f"| {w} / {t} / {lo} | {waste_ratio(res, 'recomputed_tokens'):.2f}x "
                     f"| {light_loads(res):.2f}x |")
    return "\n".join([
        "## Workloads nobody tuned for: what each extension does "
        "(`bench/generalization.py --ablation`)", "",
        f"Command: `{command(args)} --ablation`. {len(cases_)} cases, as in the section "
        "above; each row changes one parameter of `topas` to the paper's value "
        "(docs/topas.md, \"Extensions\"), and the ratios are to the best baseline of "
        "each case.", "", *lines]) + "\n"


def command(args: argparse.Namespace) -> str:
    parts = ["python bench/generalization.py", f"--draws {args.draws}", f"--tasks {args.tasks}"]
    if args.base:
        parts.append(f"--base-seed {args.base}")
    parts += [f"--calls {x}" for x in args.calls or ()]
    if args.holdout:
        parts.append("--holdout")
    parts += [f"--family {f}" for f in args.family or ()]
    parts += [f"--load {x}" for x in args.load or ()]
    parts += [f"--param {x}" for x in args.param or ()]
    parts += [f"--engine {x}" for x in engine_items(args.engine)]
    if args.versus == "all":
        parts.append("--versus all")
    return " ".join(parts)


def engine_items(engine: Sequence[tuple[str, Any]]) -> list[str]:
    """Each field `--engine` changed as NAME=VALUE (VALUE as JSON)."""
    return [f"{k}={json.dumps(v)}" for k, v in engine]


def profile_label(args: argparse.Namespace) -> str:
    """The engine the cases ran on: the default profile, and the fields `--engine` changed."""
    changed = ", ".join(engine_items(args.engine))
    return f"profile `{DEFAULT_PROFILE}`" + (f" with {changed}" if changed else "")


def parse_engine(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """`--engine NAME=VALUE` items as fields of the default profile, each of the
    field's own type (an int field takes a whole number, a flag true or false);
    ValueError naming the item and the fix."""
    default = get_profile(DEFAULT_PROFILE)
    known = [f.name for f in dataclass_fields(default)
             if type(getattr(default, f.name)) in (int, float, bool)]  # not its name, text
    out = []
    for name, value in parse_params(items, "--engine"):
        if name not in known:
            raise ValueError(f"{name}: not a field of a profile; give one of {', '.join(known)}")
        kind = type(getattr(default, name))
        ok = isinstance(value, bool) if kind is bool else (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            and (kind is float or float(value).is_integer()))
        if not ok:
            what = {bool: "true or false", int: "a whole number"}.get(kind, "a number")
            raise ValueError(f"{name}={json.dumps(value)}: give {what} (the default is "
                             f"{json.dumps(getattr(default, name))})")
        out.append((name, kind(value)))
    engine = tuple(out)
    try:  # the profile's own checks (a pool > 0, a link > 0, ...), and the generator's
        check_budget(engine_profile(engine).budget_tokens)
    except TopasError as exc:
        raise ValueError(str(exc)) from None
    return engine


def parse_params(items: Sequence[str], flag: str = "--param") -> tuple[tuple[str, Any], ...]:
    """NAME=VALUE items (`--param`, `--engine`): each value as JSON, else as a word."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"generalization.py: error: {flag} {item!r}: use NAME=VALUE")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:  # a word: pack_order=arrival
            out[name] = value
    return tuple(sorted(out.items()))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=at_least(1), default=10, help="draws per family (10)")
    ap.add_argument("--tasks", type=at_least(2), default=100, help="tasks per case (100)")
    ap.add_argument("--jobs", type=at_least(1), default=os.cpu_count() or 1)
    ap.add_argument("--family", action="append", choices=ALL_FAMILIES,
                    help=f"only this family (repeatable; default: all {len(FAMILIES)}, the "
                         f"{len(HOLDOUT)} of --holdout with it, or none with --calls)")
    ap.add_argument("--holdout", action="store_true",
                    help=f"the shapes never in the fixed list instead ({', '.join(HOLDOUT)}): "
                         "a check beyond what TOPAS was tuned on")
    ap.add_argument("--calls", action="append", type=Path, metavar="LOG",
                    help="judge on tasks drawn from this call log (docs/trace-format.md, "
                         "\"Importing a call log\"; repeatable): --draws arrival seeds x the "
                         "loads, as the generated families are")
    ap.add_argument("--load", action="append", choices=LOADS,
                    help=f"only this load (repeatable; default: all {len(LOADS)})")
    ap.add_argument("--policy", "-p", default="topas", help="the policy judged (topas)")
    ap.add_argument("--param", action="append", metavar="NAME=VALUE",
                    help="a parameter of the judged TOPAS policy (repeatable)")
    ap.add_argument("--engine", action="append", metavar="NAME=VALUE",
                    help="replay on the default profile with this field changed "
                         "(repeatable), e.g. budget_tokens=36000 (a larger KV pool; each "
                         "draw keeps its requests within it), swap_bytes_per_s=5e9 (a "
                         "slower host link), host_cache=false (no host tier, as on vLLM): "
                         "a check that TOPAS holds on other engines; capacity is measured "
                         "on the same engine")
    ap.add_argument("--base-seed", dest="base", type=at_least(0), default=0,
                    help="first draw seed (0: the fixed case list)")
    ap.add_argument("--fresh-seed", action="store_true", help="a new random case list")
    ap.add_argument("--versus", choices=("paper", "all"), default="paper",
                    help="paper: each case's best paper baseline (issue 25's bounds); all: "
                         "also replay the peers and report against the best of all too")
    ap.add_argument("--worst", type=at_least(0), default=10, help="worst cases diagnosed")
    ap.add_argument("--no-cache", action="store_true", help="replay everything again")
    ap.add_argument("--json", type=Path, help="write every case's rows here")
    ap.add_argument("--against", type=Path, metavar="EARLIER.json",
                    help="also compare with an earlier run's --json file (of the same "
                         "--versus): every bound before and now on the cases both hold, "
                         "the cases that crossed one, the largest moves (printed only, "
                         "never written)")
    ap.add_argument("--seeds", type=at_least(1), default=1, metavar="N",
                    help="also replay the judged TOPAS under quantile seeds 1..N-1 (its "
                         "only random input) and print each bound's spread across them, "
                         "and the cases over a bound under every seed (printed only)")
    ap.add_argument("--ablation", action="store_true",
                    help="instead: topas with each extension beyond the paper off in turn")
    ap.add_argument("--write", action="store_true", help="rewrite docs/RESULTS.md's section")
    args = ap.parse_args(argv)
    if args.holdout and args.calls:
        ap.error("--holdout judges the generated holdout shapes, --calls a call log: give one")
    held = {f in HOLDOUT for f in args.family or ()}
    if len(held) > 1:
        ap.error("--family: the holdout shapes (" + ", ".join(HOLDOUT) + ") and the fixed "
                 "list's families are judged apart; run them in two runs")
    args.holdout = args.holdout or held == {True}
    if args.against and args.ablation:
        ap.error("--against compares one run with an earlier one: not with --ablation")
    if args.seeds > 1 and (kind_of(args.policy) != "topas" or args.ablation
                           or "seed" in dict(parse_params(args.param or ()))):
        ap.error("--seeds replays the judged TOPAS under its quantile seeds 0..N-1: give a "
                 "topas policy, without --param seed= and without --ablation")
    try:  # before the replays: a wrong path fails now, not after the run
        before = read_ratios(args.against) if args.against else None
    except ValueError as exc:
        ap.error(f"--against {exc}")
    try:
        args.engine = parse_engine(args.engine or ())
    except ValueError as exc:
        ap.error(f"--engine {exc}")
    try:
        args.logs = read_logs(args.calls or ())
    except (OSError, ValueError, TopasError) as exc:
        ap.error(f"--calls {exc}")
    if args.fresh_seed:
        args.base = int.from_bytes(os.urandom(3), "big") + 1
        print(f"fresh case list: --base-seed {args.base}", file=sys.stderr)
    t0 = time.monotonic()
    cache = Cache(None if args.no_cache else CACHE)
    default = {"calls": (), "holdout": HOLDOUT, "": FAMILIES}[case_list(args)]
    families = [*(args.family or default), *args.logs]
    cases_ = cases(families, args.load or LOADS, args.draws, args.base)
    caps = capacities(cases_, args.tasks, cache, args.jobs, args.logs, args.engine)
    if args.ablation:
        text = ablation(cases_, args, caps, cache)
        print(text)
        if args.write:
            print(f"wrote {update_section(section_name(args, 'ablation'), text)}",
                  file=sys.stderr)
        return
    params = {args.policy: parse_params(args.param or ())}
    others = tuple(BASELINES) if args.versus == "paper" else everyone_but(args.policy)
    rows = execute(case_jobs(cases_, [*others, args.policy], args.tasks, caps, params,
                             args.logs, args.engine), cache, args.jobs, "cases")
    results = compare(rows, args.policy, others)
    worst = worst_cases(results, args.policy, args.worst, cache, args.jobs)
    took = timing(time.monotonic() - t0, cache)
    if args.versus == "paper":
        text = render(results, worst, args, args.policy, took)
    else:
        text = render_versus(compare(rows, args.policy), results, rows, worst, args, took)
    print(text)
    if before is not None:
        print(render_against(results, before, args.against))
    if args.seeds > 1:
        print(render_seeds(seed_results(results, rows, args, cases_, caps, cache, others)))
    if args.json:
        args.json.write_text(json.dumps(json_rows(results), indent=1))
    if args.write:
        kind = "" if args.versus == "paper" else "peers"
        print(f"wrote {update_section(section_name(args, kind), text)}", file=sys.stderr)


# each case list's results title (`render`)
TITLES = {"": "Workloads nobody tuned for", "calls": "Real call logs",
          "holdout": "Holdout shapes, never tuned on"}


def case_list(args: argparse.Namespace) -> str:
    """Which cases a run judges: `calls` (call logs), `holdout` (the
    `HOLDOUT` shapes) or "" (the fixed list's families)."""
    return "calls" if args.logs else "holdout" if args.holdout else ""


def section_name(args: argparse.Namespace, kind: str = "") -> str:
    """The docs/RESULTS.md section a run writes: `generalization`, then the
    kind of run (`peers`, `ablation`), then the case list unless it is the
    fixed one (`calls`, `holdout`), then `engine` and each field `--engine`
    changed, so no run overwrites another list's or another engine's."""
    engine = ["engine", *engine_items(args.engine)] if args.engine else []
    return "-".join(part for part in ("generalization", kind, case_list(args), *engine) if part)


if __name__ == "__main__":
    main()
