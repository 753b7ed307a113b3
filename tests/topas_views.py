"""Hand-built EngineViews for pinning TOPAS's equations on small cases."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from topasd.model import (
    Agent,
    CostHints,
    EngineView,
    Location,
    PrefixState,
    Request,
    RequestState,
    Reservation,
    Stage,
    StageProgress,
    StageStatus,
    TaskView,
    Workflow,
)

# Costs chosen for round numbers: T_decode = 0.1 s/token, prefill free,
# mu/B_swap = 0.001 s per prefix token.
COSTS = CostHints(t_decode_s=0.1, prefill_s_per_token=0.0, prefill_base_s=0.0,
                  kv_bytes_per_token=1000.0, swap_bytes_per_s=1e6)


def workflow(name: str, edges: dict[str, tuple[str, ...]], prefix: int = 100) -> Workflow:
    """Stages named after their agents (stage 'a' run by agent 'A')."""
    agents = {v.upper(): Agent(v.upper(), prefix) for v in edges}
    stages = {v: Stage(v, v.upper(), after) for v, after in edges.items()}
    return Workflow(name, agents, stages)


CHAIN = workflow("chain", {"a": (), "b": ("a",), "c": ("b",)})
FORK = workflow("fork", {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")})


def task(tid: int, wf: Workflow, arrival: float = 0.0, **status: str) -> TaskView:
    """A task whose stages have the given status: 'done', 'active' or pending."""
    stages = {}
    for v in wf.topo_order:
        s = status.get(v, "pending")
        stages[v] = StageProgress(
            status={"done": StageStatus.DONE, "active": StageStatus.ACTIVE}.get(
                s, StageStatus.PENDING),
            started_at=0.0 if s != "pending" else None,
        )
    return TaskView(tid, wf.name, arrival, stages)


def request(rid: int, tid: int, wf: Workflow, stage: str, *, running: bool = False,
            generated: int = 0, input_tokens: int = 10, output_tokens: int = 10,
            started_at: float | None = None, arrival: float = 0.0) -> Request:
    return Request(
        id=rid, task_id=tid, workflow=wf.name, stage=stage, agent=stage.upper(), round=0,
        input_tokens=input_tokens, output_tokens=output_tokens, ready_at=arrival,
        task_arrival=arrival, prefix_tokens=wf.agents[stage.upper()].prefix_tokens,
        generated=generated, state=RequestState.RUNNING if running else RequestState.WAITING,
        started_at=started_at, reservation=Reservation.FULL,
    )


def view(wf: Workflow | list[Workflow], tasks: list[TaskView], running: list[Request],
         waiting: list[Request], *, t: float = 0.0, budget: int = 10_000,
         gpu: tuple[str, ...] = ()) -> EngineView:
    wfs = wf if isinstance(wf, list) else [wf]
    prefixes = {}
    for w in wfs:
        for a in w.agents.values():
            loc = Location.GPU if a.name in gpu else Location.HOST
            prefixes[a.name] = PrefixState(a.name, a.prefix_tokens, loc, ready=a.name in gpu,
                                           host_copy=True)
    return EngineView(
        t=t, budget_tokens=budget, new_token_ratio=1.0, prefixes=prefixes,
        running=tuple(running), waiting=tuple(waiting), tasks={tk.id: tk for tk in tasks},
        workflows={w.name: w for w in wfs}, costs=COSTS,
    )


@contextlib.contextmanager
def exhaustive_search() -> Iterator[None]:
    """TOPAS with every generated prefix set packed: no `bound`, `refined`,
    quick or batch bounds prune anything."""
    import topasd.scheduler.topas as topas

    search = topas._Search
    saved = search.bound, search.refined, search._ext_bounds, search.quick_family
    search.bound = lambda self, r: math.inf  # type: ignore[method-assign]
    search.refined = lambda self, r: math.inf  # type: ignore[method-assign]
    search._ext_bounds = lambda self, *a: None  # type: ignore[method-assign]
    search.quick_family = (  # type: ignore[method-assign]
        lambda self, base, changes: [math.inf] * len(changes))
    try:
        yield
    finally:
        (search.bound, search.refined,  # type: ignore[method-assign]
         search._ext_bounds, search.quick_family) = saved
