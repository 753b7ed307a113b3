"""The FastAPI app over a started `Service`."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline

from topasd import version
from topasd.api import errors, routes
from topasd.api.auth import RequestGuard, auth_dependency
from topasd.api.deps import Context, Reads, StateCache
from topasd.api.sse import EventFeed
from topasd.daemon.service import Service


def create_app(service: Service) -> FastAPI:
    """The daemon's HTTP API: body guard and auth, error shapes, the routers."""
    settings = service.settings
    app = FastAPIOffline(  # FastAPI serving the /docs assets itself: no CDN needed
        title="topasd",
        version=version(),
        description="Workflow-aware prefix-state scheduler daemon (TOPAS): control API, "
                    "event stream and an OpenAI-compatible API. See docs/api.md.",
    )
    app.add_middleware(RequestGuard, settings=settings)  # type: ignore[arg-type]
    auth = auth_dependency(settings)
    guarded: list[Any] = [Depends(auth)] if auth is not None else []
    mutating = (400, 401, 403, 413, 422, 429, 503) if auth is not None else (
        400, 413, 422, 429, 503)
    read_auth = auth_dependency(settings, reads=True)
    reads = Reads([Depends(read_auth)], (401, 403)) if read_auth is not None else Reads([], ())
    errors.install(app)
    ctx = Context(service, StateCache(service), guarded, mutating, reads, EventFeed(service.bus))
    for router in (routes.status(ctx), routes.control(ctx), routes.tasks(ctx),
                   routes.openai_compatible(ctx)):
        app.include_router(router)
    return app
