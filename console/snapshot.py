"""What the console shows, as plain frozen rows, built from either source:
the daemon's `/v1/state` JSON (live) or a store replay (`store.queries`).

Widgets render only these types, so live and replay look the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store import queries as q
from topasd.lifecycle import workflow_label


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One agent: where its prefix lives, its requests, the move under way."""

    agent: str
    tokens: int
    location: str  # gpu | host | none
    ready: bool
    transfer: str | None  # load | offload | compute | None
    transfer_until: float | None
    running: int
    waiting: int
    kv_running: int  # KV tokens its running requests hold


LATE_SLACK = 0.25  # late: 25% past its workflow's (or stage's) p99 so far
LATE_SAMPLES = 5  # ... once that many of them finished (before: nothing is late)


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task in flight and its DAG progress."""

    id: int
    workflow: str
    arrival: float
    age: float
    stages_done: int
    stages_total: int | None
    running: tuple[str, ...]  # stages with a request running
    waiting: tuple[str, ...]  # stages with a request waiting
    remaining_s: float | None  # expected longest remaining path (None: not known)
    client_id: str | None = None  # the application's task id (topasd.task_id)
    stage_since: tuple[tuple[str, float], ...] = ()  # its active stages' first ready

    @property
    def expected_jct(self) -> float | None:
        return None if self.remaining_s is None else self.age + self.remaining_s


@dataclass(frozen=True, slots=True)
class Numbers:
    """Headline numbers at one time."""

    t: float
    tasks_finished: int
    throughput: float  # finished tasks per engine second
    jct_mean: float | None
    jct_p99: float | None
    decision_ms: float | None  # mean policy wall time
    decision_p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The engine at one time: KV, agents, tasks, counts, headline numbers."""

    t: float
    budget: int | None
    kv_prefixes: int  # prefix KV on the GPU
    kv_requests: int  # running requests' KV
    agents: tuple[AgentRow, ...]
    tasks: tuple[TaskRow, ...]
    numbers: Numbers
    tasks_in_flight: int
    requests_running: int
    requests_waiting: int
    decisions: int
    policy: str
    params_version: int | None = None
    speed: str = ""
    draining: bool = False
    started_ts: float | None = None
    requests_withdrawn: int = 0  # calls whose client went away (live only)
    groups: Mapping[str, q.GroupStats] = field(default_factory=dict)  # by workflow label

    @property
    def kv_free(self) -> int | None:
        if self.budget is None:
            return None
        return max(0, self.budget - self.kv_prefixes - self.kv_requests)

    def late(self, task: TaskRow) -> bool:
        return self.late_reason(task) is not None

    def late_reason(self, task: TaskRow) -> str | None:
        """Why a task is late, judged against its own workflow's finished tasks
        (LATE_SAMPLES at least): age + expected remaining path past its
        workflow's p99 JCT by LATE_SLACK, or an active stage running longer than
        that stage's p99 by LATE_SLACK. None: not late (or nothing to judge by)."""
        group = self.groups.get(workflow_label(task.workflow))
        if group is None:
            return None
        p99 = group.jct_p99_s
        if group.finished >= LATE_SAMPLES and p99 is not None:
            expected = task.age + (task.remaining_s or 0.0)
            if expected > p99 * (1 + LATE_SLACK):
                return (f"{expected:.0f} s expected > {workflow_label(task.workflow)}'s p99 "
                        f"{p99:.0f} s + {LATE_SLACK:.0%}")
        for stage, since in task.stage_since:
            n, stage_p99 = group.stages.get(stage, (0, 0.0))
            if n >= LATE_SAMPLES and self.t - since > stage_p99 * (1 + LATE_SLACK):
                return (f"stage {stage} {self.t - since:.0f} s > its p99 {stage_p99:.0f} s + "
                        f"{LATE_SLACK:.0%}")
        return None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One scheduling decision as the feed lists it."""

    seq: int
    t: float
    admit: tuple[int, ...]
    preempt: tuple[int, ...]
    load: tuple[str, ...]
    evict: tuple[str, ...]
    blocked: bool
    wall_ms: float
    n_candidates: int
    total: float | None  # the chosen state's score (baselines: none)
    n_held: int = 0  # waiting requests it left out of W_t (TOPAS's `phases`, `lot_size`)

    @property
    def noop(self) -> bool:
        return not (self.admit or self.preempt or self.load or self.evict)


@dataclass(frozen=True, slots=True)
class CandidateRow:
    """A candidate post-decision state with its Eq. 13 terms."""

    idx: int
    won: bool
    resident: tuple[str, ...]
    admit: tuple[int, ...]
    preempt: tuple[int, ...]
    j_admit: float
    j_move: float
    j_redo: float
    j_revoke: float
    v_reuse: float
    total: float


@dataclass(frozen=True, slots=True)
class DecisionDetail:
    """A decision with its candidate states."""

    row: DecisionRow
    policy: str
    reservation: str
    chosen: int | None
    candidates: tuple[CandidateRow, ...]
    note: str = ""  # e.g. how many candidates were logged
    # the admitted, preempted and held requests: (task, stage, agent)
    requests: Mapping[int, tuple[int | None, str, str]] = field(default_factory=dict)
    held: tuple[int, ...] = ()  # the waiting requests it left out of W_t

    def named(self, rid: int) -> str:
        """'12 (task 3 · b · B)', or '12' when its task is not known."""
        info = self.requests.get(rid)
        return str(rid) if info is None else f"{rid} (task {info[0]} · {info[1]} · {info[2]})"


@dataclass(frozen=True, slots=True)
class TrailRow:
    """One request of an opened task: times and the decisions that touched it."""

    id: int
    stage: str
    agent: str
    state: str
    ready: float
    admitted: float | None
    finished: float | None
    preemptions: int
    retractions: int
    decisions: tuple[tuple[int, str], ...]  # (seq, admit | preempt)
    held: int = 0  # decisions that left it out of W_t
    last_held: int | None = None  # the latest of them


@dataclass(frozen=True, slots=True)
class StageRow:
    name: str
    status: str
    rounds_done: int
    started: float | None
    finished: float | None


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """An opened task: its stages and requests (None: no longer kept)."""

    id: int
    workflow: str
    client_id: str | None
    status: str
    arrival: float
    finished: float | None
    stages: tuple[StageRow, ...]
    requests: tuple[TrailRow, ...] | None

    def decisions(self) -> list[tuple[int, str, TrailRow]]:
        """Every (decision, action, request) of its requests, by decision; a
        request that was held is listed once, as `hold` at the latest decision
        that held it (`TrailRow.held` says how many did)."""
        rows = [(seq, action, r) for r in self.requests or () for seq, action in r.decisions]
        rows += [(r.last_held, "hold", r) for r in self.requests or ()
                 if r.held and r.last_held is not None]
        return sorted(rows, key=lambda x: (x[0], x[2].id))


def task_from_api(data: Mapping[str, Any]) -> TaskDetail:
    """An opened task of `GET /v1/tasks/{id}` (or `store.queries.task_at`, alike)."""
    reqs = data.get("requests")
    return TaskDetail(
        id=int(data["id"]), workflow=str(data["workflow"]),
        client_id=data.get("client_task_id"), status=str(data["status"]),
        arrival=float(data["arrival"]), finished=_f(data.get("finished")),
        stages=tuple(StageRow(v, str(st["status"]), int(st["rounds_done"]),
                              _f(st.get("started_at")), _f(st.get("finished_at")))
                     for v, st in (data.get("stages") or {}).items()),
        requests=None if reqs is None else tuple(TrailRow(
            int(r["id"]), str(r["stage"]), str(r["agent"]), str(r["state"]), float(r["ready"]),
            _f(r.get("admitted")), _f(r.get("finished")), int(r.get("preemptions", 0)),
            int(r.get("retractions", 0)),
            tuple((int(d["seq"]), str(d["action"])) for d in r.get("decisions", ())),
            int(r.get("held") or 0), _i(r.get("last_held")))
            for r in reqs))


# ------------------------------------------------------------------ live


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def _i(x: Any) -> int | None:
    return None if x is None else int(x)


def _count(x: int | Sequence[Any]) -> int:
    """A count, or the length of a list (`/v1/state`'s waiting requests, brief or not)."""
    return x if isinstance(x, int) else len(x)


def snapshot_from_state(state: Mapping[str, Any]) -> Snapshot:
    """A snapshot of the daemon's `GET /v1/state` body."""
    t = float(state["t"])
    running: Mapping[str, Sequence[Mapping[str, Any]]] = state.get("running", {})
    waiting: Mapping[str, int | Sequence[Any]] = state.get("waiting", {})  # brief: counts
    counts = state.get("counts", {})
    agents = []
    names = [p["agent"] for p in state.get("prefixes", [])]
    names += sorted((set(running) | set(waiting)) - set(names))
    by_agent = {p["agent"]: p for p in state.get("prefixes", [])}
    for name in names:
        p = by_agent.get(name, {})
        tr = p.get("transfer") or {}
        runs = running.get(name, [])
        agents.append(AgentRow(
            agent=name, tokens=int(p.get("tokens", 0)), location=str(p.get("location", "none")),
            ready=bool(p.get("ready", False)), transfer=tr.get("kind"),
            transfer_until=_f(tr.get("until")), running=len(runs),
            waiting=_count(waiting.get(name, 0)),
            kv_running=sum(int(r["input_tokens"]) + int(r["generated"]) for r in runs)))
    tasks = []
    for item in state.get("tasks", []):
        if "arrival" not in item:
            continue
        running_stages = tuple(item.get("stages_running", ()))
        waiting_stages = tuple(item.get("stages_waiting", ()))
        since = item.get("stages_since") or {  # brief: only the active stages'
            v: st.get("started_at") for v, st in (item.get("stages") or {}).items()}
        tasks.append(TaskRow(
            id=int(item["id"]), workflow=str(item["workflow"]), arrival=float(item["arrival"]),
            age=max(0.0, t - float(item["arrival"])), stages_done=int(item["stages_done"]),
            stages_total=int(item["stages_total"]), running=running_stages,
            waiting=waiting_stages, remaining_s=_f(item.get("remaining_s")),
            client_id=item.get("client_task_id"),
            stage_since=tuple((v, float(since[v]))
                              for v in sorted({*running_stages, *waiting_stages})
                              if since.get(v) is not None)))
    stats = state.get("stats") or {}
    budget = state.get("budget", {})
    numbers = Numbers(
        t=t, tasks_finished=int(stats.get("tasks_finished", counts.get("tasks_finished", 0))),
        throughput=float(stats.get("throughput_task_s", 0.0)),
        jct_mean=_f(stats.get("jct_mean_s")), jct_p99=_f(stats.get("jct_p99_s")),
        decision_ms=_f(stats.get("decision_ms_mean")),
        decision_p99_ms=_f(stats.get("decision_ms_p99")))
    speed = state.get("speed")
    return Snapshot(
        t=t, budget=budget.get("tokens"), kv_prefixes=int(budget.get("prefixes", 0)),
        kv_requests=int(budget.get("requests", 0)), agents=tuple(agents), tasks=tuple(tasks),
        numbers=numbers, tasks_in_flight=int(counts.get("tasks_in_flight", len(tasks))),
        requests_running=int(counts.get("requests_running", 0)),
        requests_waiting=int(counts.get("requests_waiting", 0)),
        decisions=int(counts.get("decisions", 0)), policy=str(state.get("policy", "?")),
        params_version=state.get("params_version"),
        speed="" if speed is None else (f"{speed}x" if speed != "max" else "max"),
        draining=bool(state.get("draining", False)), started_ts=_f(state.get("started_ts")),
        requests_withdrawn=int(counts.get("requests_withdrawn", 0)),
        groups=_groups(stats.get("by_workflow") or {}))


def _groups(by_workflow: Mapping[str, Any]) -> dict[str, q.GroupStats]:
    """`/v1/state`'s stats.by_workflow as GroupStats."""
    return {label: q.GroupStats(int(g.get("finished", 0)), _f(g.get("jct_p99_s")), {
        v: (int(st["finished"]), float(st["p99_s"])) for v, st in (g.get("stages") or {}).items()})
        for label, g in by_workflow.items()}


def decision_from_event(data: Mapping[str, Any]) -> DecisionRow:
    """A feed row of a `decision` event (or a `recent_decisions` entry)."""
    terms = data.get("terms") or {}
    return DecisionRow(
        seq=int(data["seq"]), t=float(data["t"]), admit=tuple(data.get("admit", ())),
        preempt=tuple(data.get("preempt", ())), load=tuple(data.get("load", ())),
        evict=tuple(data.get("evict", ())), blocked=bool(data.get("blocked", False)),
        wall_ms=float(data.get("wall_ms", 0.0)), n_candidates=int(data.get("n_candidates", 0)),
        total=_f(terms.get("total")), n_held=int(data.get("n_held", 0)))


def _candidate(c: Mapping[str, Any]) -> CandidateRow:
    return CandidateRow(
        idx=int(c["idx"]), won=bool(c["won"]), resident=tuple(sorted(c.get("resident") or ())),
        admit=tuple(c.get("admit") or ()), preempt=tuple(c.get("preempt") or ()),
        j_admit=float(c["j_admit"]), j_move=float(c["j_move"]), j_redo=float(c["j_redo"]),
        j_revoke=float(c["j_revoke"]), v_reuse=float(c["v_reuse"]), total=float(c["total"]))


def detail_from_api(data: Mapping[str, Any]) -> DecisionDetail:
    """A decision detail of the daemon's `GET /v1/decisions/{seq}` body."""
    cands = tuple(_candidate(c) for c in data.get("candidates", []))
    won = next((c for c in cands if c.won), None)
    row = DecisionRow(
        seq=int(data["seq"]), t=float(data["t"]), admit=tuple(data["admit"]),
        preempt=tuple(data["preempt"]), load=tuple(data["load"]), evict=tuple(data["evict"]),
        blocked=bool(data["blocked"]), wall_ms=float(data["wall_ms"]),
        n_candidates=int(data["n_candidates"]), total=None if won is None else won.total,
        n_held=len(data.get("held") or ()))
    note = _candidates_note(len(cands), row.n_candidates, "")
    named = {int(rid): (r.get("task_id"), str(r.get("stage") or "?"), str(r.get("agent") or "?"))
             for rid, r in (data.get("requests") or {}).items()}
    return DecisionDetail(row=row, policy=str(data["policy"]),
                          reservation=str(data["reservation"]), chosen=data.get("chosen"),
                          candidates=cands, note=note, requests=named,
                          held=tuple(data.get("held") or ()))


# ----------------------------------------------------------------- replay


def numbers_from_headline(h: q.Headline) -> Numbers:
    return Numbers(t=h.t, tasks_finished=h.tasks_finished, throughput=h.throughput_task_s,
                   jct_mean=h.jct_mean_s, jct_p99=h.jct_p99_s, decision_ms=h.decision_ms_mean,
                   decision_p99_ms=h.decision_ms_p99)


def snapshot_from_replay(s: q.StateAt, policy: str,
                         groups: Mapping[str, q.GroupStats] | None = None) -> Snapshot:
    """A snapshot of a recorded run's state at a time."""
    agents = []
    names = [p.agent for p in s.prefixes]
    reqs = s.running + s.waiting
    names += sorted({r.agent for r in reqs} - set(names))
    by_agent = {p.agent: p for p in s.prefixes}
    for name in names:
        p = by_agent.get(name)
        runs = [r for r in s.running if r.agent == name]
        agents.append(AgentRow(
            agent=name, tokens=p.tokens if p else 0, location=p.location if p else "none",
            ready=p.ready if p else False, transfer=p.transfer if p else None,
            transfer_until=p.transfer_until if p else None, running=len(runs),
            waiting=sum(1 for r in s.waiting if r.agent == name),
            kv_running=sum(r.kv_tokens for r in runs)))
    tasks = tuple(TaskRow(
        id=tk.task_id, workflow=tk.workflow or "?", arrival=tk.arrival,
        age=max(0.0, s.t - tk.arrival), stages_done=tk.stages_done,
        stages_total=tk.stages_total, running=tk.stages_running, waiting=tk.stages_waiting,
        remaining_s=None, stage_since=tk.stage_since) for tk in s.tasks)
    kv_prefixes = sum(p.tokens for p in s.prefixes if p.location == "gpu")
    return Snapshot(
        t=s.t, budget=s.budget_tokens, kv_prefixes=kv_prefixes,
        kv_requests=sum(r.kv_tokens for r in s.running), agents=tuple(agents), tasks=tasks,
        numbers=numbers_from_headline(s.headline), tasks_in_flight=len(s.tasks),
        requests_running=len(s.running), requests_waiting=len(s.waiting),
        decisions=s.decisions, policy=policy, groups=groups or {})


def _json_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if x else ()


def decision_from_store(row: Mapping[str, Any]) -> DecisionRow:
    """A feed row of a `decisions` table row (`store.queries` decoded)."""
    return DecisionRow(
        seq=int(row["seq"]), t=float(row["t"]), admit=_json_tuple(row.get("admit")),
        preempt=_json_tuple(row.get("preempt")), load=_json_tuple(row.get("load")),
        evict=_json_tuple(row.get("evict")), blocked=bool(row.get("blocked")),
        wall_ms=float(row.get("wall_ms") or 0.0), n_candidates=int(row.get("n_candidates") or 0),
        total=_f(row.get("total")), n_held=int(row.get("n_held") or 0))


def _candidates_note(shown: int, scored: int, logged: str) -> str:
    if not scored:  # a baseline orders requests; it scores no candidate states
        return "no candidate states (this policy does not score any)"
    return f"{shown} of {scored} candidates{logged}"


def detail_from_store(row: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                      policy: str, requests: Mapping[int, tuple[int | None, str, str]] | None
                      = None) -> DecisionDetail:
    """A decision detail of a stored decision and its logged candidates."""
    cands = tuple(CandidateRow(
        idx=int(c["idx"]), won=bool(c["won"]), resident=tuple(sorted(c.get("resident") or ())),
        admit=_json_tuple(c.get("admit")), preempt=_json_tuple(c.get("preempt")),
        j_admit=float(c["j_admit"]), j_move=float(c["j_move"]), j_redo=float(c["j_redo"]),
        j_revoke=float(c["j_revoke"]), v_reuse=float(c["v_reuse"]), total=float(c["total"]))
        for c in candidates)
    d = decision_from_store(row)
    note = _candidates_note(len(cands), d.n_candidates, " logged")
    return DecisionDetail(row=d, policy=policy, reservation=str(row.get("reservation") or ""),
                          chosen=row.get("chosen"), candidates=cands, note=note,
                          requests=requests or {}, held=_json_tuple(row.get("held")))
