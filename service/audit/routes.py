"""``GET /admin/audit``: the audit trail, for admins."""

from __future__ import annotations

import uuid
from datetime import datetime, tzinfo
from typing import Annotated, Any
from zoneinfo import ZoneInfo

from litestar import get
from litestar.di import Provide
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit import service
from service.context import checked_moment, on_clocks
from service.errors import Invalid
from service.http import provide_admin, provide_system_session
from service.settings import Settings
from service.tenants import service as tenants


async def _clocks(session: AsyncSession, tenant_id: uuid.UUID | None, settings: Settings) -> tzinfo:
    """The clocks a ``since`` without an offset is read on: the tenant's it filters by. The
    whole trail (or a tenant gone) has none, and the server's would be a guess."""
    tenant = await tenants.find(session, tenant_id) if tenant_id else None
    if tenant is None:
        raise Invalid("without the tenant_id of a tenant, since needs a UTC offset", field="since")
    return ZoneInfo(tenants.TenantContext.of(tenant, settings).timezone)


@get(
    "/admin/audit",
    tags=["admin"],
    dependencies={"admin": Provide(provide_admin), "session": Provide(provide_system_session)},
)
async def audit_log(
    admin: None,
    session: AsyncSession,
    settings: Settings,
    tenant_id: uuid.UUID | None = None,
    since: Annotated[
        datetime | None,
        Parameter(description="ISO 8601; without an offset, on the clocks of tenant_id"),
    ] = None,
    outcome: str | None = Parameter(default=None, pattern="^(ok|failed|refused|export|erasure)$"),
    limit: int = Parameter(default=100, ge=1, le=10_000),
) -> list[dict[str, Any]]:
    """Who did what, newest first; filter by tenant, time and outcome."""
    checked_moment(since, "since")
    if since is not None and since.tzinfo is None:
        since = on_clocks(since, await _clocks(session, tenant_id, settings))
    return await service.query(session, tenant_id, since, outcome, limit)
