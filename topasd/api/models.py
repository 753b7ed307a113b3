"""The HTTP API's wire models: request bodies (validated, strict, every string
valid Unicode), replies, and the OpenAI-compatible shapes."""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any, Literal

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

from topasd.model import TopasError
from topasd.scheduler import ALL_POLICY_NAMES
from topasd.scheduler.param_specs import PARAM_SPECS, ParamSpec, canonical_params
from topasd.scheduler.params import PAPER, TopasParams

MAX_NAME = 256


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


class TrailDecision(BaseModel):
    seq: int = Field(description="The decision (GET /v1/decisions/{seq}).")
    action: Literal["admit", "preempt"]


class RequestTrail(BaseModel):
    """One request of a task: its times and the decisions that touched it."""

    id: int
    stage: str
    agent: str
    state: Literal["waiting", "running", "finished", "withdrawn"]
    ready: float
    admitted: float | None = Field(description="Its first admission.")
    finished: float | None = Field(description="When it finished or was withdrawn.")
    preemptions: int = Field(description="By the policy (each by a decision listed).")
    retractions: int = Field(description="By the engine (out of KV).")
    decisions: list[TrailDecision]
    held: int = Field(0, description="How many decisions left it out of the waiting queue "
                      "they weighed (TOPAS's `phases`, `tandem` and `lot_size`: its agent's "
                      "turn had not come).")
    last_held: int | None = Field(None, description="The latest of those decisions.")


class TaskDetail(TaskInfo):
    requests: list[RequestTrail] | None = Field(
        description="Its requests, in the order they became ready (null: the task is too "
        "old to be kept with them; the store's request_log view has them).")


class TaskList(BaseModel):
    tasks: list[TaskInfo] = Field(description="Newest first, at most `limit`.")
    total: int = Field(description="Tasks kept that match the filters.")
    limit: int


class ParamSpecInfo(BaseModel):
    """One TOPAS parameter as users see it (topasd/scheduler/param_specs.py)."""

    name: str = Field(description="The parameter's field name.")
    symbol: str = Field(description="The paper's name (H_age, M, K, B_swap), else the name.")
    help: str
    kind: Literal["float", "int", "bool", "choice"]
    unset: str | None = Field(description="What null means; null: the parameter needs a value.")
    choices: list[str]
    extension: bool = Field(description="Beyond the paper (docs/topas.md, Extensions).")
    range: list[int | float] | None


class ParamsInfo(BaseModel):
    policy: str
    params: dict[str, Any]
    version: int = Field(description="Increments with every effective change.")
    ranges: dict[str, list[int | float]] = Field(
        description="[low, high] of each parameter (integers for the integer ones).")
    aliases: dict[str, str]
    policies: list[str]
    tunable: list[str] = Field(description="The policies that take these parameters.")
    specs: list[ParamSpecInfo] = Field(description="Every TOPAS parameter, in form order.")


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


class DecisionRequest(BaseModel):
    task_id: int | None
    stage: str | None
    agent: str | None


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
    held: list[int] = Field([], description="Waiting requests it left out of the queue it "
                            "weighed (TOPAS's `phases`, `tandem` and `lot_size`).")
    params_version: int
    requests: dict[str, DecisionRequest] = Field(
        description="The admitted, preempted and held requests by id: their task, stage and "
        "agent.")
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
    """The PATCH /v1/params body, built from the parameter specs (param_specs.py):
    each parameter under its field name or the paper's, typed and ranged."""
    hints = typing.get_type_hints(TopasParams)
    policies = Literal[tuple(ALL_POLICY_NAMES)]  # type: ignore[valid-type]
    fields: dict[str, Any] = {
        "policy": (policies, Field(default=None, description="Switch the policy (its "
                                   "parameters reset to defaults plus this body's).")),
    }
    for spec in PARAM_SPECS:
        hint: Any = hints[spec.name]
        extra: dict[str, Any] = {}
        if spec.range is not None:
            extra = {"ge": spec.range[0], "le": spec.range[1]}
            if spec.kind == "float":
                extra["allow_inf_nan"] = False  # NaN: "a finite number", not "<= hi"
        if spec.choices:
            hint = Literal[spec.choices]
        if spec.kind == "bool":
            hint = StrictBool
        if spec.symbol != spec.name:
            extra["validation_alias"] = AliasChoices(spec.name, spec.symbol)
        fields[spec.name] = (hint, Field(default=None, description=describe(spec), **extra))
    base = type("ParamsBody", (RequestBody,),
                {"model_config": ConfigDict(extra="forbid", strict=True),
                 "_one_name": model_validator(mode="before")(_one_name_per_param)})
    return create_model("ParamsPatch", __base__=base, **fields)


def describe(spec: ParamSpec) -> str:
    """A parameter's OpenAPI description, from its spec."""
    paper = f" (paper: {spec.symbol})" if spec.symbol != spec.name else ""
    text = f"TOPAS `{spec.name}`{paper}: {spec.help}"
    if spec.unset is not None:
        text += f"; null: {spec.unset}"
    if spec.extension:
        text += "; an extension beyond the paper (docs/topas.md)"
    if spec.name in PAPER:
        text += (f"; {getattr(TopasParams(), spec.name)!r} by default, {PAPER[spec.name]!r} "
                 "in topas-paper")
    return text


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

