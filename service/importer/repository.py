"""SQL of imports: what of a source the tenant holds already."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.queue import repository as jobs

# A turn counts as imported once anything of it is here: its memo, one of its events, or its
# job (queued, running, or finished and not yet pruned; asked of the queue). Each arm is an
# index lookup: the memos' (tenant_id, request_id, end_seq) key, the events' primary key.
_IMPORTED_TURNS = text(
    """
    SELECT request_id FROM memos WHERE tenant_id = :tenant_id AND request_id = ANY(:request_ids)
    UNION
    SELECT request_id FROM events WHERE tenant_id = :tenant_id AND id = ANY(:event_ids)
    """
)


async def imported_turns(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    request_ids: list[str],
    event_ids: list[str],
    dedupe_keys: list[str],
) -> set[str]:
    """The request ids of these turns the tenant already holds something of."""
    if not request_ids:
        return set()
    params = {"tenant_id": tenant_id, "request_ids": request_ids, "event_ids": event_ids}
    held = {row[0] for row in await session.execute(_IMPORTED_TURNS, params)}
    return held | await jobs.payload_field_by_dedupe(session, tenant_id, dedupe_keys, "request_id")


_EXISTING_EVENTS = text("SELECT id FROM events WHERE tenant_id = :tenant_id AND id = ANY(:ids)")


async def existing_events(session: AsyncSession, tenant_id: uuid.UUID, ids: list[str]) -> set[str]:
    """Which of these event ids the tenant has."""
    if not ids:
        return set()
    rows = await session.execute(_EXISTING_EVENTS, {"tenant_id": tenant_id, "ids": ids})
    return {row[0] for row in rows}
