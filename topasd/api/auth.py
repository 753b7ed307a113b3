"""Who may use the daemon: mutating endpoints need the bearer token when the
daemon is bound off loopback (or a token is set); off loopback, reads of
`/v1/...` and `/metrics` need it too unless `public_reads` is set
(`/health`, `/ready` and the API pages stay open for probes). No body is
read before that is checked or past MAX_BODY_BYTES."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from fastapi import Depends
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from topasd.api.errors import error
from topasd.config import Settings
from topasd.daemon.errors import ServiceError

MAX_BODY_BYTES = 16 * 1024 * 1024  # a request body above this gets 413 before it is read


class Unauthorized(ServiceError):
    status = 401
    kind = "authentication_error"


class Forbidden(ServiceError):
    status = 403
    kind = "permission_error"


def needs_token(settings: Settings) -> bool:
    """Mutating endpoints need the bearer token when the daemon is bound to a
    non-loopback address, or whenever a token is configured."""
    return not settings.loopback or bool(settings.token)


def reads_need_token(settings: Settings) -> bool:
    """Reads of the daemon's data need the token: bound off loopback, and reads
    not made public (`--public-reads`)."""
    return not settings.loopback and not settings.public_reads


GUARDED_READS = ("/v1/", "/metrics")  # the paths whose reads `reads_need_token` guards


def token_problem(settings: Settings, presented: str | None) -> ServiceError | None:
    """Why a request presenting bearer `presented` (None: no Authorization
    header) may not mutate, or None when it may."""
    if presented is None:
        return Unauthorized(f"this daemon is bound to {settings.host}: send "
                            "'Authorization: Bearer <token>' with the token from its "
                            "configuration (--token-file / TOPAS_TOKEN / topasd.toml)")
    if not secrets.compare_digest(presented.encode(), (settings.token or "").encode()):
        return Forbidden("wrong bearer token: use the token from the daemon's "
                         "configuration (--token-file / TOPAS_TOKEN / topasd.toml)")
    return None


def auth_dependency(settings: Settings, reads: bool = False) -> Callable[..., Any] | None:
    """Bearer-token check for mutating endpoints (`needs_token`), or with `reads`
    for guarded reads (`reads_need_token`); `RequestGuard` has already refused
    what fails it, this declares it in the OpenAPI page."""
    if not (reads_need_token(settings) if reads else needs_token(settings)):
        return None
    bearer = HTTPBearer(auto_error=False, description="The daemon's token (--token-file, "
                        "TOPAS_TOKEN); with the openai client, its api_key.")

    # a default, not Annotated[...]: this module's annotations are strings, and a local
    # `bearer` inside one would not resolve (FastAPI would read `creds` as a query field)
    async def check(creds: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
                    ) -> None:
        problem = token_problem(settings, None if creds is None else creds.credentials)
        if problem is not None:
            raise problem

    return check


class RequestGuard:
    """ASGI middleware. Requests that carry a body (every method but GET, HEAD
    and OPTIONS): without the token (when one is needed) they get 401/403
    before any of the body is read, and a body over `MAX_BODY_BYTES` gets 413
    (announced by Content-Length, or once that much has streamed in); the
    body is then handed on in one piece. Reads of `GUARDED_READS` get 401/403
    without the token when `reads_need_token`; other reads pass."""

    def __init__(self, app: Any, settings: Settings, limit: int = 0) -> None:
        self.app = app
        self.settings = settings
        self.limit = limit or MAX_BODY_BYTES
        self.reads_guarded = reads_need_token(settings)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            guarded = self.reads_guarded and scope["path"].startswith(GUARDED_READS)
            problem = self._auth_refusal(headers) if guarded else None
            await (problem or self.app)(scope, receive, send)
            return
        problem = self._refusal(headers)
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

    def _auth_refusal(self, headers: dict[bytes, bytes]) -> JSONResponse | None:
        """401/403 unless the request presents the token."""
        scheme, _, presented = headers.get(b"authorization", b"").decode(
            "latin-1").partition(" ")
        problem = token_problem(self.settings, presented.strip()
                                 if scheme.lower() == "bearer" and presented else None)
        if problem is None:
            return None
        headers_out = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
        return error(problem.status, problem.kind, str(problem), headers=headers_out)

    def _refusal(self, headers: dict[bytes, bytes]) -> JSONResponse | None:
        if needs_token(self.settings):
            problem = self._auth_refusal(headers)
            if problem is not None:
                return problem
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return self._too_large()
        return None

    def _too_large(self) -> JSONResponse:
        return error(413, "invalid_request_error",
                      f"the body is larger than {self.limit:,} bytes; send a smaller request")
