"""``GET /admin/audit``: the audit trail, for admins."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from litestar import get
from litestar.di import Provide
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit import service
from service.context import checked_moment
from service.http import provide_admin, provide_system_session


@get(
    "/admin/audit",
    tags=["admin"],
    dependencies={"admin": Provide(provide_admin), "session": Provide(provide_system_session)},
)
async def audit_log(
    admin: None,
    session: AsyncSession,
    tenant_id: uuid.UUID | None = None,
    since: datetime | None = None,
    outcome: str | None = Parameter(default=None, pattern="^(ok|failed|refused|export|erasure)$"),
    limit: int = Parameter(default=100, ge=1, le=10_000),
) -> list[dict[str, Any]]:
    """Who did what, newest first; filter by tenant, time and outcome."""
    checked_moment(since, "since")
    return await service.query(session, tenant_id, since, outcome, limit)
