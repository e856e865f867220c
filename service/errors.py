"""The service's one error hierarchy; the HTTP layer maps each class to a status code."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


class MemoriaError(Exception):
    """Base of every error the service raises on purpose."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(MemoriaError):
    """The request is well-formed but a value is wrong; ``field`` names it."""

    status_code = 422
    code = "invalid"


class BadRequest(MemoriaError):
    """The request cannot be parsed at all."""

    status_code = 400
    code = "bad_request"


class Unauthorized(MemoriaError):
    """Missing, malformed or revoked credentials."""

    status_code = 401
    code = "unauthorized"


class Forbidden(MemoriaError):
    """Authenticated, but this action is not allowed."""

    status_code = 403
    code = "forbidden"


class NotFound(MemoriaError):
    """No such thing in the caller's tenant (also used for other tenants' things)."""

    status_code = 404
    code = "not_found"


class Conflict(MemoriaError):
    """The write conflicts with the current state (version mismatch, duplicate)."""

    status_code = 409
    code = "conflict"


class PayloadTooLarge(MemoriaError):
    """The request body is over the configured limit."""

    status_code = 413
    code = "payload_too_large"


class TooManyRequests(MemoriaError):
    """Rate limit or load shedding; ``retry_after`` seconds are suggested."""

    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(MemoriaError):
    """A dependency (the database) is down; the client should retry."""

    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConfigurationError(MemoriaError):
    """The deployment is misconfigured; raised at start, never to a client."""

    code = "configuration_error"


def field_of(error: ErrorDetails, under: str = "") -> str:
    """The dotted name of the field a pydantic error is about (``a.0.b``), named ``under``
    a prefix when given; the prefix alone, or "", when the error is the whole model's."""
    where = ".".join(str(part) for part in error["loc"])
    if not under:
        return where
    return f"{under}.{where}" if where else under
