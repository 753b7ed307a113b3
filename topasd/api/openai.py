"""The OpenAI-compatible calls: a request body counted into a `CallSpec`
(system and developer messages are the agent prefix, the rest its input;
`count_tokens`), the reply when the engine finishes it, and its stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import Request

from topasd.api.models import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ContentPart,
    TopasdMeta,
    TopasdReply,
    Usage,
)
from topasd.config import Settings
from topasd.daemon.calls import CallResult, CallSpec, agent_key, count_tokens, filler_text
from topasd.daemon.errors import Invalid, Withdrawn
from topasd.daemon.service import Service


async def call(service: Service, fut: Future[CallResult], request: Request) -> CallResult:
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


def chat_spec(body: ChatCompletionRequest, settings: Settings) -> CallSpec:
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


def completion_spec(body: CompletionRequest, settings: Settings) -> CallSpec:
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


def _usage(r: CallResult) -> Usage:
    return Usage(prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                 total_tokens=r.prompt_tokens + r.completion_tokens)


def chat_reply(r: CallResult, model: str) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-topasd-{r.request_id}", created=int(time.time()), model=model,
        choices=[ChatChoice(index=0, message=AssistantMessage(
            content=filler_text(r.completion_tokens)), finish_reason="stop")],
        usage=_usage(r), topasd=TopasdReply(**r.meta()))


def completion_reply(r: CallResult, model: str) -> Completion:
    return Completion(
        id=f"cmpl-topasd-{r.request_id}", created=int(time.time()), model=model,
        choices=[CompletionChoice(index=0, text=filler_text(r.completion_tokens),
                                  finish_reason="stop")],
        usage=_usage(r), topasd=TopasdReply(**r.meta()))


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def chat_chunks(reply: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
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


async def completion_chunks(reply: Completion, include_usage: bool) -> AsyncIterator[str]:
    head = {"id": reply.id, "object": "text_completion", "created": reply.created,
            "model": reply.model}
    yield _sse({**head, "choices": [{"index": 0, "text": reply.choices[0].text,
                                     "finish_reason": None, "logprobs": None}]})
    yield _sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop",
                                     "logprobs": None}], "topasd": reply.topasd.model_dump()})
    if include_usage:
        yield _sse({**head, "choices": [], "usage": reply.usage.model_dump()})
    yield "data: [DONE]\n\n"

