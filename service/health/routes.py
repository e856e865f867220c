"""``/healthz`` (the process is up) and ``/readyz`` (database reachable, migrations at head)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.openapi import ResponseSpec

from service.http import runtime


@get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@get(
    "/readyz",
    tags=["health"],
    responses={503: ResponseSpec(dict[str, str], description="not ready", generate_examples=False)},
)
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, str]]:
    """200 when the database answers and its schema is at this code's head, else 503."""
    ready, detail = await runtime(request).is_ready()
    return Response(
        {"status": "ok" if ready else "unavailable", "detail": detail},
        status_code=200 if ready else 503,
        headers={} if ready else {"Retry-After": "1"},
    )
