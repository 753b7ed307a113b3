"""Errors as the API answers them: OpenAI-shaped bodies,
`{"error": {"message", "type", "param", "code"}}`, with a message that says
what to fix; the handlers turn every refusal (ours, FastAPI's validation,
Starlette's routing) into one."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from topasd.api.models import ErrorBody
from topasd.daemon.errors import Busy, ServiceError
from topasd.model import TopasError
from topasd.scheduler.param_specs import SPEC_BY_NAME, canonical_param

log = logging.getLogger("topasd")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in (
        (400, "Malformed request (not JSON, or nested more than 32 deep)"),
        (401, "Missing bearer token (non-loopback bind)"),
        (403, "Wrong bearer token"),
        (404, "Unknown id"),
        (409, "Conflicts with the task's state"),
        (413, "The body is larger than 16 MiB, or holds more than 100,000 JSON values"),
        (429, "At capacity (max_tasks, max_waiting): retry after Retry-After seconds"),
        (422, "Invalid body or parameters"),
        (503, "Shutting down, or the engine loop is not answering"),
    )
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entries of these error statuses."""
    return {c: ERRORS[c] for c in codes}


def error(status: int, kind: str, message: str, param: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _num(x: float) -> str:
    """A range bound as written: whole numbers in full (2147483647, not 2.14748e+09)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    if isinstance(exc, Busy):
        headers = {"Retry-After": str(exc.retry_after)}
    return error(exc.status, exc.kind, str(exc), headers=headers)


async def topas_error(request: Request, exc: Exception) -> JSONResponse:
    return error(422, "invalid_request_error", str(exc))


async def _not_json(request: Request, errors: list[Any]) -> JSONResponse | None:
    """A 400 for a body that is no JSON object at all, else None."""
    for e in errors:
        if e.get("type") == "json_invalid":
            why = (e.get("ctx") or {}).get("error", "")
            if not _is_utf8(await request.body()):
                why = "not UTF-8 text"
            return error(400, "invalid_request_error",
                         f"the body is not valid JSON ({why}); send a JSON object")
        if tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing":
            return error(400, "invalid_request_error", "the body is empty; send a JSON "
                         "object with Content-Type: application/json")
        if tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes):
            return error(400, "invalid_request_error", "the body is not JSON; send a JSON "
                         "object with Content-Type: application/json")
    return None


async def invalid(request: Request, exc: Exception) -> JSONResponse:
    """A body or query that fails validation: each problem by its place (a
    parameter of /v1/params with its range)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    malformed = await _not_json(request, list(errors))
    if malformed is not None:
        return malformed
    parts, param = [], None
    for e in errors[:8]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        param = param or loc
        why = e.get("msg", "invalid")
        spec = SPEC_BY_NAME.get(canonical_param(loc))
        if request.url.path == "/v1/params" and spec is not None and spec.range is not None:
            got = e.get("input")
            shown = f"got {got!r}; " if isinstance(got, (int, float, str)) else ""
            lo, hi = spec.range
            why += f" ({shown}range [{_num(lo)}, {_num(hi)}])"
        parts.append(f"{loc}: {why}")
    return error(422, "invalid_request_error", "; ".join(parts), param)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = str(exc.detail)
    if exc.status_code == 404:
        message = f"no endpoint {request.method} {request.url.path}; see /docs for the API"
    elif exc.status_code == 400 and message == "There was an error parsing the body":
        message = ("the body is not valid JSON (not UTF-8 text, or nested too deeply); "
                   "send a JSON object in UTF-8")
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; see /docs"
    return error(exc.status_code, "invalid_request_error", message,
                 headers=getattr(exc, "headers", None))


async def crash(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return error(500, "internal_error", f"internal error ({type(exc).__name__}); the "
                 "daemon keeps serving; please report it with the daemon's log")


def install(app: FastAPI) -> None:
    """Every error the app answers, in one shape."""
    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(TopasError, topas_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, crash)
