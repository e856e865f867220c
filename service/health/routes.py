"""``/healthz`` (the process is up) and ``/readyz`` (database reachable, migrations at head)."""

from __future__ import annotations

import logging

from litestar import Response, get
from litestar.openapi import ResponseSpec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.db.engine import Database
from service.http import Readiness
from service.observability import JOBS
from service.queue import repository as jobs

log = logging.getLogger("service.health")


@get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@get("/metrics", tags=["health"], media_type="text/plain; version=0.0.4")
async def metrics(db: Database) -> Response[bytes]:
    """Prometheus metrics (the queue's state is read from the database at scrape time)."""
    try:
        async with db.system() as session:
            counts = await jobs.kind_status_counts(session)
        JOBS.clear()
        for kind, status, n in counts:
            JOBS.labels(kind, status).set(n)
    except Exception as exc:  # metrics never fail a scrape because the database is away
        log.info("queue metrics unavailable: %s", exc)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@get(
    "/readyz",
    tags=["health"],
    responses={503: ResponseSpec(dict[str, str], description="not ready", generate_examples=False)},
)
async def readyz(readiness: Readiness) -> Response[dict[str, str]]:
    """200 when the database answers and its schema is at this code's head, else 503."""
    ready, detail = await readiness()
    return Response(
        {"status": "ok" if ready else "unavailable", "detail": detail},
        status_code=200 if ready else 503,
        headers={} if ready else {"Retry-After": "1"},
    )
