"""Writing and reading the audit trail.

Audited: every write through the API (except the high-volume hand-over and search routes,
whose effects are traced by their jobs), every export and erasure, and every refused access
(401 unauthenticated, 403 outside the caller's scope). Routes are logged as templates
(``/v1/users/{subject}``), never with the concrete ids, so the trail itself holds no personal
data; the ids a request targeted are kept in ``targets`` and scrubbed by an erasure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from datetime import datetime
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts
from service.guard import RateLimiter, admit
from service.privacy.keys import subject_hash
from service.settings import Settings

log = logging.getLogger("service.audit")

NO_TENANT = uuid.UUID(int=0)
_QUIET = ("/v1/end", "/v1/messages", "/v1/context", "/v1/tools/call")
_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
_pending: set[asyncio.Task[None]] = set()


def audited(method: str, template: str, status: int) -> str | None:
    """The outcome to record for a request, or None when it is not audited."""
    if status in (401, 403):
        return "refused"
    if template.endswith("/export") or "/exports/" in template:
        return "export" if status < 400 else "failed"
    if method not in _WRITES or template.startswith(_QUIET) or template.endswith("/search"):
        return None
    if method == "DELETE" and template.startswith(
        ("/v1/users/", "/v1/groups/", "/admin/tenants/{tenant_id:uuid}")
    ):
        return "erasure" if status < 400 else "failed"
    return "ok" if status < 400 else "failed"


def audit_middleware(app: ASGIApp) -> ASGIApp:
    """Record audited requests after they are answered (never delaying the answer)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await app(scope, receive, capture)
        finally:
            template = str(scope.get("path_template") or scope.get("path", ""))
            outcome = audited(str(scope.get("method", "GET")), template, status)
            if outcome is not None:
                _schedule(scope, template, status, outcome)

    return middleware


def _schedule(scope: Scope, template: str, status: int, outcome: str) -> None:
    state = scope.get("state", {})
    app = scope.get("litestar_app")
    runtime = getattr(getattr(app, "state", None), "runtime", None) if app else None
    if runtime is None:
        return
    tenant = state.get("tenant_id")
    params = {k: str(v) for k, v in (scope.get("path_params") or {}).items()}
    # The actor is who authenticated (set by the tenant and admin dependencies), never read
    # from a header: a request may carry several, and only one of them was checked.
    actor = state.get("actor")
    repeats = 0
    if tenant is None and status in (401, 429):
        if status == 429:
            return  # refused before authentication: already counted among the failures
        repeats = runtime.failed_auth.admit(client_address(scope), template)
        if repeats < 0:
            return  # counted within the window: the window's next row reports it
    entry = {
        "tenant_id": uuid.UUID(tenant) if tenant else _admin_target(params),
        "actor": actor,
        "method": scope.get("method", "GET"),
        "route": template[:300],
        "status": status,
        "outcome": outcome,
        "targets": params,
        "request_id": state.get("request_id"),
    }
    if repeats:
        entry["targets"] = {**params, "repeats": str(repeats)}
    subject_kind = None
    if "subject" in params:
        subject_kind = "user" if template.startswith("/v1/users/") else "group"
    task = asyncio.get_running_loop().create_task(_write(runtime.db, entry, subject_kind))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


class FailedAuthentications:
    """Failed authentications per client address: refused once too many, and audited in
    bounded rows.

    Bogus keys cost nothing to send. Past ``auth_failure_burst`` failures (refilled at
    ``auth_failure_rate_per_second``) a client's failures are answered 429. In the
    audit trail, the first refusal of a client and route in a window is written and the rest
    are counted; the count goes with the next window's first row (``targets.repeats``).
    """

    def __init__(self, settings: Settings) -> None:
        self.limiter = RateLimiter(
            settings.auth_failure_rate_per_second,
            settings.auth_failure_burst,
            refusal="too many failed authentications from this address",
        )
        self.window = settings.audit_failure_window_seconds
        self._windows: dict[tuple[str, str], tuple[float, int]] = {}

    def failed(self, client: str) -> None:
        """Count a failed authentication of the client; ``TooManyRequests`` once it has
        failed too often (a good key from the same address is never refused)."""
        admit((self.limiter, client))

    def admit(self, client: str, route: str) -> int:
        """-1: counted, not written; else write a row reporting this many earlier repeats."""
        if self.window <= 0:
            return 0
        now = time.monotonic()
        key = (client, route)
        started, repeats = self._windows.get(key, (-math.inf, 0))
        if now - started < self.window:
            self._windows[key] = (started, repeats + 1)
            return -1
        if len(self._windows) > 10_000:  # bounded memory: forget every window
            self._windows.clear()
        self._windows[key] = (now, 0)
        return repeats


def client_address(scope: Scope) -> str:
    """The peer address of a request (what failed authentications are counted by)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _admin_target(params: dict[str, str]) -> uuid.UUID:
    with contextlib.suppress(KeyError, ValueError):
        return uuid.UUID(params["tenant_id"])
    return NO_TENANT


async def _write(db: Any, entry: dict[str, Any], subject_kind: str | None) -> None:
    try:
        async with db.system() as session:
            targets = dict(entry["targets"])
            if subject_kind is not None:
                # A person or group is named by keyed hash only: the trail must survive their
                # erasure, and must not give them away.
                targets["subject"] = await subject_hash(
                    session, entry["tenant_id"], subject_kind, targets["subject"]
                )
            await session.execute(
                text(
                    """
                    INSERT INTO audit_log (tenant_id, actor, method, route, status, outcome,
                                           targets, request_id)
                    VALUES (:tenant_id, :actor, :method, :route, :status, :outcome,
                            CAST(:targets AS jsonb), :request_id)
                    """
                ),
                {**entry, "targets": json.dumps(targets, ensure_ascii=False)},
            )
    except Exception as exc:  # the trail must never break a request
        log.warning("audit entry not written: %s", exc)


async def flush() -> None:
    """Wait for audit entries still being written (tests, shutdown)."""
    if _pending:
        await asyncio.gather(*list(_pending), return_exceptions=True)


async def query(
    session: AsyncSession,
    tenant_id: uuid.UUID | None,
    since: datetime | None,
    outcome: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Audit entries, newest first."""
    rows = await session.execute(
        text(
            """
            SELECT tenant_id, id, at, actor, method, route, status, outcome, targets, request_id
            FROM audit_log
            WHERE (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = :tenant_id)
              AND (CAST(:since AS timestamptz) IS NULL OR at >= :since)
              AND (CAST(:outcome AS text) IS NULL OR outcome = :outcome)
            ORDER BY at DESC, id DESC
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "since": since, "outcome": outcome, "limit": limit},
    )
    return dicts(rows)


async def prune(session: AsyncSession, retention_days: float) -> int:
    """Drop entries older than the retention."""
    result = await session.execute(
        text("DELETE FROM audit_log WHERE at < now() - make_interval(secs => :s)"),
        {"s": retention_days * 86400},
    )
    return int(getattr(result, "rowcount", 0) or 0)
