"""The vocabulary of topasd (paper section III).

Every policy, backend, store and console speaks these types. They are frozen
dataclasses: a backend builds an `EngineView`, a policy returns a `Decision`,
and the store writes that same `Decision` as its row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import networkx as nx  # type: ignore[import-untyped]  # no stubs (read by the mypyc build too)
import numpy as np

from topasd.score import score_total


class TopasError(Exception):
    """An error a user can fix; the message names the place and the fix."""


class WorkflowError(TopasError):
    """A workflow definition is invalid (cycle, unknown agent, ...)."""


def pid_alive(pid: Any) -> bool:
    """A process with this id exists (ours counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or beyond any process id
        return False
    except PermissionError:
        return True
    return True


def pid_runs_topasd(pid: int) -> bool:
    """Whether process `pid` runs topasd, as far as this system tells (Linux:
    its command line names topasd; elsewhere: assumed). A runtime file outlives
    a daemon that was killed, and its pid may since belong to another program,
    which `topasd stop` must not signal."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc here, or hidden: cannot tell
        return True
    return b"topasd" in cmdline


def replace_known(obj: Any, what: str, **changes: Any) -> Any:
    """`dataclasses.replace` that names unknown fields in a clear error."""
    known = {f.name for f in fields(obj)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TopasError(f"unknown {what} {unknown}; known: {sorted(known)}")
    return replace(obj, **changes)


# --------------------------------------------------------------------------
# Distributions used by stage profiles
# --------------------------------------------------------------------------

DIST_KINDS = ("fixed", "uniform", "uniform_int", "lognormal", "exponential", "choice")
INT64_MAX = 2**63 - 1  # SQLite INTEGER (signed 64-bit): task ids and seeds in the decision log
MAX_BUDGET = 10**9  # KV tokens: far beyond any engine's pool; more is a typo


def is_int64(x: int) -> bool:
    """`x` fits an INTEGER column of the decision log (signed 64-bit)."""
    return -INT64_MAX - 1 <= x <= INT64_MAX


@dataclass(frozen=True, slots=True)
class Dist:
    """A small sampling distribution for token counts, rounds and tool waits.

    `fixed`: value. `uniform`/`uniform_int`: low, high (inclusive for ints).
    `lognormal`: median, sigma, optional low/high clip. `exponential`: scale
    (its mean), optional low/high clip. `choice`: values.
    """

    kind: str
    value: float = 0.0
    low: float | None = None
    high: float | None = None
    median: float | None = None
    sigma: float | None = None
    values: tuple[float, ...] = ()
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in DIST_KINDS:
            raise WorkflowError(f"unknown distribution kind {self.kind!r}; use one of {DIST_KINDS}")
        given: dict[str, Any] = {"value": self.value, "low": self.low, "high": self.high,
                 "median": self.median, "sigma": self.sigma, "values": self.values,
                 "scale": self.scale}
        numbers = [*self.values, *(v for k, v in given.items() if k != "values")]
        if any(x is not None and not math.isfinite(x) for x in numbers):
            shown = {k: v for k, v in given.items() if v}
            raise WorkflowError(f"{self.kind} parameters must be finite numbers (no NaN or "
                                f"infinity), got {shown}")
        if self.kind == "lognormal" and self.sigma is not None and not 0 < self.sigma <= 20:
            raise WorkflowError(f"lognormal sigma must be in (0, 20], got {self.sigma:g}")
        if self.kind in ("uniform", "uniform_int") and (
            self.low is None or self.high is None or self.low > self.high
        ):
            raise WorkflowError(f"{self.kind} needs low <= high, got {self.low}, {self.high}")
        if self.kind in ("lognormal", "exponential") and None not in (self.low, self.high) \
                and self.low > self.high:  # type: ignore[operator]
            raise WorkflowError(f"{self.kind} needs low <= high (its clip), got low "
                                f"{self.low:g} > high {self.high:g}")
        if self.kind == "exponential" and (self.scale is None or self.scale <= 0):
            raise WorkflowError("exponential needs mean > 0")
        if self.kind == "lognormal" and (self.median is None or self.median <= 0 or not self.sigma):
            raise WorkflowError("lognormal needs median > 0 and sigma > 0")
        if self.kind == "choice" and not self.values:
            raise WorkflowError("choice needs a non-empty list of values")

    @staticmethod
    def fixed(value: float) -> Dist:
        return Dist("fixed", value=float(value))

    def sample(self, rng: np.random.Generator) -> float:
        """One draw (a float; callers round token counts)."""
        if self.kind == "fixed":
            return self.value
        low, high = cast(float, self.low), cast(float, self.high)  # set where used
        if self.kind == "uniform":
            return float(rng.uniform(low, high))
        if self.kind == "uniform_int":
            return float(rng.integers(int(low), int(high) + 1))
        if self.kind == "choice":
            return float(self.values[int(rng.integers(len(self.values)))])
        if self.kind == "exponential":
            return self._clip(float(rng.exponential(cast(float, self.scale))))
        median, sigma = cast(float, self.median), cast(float, self.sigma)  # lognormal's
        return self._clip(float(median * math.exp(sigma * rng.standard_normal())))

    def _clip(self, x: float) -> float:
        """`x` within the clip [low, high] (either side may be open)."""
        if self.low is not None:
            x = max(x, self.low)
        if self.high is not None:
            x = min(x, self.high)
        return x

    def least(self) -> float:
        """The smallest value a draw can take (an unclipped lognormal: 0)."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "choice":
            return float(min(self.values))
        return float(self.low) if self.low is not None else 0.0

    def mean(self) -> float:
        """The expectation (lognormal clipping ignored: an estimate only)."""
        if self.kind == "fixed":
            return self.value
        if self.kind in ("uniform", "uniform_int"):
            return (float(cast(float, self.low)) + float(cast(float, self.high))) / 2.0
        if self.kind == "choice":
            return float(np.mean(self.values))
        if self.kind == "exponential":
            return self._exponential_mean()
        median, sigma = cast(float, self.median), cast(float, self.sigma)  # lognormal's
        m = median * math.exp(sigma**2 / 2.0)
        if self.high is not None:
            m = min(m, self.high)
        return m

    def _exponential_mean(self) -> float:
        """E[min(max(X, low), high)] for X ~ Exp(mean s), exact:
        lo + s (e^{-lo/s} - e^{-hi/s}), lo = max(low, 0), hi = high (or inf)."""
        s = cast(float, self.scale)
        lo = max(self.low or 0.0, 0.0)
        hi = math.inf if self.high is None else self.high
        if hi <= lo:  # every draw clipped to high
            return hi
        return lo + s * (math.exp(-lo / s) - (0.0 if math.isinf(hi) else math.exp(-hi / s)))


# --------------------------------------------------------------------------
# Workflows: agents, stages, DAGs
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agent:
    """An agent with a static prefix (system prompt + template) of `prefix_tokens`."""

    name: str
    prefix_tokens: int


HISTORY_MODES = ("none", "parents", "ancestors")


@dataclass(frozen=True, slots=True)
class StageProfile:
    """How a stage issues LLM requests: ReAct rounds with tool waits between them.

    Round k's dynamic input = `input_tokens` + carried history: the outputs of
    upstream stages (`history`; with `summary_tokens`, each one a summary of that
    many tokens, at most the output) and, when `carry_rounds`, every earlier
    round's output plus `observation_tokens` (tool output) per earlier round.
    A stage runs `branches` copies in parallel (a map over items, the count drawn
    per task), each its own rounds; its first rounds are ready `wait_before_s`
    after the stage is (its predecessors finished, or the task arrived). With
    `share_history`, the carried upstream history is shared task context: one
    segment every round of every branch starts with, held once (`Segment`).
    With `share_rounds` (and `carry_rounds`), a round's carried conversation
    is too: each finished round's own input and output stay as a segment its
    next round starts with, kept (or not) through the tool wait between them.
    """

    rounds: Dist = field(default_factory=lambda: Dist.fixed(1))
    input_tokens: Dist = field(default_factory=lambda: Dist.fixed(256))
    output_tokens: Dist = field(default_factory=lambda: Dist.fixed(256))
    tool_wait_s: Dist = field(default_factory=lambda: Dist.fixed(0.0))
    observation_tokens: Dist = field(default_factory=lambda: Dist.fixed(0))
    history: str = "none"
    carry_rounds: bool = True
    wait_before_s: Dist = field(default_factory=lambda: Dist.fixed(0.0))
    branches: Dist = field(default_factory=lambda: Dist.fixed(1))
    summary_tokens: Dist | None = None  # None: upstream outputs carried whole
    share_history: bool = False
    share_rounds: bool = False


@dataclass(frozen=True, slots=True)
class Stage:
    """A node v of the workflow DAG, executed by `agent`."""

    name: str
    agent: str
    after: tuple[str, ...] = ()
    profile: StageProfile = field(default_factory=StageProfile)


def _rows_index(rows: Sequence[int]) -> slice | list[int]:
    """A slice selecting exactly `rows` when they are contiguous, else the list."""
    lo, hi = min(rows), max(rows)
    return slice(lo, hi + 1) if hi - lo + 1 == len(set(rows)) == len(rows) else list(rows)


@dataclass(frozen=True)
class Workflow:
    """A validated DAG G=(V,E) of stages, each mapped to an agent (section III)."""

    name: str
    agents: Mapping[str, Agent]
    stages: Mapping[str, Stage]
    description: str = ""

    def __post_init__(self) -> None:
        where = f"workflow {self.name!r}"
        if not self.stages:
            raise WorkflowError(f"{where}: has no stages; add at least one stage")
        for stage in self.stages.values():
            if stage.agent not in self.agents:
                raise WorkflowError(
                    f"{where}, stage {stage.name!r}: unknown agent {stage.agent!r}; "
                    f"define it under agents (known: {sorted(self.agents)})"
                )
            for pred in stage.after:
                if pred not in self.stages:
                    raise WorkflowError(
                        f"{where}, stage {stage.name!r}: 'after' names unknown stage {pred!r}"
                    )
        for agent in self.agents.values():
            if agent.prefix_tokens < 0:
                raise WorkflowError(f"{where}, agent {agent.name!r}: prefix_tokens must be >= 0")
        graph = self.graph
        if not nx.is_directed_acyclic_graph(graph):
            cycle = " -> ".join(u for u, _ in nx.find_cycle(graph))
            raise WorkflowError(f"{where}: the stage graph has a cycle ({cycle}); remove an edge")

    @cached_property
    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(self.stages)
        for stage in self.stages.values():
            g.add_edges_from((pred, stage.name) for pred in stage.after)
        return g

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Stages in a deterministic topological order."""
        return tuple(nx.lexicographical_topological_sort(self.graph))

    @cached_property
    def preds(self) -> Mapping[str, tuple[str, ...]]:
        return {v: tuple(sorted(self.graph.predecessors(v))) for v in self.stages}

    @cached_property
    def succs(self) -> Mapping[str, tuple[str, ...]]:
        return {v: tuple(sorted(self.graph.successors(v))) for v in self.stages}

    @cached_property
    def depth(self) -> Mapping[str, int]:
        """Longest hop count from an entry stage (entry stages have depth 0)."""
        depth: dict[str, int] = {}
        for v in self.topo_order:
            depth[v] = max((depth[p] + 1 for p in self.preds[v]), default=0)
        return depth

    @cached_property
    def stage_index(self) -> Mapping[str, int]:
        """Row of each stage in `topo_order`."""
        return {v: i for i, v in enumerate(self.topo_order)}

    @cached_property
    def succ_rows(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(row, successor rows) in reverse topological order (longest paths)."""
        idx = self.stage_index
        return tuple((idx[v], tuple(idx[s] for s in self.succs[v]))
                     for v in reversed(self.topo_order))

    @cached_property
    def heights(self) -> Mapping[str, int]:
        """Each stage's height: the most edges on a path from it to an exit."""
        height: dict[str, int] = {}
        for v in reversed(self.topo_order):
            height[v] = 1 + max((height[s] for s in self.succs[v]), default=-1)
        return height

    @cached_property
    def lp_groups(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """Longest-path plan: (rows, their common successor rows) by height from
        the sinks; rows in one group share successors and never depend on each
        other, so each group is one vectorized step."""
        idx = self.stage_index
        height = self.heights
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for v in reversed(self.topo_order):
            succ = tuple(idx[s] for s in self.succs[v])
            if succ:
                groups.setdefault((height[v], succ), []).append(idx[v])
        return tuple((tuple(rows), succ) for (_, succ), rows in sorted(groups.items()))

    @cached_property
    def lp_steps(self) -> tuple[tuple[slice | list[int], slice | list[int]], ...]:
        """`lp_groups` as array indices: a slice where the rows (or successor
        rows) are contiguous, so a step reads and writes a view, not a copy."""
        return tuple((_rows_index(rows), _rows_index(succ)) for rows, succ in self.lp_groups)

    @cached_property
    def entry_stages(self) -> tuple[str, ...]:
        return tuple(v for v in self.topo_order if not self.preds[v])

    @cached_property
    def is_chain(self) -> bool:
        return all(len(self.preds[v]) <= 1 and len(self.succs[v]) <= 1 for v in self.stages) and (
            len(self.entry_stages) == 1
        )

    def prefix_tokens(self, stage: str) -> int:
        return self.agents[self.stages[stage].agent].prefix_tokens


# --------------------------------------------------------------------------
# Requests, prefixes, tasks: what the engine holds
# --------------------------------------------------------------------------


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Location(StrEnum):
    """Where an agent's prefix KV lives."""

    GPU = "gpu"
    HOST = "host"
    NONE = "none"


class Reservation(StrEnum):
    """How a running request's decode KV is reserved (Eq. 2's d_r(t)).

    FULL reserves every remaining output token (TOPAS); OPTIMISTIC reserves
    `remaining x new_token_ratio` like SGLang and may be retracted later.
    """

    FULL = "full"
    OPTIMISTIC = "optimistic"


@dataclass(frozen=True, slots=True)
class Segment:
    """Shared task context: a named piece of a request's input that requests of
    the same task reuse from the KV cache, as a radix cache shares a common
    prompt prefix. It sits after the agent prefix, so `key` names one copy by
    its agent, its task and the segments before it in the prompt
    (`segment_keys`); `tokens` is its size (part of `input_tokens`)."""

    key: str
    tokens: int


def segment_keys(agent: str, task_id: int, names: Sequence[str]) -> tuple[str, ...]:
    """The copy each of a prompt's shared segments is, in prompt order: the
    i-th is `agent/task/name_0/.../name_i` (a radix path: a segment is shared
    only after the same agent prefix and the same segments before it)."""
    return tuple("/".join((agent, str(task_id), *names[:i + 1])) for i in range(len(names)))


@dataclass(frozen=True, slots=True)
class Request:
    """One LLM call of a stage round. Token counts exclude the agent prefix;
    `input_tokens` includes the `shared` segments (held once, see `Segment`)."""

    id: int
    task_id: int
    workflow: str
    stage: str
    agent: str
    round: int
    input_tokens: int
    output_tokens: int
    ready_at: float
    task_arrival: float
    prefix_tokens: int = 0
    queued_at: float = 0.0  # when it (re-)entered the waiting queue
    generated: int = 0
    state: RequestState = RequestState.WAITING
    admitted_at: float | None = None
    started_at: float | None = None
    reservation: Reservation = Reservation.FULL
    preemptions: int = 0
    shared: tuple[Segment, ...] = ()  # shared task context, in prompt order
    # the copy its finished sequence (own input and output) becomes: the conversation
    # its next ReAct round starts with, kept through the tool wait between them
    keeps: Segment | None = None

    @property
    def remaining(self) -> int:
        return self.output_tokens - self.generated

    @property
    def own_input(self) -> int:
        """The dynamic input beyond its shared segments: KV it holds alone."""
        return self.input_tokens - sum(s.tokens for s in self.shared) if self.shared \
            else self.input_tokens

    def kv_tokens(self) -> int:
        """KV the request holds alone now: its own input and generated tokens
        (its shared segments are held once, by their copies)."""
        return self.own_input + self.generated

    def demand(self, ratio: float, clip: int = 4096) -> float:
        """d_r(t) of Eq. 2 for a running request: own input + retained output +
        the decode reservation of its admission mode (OPTIMISTIC: SGLang's
        min(remaining, clip) x new_token_ratio). Shared segments are counted
        once per copy (`shared_kv`), not here."""
        if self.reservation is Reservation.FULL:
            return float(self.own_input + self.output_tokens)
        return self.own_input + self.generated + ratio * min(self.remaining, clip)

    def admit_demand(self, reservation: Reservation = Reservation.FULL, ratio: float = 1.0,
                     clip: int = 4096) -> float:
        """KV a request needs to be admitted beside its shared segments: own input
        + retained output + decode reservation (all remaining tokens, or
        SGLang's ratio-scaled estimate)."""
        if reservation is Reservation.FULL:
            return float(self.own_input + self.output_tokens)
        return self.own_input + self.generated + ratio * min(self.remaining, clip)


def shared_kv(requests: Iterable[Request], held: Collection[str] = ()) -> dict[str, int]:
    """The shared segments `requests` hold, each copy once (key -> tokens),
    leaving out those in `held` (already counted)."""
    out: dict[str, int] = {}
    for r in requests:
        for s in r.shared:
            if s.key not in held:
                out[s.key] = s.tokens
    return out


def missing_shared(r: Request, present: Collection[str]) -> int:
    """Tokens of `r`'s shared segments whose copy is not in `present`."""
    return sum(s.tokens for s in r.shared if s.key not in present)


def held_demand(r: Request, held: Collection[str], reservation: Reservation = Reservation.FULL,
                ratio: float = 1.0, clip: int = 4096) -> float:
    """d_r of Eq. 2 for admitting a waiting request beside the shared segments
    `held` (locked by running requests): `admit_demand` plus its segments
    not yet held, each of which its admission locks."""
    return beside_held(r, r.admit_demand(reservation, ratio, clip), held)


def beside_held(r: Request, admit: float, held: Collection[str]) -> float:
    """d_r of Eq. 2 from r's `admit_demand` `admit`: plus its shared segments
    not in `held`, each of which its admission locks (`held_demand`)."""
    return admit + missing_shared(r, held) if r.shared else admit


def redo_tokens(r: Request) -> int:
    """Tokens a preempted request prefills again: its own input and output so
    far (its shared segments stay cached while they fit)."""
    return r.own_input + r.generated


@dataclass(frozen=True, slots=True)
class PrefixState:
    """An agent prefix's place: on GPU (`ready` once loaded/computed), host or none."""

    agent: str
    tokens: int
    location: Location
    ready: bool = False
    host_copy: bool = False
    last_used: float = 0.0
    ready_at: float | None = None

    @property
    def on_gpu(self) -> bool:
        return self.location is Location.GPU


@dataclass(frozen=True, slots=True)
class ContextState:
    """A copy of shared task context (`Segment`) on the engine: on the GPU
    (`ready` once computed or loaded), on the host (offloaded by a policy's
    eviction where the engine has a host tier: loaded back by its next
    holder, or before it by a decision's `load` naming its key) or gone
    (NONE: recomputed by its next holder).
    `holders`: running requests that hold it (locked); with none it stays
    cached in free KV, given up when the room is needed (a radix cache's
    evictable node), except while it loads back with no holder (`uploading`):
    a transfer in flight holds its room."""

    key: str
    agent: str
    task_id: int
    tokens: int
    location: Location
    ready: bool = False
    holders: int = 0
    last_used: float = 0.0  # when its last holder left (a tool wait's start)
    next_use: float | None = None  # when a request holding it is next ready (the wait's end)

    @property
    def uploading(self) -> bool:
        """Loading back from the host ahead of any holder: its room is taken."""
        return self.location is Location.GPU and not self.ready and not self.holders


class StageStatus(StrEnum):
    PENDING = "pending"  # predecessors unfinished
    ACTIVE = "active"  # a round is waiting, running or in a tool wait
    DONE = "done"


@dataclass(frozen=True, slots=True)
class StageProgress:
    """The stage history: cumulative LLM service e_{i,v} of finished rounds."""

    status: StageStatus = StageStatus.PENDING
    service_s: float = 0.0
    rounds_done: int = 0
    started_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task J_i as the scheduler sees it: arrival tau_i and stage histories."""

    id: int
    workflow: str
    arrival: float
    stages: Mapping[str, StageProgress]
    finished_at: float | None = None
    # a round finished or a stage is done (set from `stages` at construction)
    progressed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "progressed", any(
            st.rounds_done or st.status is StageStatus.DONE for st in self.stages.values()))

    @property
    def service_s(self) -> float:
        """Attained LLM service over all finished rounds (Autellix's signal)."""
        return sum(s.service_s for s in self.stages.values())


@dataclass(frozen=True, slots=True)
class CostHints:
    """The profiled costs a policy may use (from the backend's hardware profile).

    A decode step of B requests reading K context tokens takes
    max(weights_s, lin_per_token_s * B) + kv_read_per_token_s * K + overhead_s.
    """

    t_decode_s: float  # one decode step at batch 1 (the profile's T_decode floor)
    prefill_s_per_token: float
    prefill_base_s: float
    kv_bytes_per_token: float
    swap_bytes_per_s: float
    weights_s: float = 0.0
    lin_per_token_s: float = 0.0
    kv_read_per_token_s: float = 0.0
    overhead_s: float = 0.0
    preempt_drops_input: bool = True  # a preempted request's prompt KV is recomputed too

    def t_prefill(self, tokens: int) -> float:
        """T_prefill(|input|): profiled prefill time of `tokens` on a cached prefix."""
        return self.prefill_base_s + self.prefill_s_per_token * tokens

    def t_swap(self, tokens: int) -> float:
        """mu * l / B_swap: moving `tokens` of prefix KV over the host link."""
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    def t_request(self, input_tokens: int, output_tokens: int) -> float:
        """Profiled request service: T_prefill(|input|) + T_decode * max_new."""
        return self.t_prefill(input_tokens) + self.t_decode_s * output_tokens

    def t_decode_step(self, batch: int, context_tokens: int) -> float:
        """Profiled decode step time for `batch` requests reading `context_tokens`
        (at least the batch-1 step time `t_decode_s`)."""
        if not self.weights_s:
            return self.t_decode_s
        step = (max(self.weights_s, self.lin_per_token_s * batch)
                + self.kv_read_per_token_s * context_tokens + self.overhead_s)
        return max(step, self.t_decode_s)


@dataclass(frozen=True, slots=True)
class EngineView:
    """What a policy sees at a scheduling event t (section III)."""

    t: float
    budget_tokens: int
    new_token_ratio: float
    prefixes: Mapping[str, PrefixState]
    running: tuple[Request, ...]
    waiting: tuple[Request, ...]
    tasks: Mapping[int, TaskView]
    workflows: Mapping[str, Workflow]
    costs: CostHints
    new_request_ratio: float = 1.0  # share of max_new an optimistic admission reserves
    batch_is_full: bool = False  # SGLang: the last admission stopped on a lack of KV
    chunk_tokens: int = 8192  # prefill tokens one engine round takes (chunked prefill)
    max_prefill_tokens: int = 16384  # input tokens one admission round takes
    seq: int = 0
    contexts: Mapping[str, ContextState] = field(default_factory=dict)  # shared context

    def prefix_tokens(self, agent: str) -> int:
        return self.prefixes[agent].tokens

    def gpu_prefixes(self) -> tuple[str, ...]:
        return tuple(a for a, p in self.prefixes.items() if p.on_gpu)

    def cached_contexts(self) -> frozenset[str]:
        """Shared segments whose copy is on the GPU (computed or computing)."""
        return frozenset(k for k, c in self.contexts.items() if c.location is Location.GPU)


# --------------------------------------------------------------------------
# Decisions: what a policy returns, and what the store writes
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScoreTerms:
    """Eq. 13: total = j_admit (age-weighted) - j_move - j_redo - j_revoke + v_reuse."""

    j_admit: float = 0.0
    j_move: float = 0.0
    j_redo: float = 0.0
    j_revoke: float = 0.0
    v_reuse: float = 0.0

    @property
    def total(self) -> float:
        return score_total(self.j_admit, self.j_move, self.j_redo, self.j_revoke, self.v_reuse)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A generated post-decision state S' = (R', Q') with its score terms."""

    resident: tuple[str, ...]
    admit: tuple[int, ...]
    preempt: tuple[int, ...]
    terms: ScoreTerms = field(default_factory=ScoreTerms)


# what a decision did to a request (the log's `decision_actions.action`) -> the
# `Decision` field (and `decisions` column) that lists those request ids
DECISION_REQUESTS: Mapping[str, str] = {"admit": "admit", "preempt": "preempt", "hold": "held"}


@dataclass(frozen=True, slots=True)
class Decision:
    """The target state as actions, plus every candidate considered (for the log)."""

    t: float
    policy: str
    admit: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()
    load: tuple[str, ...] = ()
    evict: tuple[str, ...] = ()
    reservation: Reservation = Reservation.FULL
    blocked: bool = False  # admission stopped at a request that did not fit (KV)
    retry: bool = False  # ask to decide again after the next engine step
    # ask for a scheduling point at this engine time even if no event comes then
    # (a policy's own timer: a predicted tool return); None: nothing asked
    wake_at: float | None = None
    # waiting requests the policy left out of W_t (TOPAS's `lot_size` and
    # `phases`, topasd/scheduler/lots.py): why they waited while others ran
    held: tuple[int, ...] = ()
    candidates: Sequence[Candidate] = ()
    chosen: int | None = None
    wall_ms: float = 0.0
    seq: int = 0

    @property
    def is_noop(self) -> bool:
        return not (self.admit or self.preempt or self.load or self.evict)

    @property
    def chosen_candidate(self) -> Candidate | None:
        return None if self.chosen is None else self.candidates[self.chosen]


# --------------------------------------------------------------------------
# Events: what a backend (and the workflow driver) reports
# --------------------------------------------------------------------------


class EventKind(StrEnum):
    SCHEDULE = "schedule"  # a scheduling point: the runner must decide now
    TASK_ARRIVE = "task_arrive"
    REQUEST_READY = "request_ready"
    REQUEST_ADMIT = "request_admit"
    REQUEST_START = "request_start"  # first prefill chunk ran (service starts)
    PREFILL_END = "prefill_end"
    REQUEST_FINISH = "request_finish"
    # a request taken back before it finished: its caller went away (`note`: why)
    REQUEST_WITHDRAW = "request_withdraw"
    PREEMPT = "preempt"  # by the policy's decision
    RETRACT = "retract"  # by the engine: a decode step ran out of KV
    PREFIX_LOAD_START = "prefix_load_start"
    PREFIX_LOAD_END = "prefix_load_end"
    PREFIX_COMPUTE_START = "prefix_compute_start"
    PREFIX_COMPUTE_END = "prefix_compute_end"
    PREFIX_OFFLOAD_START = "prefix_offload_start"
    PREFIX_OFFLOAD_END = "prefix_offload_end"
    PREFIX_EVICT = "prefix_evict"
    PREFIX_DROP = "prefix_drop"  # a kept copy (`keep_evicted`) gave up its room
    # shared task context (`note`: the segment's key; `tokens`: its size)
    CONTEXT_HIT = "context_hit"  # an admitted request found the copy on the GPU
    CONTEXT_COMPUTE_START = "context_compute_start"  # ... did not: it is prefilled
    CONTEXT_COMPUTE_END = "context_compute_end"
    CONTEXT_DROP = "context_drop"  # an unheld copy gave up its room (or its compute)
    CONTEXT_KEEP = "context_keep"  # a finished round's sequence kept as its next round's
    CONTEXT_OFFLOAD = "context_offload"  # an unheld copy to host (`value`: the transfer)
    # a copy back from host: its holder admitted, or ahead of any holder by a
    # decision's `load` (no request id)
    CONTEXT_LOAD_START = "context_load_start"
    CONTEXT_LOAD_END = "context_load_end"
    # a ReAct round's tool call, between its request's finish and the next round's
    # readiness (`request_id`: the finished request; `value`: the wait)
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_END = "tool_call_end"
    STAGE_FINISH = "stage_finish"
    TASK_FINISH = "task_finish"
    TASK_ABANDON = "task_abandon"  # an application's task that will see no more calls (`note`)
    # a logged decision the engine never carried out: SGLang's scheduler stopped
    # waiting for it (`value`: the decision's seq)
    DECISION_DROPPED = "decision_dropped"


KEPT_NOTE = "kept in free KV"  # the note of a kept copy's offload end and its take-back


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One flat event row. `value` is a duration in seconds where one applies
    (request service, stage service, a host transfer from when it is decided to
    its end, waiting for the serial link included); `tokens` a token count;
    `decision` the seq of the decision a PREEMPT carries out (None elsewhere)."""

    t: float
    kind: EventKind
    request_id: int | None = None
    task_id: int | None = None
    agent: str | None = None
    stage: str | None = None
    tokens: int = 0
    value: float = 0.0
    note: str = ""
    decision: int | None = None

    def as_row(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "kind": str(self.kind),
            "request_id": self.request_id,
            "task_id": self.task_id,
            "agent": self.agent,
            "stage": self.stage,
            "tokens": self.tokens,
            "value": self.value,
            "note": self.note,
            "decision": self.decision,
        }
