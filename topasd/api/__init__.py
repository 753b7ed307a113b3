"""The daemon's HTTP API (FastAPI): control API, event stream, Prometheus
metrics and an OpenAI-compatible API, over a `topasd.daemon.service.Service`.

The API never touches engine internals: it parses and validates bodies, then
calls the service's thread-safe methods and awaits their futures. Modules:
`models` (wire shapes), `routes` (one router per group), `openai` (calls and
replies), `sse` (the event stream), `prometheus` (/metrics), `auth` (bearer
token and body limits), `errors` (one error shape), `app` (the factory).
Endpoints: docs/api.md, and the server's own /docs.
"""

from topasd.api.app import create_app

__all__ = ["create_app"]
