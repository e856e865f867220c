"""The error a Memoria client raises: an API error answer, or an argument refused before sending."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Self

import httpx


class MemoriaAPIError(Exception):
    """An error answer of the API: its status, error code, message, offending field, request id."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        field: str | None = None,
        request_id: str | None = None,
        *,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(f"{status} {error}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.error = error
        self.message = message
        self.field = field
        self.request_id = request_id
        self.retry_after = retry_after
        self.body = body

    @classmethod
    def from_response(cls, response: httpx.Response) -> MemoriaAPIError:
        """The error an answer carries (JSON error body, or whatever a proxy sent)."""
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        request_id = response.headers.get("x-request-id")
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        if isinstance(body, dict) and "error" in body:
            return cls(
                response.status_code,
                str(body["error"]),
                str(body.get("message") or body["error"]),
                body.get("field"),
                body.get("request_id") or request_id,
                retry_after=retry_after,
                body=body,
            )
        text = response.text.strip()[:500] or response.reason_phrase
        if response.is_redirect:
            where = response.headers.get("location") or "nowhere"
            text = f"redirected to {where}: the base URL must be the service's own ({text})"
        return cls(
            response.status_code,
            f"http_{response.status_code}",
            text,
            None,
            request_id,
            retry_after=retry_after,
            body=body,
        )

    @classmethod
    def not_json(cls, response: httpx.Response) -> MemoriaAPIError:
        """A success answer whose body is not the JSON the route returns (something other
        than the service answered, or the body was cut)."""
        shown = response.text.strip()[:200] or "an empty body"
        return cls(
            response.status_code,
            "not_json",
            f"the answer is not JSON: {shown}",
            None,
            response.headers.get("x-request-id"),
        )

    @classmethod
    def invalid(cls, field: str, message: str, errors: list[dict[str, Any]] | None = None) -> Self:
        """A bad argument, refused here before anything is sent: the 422 the service would give
        (``request_id`` is None, as no request was made)."""
        body = {"status": 422, "error": "invalid", "message": message, "field": field}
        if errors:
            body["errors"] = errors
        return cls(422, "invalid", message, field, None, body=body)

    def as_tool_content(self) -> str:
        """The error as a tool message, so the model can correct its call."""
        detail = {"error": self.error, "message": self.message}
        if self.field:
            detail["field"] = self.field
        return json.dumps(detail, ensure_ascii=False)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())
