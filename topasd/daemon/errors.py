"""The refusals the daemon answers with: each carries its HTTP status and the
OpenAI error type, and a message that names the place and the fix."""

from __future__ import annotations

from topasd.model import TopasError


class ServiceError(TopasError):
    """A request the daemon refuses; `status` is its HTTP status."""

    status = 400
    kind = "invalid_request_error"


class Invalid(ServiceError):
    status = 422


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"


class Conflict(ServiceError):
    status = 409
    kind = "conflict_error"


class Unavailable(ServiceError):
    status = 503
    kind = "unavailable_error"


class Busy(ServiceError):
    """New work refused while the daemon is at a bound of its admission control;
    `retry_after`: seconds until the client may try again (its Retry-After)."""

    status = 429
    kind = "rate_limit_error"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Withdrawn(ServiceError):
    """A call taken back before it finished: its client went away (nobody reads the
    reply; 499 is the status logs use for a client that closed the request)."""

    status = 499
    kind = "withdrawn_error"
