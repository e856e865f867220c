"""Reading a conversation's events (the historian writes them)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import checked_moment, scope_of
from service.errors import Invalid, NotFound
from service.events import repository
from service.events.schemas import EventInfo, EventPage


def page_cursor(value: str) -> tuple[datetime, str]:
    """``before`` of a page: an ISO time, or a page's ``next_before`` (``time|event id``)."""
    moment, _, event_id = value.partition("|")
    try:
        at = datetime.fromisoformat(moment.replace(" ", "+"))
    except ValueError:
        raise Invalid("not an ISO 8601 time or a page cursor", field="before") from None
    if at.tzinfo is None:
        raise Invalid("the time needs a UTC offset", field="before")
    checked_moment(at, "before")
    return at, event_id


async def page(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str | None,
    user_id: str | None,
    limit: int,
    before: str | None,
) -> EventPage:
    """Events of one group or one private chat, newest first, a page at a time."""
    key = scope_of(group_id, user_id)
    cursor = page_cursor(before) if before else None
    rows = await repository.list_events(session, tenant_id, key, limit, cursor)
    events = [EventInfo(**row) for row in rows]
    last = events[-1] if len(events) == limit else None
    next_before = f"{last.occurred_at.isoformat()}|{last.id}" if last else None
    return EventPage(events=events, next_before=next_before)


async def get(session: AsyncSession, tenant_id: uuid.UUID, event_id: str) -> EventInfo:
    """One event; ``NotFound`` when the tenant has none by that id."""
    row = await repository.get_event(session, tenant_id, event_id)
    if row is None:
        raise NotFound("no such event")
    return EventInfo(**row)
