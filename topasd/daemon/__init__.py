"""The daemon shell around the event loop: what `topasd start` runs.

`service` (the engine loop thread and its thread-safe commands) over
`runner.EventLoop`; `calls` (OpenAI-compatible calls an application drives),
`workflows` (registered and active workflows), `feeder` (the built-in
driver), `ledger` (tasks as GET /v1/tasks reports them), `recorder` (every
decision and event to the store, the bus and the metrics), `bus` (the event
stream's ring), `metrics`, `state` (/v1/state), `engine` (which backend, what
bounds a request), `runtime` (the runtime file), `process` (signals, the HTTP
server thread, `serve`), `errors` (refusals with their HTTP status).
"""
