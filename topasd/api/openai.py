"""The OpenAI-compatible calls: a request body counted into a `CallSpec`
(system and developer messages are the agent prefix, the rest its input;
`count_tokens`), the reply when the engine finishes it, and its stream."""

from __future__ import annotations

import asyncio
import contextlib
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
from topasd.daemon.calls import (
    CallResult,
    CallSpec,
    Progress,
    agent_key,
    count_tokens,
    filler_text,
)
from topasd.daemon.errors import Invalid, Withdrawn
from topasd.daemon.service import Service
from topasd.model import TopasError


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


def filler_piece(start: int, end: int) -> str:
    """Tokens [start, end) of `filler_text`: the pieces of a stream add up to
    the reply's text."""
    return filler_text(end)[len(filler_text(start)):]


class Chunks:
    """The chunks of a streamed reply: chat (`chat.completion.chunk`, deltas)
    or legacy completions (`text_completion`, text)."""

    def __init__(self, chat: bool, request_id: int, model: str) -> None:
        self.chat = chat
        self.head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-topasd-{request_id}",
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model}

    def _choice(self, text: str | None, finish: str | None, role: bool = False
                ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", "content": ""}
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

    def role(self) -> str:
        """The first chunk (chat): the call was admitted."""
        return _sse({**self.head, "choices": [self._choice(None, None, role=True)]}) \
            if self.chat else ""

    def text(self, text: str) -> str:
        return _sse({**self.head, "choices": [self._choice(text, None)]}) if text else ""

    def end(self, result: CallResult, include_usage: bool) -> str:
        """The finish chunk (with the topasd fields), usage if asked, [DONE]."""
        out = _sse({**self.head, "choices": [self._choice(None, "stop")],
                    "topasd": TopasdReply(**result.meta()).model_dump()})
        if include_usage:
            out += _sse({**self.head, "choices": [], "usage": _usage(result).model_dump()})
        return out + "data: [DONE]\n\n"


async def streamed(service: Service, spec: CallSpec, model: str, chat: bool,
                   include_usage: bool) -> AsyncIterator[str]:
    """A streamed call: returns once it reached the engine (its refusal raises,
    an HTTP error as for any call), then streams: keep-alive comments while it
    waits, the role chunk when it is admitted, its tokens as the engine makes
    them (in engine time on the simulator), the finish chunk and usage last. A
    client that goes away takes its call back."""
    loop = asyncio.get_running_loop()
    news = asyncio.Event()
    progress = Progress()

    def wake() -> None:  # the engine loop's thread
        with contextlib.suppress(RuntimeError):  # the server's loop already closed
            loop.call_soon_threadsafe(news.set)

    progress.wake = wake
    fut = service.submit_call(spec, progress)
    reply = asyncio.wrap_future(fut)
    waiting = asyncio.ensure_future(news.wait())
    await asyncio.wait((reply, waiting), return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if reply.done():  # raises the refusal; a finished call streams all at once below
        request_id = reply.result().request_id
    else:
        assert progress.request_id is not None  # set before the loop wakes us
        request_id = progress.request_id
    return _stream(service, fut, reply, progress, news, Chunks(chat, request_id, model),
                   include_usage, service.settings.stream_keepalive)


async def _stream(service: Service, fut: Future[CallResult], reply: asyncio.Future[CallResult],
                  progress: Progress, news: asyncio.Event, chunks: Chunks,
                  include_usage: bool, keepalive: float) -> AsyncIterator[str]:
    sent, admitted, t0 = 0, False, time.monotonic()
    try:
        while not reply.done():
            news.clear()
            if progress.admitted and not admitted:
                admitted = True
                yield chunks.role()
            if progress.tokens > sent:
                yield chunks.text(filler_piece(sent, progress.tokens))
                sent = progress.tokens
            waiting = asyncio.ensure_future(news.wait())
            done, _ = await asyncio.wait((reply, waiting), timeout=keepalive,
                                         return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if not done and not admitted:
                yield f": waiting for admission ({time.monotonic() - t0:.0f} s)\n\n"
        try:
            result = reply.result()
        except TopasError as exc:
            yield _sse({"error": {"message": str(exc), "type": type(exc).__name__}})
            yield "data: [DONE]\n\n"
            return
        if not admitted:
            yield chunks.role()
        yield chunks.text(filler_piece(sent, result.completion_tokens))
        yield chunks.end(result, include_usage)
    finally:
        if not fut.done():  # the client went away: its call leaves the engine
            service.withdraw_call(fut, "its client disconnected")
