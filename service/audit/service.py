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
import uuid
from datetime import datetime
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

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
    if "subject" in params:
        # A person or group is named by hash only: the trail must survive their erasure.
        from service.privacy.service import subject_hash

        kind = "user" if template.startswith("/v1/users/") else "group"
        params["subject"] = subject_hash(
            uuid.UUID(tenant) if tenant else NO_TENANT, kind, params["subject"]
        )
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    # The admin token acting within a tenant leaves its mark in the state (see provide_tenant).
    actor = state.get("actor")
    if actor is None and template.startswith("/admin"):
        actor = "admin"
    elif actor is None and auth.lower().startswith("bearer mk_"):
        actor = auth[7:20]
    entry = {
        "tenant_id": uuid.UUID(tenant) if tenant else _admin_target(params),
        "actor": actor,
        "method": scope.get("method", "GET"),
        "route": template[:300],
        "status": status,
        "outcome": outcome,
        "targets": json.dumps(params, ensure_ascii=False),
        "request_id": state.get("request_id"),
    }
    task = asyncio.get_running_loop().create_task(_write(runtime.db, entry))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _admin_target(params: dict[str, str]) -> uuid.UUID:
    with contextlib.suppress(KeyError, ValueError):
        return uuid.UUID(params["tenant_id"])
    return NO_TENANT


async def _write(db: Any, entry: dict[str, Any]) -> None:
    try:
        async with db.system() as session:
            await session.execute(
                text(
                    """
                    INSERT INTO audit_log (tenant_id, actor, method, route, status, outcome,
                                           targets, request_id)
                    VALUES (:tenant_id, :actor, :method, :route, :status, :outcome,
                            CAST(:targets AS jsonb), :request_id)
                    """
                ),
                entry,
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
    return [dict(r._mapping) for r in rows]


async def prune(session: AsyncSession, retention_days: float) -> int:
    """Drop entries older than the retention."""
    result = await session.execute(
        text("DELETE FROM audit_log WHERE at < now() - make_interval(secs => :s)"),
        {"s": retention_days * 86400},
    )
    return int(getattr(result, "rowcount", 0) or 0)
