"""What a plan across decisions could buy TOPAS: an oracle that decides by
forking the simulated world, on generated cases of `bench/generalization.py`.

    python bench/oracle_rollout.py [--case FAMILY:DRAW:LOAD ...] [--horizon 30 ...]
        [--space states|phases] [--k 3] [--objective plain|queue|tail]
        [--tasks 100] [--workers 2] [--write]

At each decision with at least two options and requests waiting, the oracle
forks the whole simulated world (engine, task book, policy) once per
option. The options (`--space`):

- `states`: TOPAS's own decision, and the best state (Eq. 13) of each of
  the K best choices of (prefix set R', preemptions) among its candidates,
  of the running agents' set alone, and of that set with each waiting agent
  added;
- `phases`: TOPAS's own decision, and TOPAS's decision on the waiting
  requests of one agent alone, for each waiting agent (LPM's phases, each
  chosen by its consequences).

Each fork takes its option, then runs `horizon` simulated seconds on under
plain TOPAS, the trace's arrivals included (`inf`: to the end of the
trace). The oracle keeps the option whose fork costs least, TOPAS's own on
a tie. A fork's cost (`--objective`): `plain`, the sum over the arrived
tasks of the JCT of those that finished and of t_H - arrival + L_hat
(Eq. 5) of the rest; `queue`, the same with each unfinished task also
charged the expected paths of every unfinished task no longer than its own
over the mean batch (an SRPT queue at the engine's observed parallelism);
`tail` (whole runs only), the mean JCT plus the p99. With `--horizon inf`
and `plain` this is a rollout of TOPAS in the sense of approximate dynamic
programming: every choice is TOPAS's continuation's exact total JCT, so
its mean is never above TOPAS's.

Its model of the next fills is the simulator itself, exact, so it measures
what choosing among these options by their consequences buys over Eq. 13's
one-decision score. It prints, per case, TOPAS's and each horizon's
oracle's mean and p99 JCT over the best baseline's (`generalization.py`'s
comparison), then the geometric means; `--write` records the table in
docs/RESULTS.md (section "oracle-rollout", with the space and cost named
unless they are the defaults).

The oracle replays run the pure-Python search in spawned processes
(TOPASD_NATIVE=0): a fork deep-copies the policy, which the compiled search's
classes do not support. Every fork replays up to `horizon` seconds, so a
case takes from seconds to hours (`inf` on a long overload case).
"""

from __future__ import annotations

import argparse
import copy
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from _results import command_line, publish  # bench/_results.py
from generalization import (
    CACHE,
    Cache,
    Job,
    capacities,
    case_jobs,
    compare,
    execute,
    geomean,
    job_trace,
)
from prefix_room import PrefixRoom

from backends.sim.engine import SimBackend
from topasd.model import Decision, EngineEvent, EngineView
from topasd.profiles import DEFAULT_PROFILE, get_profile
from topasd.runner import Run
from topasd.scheduler import native
from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.topas import TopasPolicy, _best, _Search, _State
from workflows.generator import FAMILIES, LOADS

Case = tuple[str, int, str]
Choice = tuple[frozenset[str], tuple[int, ...]]  # (R', preempted requests)
# ("own", None): TOPAS's decision; ("set", Choice): its best state of that choice;
# ("only", agent): TOPAS's decision on that agent's waiting requests alone
Option = tuple[str, Any]
OWN: Option = ("own", None)

# The fixed list's 30 cases (seed 0) over 1.02x the best baseline's mean or
# 1.10x its p99 on main at 0b1337b, then 8 others drawn from the list by
# `random.Random(25).sample` as a control.
MISSED: tuple[Case, ...] = (
    ("chain", 0, "burst"), ("chain", 0, "heavy"), ("chain", 1, "heavy"), ("chain", 4, "burst"),
    ("chain", 4, "heavy"), ("chain", 4, "light"), ("chain", 5, "burst"), ("chain", 6, "burst"),
    ("chain", 7, "heavy"), ("chain", 7, "overload"), ("chain", 9, "burst"),
    ("debate", 1, "heavy"), ("debate", 5, "overload"), ("fork_join", 0, "heavy"),
    ("fork_join", 0, "overload"), ("fork_join", 1, "heavy"), ("mixed", 0, "overload"),
    ("mixed", 3, "light"), ("mixed", 4, "heavy"), ("mixed", 5, "burst"), ("react", 4, "burst"),
    ("react", 6, "burst"), ("react", 6, "heavy"), ("react", 7, "burst"),
    ("recurrent", 2, "heavy"), ("recurrent", 5, "burst"), ("shared_fanout", 1, "overload"),
    ("shared_fanout", 3, "burst"), ("shared_fanout", 7, "heavy"), ("shared_fanout", 7, "light"),
)
CONTROL: tuple[Case, ...] = (
    ("debate", 4, "overload"), ("chain", 2, "overload"), ("recurrent", 1, "burst"),
    ("shared_fanout", 4, "overload"), ("agent_loop", 8, "burst"), ("coding", 7, "light"),
    ("chain", 7, "burst"), ("recurrent", 7, "overload"),
)


@dataclass(frozen=True)
class Oracle:
    """One oracle's settings: rollout `horizon` (simulated s), the `k` best
    choices by score (`states`), the fork's cost and the options' `space`."""

    horizon: float
    k: int = 3
    objective: str = "plain"
    space: str = "states"


def choice(state: _State) -> Choice:
    return state.resident, state.preempt


def best_by_choice(states: Sequence[_State]) -> list[int]:
    """The index of the best state of each distinct choice, best first."""
    best: dict[Choice, int] = {}
    for i, s in enumerate(states):
        key = choice(s)
        if key not in best or s.total > states[best[key]].total:
            best[key] = i
    return sorted(best.values(), key=lambda i: (-states[i].total, i))


def packed(search: _Search, sets: Sequence[frozenset[str]]) -> list[_State]:
    """GreedyPack's states of each set, past the search budget."""
    search.steps = -math.inf
    return [s for r in sets for s in search.pack(r)]


class OraclePolicy:
    """TOPAS whose decision is made by rollouts among its options (module
    docstring). A fork's copy takes `force` once, then decides as plain TOPAS."""

    def __init__(self, topas: TopasPolicy, oracle: Oracle) -> None:
        self.topas, self.oracle = topas, oracle
        self.name = topas.name
        self.run: Run | None = None  # the world forked; None in a fork
        self.force: Option = OWN
        self.last: Decision | None = None  # a fork's: the decision of its `force`
        self.forks = self.changed = 0
        self.holds = 0  # changed decisions that admit and load nothing where TOPAS admits

    @property
    def params(self) -> Any:
        return self.topas.params

    def observe(self, event: EngineEvent) -> None:
        self.topas.observe(event)

    def decide(self, view: EngineView) -> Decision:
        if self.run is None:
            force, self.force = self.force, OWN
            self.last = self.take(view, force)
            return self.last
        options = self.options(view)
        if len(options) >= 2:
            return self.take(view, self._pick(view.t, options))
        return self.take(view, OWN)

    def options(self, view: EngineView) -> list[Option]:
        """TOPAS's own decision first, then the others of `oracle.space`."""
        if not view.waiting:
            return [OWN]
        if self.oracle.space == "phases":
            agents = sorted({r.agent for r in view.waiting})
            return [OWN, *(("only", a) for a in agents)] if len(agents) >= 2 else [OWN]
        search = _Search(self.topas, view)
        states = search.run()
        own = choice(states[_best(states)])
        cands = [choice(states[i]) for i in best_by_choice(states)[: self.oracle.k]]
        run = search.running_agents
        sets = [run, *(run | {a} for a in sorted(search.waiting_by_agent) if a not in run)]
        for s in packed(search, sets):
            if not s.is_empty and choice(s) not in cands:
                cands.append(choice(s))
        return [OWN, *(("set", c) for c in cands if c != own)]

    def take(self, view: EngineView, option: Option) -> Decision:
        """The decision of `option`: TOPAS's best state, its best of one choice
        of (R', preemptions), or TOPAS's on one agent's waiting requests."""
        kind, arg = option
        if kind == "only":
            view = replace(view, waiting=tuple(r for r in view.waiting if r.agent == arg))
        search = _Search(self.topas, view)
        states = search.run()
        idx = _best(states)
        if kind == "set":
            if arg not in {choice(s) for s in states}:
                states = states + packed(search, [arg[0]])
            idx = next(i for i in best_by_choice(states) if choice(states[i]) == arg)
        return self.topas.decision(view, search, states, idx)

    def _pick(self, t: float, options: list[Option]) -> Option:
        """The option whose fork costs least (TOPAS's own on a tie)."""
        assert self.run is not None
        batch = max(self.run.backend.stats.mean_batch, 1.0)
        costs, told = [], []
        for option in options:
            fork, twin = self.fork(option)
            told.append(twin.last)
            advance(fork, t + self.oracle.horizon)
            costs.append(fork_cost(fork, twin.topas, self.oracle.objective, batch))
        self.forks += 1
        best = min(range(len(options)), key=lambda i: (costs[i], i))
        self.changed += best != 0
        self.holds += best != 0 and is_hold(told[best], told[0])
        return options[best]

    def fork(self, force: Option) -> tuple[Run, OraclePolicy]:
        """A deep copy of the world now, which has decided `force`, and its policy."""
        assert self.run is not None
        run = self.run
        memo: dict[int, Any] = {id(run.trace): run.trace,
                                id(run.trace.workflows): run.trace.workflows, id(run): None}
        fork = copy.copy(run)
        fork.loop = copy.deepcopy(run.loop, memo)
        fork.backend = fork.loop.backend
        twin = fork.policy = fork.loop.policy
        assert isinstance(twin, OraclePolicy)
        twin.force = force
        fork.loop.decide()
        return fork, twin


def is_hold(chosen: Decision | None, own: Decision | None) -> bool:
    """`chosen` admits and loads nothing where TOPAS's `own` decision admits."""
    assert chosen is not None and own is not None
    return not (chosen.admit or chosen.load) and bool(own.admit)


def advance(run: Run, t_end: float) -> None:
    """Run `run`'s loop on to `t_end`, its trace's tasks arriving on time."""
    loop, tasks = run.loop, run.trace.tasks
    i = len(loop.book.arrivals)
    while i < len(tasks) and tasks[i].arrival <= t_end:
        loop.pump(tasks[i].arrival, more_at_stop=True)
        while i < len(tasks) and tasks[i].arrival <= run.backend.t:
            loop.arrive(tasks[i])
            i += 1
    loop.pump(t_end)


def fork_cost(run: Run, topas: TopasPolicy, objective: str, batch: float) -> float:
    """Finished tasks' JCTs plus each open task's age and expected path
    (`queue`: at least its SRPT queue's paths over `batch`); `tail`, once
    every task finished: the mean JCT plus the p99."""
    book, t_h = run.loop.book, run.backend.t
    jcts = [book.finishes[tid] - a for tid, a in book.arrivals.items() if tid in book.finishes]
    if objective == "tail":
        if len(jcts) < len(run.trace.tasks):
            raise ValueError("the `tail` cost needs every task finished (--horizon inf)")
        return float(np.mean(jcts) + np.percentile(jcts, 99))
    cost = sum(jcts)
    paths = open_paths(run, topas)
    ahead = 0.0
    for tid in sorted(paths, key=lambda i: (paths[i], i)):
        ahead += paths[tid]
        wait = max(paths[tid], ahead / batch) if objective == "queue" else paths[tid]
        cost += t_h - book.arrivals[tid] + wait
    return cost


def open_paths(run: Run, topas: TopasPolicy) -> dict[int, float]:
    """L_hat_i({}, t) (Eq. 5) of each unfinished task at the fork's end."""
    book = run.loop.book
    if not book.tasks:
        return {}
    view = run.backend.state(book.tasks, run.trace.workflows)
    return _Search(topas, view).remaining_paths(book.tasks)


def replay(job: Job, oracle: Oracle) -> dict[str, Any]:
    """One case under the oracle (in a spawned worker: the pure search)."""
    if native.status().active:
        raise RuntimeError("oracle_rollout.py: the compiled search is loaded; forks need "
                           "the pure one (run with TOPASD_NATIVE=0)")
    policy = OraclePolicy(TopasPolicy(), oracle)
    trace = job_trace(job)
    room = PrefixRoom({a.name: a.prefix_tokens for w in trace.workflows.values()
                       for a in w.agents.values()})
    run = Run(trace, policy, SimBackend(get_profile(DEFAULT_PROFILE)), sink=room)
    policy.run = run
    wall = time.perf_counter()
    summary = run.execute().summary()
    return {"mean_jct_s": summary["mean_jct_s"], "p99_jct_s": summary["p99_jct_s"],
            "makespan_s": summary["makespan_s"], "mean_batch": summary["mean_batch"],
            "pinned_kv": room.averages()["pinned_kv"], "forks": policy.forks,
            "changed": policy.changed, "holds": policy.holds,
            "wall_s": time.perf_counter() - wall}


def _replay(item: tuple[Job, Oracle]) -> tuple[Job, Oracle, dict[str, Any]]:
    return item[0], item[1], replay(*item)


def oracle_rows(jobs: Sequence[Job], oracles: Sequence[Oracle],
                workers: int) -> dict[tuple[Case, Oracle], dict[str, Any]]:
    """Every (case, oracle) replayed in spawned workers, progress on stderr."""
    os.environ["TOPASD_NATIVE"] = "0"  # read by each spawned worker's import
    items = [(job, o) for job in jobs for o in oracles]
    out = {}
    t0 = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for n, (job, o, row) in enumerate(pool.imap_unordered(_replay, items), 1):
            out[(job.case, o)] = row
            print(f"\roracle {n}/{len(items)} ({time.monotonic() - t0:.0f} s)", end="",
                  file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def table(results: Sequence[Any], rows: dict[tuple[Case, Oracle], dict[str, Any]],
          oracles: Sequence[Oracle]) -> list[str]:
    """Per case: TOPAS's and each oracle's mean and p99 over the best baseline's."""
    heads = [f"H={o.horizon:g} s" for o in oracles]
    lines = ["| case | best mean / p99 | mean: topas | " + " | ".join(heads)
             + " | p99: topas | " + " | ".join(heads) + " | forks (changed, holds) | "
             "oracle's mean batch / pinned prefix KV |",
             "|---|---|---|" + "---|" * len(oracles) + "---|" + "---|" * len(oracles)
             + "---|---|"]
    ratios: dict[str, list[float]] = {}
    for r in results:
        bm, bp = r.best_mean[1], r.best_p99[1]
        mine = [rows[(r.case, o)] for o in oracles]
        means = [r.mean_ratio, *(m["mean_jct_s"] / bm for m in mine)]
        p99s = [r.p99_ratio, *(m["p99_jct_s"] / bp for m in mine)]
        for j, x in enumerate(means + p99s):
            ratios.setdefault(str(j), []).append(x)
        forks = ", ".join(f"{m['forks']} ({m['changed']}, {m['holds']})" for m in mine)
        room = "; ".join(f"{m['mean_batch']:.2f} / {m['pinned_kv']:,.0f}" for m in mine)
        lines.append(f"| `{r.case[0]}` #{r.case[1]} {r.case[2]} | {r.best_mean[0]} {bm:.0f} s"
                     f" / {r.best_p99[0]} {bp:.0f} s | "
                     + " | ".join(f"{x:.3f}x" for x in means) + " | "
                     + " | ".join(f"{x:.3f}x" for x in p99s) + f" | {forks} | {room} |")
    gms = [geomean(ratios[str(j)]) for j in range(2 * (len(oracles) + 1))]
    lines.append("| geometric mean | | " + " | ".join(f"{x:.3f}x" for x in gms) + " | | |")
    return lines


def parse_case(text: str) -> Case:
    family, _, rest = text.partition(":")
    draw, _, load = rest.partition(":")
    if family not in FAMILIES or not draw.isdigit() or load not in LOADS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use FAMILY:DRAW:LOAD, FAMILY one of {', '.join(FAMILIES)}, "
            f"LOAD one of {', '.join(LOADS)}")
    return family, int(draw), load


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", type=parse_case, action="append", metavar="FAMILY:DRAW:LOAD",
                    help="a generated case (repeat; default: the 30 missed and 8 control cases)")
    ap.add_argument("--horizon", type=float, action="append",
                    help="rollout horizon in simulated seconds, `inf` to the trace's end "
                         "(repeat; default 30 and 120)")
    ap.add_argument("--k", type=int, default=3,
                    help="`states`: the best choices by score forked (3)")
    ap.add_argument("--objective", choices=("plain", "queue", "tail"), default="plain",
                    help="a fork's cost (module docstring; `tail` needs --horizon inf)")
    ap.add_argument("--space", choices=("states", "phases"), default="states",
                    help="the options forked: TOPAS's candidate choices of (R', "
                         "preemptions), or its decision on each waiting agent alone")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--no-cache", action="store_true",
                    help="replay TOPAS and the baselines again (the oracle always replays)")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args(argv)
    cases = args.case or [*MISSED, *CONTROL]
    oracles = [Oracle(h, args.k, args.objective, args.space)
               for h in args.horizon or (30.0, 120.0)]
    if any(o.horizon <= 0 for o in oracles) or args.k < 1:
        ap.error("--horizon must be positive and --k at least 1")
    if args.objective == "tail" and any(o.horizon != math.inf for o in oracles):
        ap.error("--objective tail compares whole runs: give --horizon inf")
    cache = Cache(None if args.no_cache else CACHE)
    caps = capacities(cases, args.tasks, cache, args.workers)
    jobs = case_jobs(cases, ["topas", *BASELINES], args.tasks, caps, {})
    results = compare(execute(jobs, cache, args.workers, "replays"), "topas")
    rows = oracle_rows([r.job for r in results], oracles, args.workers)
    variant = "" if (args.space, args.objective) == ("states", "plain") \
        else f"-{args.space}-{args.objective}"
    publish(
        "oracle-rollout" + variant,
        f"What an oracle rollout buys (`bench/oracle_rollout.py`{', ' if variant else ''}"
        f"{variant[1:]})",
        f"Command: `{command_line('oracle_rollout.py', argv)}`. {len(cases)} cases of "
        f"`bench/generalization.py`, {args.tasks} tasks each; options `{args.space}`, K = "
        f"{args.k}, cost `{args.objective}` (the script's docstring). Mean and p99 JCT over "
        "the best baseline's; forks: the decisions forked (those where the oracle's choice "
        "was not TOPAS's, and of those the holds: the oracle admits and loads nothing where "
        "TOPAS admits).",
        table(results, rows, oracles), args.write)


if __name__ == "__main__":
    main()
