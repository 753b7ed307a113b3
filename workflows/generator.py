"""Seeded random workloads that nobody tuned a scheduler for.

`draw_workload(family, seed)` returns a `Workload` of one family of
multi-agent workflow shapes, with every size drawn from the seed:

    chain          2-8 stages, agents distinct or recurring
    fork_join      an entry stage, 2-12 parallel branches, a join (sometimes twice)
    react          1-4 stages of 1-8 ReAct rounds with tool waits between rounds
    recurrent      a central agent between specialists (MetaGPT-TL's star, unrolled)
    shared_fanout  a planner, 2-10 branches all served by one agent in ReAct loops, a reducer
    debate         2-4 debaters over 1-4 rounds, each round seeing the last, then a judge
    coding         an architect, 2-8 programmers in parallel, review and revision rounds
    mixed          two or three of the above in one trace, sharing agents
    agent_loop     1-3 ReAct agents (1-8 rounds) keeping their conversation across tool
                   waits (`share_rounds`), optionally reading a task document held once
                   (`share_history`) and fanning out over 2-6 branches of one agent

Five more shapes, `HOLDOUT`, are never in the fixed case list and only
drawn on request (`bench/generalization.py --holdout`): a check on shapes
nobody tuned for, as long as nobody tunes on them:

    map_reduce     a plan, a map over one shared agent, a combine, a second map, a reduce
    validate_loop  a plan, then 1-3 attempts of a worker's ReAct loop and a validator,
                   then the planner again
    wide_merge     a split into 12-24 short calls over 2-4 agents, merged by one long answer
    long_tail      three stages whose middle one writes long answers
    tree           a binary fan-out 2-3 levels deep, joined back in pairs

Token sizes are lognormal with a wide spread (sigma 0.3-1.2), prefixes from 0
to 10k tokens (on a pool smaller than the default 18k, the same share of it);
every draw keeps each request within `budget` KV tokens (prefix + input +
output), so a trace fits the engine it is replayed on.
A family's draws depend only on its index in `ALL_FAMILIES` (`FAMILIES`,
then `HOLDOUT`) and the seed, so a family added at the end leaves every
earlier draw (and case) as it was;
`mixed` draws from `MIXABLE`, the shapes it always drew from.
`case_trace` turns a workload into a trace at a load relative to a measured
capacity (Poisson arrivals) or as a burst (every task within a short window);
`log_case_trace` does the same with the tasks of a trace imported from a
real call log (`workflows/importer.py`), drawn from it by the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from topasd.model import TopasError
from workflows.builtin import Workload, workload_from_dict
from workflows.trace import TaskRecord, Trace, sample_task

FAMILIES = ("chain", "fork_join", "react", "recurrent", "shared_fanout", "debate", "coding",
            "mixed", "agent_loop")
LOADS = ("light", "heavy", "overload", "burst")
# arrival rate as a share of the measured capacity (tasks/s a saturated engine finishes)
LOAD_SHARE = {"light": 0.5, "heavy": 0.85, "overload": 1.3}
BURST_WINDOW = 0.1  # a burst's tasks arrive within this share of the time capacity needs
DEFAULT_BUDGET = 18_000  # the default profile's KV pool (qwen2.5-32b-a100)
MAX_PREFIX = 10_000
MIN_BUDGET = 1_000  # the smallest KV pool a draw is made for (`check_budget`)
# medians of the token sizes and tool waits, drawn log-uniform in these ranges
INPUT_MEDIAN = (60.0, 2500.0)  # a stage's first input
OBSERVATION_MEDIAN = (20.0, 600.0)  # a tool's observation
TOOL_WAIT_MEDIAN = (0.3, 20.0)  # s
TOOL_WAIT_HIGH = 300.0  # s

Spec = dict[str, Any]


@dataclass(frozen=True)
class Draw:
    """The random state of one workload draw: the generator, and the names
    of the agents drawn so far with their prefix sizes (shared by `mixed`)."""

    rng: np.random.Generator
    agents: dict[str, int]
    budget: int
    tag: str  # prefix of every agent and workflow name of this draw

    def uniform(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))

    def integer(self, lo: int, hi: int) -> int:
        """A whole number in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def log_uniform(self, lo: float, hi: float) -> float:
        return float(math.exp(self.rng.uniform(math.log(lo), math.log(hi))))

    def agent(self, role: str, reuse: float = 0.0) -> str:
        """An agent for `role`: with probability `reuse` one drawn before
        (a recurring agent), else a new one with a prefix of 0-10k tokens
        (`max_prefix`)."""
        if self.agents and self.chance(reuse):
            names = sorted(self.agents)
            return names[self.integer(0, len(names) - 1)]
        name = f"{self.tag}{role}{len(self.agents)}"
        self.agents[name] = 0 if self.chance(0.1) else round(self.log_uniform(150,
                                                                               self.max_prefix))
        return name

    @property
    def max_prefix(self) -> float:
        """The largest prefix drawn: `MAX_PREFIX`, the same share of a pool
        smaller than the default one (so a draw for a small engine fits it)."""
        return min(MAX_PREFIX, MAX_PREFIX * self.budget / DEFAULT_BUDGET)


def lognormal(draw: Draw, median: float, low: float, high: float) -> Spec:
    """A wide lognormal token size (sigma 0.3-1.2), clipped to [low, high]."""
    median = min(max(median, low), high)
    return {"lognormal": {"median": round(median, 1), "sigma": round(draw.uniform(0.3, 1.2), 3),
                          "low": low, "high": high}}


def stage(draw: Draw, name: str, agent: str, after: list[str], *, rounds: Any = 1,
          history: str = "none", out_median: float | None = None) -> Spec:
    """One stage with drawn token sizes; ReAct stages (`rounds` not 1) get tool
    waits and tool observations between rounds."""
    room = draw.budget - draw.agents[agent]
    out_hi = max(32, min(2048, room // 4))
    out_med = out_median if out_median is not None else draw.log_uniform(40, 900)
    spec: Spec = {
        "name": name, "agent": agent, "after": after, "rounds": rounds, "history": history,
        "input_tokens": lognormal(draw, draw.log_uniform(*INPUT_MEDIAN), 1, max(1, room // 4)),
        "output_tokens": lognormal(draw, out_med, 1, out_hi),
    }
    if rounds != 1:
        spec["tool_wait_s"] = tool_wait(draw.log_uniform(*TOOL_WAIT_MEDIAN), 1.0)
        spec["observation_tokens"] = lognormal(draw, draw.log_uniform(*OBSERVATION_MEDIAN), 0,
                                               max(1, room // 16))
    return spec


def tool_wait(median: float, sigma: float) -> Spec:
    """A lognormal tool wait (s) clipped to [0, `TOOL_WAIT_HIGH`]."""
    return {"lognormal": {"median": round(median, 2), "sigma": sigma, "low": 0.0,
                          "high": TOOL_WAIT_HIGH}}


def conversation_clips(room: int, rounds: int) -> tuple[int, int, int]:
    """Clips (first input, output, observation) of a stage's sizes such that its
    longest conversation, `rounds` rounds each carrying the earlier ones, fits
    `room` tokens: first input + rounds x output + (rounds - 1) x observation.
    `stage`'s clips where they fit, else each scaled down by one factor."""
    clips = (max(1, room // 4), max(32, min(2048, room // 4)), max(1, room // 16))
    longest = clips[0] + rounds * clips[1] + (rounds - 1) * clips[2]
    if longest <= room:
        return clips
    f = room / longest
    return max(1, int(clips[0] * f)), max(1, int(clips[1] * f)), int(clips[2] * f)


def loop_stage(draw: Draw, name: str, agent: str, after: list[str], upstream: int,
               **keys: Any) -> Spec:
    """A ReAct stage of 1-8 rounds whose conversation is kept across its tool
    waits (`share_rounds`): round k+1's prompt is rounds 1..k (inputs and
    outputs) plus the tool's observation. Its clips keep the longest
    conversation, after the agent's prefix and at most `upstream` carried
    tokens, within the budget, so `fit_budget` never cuts a kept conversation.
    Tool waits are heavy-tailed (sigma 1-2: some far shorter than a round's
    service, some far longer); `keys` adds spec keys (branches, history...)."""
    cap = draw.integer(1, 8)
    in_hi, out_hi, obs_hi = conversation_clips(draw.budget - draw.agents[agent] - upstream, cap)
    spec: Spec = {
        "name": name, "agent": agent, "after": after, "share_rounds": True,
        "rounds": 1 if cap == 1 else {"uniform_int": [1, cap]},
        "input_tokens": lognormal(draw, draw.log_uniform(*INPUT_MEDIAN), 1, in_hi),
        "output_tokens": lognormal(draw, draw.log_uniform(30, 500), 1, out_hi),
        **keys,
    }
    if cap > 1:
        spec["tool_wait_s"] = tool_wait(draw.log_uniform(*TOOL_WAIT_MEDIAN),
                                        round(draw.uniform(1.0, 2.0), 3))
        spec["observation_tokens"] = lognormal(draw, draw.log_uniform(*OBSERVATION_MEDIAN), 0,
                                               obs_hi)
    return spec


def react_rounds(draw: Draw, most: int = 8) -> Any:
    """Rounds of a ReAct stage: 1 to `most` (uniform from 1 to a drawn cap)."""
    cap = draw.integer(1, most)
    return 1 if cap == 1 else {"uniform_int": [1, cap]}


def history_mode(draw: Draw) -> str:
    return ("none", "parents", "ancestors")[draw.integer(0, 2)]


# ----------------------------------------------------------------- families


def chain(draw: Draw, name: str) -> list[Spec]:
    stages: list[Spec] = []
    prev: list[str] = []
    for i in range(draw.integer(2, 8)):
        agent = draw.agent("s", reuse=0.3)
        stages.append(stage(draw, f"s{i}", agent, prev, history=history_mode(draw)))
        prev = [f"s{i}"]
    return stages


def fork_join(draw: Draw, name: str) -> list[Spec]:
    stages = [stage(draw, "entry", draw.agent("plan"), [])]
    prev = ["entry"]
    for level in range(1 if draw.chance(0.7) else 2):
        width = draw.integer(2, 12)
        pool = [draw.agent("b", reuse=0.2) for _ in range(draw.integer(1, width))]
        branches = [f"l{level}b{i}" for i in range(width)]
        hist = "parents" if draw.chance(0.5) else "none"
        stages += [stage(draw, b, pool[i % len(pool)], prev, history=hist)
                   for i, b in enumerate(branches)]
        join = f"join{level}"
        stages.append(stage(draw, join, draw.agent("j", reuse=0.3), branches,
                            history="parents" if draw.chance(0.5) else "none"))
        prev = [join]
    return stages


def react(draw: Draw, name: str) -> list[Spec]:
    stages: list[Spec] = []
    prev: list[str] = []
    for i in range(draw.integer(1, 4)):
        agent = draw.agent("r", reuse=0.2)
        stages.append(stage(draw, f"r{i}", agent, prev, rounds=react_rounds(draw),
                            history="parents" if i and draw.chance(0.5) else "none",
                            out_median=draw.log_uniform(30, 500)))
        prev = [f"r{i}"]
    return stages


def recurrent(draw: Draw, name: str) -> list[Spec]:
    """A central agent between specialists: c0 -> s0 -> c1 -> s1 -> ... -> cN."""
    center = draw.agent("lead")
    stages = [stage(draw, "c0", center, [], out_median=draw.log_uniform(100, 700))]
    for i in range(draw.integer(1, 4)):
        agent = draw.agent("spec")
        stages.append(stage(draw, f"s{i}", agent, [f"c{i}"], rounds=react_rounds(draw, 6),
                            history="parents", out_median=draw.log_uniform(50, 500)))
        stages.append(stage(draw, f"c{i + 1}", center, [f"s{i}"], rounds=react_rounds(draw, 3),
                            out_median=draw.log_uniform(60, 300)))
    return stages


def shared_fanout(draw: Draw, name: str) -> list[Spec]:
    """One agent serves every parallel branch, each a ReAct loop."""
    worker = draw.agent("worker")
    width = draw.integer(2, 10)
    rounds = react_rounds(draw, 6)
    out = draw.log_uniform(40, 600)
    stages = [stage(draw, "plan", draw.agent("plan"), [])]
    stages += [stage(draw, f"w{i}", worker, ["plan"], rounds=rounds, history="parents",
                     out_median=out) for i in range(width)]
    stages.append(stage(draw, "reduce", draw.agent("reduce", reuse=0.3),
                        [f"w{i}" for i in range(width)], history="parents"))
    return stages


def debate(draw: Draw, name: str) -> list[Spec]:
    """Debaters answer in rounds, each round seeing the previous one; a judge decides."""
    debaters = [draw.agent("deb") for _ in range(draw.integer(2, 4))]
    out = draw.log_uniform(80, 700)
    stages: list[Spec] = []
    prev: list[str] = []
    for r in range(draw.integer(1, 4)):
        names = [f"r{r}d{i}" for i in range(len(debaters))]
        stages += [stage(draw, n, a, prev, history="parents" if prev else "none",
                         out_median=out) for n, a in zip(names, debaters, strict=True)]
        prev = names
    stages.append(stage(draw, "judge", draw.agent("judge"), prev, history="parents",
                        out_median=draw.log_uniform(40, 400)))
    return stages


def coding(draw: Draw, name: str) -> list[Spec]:
    """Architect -> programmers in parallel -> review -> revisions, for 1-3 rounds."""
    programmer, reviewer = draw.agent("prog"), draw.agent("rev")
    files = draw.integer(2, 8)
    code = draw.log_uniform(150, 1200)
    stages = [stage(draw, "arch", draw.agent("arch"), [], out_median=draw.log_uniform(200, 900))]
    prev = ["arch"]
    for r in range(draw.integer(1, 3)):
        names = [f"code{r}f{i}" for i in range(files)]
        stages += [stage(draw, n, programmer, prev, history="parents", out_median=code)
                   for n in names]
        stages.append(stage(draw, f"review{r}", reviewer, names,
                            out_median=draw.log_uniform(50, 400)))
        prev = [f"review{r}"]
    return stages


SUMMARY_HIGH = 1024  # an agent's hand-off to the next: a summary of at most this many tokens


def agent_loop(draw: Draw, name: str) -> list[Spec]:
    """Tool-calling agents as real frameworks run them: an optional task
    document (a reading stage's output), then 1-3 ReAct agents in turn, each
    keeping its conversation across its tool waits. An agent reads the
    document whole and held once (`share_history`: one copy for its rounds
    and branches); a later one reads its predecessor's hand-off as a summary,
    and the document again with some chance. An agent may fan out over 2-6
    branches of itself (`branches`), each its own kept conversation."""
    stages: list[Spec] = []
    prev: list[str] = []
    doc_high = 0
    if draw.chance(0.5):
        stages.append(stage(draw, "doc", draw.agent("doc"), [],
                            out_median=draw.log_uniform(200, 2000)))
        doc_high = stages[-1]["output_tokens"]["lognormal"]["high"]
        prev = ["doc"]
    for i in range(draw.integer(1, 3)):
        agent = draw.agent("agent", reuse=0.3)
        keys: Spec = {}
        if i and doc_high and draw.chance(0.5):
            prev = ["doc", *prev]
        if i:  # the predecessor's hand-off (and the document) summarized
            keys["summary_tokens"] = lognormal(draw, draw.log_uniform(100, 800), 0,
                                               SUMMARY_HIGH)
        if draw.chance(0.4):
            keys["branches"] = {"uniform_int": [2, draw.integer(2, 6)]}
        upstream = len(prev) * SUMMARY_HIGH if i else doc_high
        stages.append(loop_stage(draw, f"a{i}", agent, prev, upstream,
                                 history="parents" if prev else "none",
                                 share_history=bool(prev), **keys))
        prev = [f"a{i}"]
    return stages


# ------------------------------------------------------------ holdout shapes
# Drawn only with `--holdout` (bench/generalization.py): shapes outside the
# fixed list, to check that what holds there holds on workflows nobody tuned for.


def map_reduce(draw: Draw, name: str) -> list[Spec]:
    """Plan -> a first map (one shared agent) -> combine -> a second map -> reduce."""
    first, second = draw.agent("map"), draw.agent("map")
    stages = [stage(draw, "plan", draw.agent("plan"), [])]
    maps = [f"a{i}" for i in range(draw.integer(2, 6))]
    stages += [stage(draw, m, first, ["plan"], history="parents") for m in maps]
    stages.append(stage(draw, "combine", draw.agent("comb"), maps, history="parents"))
    again = [f"b{i}" for i in range(draw.integer(2, 6))]
    stages += [stage(draw, m, second, ["combine"], history="parents") for m in again]
    stages.append(stage(draw, "reduce", draw.agent("reduce", reuse=0.5), again,
                        history="parents"))
    return stages


def validate_loop(draw: Draw, name: str) -> list[Spec]:
    """Plan -> (worker ReAct loop -> validator) for 1-3 attempts -> the planner sums up."""
    planner, worker, validator = draw.agent("plan"), draw.agent("work"), draw.agent("val")
    stages = [stage(draw, "plan", planner, [])]
    prev = ["plan"]
    for i in range(draw.integer(1, 3)):
        stages.append(stage(draw, f"w{i}", worker, prev, rounds=react_rounds(draw, 6),
                            history="parents", out_median=draw.log_uniform(50, 600)))
        stages.append(stage(draw, f"v{i}", validator, [f"w{i}"],
                            out_median=draw.log_uniform(20, 200)))
        prev = [f"v{i}"]
    stages.append(stage(draw, "sum", planner, prev, history="parents"))
    return stages


def wide_merge(draw: Draw, name: str) -> list[Spec]:
    """A split into 12-24 short calls over 2-4 agents, merged by one long answer."""
    agents = [draw.agent("x", reuse=0.2) for _ in range(draw.integer(2, 4))]
    calls = [f"x{i}" for i in range(draw.integer(12, 24))]
    stages = [stage(draw, "split", draw.agent("split"), [], out_median=draw.log_uniform(50, 300))]
    stages += [stage(draw, c, agents[i % len(agents)], ["split"],
                     out_median=draw.log_uniform(20, 200)) for i, c in enumerate(calls)]
    stages.append(stage(draw, "merge", draw.agent("merge"), calls, history="parents",
                        out_median=draw.log_uniform(600, 1800)))
    return stages


def long_tail(draw: Draw, name: str) -> list[Spec]:
    """Three stages whose middle one writes long answers (a draft between two short calls)."""
    return [stage(draw, "s0", draw.agent("a"), [], out_median=draw.log_uniform(20, 100)),
            stage(draw, "s1", draw.agent("b"), ["s0"], out_median=draw.log_uniform(800, 1800)),
            stage(draw, "s2", draw.agent("c", reuse=0.5), ["s1"],
                  out_median=draw.log_uniform(20, 100))]


def tree(draw: Draw, name: str) -> list[Spec]:
    """A binary fan-out 2-3 levels deep (one agent per level), joined back in pairs."""
    stages = [stage(draw, "root", draw.agent("root"), [])]
    level = ["root"]
    for _ in range(draw.integer(2, 3)):
        agent = draw.agent("t", reuse=0.3)
        level = [f"{parent}_{k}" for parent in level for k in range(2)]
        stages += [stage(draw, v, agent, [v.rsplit("_", 1)[0]], history="parents")
                   for v in level]
    while len(level) > 1:
        agent = draw.agent("j", reuse=0.5)
        pairs = [level[i:i + 2] for i in range(0, len(level), 2)]
        level = [f"j{len(stages) + i}" for i in range(len(pairs))]
        stages += [stage(draw, v, agent, pair, history="parents")
                   for v, pair in zip(level, pairs, strict=True)]
    return stages


SHAPES: dict[str, Callable[[Draw, str], list[Spec]]] = {
    "chain": chain, "fork_join": fork_join, "react": react, "recurrent": recurrent,
    "shared_fanout": shared_fanout, "debate": debate, "coding": coding,
    "agent_loop": agent_loop,
    "map_reduce": map_reduce, "validate_loop": validate_loop, "wide_merge": wide_merge,
    "long_tail": long_tail, "tree": tree,
}
# never in the fixed case list (`FAMILIES`); `HOLDOUT` families are for checking, never tuning
HOLDOUT = ("map_reduce", "validate_loop", "wide_merge", "long_tail", "tree")
ALL_FAMILIES = FAMILIES + HOLDOUT
# what `mixed` draws from: the shapes it always drew from (a shape added since
# would change every `mixed` draw, and with it the fixed case list)
MIXABLE = ("chain", "coding", "debate", "fork_join", "react", "recurrent", "shared_fanout")


# ----------------------------------------------------------------- workloads


def check_budget(budget: int) -> None:
    """A draw is made for a KV pool of at least `MIN_BUDGET` tokens (TopasError if not)."""
    if budget < MIN_BUDGET:
        raise TopasError(f"a {budget}-token KV pool is too small to draw a workload for; "
                         f"give at least {MIN_BUDGET:,} tokens")


def draw_workload(family: str, seed: int, budget: int = DEFAULT_BUDGET) -> Workload:
    """A seeded random workload of `family` (one of `FAMILIES`, or of the
    `HOLDOUT` shapes); `mixed` draws two or three other shapes whose
    workflows share agents."""
    if family not in ALL_FAMILIES:
        raise TopasError(f"unknown workflow family {family!r}; use one of "
                         f"{', '.join(ALL_FAMILIES)}")
    check_budget(budget)
    draw = Draw(np.random.default_rng([ALL_FAMILIES.index(family), seed]), {}, budget, "")
    shapes = [family]
    if family == "mixed":
        picks = draw.rng.choice(len(MIXABLE), size=draw.integer(2, 3), replace=False)
        shapes = [MIXABLE[int(i)] for i in sorted(picks)]
    wfs = []
    for i, shape in enumerate(shapes):
        wf_name = f"{family}-{seed}" if len(shapes) == 1 else f"{family}-{seed}-{shape}{i}"
        wfs.append((wf_name, SHAPES[shape](draw, wf_name)))
    return workload_from_dict(_workload_spec(f"{family}-{seed}", wfs, draw.agents),
                              f"generated {family} #{seed}")


def _workload_spec(name: str, wfs: list[tuple[str, list[Spec]]],
                   agents: dict[str, int]) -> Spec:
    def one(wf_name: str, stages: list[Spec]) -> Spec:
        used = sorted({s["agent"] for s in stages})
        return {"name": wf_name, "agents": {a: {"prefix_tokens": agents[a]} for a in used},
                "stages": stages}

    specs = [one(n, s) for n, s in wfs]
    return specs[0] if len(specs) == 1 else {"name": name, "workflows": specs}


# ----------------------------------------------------------------- traces


def fit_budget(task: TaskRecord, wl: Workload, budget: int) -> TaskRecord:
    """The task with each round's input cut so that prefix + input + output
    fits `budget` (carried history can outgrow any clip of the spec). A round
    starting with shared segments (a kept conversation, a shared document) is
    never cut: its draw's clips must keep it within the budget."""
    wf = next(w for w in wl.workflows if w.name == task.workflow)
    stages = {}
    for v, rounds in task.stages.items():
        room = budget - wf.prefix_tokens(v)
        cut = tuple(replace(r, input_tokens=min(r.input_tokens, max(0, room - r.output_tokens)))
                    for r in rounds)
        if any(c != r and r.shared for c, r in zip(cut, rounds, strict=True)):
            raise TopasError(f"workload {wl.name!r}, task {task.id}, stage {v!r}: a round "
                             f"that starts with shared segments exceeds the {budget}-token "
                             "budget; clip the stage's sizes (`conversation_clips`)")
        stages[v] = cut
    return replace(task, stages=stages)


def sample_tasks(wl: Workload, arrivals: list[float], seed: int,
                 budget: int = DEFAULT_BUDGET) -> tuple[TaskRecord, ...]:
    """One task per arrival, cycling through the workload's workflows."""
    rng = np.random.default_rng([seed, 7])
    return tuple(fit_budget(sample_task(wl.workflows[i % len(wl.workflows)], i, t, rng), wl,
                            budget) for i, t in enumerate(arrivals))


def arrivals(load: str, n_tasks: int, capacity: float, seed: int) -> list[float]:
    """Arrival times: Poisson at `LOAD_SHARE[load]` x capacity, or for a burst
    uniform within `BURST_WINDOW` of the time the capacity needs for them."""
    if capacity <= 0 or not math.isfinite(capacity):
        raise TopasError(f"capacity must be a finite number > 0 task/s, got {capacity}")
    rng = np.random.default_rng([seed, 11])
    if load == "burst":
        window = BURST_WINDOW * n_tasks / capacity
        return sorted(round(float(t), 6) for t in rng.uniform(0.0, window, n_tasks))
    if load not in LOAD_SHARE:
        raise TopasError(f"unknown load {load!r}; use one of {', '.join(LOADS)}")
    gaps = rng.exponential(1.0 / (LOAD_SHARE[load] * capacity), n_tasks)
    gaps[0] = 0.0
    return [round(float(t), 6) for t in np.cumsum(gaps)]


def case_trace(wl: Workload, load: str, n_tasks: int, capacity: float, seed: int,
               budget: int = DEFAULT_BUDGET) -> Trace:
    """The trace of one case: the workload at a load relative to `capacity`."""
    tasks = sample_tasks(wl, arrivals(load, n_tasks, capacity, seed), seed, budget)
    meta = {"workload": wl.name, "load": load, "capacity": capacity, "tasks": n_tasks,
            "seed": seed}
    return Trace({wf.name: wf for wf in wl.workflows}, tasks, meta)


def log_case_trace(log: Trace, load: str, n_tasks: int, capacity: float,
                   seed: int) -> Trace:
    """A case of a logged workload: `n_tasks` of the log's tasks drawn by
    `seed` (each once while the log has enough, else with repeats), their
    calls exactly as logged, arriving at a load relative to `capacity`
    (load "capacity": every task at t=0, the burst that measures it)."""
    if not log.tasks:
        raise TopasError("the call log has no tasks to draw a case from")
    rng = np.random.default_rng([seed, 13])
    picks = rng.choice(len(log.tasks), n_tasks, replace=n_tasks > len(log.tasks))
    times = [0.0] * n_tasks if load == "capacity" else arrivals(load, n_tasks, capacity, seed)
    tasks = tuple(replace(log.tasks[int(k)], id=i, arrival=t, line=None)
                  for i, (k, t) in enumerate(zip(picks, times, strict=True)))
    used = {t.workflow for t in tasks}
    meta = {"workload": log.meta.get("workload", "calls"), "load": load, "tasks": n_tasks,
            "seed": seed, **({"capacity": capacity} if load != "capacity" else {})}
    return Trace({n: wf for n, wf in log.workflows.items() if n in used}, tasks, meta)


def burst_trace(wl: Workload, n_tasks: int, seed: int, budget: int = DEFAULT_BUDGET) -> Trace:
    """Every task at t=0: what a saturated engine finishes measures its capacity."""
    tasks = sample_tasks(wl, [0.0] * n_tasks, seed, budget)
    return Trace({wf.name: wf for wf in wl.workflows}, tasks,
                 {"workload": wl.name, "load": "capacity", "tasks": n_tasks, "seed": seed})
