"""JSON request bodies parsed at a bounded cost. Before a body becomes Python
objects its shape is measured at C speed (strings cut out by one regular
expression, then brackets and commas counted): more than MAX_JSON_VALUES
values is 413, nesting deeper than MAX_JSON_DEPTH is 400, so a 16 MiB body
of millions of `{}` costs a scan, not a gigabyte. A body over
OFF_LOOP_BYTES is measured and parsed in a worker thread, off the event
loop that serves every other request.

`BoundedJsonRoute` is the routers' route class: it parses the body of a
route that takes one this way, then hands FastAPI the parsed value (through
Starlette's cache of `Request.json()`), so the body is parsed once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine
from itertools import accumulate
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from topasd.daemon.errors import ServiceError

MAX_JSON_VALUES = 100_000  # array elements and object members, containers included
MAX_JSON_DEPTH = 32  # nested arrays and objects
OFF_LOOP_BYTES = 64 * 1024  # bodies above this are measured and parsed in a thread

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = [0] * 256
for _open in b"[{":
    _STEP[_open] = 1
for _close in b"]}":
    _STEP[_close] = -1


class TooManyValues(ServiceError):
    status = 413


class TooDeep(ServiceError):
    status = 400


def check_shape(body: bytes) -> None:
    """TooManyValues or TooDeep when parsing `body` would cost more than the
    bounds allow; linear in its size, no Python object per value."""
    skeleton = _STRING.sub(b"", body)
    containers = skeleton.count(b"[") + skeleton.count(b"{")
    values = containers + skeleton.count(b",")
    if values > MAX_JSON_VALUES:
        raise TooManyValues(f"the body holds more than {MAX_JSON_VALUES:,} JSON values "
                            f"(about {values:,}); send fewer")
    brackets = skeleton.translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
    if depth > MAX_JSON_DEPTH:
        raise TooDeep(f"the body nests {depth} levels deep, more than {MAX_JSON_DEPTH}; "
                      "send a flatter JSON object")


def parse(body: bytes) -> Any:
    """`body` as JSON after `check_shape` (json.JSONDecodeError when it is not JSON)."""
    check_shape(body)
    return json.loads(body)


async def parse_bounded(body: bytes) -> Any:
    """`parse`, in a worker thread for a body over OFF_LOOP_BYTES."""
    if len(body) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse, body)
    return parse(body)


def _is_json(content_type: str | None) -> bool:
    """The body is JSON by its Content-Type (application/json or
    application/*+json), as FastAPI decides; strictly: none is not JSON."""
    if not content_type:
        return False
    kind = content_type.partition(";")[0].strip().lower()
    return kind.startswith("application/") and (kind == "application/json"
                                                  or kind.endswith("+json"))


class BoundedJsonRoute(APIRoute):
    """A route whose JSON body is parsed by `parse_bounded` before FastAPI sees it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def bounded(request: Request) -> Response:
            body = await request.body()
            if body and _is_json(request.headers.get("content-type")):
                try:
                    parsed = await parse_bounded(body)
                except json.JSONDecodeError as exc:  # as FastAPI reports it
                    raise RequestValidationError(
                        [{"type": "json_invalid", "loc": ("body", exc.pos),
                          "msg": "JSON decode error", "input": {},
                          "ctx": {"error": exc.msg}}], body=exc.doc) from None
                except UnicodeDecodeError:
                    raise ServiceError("the body is not valid JSON (not UTF-8 text); send a "
                                       "JSON object in UTF-8") from None
                except ValueError as exc:  # e.g. an integer of 5,000 digits
                    raise ServiceError(f"the body is not JSON this daemon reads ({exc}); "
                                       "send a JSON object") from None
                request._json = parsed  # Starlette's cache: FastAPI's request.json() reads it
            return await handler(request)

        return bounded
