"""``GET /v1/events`` and ``GET /v1/events/{id}``."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.events import service
from service.events.schemas import EventInfo, EventPage
from service.http import errors, reads
from service.tenants.service import TenantContext


class EventController(Controller):
    """A conversation's events."""

    path = "/v1/events"
    tags = ["events"]

    @get("/", dependencies=reads())
    async def list_events(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str | None = None,
        user_id: str | None = None,
        limit: int = Parameter(default=50, ge=1, le=500),
        before: str | None = Parameter(
            default=None, description="an ISO time, or the next_before cursor of a page"
        ),
    ) -> EventPage:
        """Events of one group (``group_id``) or one private chat (``user_id``), newest first."""
        return await service.page(session, tenant.tenant_id, group_id, user_id, limit, before)

    @get("/{event_id:str}", responses=errors(404))
    async def get_event(
        self, tenant: TenantContext, session: AsyncSession, event_id: str
    ) -> EventInfo:
        """One event."""
        return await service.get(session, tenant.tenant_id, event_id)
