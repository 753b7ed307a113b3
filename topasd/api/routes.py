"""The endpoints, one router per group: status, control, tasks, OpenAI."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from topasd import version
from topasd.api import openai, sse
from topasd.api.bodies import BoundedJsonRoute
from topasd.api.deps import Context, wait
from topasd.api.errors import responses
from topasd.api.models import (
    MAX_NAME,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    DecisionDetail,
    Health,
    ModelCard,
    ModelList,
    ParamsChanged,
    ParamsInfo,
    ParamsPatch,
    Ready,
    TaskDetail,
    TaskInfo,
    TaskList,
    TaskSubmit,
)
from topasd.api.prometheus import CONTENT_TYPE, Collector
from topasd.daemon.calls import CallResult, CallSpec
from topasd.daemon.errors import Invalid, Unavailable
from topasd.model import TopasError
from topasd.scheduler import ALL_POLICY_NAMES, TUNABLE_NAMES
from topasd.scheduler.param_specs import PARAM_ALIASES, PARAM_SPECS, spec_dict

_STATE_SCHEMA: dict[int | str, dict[str, Any]] = {200: {"content": {"application/json": {
    "schema": {"type": "object", "additionalProperties": True,
               "title": "Response State V1 State Get"}}}, "description": "Successful Response"}}
_STREAM: dict[str, Any] = {"content": {"text/event-stream": {}}}


def status(ctx: Context) -> APIRouter:
    """Liveness, readiness and Prometheus metrics."""
    router = APIRouter(tags=["status"])
    service = ctx.service
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(service, version()))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, memory, open fds
    PlatformCollector(registry=registry)  # python_info

    @router.get("/health", response_model=Health)
    async def health() -> Health:
        """The process answers (the engine loop may be stopped: see `engine`)."""
        return Health(engine=service.alive)

    @router.get("/ready", response_model=Ready, responses=responses(503))
    async def ready() -> Ready:
        """The engine loop runs and admits work."""
        reason = service.unready_reason
        if reason is not None:
            raise Unavailable(reason)
        return Ready(ready=True)

    @router.get("/metrics", response_class=Response, dependencies=ctx.reads.guarded,
                responses={200: {"content": {CONTENT_TYPE: {}},
                                 "description": "Prometheus text format"},
                           **responses(*ctx.reads.errors)})
    async def metrics() -> Response:
        """Prometheus metrics (vLLM's and SGLang's names under `topasd_`): JCT, queue
        time, time to first token and end-to-end latency by workflow and stage, queues,
        starvation, tokens, prefix-cache hits, KV usage, decisions, preemptions."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    return router


def control(ctx: Context) -> APIRouter:
    """The engine's state, its event stream, decisions and live parameters."""
    router = APIRouter(tags=["control"], route_class=BoundedJsonRoute)
    service = ctx.service

    @router.get("/v1/state", response_class=JSONResponse, dependencies=ctx.reads.guarded,
                responses={**_STATE_SCHEMA, **responses(*ctx.reads.errors, 422, 503)})
    async def state(limit: int = Query(50, ge=1, le=10_000, description="Entries per list."),
                    brief: bool = Query(False, description="What a dashboard draws: waiting "
                                        "requests counted by agent, tasks without their "
                                        "stage tables, no recent decisions.")) -> Response:
        """Engine time, KV budget, resident prefixes and where they live, running and
        waiting requests by agent, tasks in flight with their stage progress and
        expected remaining path, recent decisions, counters, headline statistics."""
        return Response(await ctx.states.get(limit, brief), media_type="application/json")

    @router.get("/v1/events", dependencies=ctx.reads.guarded, responses={
        200: {**_STREAM, "description": "Server-sent events: `decision`, `engine`, `lag`, "
              "`end`."}, **responses(*ctx.reads.errors, 422)})
    async def events(request: Request,
                     kinds: str | None = Query(None, description="Comma-separated: decision "
                                               "and/or engine event kinds (request_finish, ...)"),
                     since: int | None = Query(None, ge=0, description="Resume after this "
                                               "event id (default: from now)."),
                     max_events: int | None = Query(None, ge=1, description="Close the stream "
                                                    "after this many events.")) -> Response:
        """A server-sent-event stream of decisions and engine events. Coalesced: a reader
        that falls behind skips ahead (a `lag` event says how many it missed); the
        scheduler never waits for a reader."""
        wanted = sse.kinds(kinds)
        newest = service.bus.seq
        if since is not None and since > newest:
            raise Invalid(f"since: {since} is beyond the newest event id {newest} (ids start "
                          "again at 1 when the daemon restarts); resume with since <= "
                          f"{newest}, or leave it out to stream from now")
        return StreamingResponse(sse.event_stream(ctx.events, service.stopped, request, wanted,
                                                  since, max_events),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/v1/decisions/{seq}", response_model=DecisionDetail,
                dependencies=ctx.reads.guarded, responses=responses(*ctx.reads.errors, 404, 422))
    async def get_decision(seq: int, candidates: int = Query(
            50, ge=0, le=10_000, description="Candidates to return: the best by total, "
            "plus the chosen one.")) -> dict[str, Any]:
        """A recent decision (the last 1024 are kept) with its candidate states and every
        score term; older ones are in the store."""
        return service.decision(seq, candidates)

    _params_routes(router, ctx)
    return router


def _params_routes(router: APIRouter, ctx: Context) -> None:
    service = ctx.service

    @router.get("/v1/params", response_model=ParamsInfo, dependencies=ctx.reads.guarded,
                responses=responses(*ctx.reads.errors))
    async def get_params() -> ParamsInfo:
        """The policy and its parameters."""
        return ParamsInfo(**service.params(), **param_meta())

    @router.patch("/v1/params", response_model=ParamsChanged, dependencies=ctx.guarded,
                  responses=responses(*ctx.mutating))
    async def patch_params(body: ParamsPatch) -> ParamsChanged:
        """Change the policy or its parameters (`beta`, `rho`, `h_age`/`H_age`, `m`/`M`,
        `k`/`K`, ...): validated, effective at the next decision, recorded in the store."""
        changes = {name: getattr(body, name) for name in body.model_fields_set}
        result = await wait(service.patch_params(changes))
        ctx.states.invalidate()
        try:  # acknowledged only once the store holds it (and every decision before)
            await asyncio.to_thread(service.store_sink.sync)
        except TopasError as exc:
            raise Unavailable(f"the change is applied but the decision log failed ({exc})"
                              ) from None
        return ParamsChanged(**result, **param_meta())


def param_meta() -> dict[str, Any]:
    """What a client needs to fill a parameter form: the specs (ranges, the
    paper's names, help), the policies and which of them take parameters."""
    return {"ranges": {s.name: list(s.range) for s in PARAM_SPECS if s.range is not None},
            "aliases": dict(PARAM_ALIASES), "policies": list(ALL_POLICY_NAMES),
            "tunable": list(TUNABLE_NAMES), "specs": [spec_dict(s) for s in PARAM_SPECS]}


def tasks(ctx: Context) -> APIRouter:
    """Tasks of registered workflows."""
    router = APIRouter(tags=["tasks"], route_class=BoundedJsonRoute)
    service = ctx.service

    @router.post("/v1/tasks", response_model=TaskInfo, status_code=201,
                 dependencies=ctx.guarded, responses=responses(*ctx.mutating))
    async def submit_task(body: TaskSubmit) -> JSONResponse:
        """Submit a task of a registered workflow (rounds sampled from its profiles,
        optional per-stage token overrides)."""
        overrides = {v: o.model_dump(exclude_none=True) for v, o in body.stages.items()}
        info = await wait(service.submit_task(body.workflow, overrides))
        ctx.states.invalidate()
        return JSONResponse(info, status_code=201, headers={"Location": f"/v1/tasks/{info['id']}"})

    @router.get("/v1/tasks", response_model=TaskList, dependencies=ctx.reads.guarded,
                responses=responses(*ctx.reads.errors, 400, 422, 503))
    async def list_tasks(
            workflow: str | None = Query(None, max_length=MAX_NAME, description="Only this "
                                         "workflow's tasks."),
            status: str | None = Query(None, description="running, done or abandoned."),
            client_task_id: str | None = Query(None, max_length=MAX_NAME, description="Only "
                                               "the tasks a client gave this id "
                                               "(topasd.task_id)."),
            limit: int = Query(100, ge=1, le=10_000, description="Tasks to return.")
    ) -> dict[str, Any]:
        """The tasks the daemon keeps, newest first, filtered by workflow, status and
        client task id."""
        return await wait(service.list_tasks(  # type: ignore[no-any-return]
            workflow, status, client_task_id, limit))

    @router.get("/v1/tasks/{task_id}", response_model=TaskDetail,
                dependencies=ctx.reads.guarded,
                responses=responses(*ctx.reads.errors, 404, 422, 503))
    async def get_task(task_id: str = Path(max_length=MAX_NAME, description="The daemon's "
                                           "task id, or the client's (topasd.task_id)."),
                       workflow: str | None = Query(None, max_length=MAX_NAME, description=
                                                    "With a client's id: its task of this "
                                                    "workflow.")) -> dict[str, Any]:
        """A task's status, arrival, completion, stage progress and its requests with the
        decisions that admitted or preempted them. By the daemon's id, or by the client's
        (`topasd.task_id`: its latest task with that id; digits are the daemon's id first)."""
        return await wait(service.get_task(task_id, workflow))  # type: ignore[no-any-return]

    return router


def openai_compatible(ctx: Context) -> APIRouter:
    """OpenAI-compatible completions with workflow metadata (docs/api.md)."""
    router = APIRouter(tags=["openai"], route_class=BoundedJsonRoute)
    service, settings = ctx.service, ctx.service.settings
    replied = {200: _STREAM, **responses(409, *ctx.mutating)}

    @router.post("/v1/chat/completions", response_model=ChatCompletion,
                 dependencies=ctx.guarded, responses=replied)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        """OpenAI-compatible chat completion; the reply arrives when the request finishes
        (`stream`: its tokens as the engine makes them). Workflow metadata: the `topasd`
        field (docs/api.md)."""
        return await _answer(ctx, openai.chat_spec(body, settings), request, body,
                             openai.chat_reply)

    @router.post("/v1/completions", response_model=Completion, dependencies=ctx.guarded,
                 responses=replied)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        """OpenAI-compatible (legacy) text completion, as chat completions."""
        return await _answer(ctx, openai.completion_spec(body, settings), request, body,
                             openai.completion_reply)

    @router.get("/v1/models", response_model=ModelList, dependencies=ctx.reads.guarded,
                responses=responses(*ctx.reads.errors))
    async def models() -> ModelList:
        """The model name this daemon serves (any name is accepted in requests)."""
        card = ModelCard(id=settings.model, created=int(service.started_wall), owned_by="topasd")
        return ModelList(data=[card])

    return router


async def _answer(ctx: Context, spec: CallSpec, request: Request,
                  body: ChatCompletionRequest | CompletionRequest,
                  reply: Callable[[CallResult, str], Any]) -> Any:
    """Run one call and answer it: the reply, or (`stream`) its chunks as the
    engine makes them."""
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = await openai.streamed(ctx.service, spec, body.model,
                                       isinstance(body, ChatCompletionRequest), include_usage)
        ctx.states.invalidate()
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})
    result = await openai.call(ctx.service, ctx.service.submit_call(spec), request)
    ctx.states.invalidate()
    return reply(result, body.model)
