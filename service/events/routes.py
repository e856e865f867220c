"""``GET /v1/events`` and ``GET /v1/events/{id}``."""

from __future__ import annotations

from datetime import datetime

from litestar import Controller, get
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import checked_moment, scope_of
from service.errors import Invalid, NotFound
from service.events import repository
from service.events.schemas import EventInfo, EventPage
from service.http import errors, reads
from service.tenants.service import TenantContext


def _cursor(value: str) -> tuple[datetime, str]:
    moment, _, event_id = value.partition("|")
    try:
        at = datetime.fromisoformat(moment.replace(" ", "+"))
    except ValueError:
        raise Invalid("not an ISO 8601 time or a page cursor", field="before") from None
    if at.tzinfo is None:
        raise Invalid("the time needs a UTC offset", field="before")
    checked_moment(at, "before")
    return at, event_id


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
        key = scope_of(group_id, user_id)
        cursor = _cursor(before) if before else None
        rows = await repository.list_events(session, tenant.tenant_id, key, limit, cursor)
        events = [EventInfo(**row) for row in rows]
        last = events[-1] if len(events) == limit else None
        next_before = f"{last.occurred_at.isoformat()}|{last.id}" if last else None
        return EventPage(events=events, next_before=next_before)

    @get("/{event_id:str}", responses=errors(404))
    async def get_event(
        self, tenant: TenantContext, session: AsyncSession, event_id: str
    ) -> EventInfo:
        """One event."""
        row = await repository.get_event(session, tenant.tenant_id, event_id)
        if row is None:
            raise NotFound("no such event")
        return EventInfo(**row)
