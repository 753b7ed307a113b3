"""`lot_size`: an agent's waiting requests join W_t as one economic lot.

While the waiting work of the other agents is more than the pool holds
(a backlog: the engine stays full whatever this decision does), every
token-second an agent's prefix spends on the GPU is room the backlog's
batch does not get. Serving agent a's waiting requests now pins l_a for
`ext`, how far their service runs past a's running requests (all of it if
none runs), which delays each of the N tasks waiting on other agents by
about (l_a / B_t) * ext: the lot's setup cost, N * (l_a / B_t) * ext task
seconds. Waiting costs each of a's waiting requests one task second per
second. Part-period balancing (the lot-sizing rule behind the economic
order quantity) starts the lot once the summed wait of its requests
reaches `lot_size` times that setup cost; until then a's requests are
left out of the decision's W_t, so neither an admission nor a resident
idle prefix is spent on them.

A request is never held when its lot cannot grow (no other task in the
system still needs a: waiting would buy no batch), when its task is
overdue (`overdue`, against its workflow's mean recent JCT), or once it has
waited, since it entered the queue, its task's expected remaining path
(Eq. 5), at most its workflow's expected fresh path (the `started_hol`
scale): the rule shapes batches, it does not starve, and no one wait of a
request is held longer than what its task still has to do (a task of many
sequential requests may be held once per request).

`phases`: LPM's phases under TOPAS's order. While the agents whose prefixes
are on the GPU have more waiting work of started tasks than `phases` times
the room those prefixes leave in the pool, no other agent's prefix comes
in: the other agents' waiting requests leave W_t, so the pool serves the
resident agents' backlog in full batches and a prefix is brought in only
once that backlog no longer fills it (one setup per phase instead of one
per thin batch). New tasks' requests do not keep a phase going, as under
`start_gate` they do not pass started tasks. Nor do they prolong one past
its started work: once no started task's request of a resident agent
waits, while a started task's request of another agent fits only if a
resident prefix leaves and the started tasks' work for the other agents
(waiting, and about to be readied by the running requests) fills the room
their next phase has (`phases` times it), new tasks' requests of the
resident agents leave W_t (`phase_end_holds`): the resident prefixes then
go as soon as their running requests end, and the new tasks, whose batch
the next phase would not hold, start after it. The same exemptions hold
(`never_held`).

`tandem`: a request that runs on the resident prefix now and then follows
started tasks along their path pays no setup of its own. When started
tasks wait on an agent whose prefix comes in only if a resident one
leaves, and a resident agent's waiting request is one stage behind them on
their path, it goes first while the setups it saves, times the tasks
waiting, outweigh the delay it gives the started tasks at each stage they
have left; where its request fits beside theirs in the pool it rides in
their batch, saving its service at each of those stages and delaying them
once (`tandem_holds`: the other agent's requests leave W_t, with the same
exemptions).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence

from topasd.model import EngineView, Request, StageStatus, TaskView, Workflow
from topasd.scheduler.window import is_fresh


def decode_step(view: EngineView) -> float:
    """T_decode: the profiled decode step time at the current running batch."""
    context = sum(r.prefix_tokens + r.input_tokens + r.generated for r in view.running)
    return view.costs.t_decode_step(len(view.running), context)


def _work(r: Request) -> int:
    """The tokens a waiting request's input and output take: the work the
    backlog tests of `lot_size` and `phases` weigh."""
    return r.input_tokens + r.output_tokens


def _ell(view: EngineView, agent: str) -> int:
    """l_a: the agent's prefix tokens (0 for an agent without a prefix)."""
    return view.prefixes[agent].tokens if agent in view.prefixes else 0


def _room(view: EngineView, gpu: frozenset[str]) -> int:
    """The KV the resident prefixes (`gpu`) leave in the pool."""
    return view.budget_tokens - sum(_ell(view, a) for a in gpu)


def _started(view: EngineView, r: Request, running_tasks: frozenset[int]) -> bool:
    """Whether r's task has started (`is_fresh`; `running_tasks`: those with
    a request running)."""
    return not is_fresh(view.tasks.get(r.task_id), running_tasks)


def _running_left(view: EngineView, step: float) -> dict[str, float]:
    """Per agent, how long its running requests still decode (the longest's
    remaining tokens times the decode step `step`)."""
    left: dict[str, float] = {}
    for r in view.running:
        left[r.agent] = max(left.get(r.agent, 0.0), r.remaining * step)
    return left


def _needs_agent(task: TaskView, workflow: Workflow, agent: str) -> bool:
    """Whether `task` has a stage of `agent` not yet done."""
    for name, stage in workflow.stages.items():
        if stage.agent != agent:
            continue
        progress = task.stages.get(name)
        if progress is None or progress.status is not StageStatus.DONE:
            return True
    return False


def lot_can_grow(view: EngineView, agent: str, waiting_tasks: set[int]) -> bool:
    """Whether a task in the system other than `waiting_tasks` (those with a
    request of `agent` waiting) still has a stage of `agent` to run."""
    for task in view.tasks.values():
        if task.finished_at is None and task.id not in waiting_tasks and _needs_agent(
                task, view.workflows[task.workflow], agent):
            return True
    return False


def unripe_lots(view: EngineView, lot_size: float) -> frozenset[int]:
    """The ids of the waiting requests whose agent's lot is not ripe (module
    docstring; `never_held` gives the exemptions)."""
    if not view.waiting or not view.running:
        return frozenset()
    budget = float(view.budget_tokens)
    by_agent: defaultdict[str, list[Request]] = defaultdict(list)
    for r in view.waiting:
        by_agent[r.agent].append(r)
    demand = {a: sum(_work(r) for r in rs) for a, rs in by_agent.items()}
    total = sum(demand.values())
    step = decode_step(view)
    running_left = _running_left(view, step)
    others = tasks_waiting_on_others(view.waiting)
    held: set[int] = set()
    for agent, requests in by_agent.items():
        ell = _ell(view, agent)
        if ell <= 0 or total - demand[agent] <= budget:  # no prefix, or no backlog
            continue
        if not unripe(view, requests, ell, step, running_left.get(agent, 0.0),
                      others[agent], lot_size):
            continue
        if lot_can_grow(view, agent, {r.task_id for r in requests}):
            held.update(r.id for r in requests)
    return frozenset(held)


def tasks_waiting_on_others(waiting: Sequence[Request]) -> dict[str, int]:
    """N of each agent with a waiting request: the tasks with a waiting
    request of another agent (every task but those waiting on it alone)."""
    agents_of: defaultdict[int, set[str]] = defaultdict(set)
    for r in waiting:
        agents_of[r.task_id].add(r.agent)
    alone: Counter[str] = Counter(next(iter(a)) for a in agents_of.values() if len(a) == 1)
    return {r.agent: len(agents_of) - alone[r.agent] for r in waiting}


def unripe(view: EngineView, requests: list[Request], ell: int, step: float,
           running_left: float, others: int, lot_size: float) -> bool:
    """Whether the summed wait of an agent's waiting `requests` is below
    `lot_size` times their lot's setup cost, N * (l_a / B_t) * ext, with
    N = `others` (`tasks_waiting_on_others`)."""
    service = min(view.costs.t_prefill(r.input_tokens) + r.output_tokens * step
                  for r in requests)
    ext = max(0.0, service - running_left)
    setup = others * ell / float(view.budget_tokens) * ext
    waited = sum(view.t - r.queued_at for r in requests)
    return waited < lot_size * setup


def never_held(view: EngineView, overdue: float | None, mean_jct: Mapping[str, float],
               patience: Mapping[int, float]) -> frozenset[int]:
    """The waiting requests `lot_size` and `phases` never hold: of an overdue
    task (older than `overdue` times its workflow's mean recent JCT), or
    waiting since their queue entry at least their `patience` (by id; 0 if
    not given): their task's expected remaining path, at most its
    workflow's expected fresh path (`TopasPolicy.patience`)."""
    def exempt(r: Request) -> bool:
        ref = mean_jct.get(r.workflow)
        late = overdue is not None and ref is not None and view.t - r.task_arrival > overdue * ref
        return late or view.t - r.queued_at >= patience.get(r.id, 0.0)

    return frozenset(r.id for r in view.waiting if exempt(r))


def phase_holds(view: EngineView, phases: float) -> frozenset[int]:
    """The ids of the waiting requests of agents not on the GPU while the
    resident agents' waiting work of started tasks (input + output) is more
    than `phases` times the room their prefixes leave; once they have none,
    those of new tasks on the resident agents at a phase's end
    (`phase_end_holds`; module docstring, `phases`)."""
    if not view.waiting or not view.running:
        return frozenset()
    gpu = frozenset(view.gpu_prefixes())
    room = _room(view, gpu)
    running_tasks = frozenset(r.task_id for r in view.running)
    resident = [r for r in view.waiting if r.agent in gpu and _started(view, r, running_tasks)]
    if not resident:
        waiting_out = [r for r in view.waiting
                       if r.agent not in gpu and _started(view, r, running_tasks)]
        return phase_end_holds(view, gpu, room, waiting_out, phases)
    if sum(_work(r) for r in resident) <= phases * room:
        return frozenset()
    return frozenset(r.id for r in view.waiting if r.agent not in gpu)


def phase_end_holds(view: EngineView, gpu: frozenset[str], room: int,
                    waiting_out: Sequence[Request], phases: float) -> frozenset[int]:
    """The ids of the waiting requests of the resident agents (`gpu`), every
    one of them a new task's (no started task's request of theirs waits), at
    the end of their phase: when a started task's request of another agent
    (`waiting_out`) does
    not fit beside the resident prefixes even once every running request
    ends (`room`), and the started tasks' work for the other agents is at
    least `phases` times the room the largest of their prefixes leaves: what
    waits, and what the running requests ready there as they end
    (`readies_elsewhere`, each counted at its own work). A new task's request
    would keep a resident prefix on the GPU past its phase for a batch that
    the started tasks' next phase fills without it."""
    if not waiting_out:
        return frozenset()
    if min(_ell(view, r.agent) + _work(r) for r in waiting_out) <= room:
        return frozenset()
    coming = sum(_work(r) for r in view.running if readies_elsewhere(view, r, gpu))
    next_room = view.budget_tokens - max(_ell(view, r.agent) for r in waiting_out)
    if sum(_work(r) for r in waiting_out) + coming < phases * next_room:
        return frozenset()
    return frozenset(r.id for r in view.waiting if r.agent in gpu)


def tandem_holds(view: EngineView, dhat: Callable[[Request], float]) -> frozenset[int]:
    """The ids of the waiting requests of an agent b off the GPU that the
    next phase would serve, while a request F of a resident agent should run
    first and follow them (`tandem`; module docstring): F's task is one
    stage behind b's waiting started tasks (the leaders) on their path, and
    b's prefix comes in beside F's agent's only once F's agent leaves.
    Running F first saves F's setups s_F (its resident prefix now, and each
    later stage's, which it then takes right after the leaders on the same
    prefix), worth s_F to F's task and to each task waiting behind them all.
    It delays each of the m leaders by ext_F, F's service (`dhat`: D_hat_F)
    past the resident agent's running requests, at each of the k stages of
    their path. F goes first while s_F (1 + tasks behind) > ext_F k m: an
    exchange of F with the leaders' phase, priced on the tasks present. If
    F's request fits beside the leaders' phase (their prefix and their
    waiting requests), F rides in their batch at each stage: its service
    there is saved and the leaders wait for F once (`tandem_pays`).
    (bench/fig2_optimal.py's present plan makes the same choices on the
    Fig. 2 machine with room for one and two requests.)"""
    gpu = frozenset(view.gpu_prefixes())
    leaders = _tandem_leaders(view, gpu)
    if not leaders:
        return frozenset()
    running_left = _running_left(view, decode_step(view))
    waiting_tasks = len({r.task_id for r in view.waiting})
    followers = [r for r in view.waiting if r.agent in gpu]
    paths: dict[tuple[str, str], tuple[str, ...]] = {}  # (workflow, stage) -> path_agents
    held: set[int] = set()
    for agent, mine in leaders.items():
        stages = {(r.workflow, r.stage) for r in mine}
        tasks = {r.task_id for r in mine}
        behind = waiting_tasks - len(tasks)  # F's task and those behind
        ell = _ell(view, agent)
        need = ell + min(_work(r) for r in mine)
        batch = ell + sum(_work(r) for r in mine)  # the leaders' phase
        for f in followers:
            if _ell(view, f.agent) + need <= view.budget_tokens:
                continue  # the leaders' prefix comes in beside F's once others leave
            joined = _joined(view, f, stages)
            if f.task_id in tasks or joined is None:
                continue
            path = paths.get((f.workflow, joined))
            if path is None:
                path = paths[f.workflow, joined] = path_agents(view.workflows[f.workflow], joined)
            d = dhat(f)
            if tandem_pays(view, f, path, len(tasks), behind,
                           d - running_left.get(f.agent, 0.0),
                           d if batch + _work(f) <= view.budget_tokens else None):
                held.update(r.id for r in view.waiting if r.agent == agent)
                break
    return frozenset(held)


def _tandem_leaders(view: EngineView, gpu: frozenset[str]) -> dict[str, list[Request]]:
    """Started tasks' waiting requests of each agent off the GPU whose prefix
    comes in only if a resident one leaves (not even once every running
    request ends), by agent; `tandem_holds` weighs only a follower whose own
    prefix must leave for them."""
    room = _room(view, gpu)
    running_tasks = frozenset(r.task_id for r in view.running)
    out: defaultdict[str, list[Request]] = defaultdict(list)
    for r in view.waiting:
        if r.agent not in gpu and _ell(view, r.agent) + _work(r) > room and _started(
                view, r, running_tasks):
            out[r.agent].append(r)
    return out


def _joined(view: EngineView, f: Request, stages: set[tuple[str, str]]) -> str | None:
    """The leaders' stage (of `stages`) that F's stage, once done, readies in
    F's task (`readied_by`: every other predecessor done), if any (the first
    by name): only then does F's task follow the leaders from there."""
    task = view.tasks.get(f.task_id)
    if task is None:
        return None
    wf = view.workflows[f.workflow]
    return next((v for v in readied_by(wf, task, f.stage) if (f.workflow, v) in stages), None)


def tandem_pays(view: EngineView, f: Request, path: tuple[str, ...], leaders: int,
                tasks: int, ext: float, ride: float | None = None) -> bool:
    """Whether F goes before `leaders` tasks waiting at the stage after F's,
    whose `path` (`path_agents`) F would follow (`tandem_holds`): s_F *
    `tasks` > ext_F k m, with `tasks` counting F's and those behind. With
    `ride` (F's service at a stage, where F's request fits beside the
    leaders' phase in the pool), F's task runs each of the k stages in the
    leaders' batch: it saves that service at each, and the leaders wait for
    F once: s_F * `tasks` + `ride` k > ext_F m."""
    wf = view.workflows[f.workflow]
    saved = sum(view.costs.t_swap(wf.agents[a].prefix_tokens) for a in (f.agent, *path))
    ext, k = max(0.0, ext), len(path)
    if ride is not None:
        return saved * tasks + ride * k > ext * leaders
    return saved * tasks > ext * k * leaders


def path_agents(wf: Workflow, stage: str) -> tuple[str, ...]:
    """The agents of the longest chain of stages from `stage` to an exit
    (ties by name): the path a task at `stage` has left."""
    height = wf.heights
    out = [wf.stages[stage].agent]
    while wf.succs[stage]:
        stage = max(wf.succs[stage], key=lambda v: (height[v], v))
        out.append(wf.stages[stage].agent)
    return tuple(out)


def readies_elsewhere(view: EngineView, r: Request, gpu: frozenset[str]) -> bool:
    """Whether running r's stage, once done, readies a stage of its task on
    an agent not in `gpu` (`readied_by`)."""
    task = view.tasks.get(r.task_id)
    if task is None:
        return False
    wf = view.workflows[task.workflow]
    return any(wf.stages[v].agent not in gpu for v in readied_by(wf, task, r.stage))


def readied_by(wf: Workflow, task: TaskView, stage: str) -> Iterator[str]:
    """The pending stages of `task` after `stage` whose every other
    predecessor is done: those `stage`'s end readies."""
    status = task.stages
    for v in wf.succs[stage]:
        if status[v].status is StageStatus.PENDING and all(
                p == stage or status[p].status is StageStatus.DONE for p in wf.preds[v]):
            yield v
