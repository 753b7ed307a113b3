"""The daemon's HTTP API (FastAPI) and its server (uvicorn in a thread).

The API never touches engine internals: it parses and validates bodies, then
calls the `Service`'s thread-safe methods and awaits their futures. Errors are
OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, with a
message that says what to fix; the endpoints are described in docs/api.md and
on the server's own `/docs` (OpenAPI at `/openapi.json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    create_model,
    field_validator,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from topasd.config import Settings, read_runtime, stop_command
from topasd.model import EventKind, TopasError
from topasd.scheduler import ALL_POLICY_NAMES, native
from topasd.scheduler.param_specs import PARAM_ALIASES, canonical_param, canonical_params
from topasd.scheduler.params import PAPER, PARAM_RANGES, TopasParams
from topasd.service import (
    CallResult,
    CallSpec,
    Invalid,
    Service,
    ServiceError,
    Unavailable,
    Withdrawn,
    agent_key,
    count_tokens,
    filler_text,
)

log = logging.getLogger("topasd")

QUERY_TIMEOUT_S = 10.0  # state, params and task queries wait this long for the loop
STATE_MAX_AGE_S = 0.2  # /v1/state serves one engine-loop snapshot this long (wall s)
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_NAME = 256
MAX_BODY_BYTES = 16 * 1024 * 1024  # a request body above this gets 413 before it is read


class Unauthorized(ServiceError):
    status = 401
    kind = "authentication_error"


class Forbidden(ServiceError):
    status = 403
    kind = "permission_error"


# ------------------------------------------------------------------ models


def unpaired_surrogate(value: Any, path: str = "") -> str | None:
    """The JSON path of the first string (or key) in `value` that is not valid
    Unicode (an unpaired UTF-16 surrogate such as "\\ud800", which JSON can
    escape but no text encoding can carry), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
            where = f"{path}.{name}" if path else name  # printable: the bad key itself isn't
            bad = unpaired_surrogate(key, where) or unpaired_surrogate(item, where)
            if bad:
                return bad
    elif isinstance(value, list):
        for i, item in enumerate(value):
            bad = unpaired_surrogate(item, f"{path}.{i}" if path else str(i))
            if bad:
                return bad
    return None


class RequestBody(BaseModel):
    """A request body: every string in it must be valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        bad = unpaired_surrogate(data)
        if bad:
            raise ValueError(f"{bad} is not valid Unicode (an unpaired surrogate such as "
                             "\\ud800); send UTF-8 text")
        return data


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong and how to fix it.")
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail


class TopasdMeta(BaseModel):
    """Workflow metadata of an OpenAI-compatible call (`extra_body={"topasd": {...}}`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task_id: StrictStr | StrictInt | None = Field(
        default=None, description="The application's task id; one id ties a task's calls "
        "together (required with a multi-stage workflow).")
    workflow: str | None = Field(
        default=None, max_length=MAX_NAME, description="A registered workflow (another name is "
        "422); none: the call is a one-stage task of its agent.")
    stage: str | None = Field(default=None, max_length=MAX_NAME,
                              description="The workflow stage this call runs.")
    agent: str | None = Field(default=None, min_length=1, max_length=MAX_NAME,
                              description="The agent (default: the stage's agent, or a key "
                              "of the system prompt).")
    last_in_stage: StrictBool = Field(default=True, description="This call is the stage's last "
                                "round (false for earlier ReAct rounds).")
    last_in_task: StrictBool = Field(default=False, description="End the task after this call even "
                               "if stages of its workflow did not run.")

    @field_validator("task_id")
    @classmethod
    def _id_length(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, str) and len(value) > MAX_NAME:
            raise ValueError(f"at most {MAX_NAME} characters")
        return value


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class ChatCompletionRequest(RequestBody):
    """An OpenAI chat completion request; unknown OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    n: int | None = Field(default=None, ge=1, le=1, description="Only 1 is supported.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    topasd: TopasdMeta | None = None


class CompletionRequest(RequestBody):
    """An OpenAI (legacy) completion request; unknown OpenAI fields are ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    prompt: str | list[str] = Field(description="One prompt (a list of exactly one is "
                                    "accepted).")
    max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    n: int | None = Field(default=None, ge=1, le=1, description="Only 1 is supported.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    topasd: TopasdMeta | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopasdReply(BaseModel):
    """Where the call ran: the daemon's task and request ids and its simulated times."""

    task_id: int
    client_task_id: str | None
    request_id: int
    workflow: str
    stage: str
    agent: str
    round: int
    t_ready: float
    t_finish: float
    latency_s: float
    task_done: bool


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    topasd: TopasdReply


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    topasd: TopasdReply


class StageOverride(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    input_tokens: int | None = Field(default=None, ge=0, le=10_000_000,
                                     description="Dynamic input of every round of the stage.")
    output_tokens: int | None = Field(default=None, ge=1, le=10_000_000,
                                      description="Generated tokens of every round.")


class TaskSubmit(RequestBody):
    """A task of a registered workflow, its rounds sampled from the workflow's profiles."""

    model_config = ConfigDict(extra="forbid", strict=True)
    workflow: str = Field(max_length=MAX_NAME, examples=["chain3"])
    stages: dict[str, StageOverride] = Field(
        default_factory=dict, description="Per-stage token overrides, by stage name.")


class StageInfo(BaseModel):
    status: str
    rounds_done: int
    service_s: float
    started_at: float | None
    finished_at: float | None


class TaskInfo(BaseModel):
    id: int
    workflow: str
    source: Literal["driver", "api", "openai"]
    client_task_id: str | None
    status: Literal["running", "done", "abandoned"]
    arrival: float
    finished: float | None
    jct: float | None
    stages_done: int
    stages_total: int
    stages: dict[str, StageInfo]


class ParamsInfo(BaseModel):
    policy: str
    params: dict[str, Any]
    version: int = Field(description="Increments with every effective change.")
    ranges: dict[str, list[int | float]] = Field(
        description="[low, high] of each parameter (integers for the integer ones).")
    aliases: dict[str, str]
    policies: list[str]


class ParamsChanged(ParamsInfo):
    changed: list[str]
    t: float = Field(description="Engine time of the change.")
    effective_from_decision: int = Field(description="The first decision (seq) that uses it.")


class CandidateInfo(BaseModel):
    """A candidate post-decision state S' = (R', Q') with its Eq. 13 score terms."""

    idx: int = Field(description="Index in the policy's candidate list.")
    won: bool = Field(description="The state the policy chose.")
    resident: list[str] = Field(description="R': the agent prefixes on the GPU.")
    admit: list[int]
    preempt: list[int]
    j_admit: float
    j_move: float
    j_redo: float
    j_revoke: float
    v_reuse: float
    total: float = Field(description="j_admit - j_move - j_redo - j_revoke + v_reuse.")


class DecisionDetail(BaseModel):
    """One decision: its actions and its candidate states, best total first."""

    seq: int
    t: float = Field(description="Engine time of the decision.")
    policy: str
    admit: list[int]
    preempt: list[int]
    load: list[str]
    evict: list[str]
    noop: bool
    blocked: bool
    retry: bool
    reservation: str
    wall_ms: float = Field(description="The policy's wall time for this decision.")
    n_candidates: int = Field(description="How many candidates the policy generated.")
    chosen: int | None = Field(description="`idx` of the chosen candidate (baselines: none).")
    params_version: int
    candidates: list[CandidateInfo]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    engine: bool


class Ready(BaseModel):
    ready: bool


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _params_patch_model() -> type[BaseModel]:
    """The PATCH /v1/params body, built from TopasParams and its ranges."""
    hints = typing.get_type_hints(TopasParams)
    alias_of = {v: k for k, v in PARAM_ALIASES.items()}
    policies = Literal[tuple(ALL_POLICY_NAMES)]  # type: ignore[valid-type]
    fields: dict[str, Any] = {
        "policy": (policies, Field(default=None, description="Switch the policy (its "
                                   "parameters reset to defaults plus this body's).")),
    }
    for name, hint in hints.items():
        extra: dict[str, Any] = {}
        if name in PARAM_RANGES:
            lo, hi = PARAM_RANGES[name]
            extra = {"ge": lo, "le": hi}
            if float in typing.get_args(hint) or hint is float:
                extra["allow_inf_nan"] = False  # NaN: "a finite number", not "<= hi"
        if name == "reservation":
            hint = Literal["full", "optimistic"]
        if name == "pack_order":
            hint = Literal["ratio", "arrival"]
        if name in alias_of:
            extra["validation_alias"] = AliasChoices(name, alias_of[name])
        desc = f"TOPAS `{name}`" + (f" (paper: {alias_of[name]})" if name in alias_of else "")
        if name in ("h_age", "b_swap", "mu"):
            desc += "; null: derived (observed / the backend's)"
        if name == "hol_age":
            desc += "; null: off (an extension beyond the paper, see docs/topas.md)"
        if name in ("preempt", "preempt_margin", "start_gate"):
            desc += "; an extension beyond the paper (docs/topas.md)"
        if name == "pack_order":
            desc += "; 'arrival' is an extension beyond the paper (docs/topas.md)"
        if name in PAPER:
            desc += (f"; {getattr(TopasParams(), name)!r} by default, {PAPER[name]!r} in "
                     "topas-paper")
        if hint is bool:
            hint = StrictBool
        fields[name] = (hint, Field(default=None, description=desc, **extra))
    base = type("ParamsBody", (RequestBody,),
                {"model_config": ConfigDict(extra="forbid", strict=True),
                 "_one_name": model_validator(mode="before")(_one_name_per_param)})
    return create_model("ParamsPatch", __base__=base, **fields)


def _one_name_per_param(cls: type, data: Any) -> Any:
    """A parameter given under both its names (`M` and `m`) is one error that
    says so, not "extra inputs are not permitted" on one of them."""
    if isinstance(data, dict):
        try:
            canonical_params(data)
        except TopasError as exc:
            raise ValueError(str(exc)) from None
    return data


if TYPE_CHECKING:  # a model built at import: checked as any request body
    ParamsPatch = RequestBody
else:
    ParamsPatch = _params_patch_model()

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in (
        (400, "Malformed request (not JSON)"),
        (401, "Missing bearer token (non-loopback bind)"),
        (403, "Wrong bearer token"),
        (404, "Unknown id"),
        (409, "Conflicts with the task's state"),
        (413, "The body is larger than 16 MiB"),
        (422, "Invalid body or parameters"),
        (503, "Shutting down, or the engine loop is not answering"),
    )
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: ERRORS[c] for c in codes}


# ---------------------------------------------------------------- the app


class _States:
    """/v1/state for any number of pollers: at most one engine-loop snapshot (and
    one JSON encoding) per `limit` every STATE_MAX_AGE_S, so reads take little of
    the loop's time from the scheduler. A change through the API starts afresh."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.lock = asyncio.Lock()
        self.kept: dict[int, tuple[float, bytes]] = {}

    def invalidate(self) -> None:
        self.kept.clear()

    async def get(self, limit: int) -> bytes:
        async with self.lock:  # concurrent pollers wait for one snapshot
            hit = self.kept.get(limit)
            if hit is not None and time.monotonic() - hit[0] < STATE_MAX_AGE_S:
                return hit[1]
            state = await _wait(self.service.state(limit), QUERY_TIMEOUT_S)
            # plain JSON types already: skip FastAPI's encoder (7x the cost of json.dumps on
            # a state of hundreds of tasks); the encoding of Starlette's JSONResponse
            body = json.dumps(state, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":")).encode("utf-8")
            if len(self.kept) >= 8:
                self.kept.clear()
            self.kept[limit] = (time.monotonic(), body)
            return body


def create_app(service: Service) -> FastAPI:
    """The FastAPI app over a started `Service`."""
    settings = service.settings
    states = _States(service)
    app = FastAPIOffline(  # FastAPI serving the /docs assets itself: no CDN needed
        title="topasd",
        version=_version(),
        description="Workflow-aware prefix-state scheduler daemon (TOPAS): control API, "
                    "event stream and an OpenAI-compatible API. See docs/api.md.",
    )
    app.add_middleware(BodyGuard, settings=settings)  # type: ignore[arg-type]
    auth = _auth_dependency(settings)
    guarded: list[Any] = [Depends(auth)] if auth is not None else []
    mutating = (400, 401, 403, 413, 422, 503) if auth is not None else (400, 413, 422, 503)
    _install_errors(app)

    @app.get("/health", response_model=Health, tags=["status"])
    async def health() -> Health:
        """The process answers (the engine loop may be stopped: see `engine`)."""
        return Health(engine=service.alive)

    @app.get("/ready", response_model=Ready, tags=["status"], responses=_errors(503))
    async def ready() -> Ready:
        """The engine loop runs and admits work."""
        if not service.ready:
            raise Unavailable("the engine is not running (starting, shutting down or failed)")
        return Ready(ready=True)

    @app.get("/v1/state", tags=["control"], response_class=JSONResponse,
             responses={200: {"content": {"application/json": {"schema": {
                 "type": "object", "additionalProperties": True,
                 "title": "Response State V1 State Get"}}},
                 "description": "Successful Response"}, **_errors(422, 503)})
    async def state(limit: int = Query(50, ge=1, le=10_000, description="Entries per list."
                                       )) -> Response:
        """Engine time, KV budget, resident prefixes and where they live, running and
        waiting requests by agent, tasks in flight with their stage progress and
        expected remaining path, recent decisions, counters, headline statistics."""
        return Response(await states.get(limit), media_type="application/json")

    @app.get("/v1/events", tags=["control"], responses={
        200: {"content": {"text/event-stream": {}},
              "description": "Server-sent events: `decision`, `engine`, `lag`, `end`."},
        **_errors(422)})
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
        wanted = _kinds(kinds)
        newest = service.bus.seq
        if since is not None and since > newest:
            raise Invalid(f"since: {since} is beyond the newest event id {newest} (ids start "
                          "again at 1 when the daemon restarts); resume with since <= "
                          f"{newest}, or leave it out to stream from now")
        return StreamingResponse(_event_stream(service, request, wanted, since, max_events),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/v1/decisions/{seq}", response_model=DecisionDetail, tags=["control"],
             responses=_errors(404, 422))
    async def get_decision(seq: int, candidates: int = Query(
            50, ge=0, le=10_000, description="Candidates to return: the best by total, "
            "plus the chosen one.")) -> dict[str, Any]:
        """A recent decision (the last 1024 are kept) with its candidate states and every
        score term; older ones are in the store."""
        return service.decision(seq, candidates)

    @app.get("/v1/params", response_model=ParamsInfo, tags=["control"])
    async def get_params() -> ParamsInfo:
        """The policy and its parameters."""
        return ParamsInfo(**service.params(), **_param_meta())

    @app.patch("/v1/params", response_model=ParamsChanged, tags=["control"],
               dependencies=guarded, responses=_errors(*mutating))
    async def patch_params(body: ParamsPatch) -> ParamsChanged:
        """Change the policy or its parameters (`beta`, `rho`, `h_age`/`H_age`, `m`/`M`,
        `k`/`K`, ...): validated, effective at the next decision, recorded in the store."""
        changes = {name: getattr(body, name) for name in body.model_fields_set}
        result = await _wait(service.patch_params(changes), QUERY_TIMEOUT_S)
        states.invalidate()
        try:  # acknowledged only once the store holds it (and every decision before)
            await asyncio.to_thread(service.store_sink.sync)
        except TopasError as exc:
            raise Unavailable(f"the change is applied but the decision log failed ({exc})"
                              ) from None
        return ParamsChanged(**result, **_param_meta())

    @app.post("/v1/tasks", response_model=TaskInfo, status_code=201, tags=["tasks"],
              dependencies=guarded, responses=_errors(*mutating))
    async def submit_task(body: TaskSubmit) -> JSONResponse:
        """Submit a task of a registered workflow (rounds sampled from its profiles,
        optional per-stage token overrides)."""
        overrides = {v: o.model_dump(exclude_none=True) for v, o in body.stages.items()}
        info = await _wait(service.submit_task(body.workflow, overrides), QUERY_TIMEOUT_S)
        states.invalidate()
        return JSONResponse(info, status_code=201, headers={"Location": f"/v1/tasks/{info['id']}"})

    @app.get("/v1/tasks/{task_id}", response_model=TaskInfo, tags=["tasks"],
             responses=_errors(404, 422, 503))
    async def get_task(task_id: int) -> dict[str, Any]:
        """A task's status, arrival, completion and stage progress."""
        return await _wait(service.get_task(task_id), QUERY_TIMEOUT_S)

    @app.post("/v1/chat/completions", response_model=ChatCompletion, tags=["openai"],
              dependencies=guarded, responses={
                  200: {"content": {"text/event-stream": {}}}, **_errors(409, *mutating)})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        """OpenAI-compatible chat completion; the reply arrives when the simulated request
        finishes. Workflow metadata: the `topasd` field (docs/api.md)."""
        spec = _chat_spec(body, settings)
        result = await _call(service, service.submit_call(spec), request)
        states.invalidate()
        reply = _chat_reply(result, body.model)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_chat_chunks(reply, include_usage),
                                     media_type="text/event-stream")
        return reply

    @app.post("/v1/completions", response_model=Completion, tags=["openai"],
              dependencies=guarded, responses={
                  200: {"content": {"text/event-stream": {}}}, **_errors(409, *mutating)})
    async def completions(body: CompletionRequest, request: Request) -> Any:
        """OpenAI-compatible (legacy) text completion, as chat completions."""
        spec = _completion_spec(body, settings)
        result = await _call(service, service.submit_call(spec), request)
        states.invalidate()
        reply = _completion_reply(result, body.model)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_completion_chunks(reply, include_usage),
                                     media_type="text/event-stream")
        return reply

    @app.get("/v1/models", response_model=ModelList, tags=["openai"])
    async def models() -> ModelList:
        """The model name this daemon serves (any name is accepted in requests)."""
        card = ModelCard(id=settings.model, created=int(service.started_wall), owned_by="topasd")
        return ModelList(data=[card])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(service))  # type: ignore[arg-type]

    @app.get("/metrics", tags=["status"], response_class=Response,
             responses={200: {"content": {METRICS_CONTENT_TYPE: {}},
                              "description": "Prometheus text format"}})
    async def metrics() -> Response:
        """Prometheus metrics: JCT histogram, queue depths, resident prefixes, decision
        latency, swaps, preemptions, loop time."""
        return Response(generate_latest(registry), media_type=METRICS_CONTENT_TYPE)

    return app


# ------------------------------------------------------------ request glue


async def _wait(fut: Future[Any], timeout: float | None = None) -> Any:
    """Await a Service future (a timeout is a 503: the loop did not answer)."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
    except TimeoutError:
        raise Unavailable("the engine loop did not answer in time; retry") from None


async def _call(service: Service, fut: Future[CallResult], request: Request) -> CallResult:
    """Await a call's reply; a client that disconnects first takes its request
    back from the engine, waiting or running (its KV freed)."""
    reply = asyncio.wrap_future(fut)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((reply, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if reply.done():
        return reply.result()
    if not fut.cancel():  # it reached the engine
        service.withdraw_call(fut, "its client disconnected")
    reply.cancel()
    raise Withdrawn("the client disconnected before the reply")


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _param_meta() -> dict[str, Any]:
    return {"ranges": {k: list(v) for k, v in PARAM_RANGES.items()},
            "aliases": dict(PARAM_ALIASES),
            "policies": list(ALL_POLICY_NAMES)}


def _text(content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.text for p in content if p.text)


def _meta_fields(meta: TopasdMeta | None) -> dict[str, Any]:
    if meta is None:
        return {}
    task_id = meta.task_id
    return {"task_key": None if task_id is None else str(task_id), "workflow": meta.workflow,
            "stage": meta.stage, "agent": meta.agent, "last_in_stage": meta.last_in_stage,
            "last_in_task": meta.last_in_task}


def _chat_spec(body: ChatCompletionRequest, settings: Settings) -> CallSpec:
    """Count a chat request: system/developer messages are the agent prefix, the
    rest is the request's input (`count_tokens`: characters / 4)."""
    system = "\n".join(_text(m.content) for m in body.messages
                       if m.role in ("system", "developer"))
    rest = "\n".join(_text(m.content) for m in body.messages
                     if m.role not in ("system", "developer"))
    out = body.max_completion_tokens or body.max_tokens or settings.max_tokens
    return CallSpec(system_tokens=count_tokens(system), system_key=agent_key(system),
                    input_tokens=max(1, count_tokens(rest)), output_tokens=out,
                    **_meta_fields(body.topasd))


def _completion_spec(body: CompletionRequest, settings: Settings) -> CallSpec:
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise Invalid("prompt: send exactly one prompt per request (got a list of "
                               f"{len(prompt)})")
        prompt = prompt[0]
    out = body.max_tokens or settings.max_tokens
    return CallSpec(system_tokens=0, system_key=agent_key(""),
                    input_tokens=max(1, count_tokens(prompt)), output_tokens=out,
                    **_meta_fields(body.topasd))


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _usage(r: CallResult) -> Usage:
    return Usage(prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                 total_tokens=r.prompt_tokens + r.completion_tokens)


def _chat_reply(r: CallResult, model: str) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-topasd-{r.request_id}", created=int(time.time()), model=model,
        choices=[ChatChoice(index=0, message=AssistantMessage(
            content=filler_text(r.completion_tokens)), finish_reason="stop")],
        usage=_usage(r), topasd=TopasdReply(**r.meta()))


def _completion_reply(r: CallResult, model: str) -> Completion:
    return Completion(
        id=f"cmpl-topasd-{r.request_id}", created=int(time.time()), model=model,
        choices=[CompletionChoice(index=0, text=filler_text(r.completion_tokens),
                                  finish_reason="stop")],
        usage=_usage(r), topasd=TopasdReply(**r.meta()))


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _chat_chunks(reply: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
    head = {"id": reply.id, "object": "chat.completion.chunk", "created": reply.created,
            "model": reply.model}
    text = reply.choices[0].message.content
    yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})
    yield _sse({**head, "choices": [{"index": 0, "delta": {"content": text},
                                     "finish_reason": None}]})
    yield _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "topasd": reply.topasd.model_dump()})
    if include_usage:
        yield _sse({**head, "choices": [], "usage": reply.usage.model_dump()})
    yield "data: [DONE]\n\n"


async def _completion_chunks(reply: Completion, include_usage: bool) -> AsyncIterator[str]:
    head = {"id": reply.id, "object": "text_completion", "created": reply.created,
            "model": reply.model}
    yield _sse({**head, "choices": [{"index": 0, "text": reply.choices[0].text,
                                     "finish_reason": None, "logprobs": None}]})
    yield _sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop",
                                     "logprobs": None}], "topasd": reply.topasd.model_dump()})
    if include_usage:
        yield _sse({**head, "choices": [], "usage": reply.usage.model_dump()})
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------- event stream


def _kinds(text: str | None) -> frozenset[str] | None:
    if text is None or not text.strip():
        return None
    known = {"decision", *(k.value for k in EventKind)} - {EventKind.SCHEDULE.value}
    wanted = {k.strip() for k in text.split(",") if k.strip()}
    if not wanted:  # ",,": like none given
        return None
    unknown = sorted(wanted - known)
    if unknown:
        raise Invalid(f"kinds: unknown kind(s) {unknown}; use decision and/or "
                           f"{', '.join(sorted(known - {'decision'}))}")
    return frozenset(wanted)


async def _event_stream(service: Service, request: Request, kinds: frozenset[str] | None,
                        since: int | None, max_events: int | None) -> AsyncIterator[str]:
    bus = service.bus
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the server's loop already closed
            loop.call_soon_threadsafe(wake.set)

    bus.listen(notify)
    cursor = bus.seq if since is None else since
    sent = 0
    try:
        yield f"retry: 1000\n: topasd events from {cursor}\n\n"
        while True:
            missed, items = bus.since(cursor)
            parts: list[str] = []
            if missed:
                parts.append(f"event: lag\ndata: {json.dumps({'missed': missed})}\n\n")
            for seq, kind, item in items:
                cursor = seq
                if kind == "decision":
                    name, data = "decision", item.as_dict()
                else:
                    name, data = "engine", item.as_row()
                    if kinds is not None and data["kind"] not in kinds:
                        continue
                if kinds is not None and name == "decision" and "decision" not in kinds:
                    continue
                parts.append(f"id: {seq}\nevent: {name}\n"
                             f"data: {json.dumps(data, separators=(',', ':'))}\n\n")
                sent += 1
                if max_events is not None and sent >= max_events:
                    break
            if parts:
                yield "".join(parts)
            if max_events is not None and sent >= max_events:
                return
            if items:
                continue
            if service.stopped.is_set():
                yield "event: end\ndata: {}\n\n"
                return
            if await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(wake.wait(), 15.0)
            except TimeoutError:
                yield ": keep-alive\n\n"
            wake.clear()
    finally:
        bus.unlisten(notify)


# ------------------------------------------------------------------ metrics


class _Collector:
    """Prometheus view of the service's counters (read without locks)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Any:
        svc = self.service
        m = svc.metrics
        c = m.counts
        yield _hist("topasd_task_jct_seconds", "Task completion time (engine seconds).", m.jct)
        yield _hist("topasd_decision_latency_seconds", "Policy decision wall time.",
                    m.decision_latency)
        for name, doc, agents in (
                ("topasd_requests_waiting", "Waiting requests by agent.", m.waiting),
                ("topasd_requests_running", "Running requests by agent.", m.running),
                ("topasd_prefix_resident", "1 if the agent's prefix is on the GPU.", m.on_gpu)):
            g = GaugeMetricFamily(name, doc, labels=["agent"])
            for agent, n in sorted(agents.copy().items()):
                g.add_metric([agent], n)
            yield g
        yield _gauge("topasd_prefixes_resident", "Agent prefixes on the GPU.",
                     sum(m.on_gpu.copy().values()))
        yield _gauge("topasd_tasks_in_flight", "Tasks arrived and not finished.",
                     m.tasks_in_flight)
        yield _gauge("topasd_engine_time_seconds", "The engine's (virtual) clock.", m.t)
        yield _gauge("topasd_kv_budget_tokens", "KV budget in tokens.",
                     svc.profile.budget_tokens)
        yield _gauge("topasd_params_version", "Live parameter version.", svc.params_version)
        yield _gauge("topasd_ready", "1 while the engine admits work.", int(svc.ready))
        for name, doc, value in (
                ("topasd_tasks_arrived", "Tasks arrived.", c[EventKind.TASK_ARRIVE]),
                ("topasd_tasks_finished", "Tasks finished.", c[EventKind.TASK_FINISH]),
                ("topasd_requests_finished", "Requests finished.", c[EventKind.REQUEST_FINISH]),
                ("topasd_requests_withdrawn", "Requests taken back unfinished (their "
                 "client went away).", c[EventKind.REQUEST_WITHDRAW]),
                ("topasd_decisions", "Policy decisions.", m.decisions),
                ("topasd_prefix_computes", "Prefixes recomputed by prefill.",
                 c[EventKind.PREFIX_COMPUTE_START]),
                ("topasd_param_changes", "Live parameter changes.", m.param_changes),
                ("topasd_engine_loop_seconds", "Wall time in the engine and scheduler.",
                 m.pump_wall_s),
                ("topasd_scheduler_seconds", "Wall time in policy decisions.",
                 m.decide_wall_s)):
            yield _counter(name, doc, value)
        swaps = CounterMetricFamily("topasd_prefix_swaps", "Prefix moves over the host link.",
                                    labels=["direction"])
        swaps.add_metric(["in"], c[EventKind.PREFIX_LOAD_START])
        swaps.add_metric(["out"], c[EventKind.PREFIX_OFFLOAD_START])
        yield swaps
        pre = CounterMetricFamily("topasd_preemptions", "Preempted requests.", labels=["by"])
        pre.add_metric(["policy"], c[EventKind.PREEMPT])
        pre.add_metric(["engine"], c[EventKind.RETRACT])
        yield pre


def _hist(name: str, doc: str, h: Any) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.sum)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


# ------------------------------------------------------------------- errors


def _needs_token(settings: Settings) -> bool:
    """Mutating endpoints need the bearer token when the daemon is bound to a
    non-loopback address, or whenever a token is configured."""
    return not settings.loopback or bool(settings.token)


def _token_problem(settings: Settings, presented: str | None) -> ServiceError | None:
    """Why a request presenting bearer `presented` (None: no Authorization
    header) may not mutate, or None when it may."""
    if presented is None:
        return Unauthorized(f"this daemon is bound to {settings.host}: send "
                            "'Authorization: Bearer <token>' with the token from its "
                            "configuration (--token / TOPAS_TOKEN / topasd.toml)")
    if not secrets.compare_digest(presented.encode(), (settings.token or "").encode()):
        return Forbidden("wrong bearer token: use the token from the daemon's "
                         "configuration (--token / TOPAS_TOKEN / topasd.toml)")
    return None


def _auth_dependency(settings: Settings) -> Callable[..., Any] | None:
    """Bearer-token check for mutating endpoints (`_needs_token`); `BodyGuard`
    has already refused what fails it, this declares it in the OpenAPI page."""
    if not _needs_token(settings):
        return None
    bearer = HTTPBearer(auto_error=False, description="The daemon's token (--token, "
                        "TOPAS_TOKEN); with the openai client, its api_key.")

    # a default, not Annotated[...]: this module's annotations are strings, and a local
    # `bearer` inside one would not resolve (FastAPI would read `creds` as a query field)
    async def check(creds: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
                    ) -> None:
        problem = _token_problem(settings, None if creds is None else creds.credentials)
        if problem is not None:
            raise problem

    return check


class BodyGuard:
    """ASGI middleware for requests that carry a body (every method but GET,
    HEAD and OPTIONS): without the token (when one is needed) they get 401/403
    before any of the body is read, and a body over `MAX_BODY_BYTES` gets 413
    (announced by Content-Length, or once that much has streamed in); the
    body is then handed on in one piece. Reads are left alone."""

    def __init__(self, app: Any, settings: Settings, limit: int = 0) -> None:
        self.app = app
        self.settings = settings
        self.limit = limit or MAX_BODY_BYTES

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        problem = self._refusal(dict(scope.get("headers") or ()))
        if problem is not None:
            await problem(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._too_large()(scope, receive, send)
                return
            if not message.get("more_body"):
                break
        handed = False

        async def replay() -> dict[str, Any]:
            nonlocal handed
            if handed:
                return await receive()  # after the body: disconnects (streamed replies)
            handed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _refusal(self, headers: dict[bytes, bytes]) -> JSONResponse | None:
        if _needs_token(self.settings):
            scheme, _, presented = headers.get(b"authorization", b"").decode(
                "latin-1").partition(" ")
            problem = _token_problem(self.settings, presented.strip()
                                     if scheme.lower() == "bearer" and presented else None)
            if problem is not None:
                headers_out = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
                return _error(problem.status, problem.kind, str(problem), headers=headers_out)
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return self._too_large()
        return None

    def _too_large(self) -> JSONResponse:
        return _error(413, "invalid_request_error",
                      f"the body is larger than {self.limit:,} bytes; send a smaller request")


def _error(status: int, kind: str, message: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _num(x: float) -> str:
    """A range bound as written: whole numbers in full (2147483647, not 2.14748e+09)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.kind, str(exc), headers=headers)

    @app.exception_handler(TopasError)
    async def topas_error(request: Request, exc: TopasError) -> JSONResponse:
        return _error(422, "invalid_request_error", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                why = (e.get("ctx") or {}).get("error", "")
                if not _is_utf8(await request.body()):
                    why = "not UTF-8 text"
                return _error(400, "invalid_request_error",
                              f"the body is not valid JSON ({why}); send a JSON object")
            if tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing":
                return _error(400, "invalid_request_error", "the body is empty; send a JSON "
                              "object with Content-Type: application/json")
            if tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes):
                return _error(400, "invalid_request_error", "the body is not JSON; send a JSON "
                              "object with Content-Type: application/json")
        parts, param = [], None
        for e in errors[:8]:
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            param = param or loc
            why = e.get("msg", "invalid")
            limits = PARAM_RANGES.get(canonical_param(loc))
            if request.url.path == "/v1/params" and limits is not None:
                got = e.get("input")
                shown = f"got {got!r}; " if isinstance(got, (int, float, str)) else ""
                why += f" ({shown}range [{_num(limits[0])}, {_num(limits[1])}])"
            parts.append(f"{loc}: {why}")
        return _error(422, "invalid_request_error", "; ".join(parts), param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no endpoint {request.method} {request.url.path}; see /docs for the "
                       "API")
        elif exc.status_code == 400 and message == "There was an error parsing the body":
            message = ("the body is not valid JSON (not UTF-8 text, or nested too deeply); "
                       "send a JSON object in UTF-8")
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; see /docs"
        return _error(exc.status_code, "invalid_request_error", message,
                      headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return _error(500, "internal_error", f"internal error ({type(exc).__name__}); the "
                      "daemon keeps serving; please report it with the daemon's log")


def _version() -> str:
    try:
        return metadata.version("topasd")
    except metadata.PackageNotFoundError:
        return "unknown"


# ------------------------------------------------------------------- server


class AlreadyRunning(TopasError):
    """Another daemon owns the runtime file."""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections (with proto
    # 0 it does not, and keep-alive replies stall 40 ms on Nagle + delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise TopasError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                         "--port (0 picks a free one) or --host") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(host: str, port: int) -> str:
    """The address clients use: a wildcard bind by its loopback, an IPv6
    literal in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def serve(settings: Settings, on_ready: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns the exit code.

    On a signal: stop admitting new tasks, let running work finish up to
    `settings.grace` seconds (the HTTP server keeps answering meanwhile), stop
    the server, flush the store, remove the runtime file, return 0.
    """
    runtime = Path(settings.runtime_file)
    if not runtime.parent.is_dir():  # as --db: a mistyped folder is not created
        raise TopasError(f"runtime file {runtime}: the folder {runtime.parent} does not exist; "
                         "create it or give another --runtime-file")
    other = read_runtime(runtime)
    if other is not None and other.get("pid") != os.getpid():
        raise AlreadyRunning(f"a daemon already runs (pid {other.get('pid')}, "
                             f"{other.get('url')}); stop it with `{stop_command(runtime)}` or "
                             "give this one another --runtime-file")
    stop = threading.Event()
    signals: list[int] = []
    services: list[Service] = []  # the service, once started

    def handle(signum: int, frame: Any) -> None:
        signals.append(signum)
        if len(signals) > 1 and services:  # a second signal: stop now
            log.warning("received %s again: the grace period is cut short, running work "
                        "stops now", signal.Signals(signum).name)
            services[0].drain(0.0)
        stop.set()

    # before the engine starts (vLLM takes seconds): a signal then stops the
    # daemon cleanly once it is up, exit code 0, instead of killing it
    old = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        sock = _bind(settings.host, settings.port)
        port = sock.getsockname()[1]
        try:
            service = Service(settings)
        except BaseException:
            sock.close()
            raise
    except BaseException:
        for s, h in old.items():
            signal.signal(s, h)
        raise
    for s in old:  # again: an engine may have installed its own while starting
        signal.signal(s, handle)
    service.start()
    services.append(service)
    if len(signals) > 1:
        service.drain(0.0)
    code = 0
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    try:
        config = uvicorn.Config(create_app(service), log_config=None, lifespan="off",
                                access_log=settings.log_level == "debug",
                                timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                  name="topasd-http", daemon=True)
        thread.start()
        while not server.started and thread.is_alive() and not stop.is_set():
            time.sleep(0.01)
        url = _url(settings.host, port)
        info = {"pid": os.getpid(), "url": url, "host": settings.host, "port": port,
                "db": str(Path(settings.db).resolve()), "run_id": service.run_id,
                "started_ts": service.started_wall, "version": _version(),
                "auth": not (settings.loopback and not settings.token),
                "backend": settings.backend, "search": native.status().reason}
        _write_runtime(runtime, info)
        log.info("topasd %s listening on %s (policy %s, %s backend, profile %s, speed %s, "
                 "db %s run %s; TOPAS search: %s)", info["version"], url, settings.policy,
                 settings.backend, settings.profile, settings.speed, settings.db,
                 service.run_id, native.status().reason)
        if on_ready is not None:
            on_ready(info)
        while not stop.wait(0.2):
            if not thread.is_alive() or service.stopped.is_set():
                log.error("the %s stopped unexpectedly; shutting down",
                          "HTTP server" if not thread.is_alive() else "engine loop")
                code = 1
                break
        if signals:
            log.info("received %s: draining (running work may finish for up to %.0fs; send "
                     "it again, e.g. Ctrl-C, to stop now)", signal.Signals(signals[0]).name,
                     settings.grace)
        service.drain()
        service.wait_stopped(settings.grace + 10)
    finally:
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(15)
        service.close()
        for s, h in old.items():
            signal.signal(s, h)
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(runtime.read_text())
            if current.get("pid") == os.getpid():
                runtime.unlink()
        with contextlib.suppress(OSError):
            sock.close()
    if service.crash is not None:
        code = 1
    log.info("topasd stopped (store %s flushed, exit %d)", settings.db, code)
    return code


def _write_runtime(path: Path, info: dict[str, Any]) -> None:
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise TopasError(f"cannot write the runtime file {path} ({exc.strerror}); set "
                         "--runtime-file to a writable place") from None
