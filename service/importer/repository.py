"""SQL of imports: what of a source the tenant holds already."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.queue import repository as jobs

# A turn (a conversation's request id) counts as imported once anything of it is here: its
# memo, one of its events, or its job (queued, running, or finished and not yet pruned; asked
# of the queue). Each arm is an index lookup: the memos' (tenant_id, conversation_key,
# request_id, end_seq) key, the events' primary key.
_IMPORTED_TURNS = text(
    """
    SELECT conversation_key, request_id FROM memos
    WHERE tenant_id = :tenant_id
      AND (conversation_key, request_id) IN (
          SELECT * FROM unnest(CAST(:keys AS text[]), CAST(:request_ids AS text[])))
    UNION
    SELECT conversation_key, request_id FROM events
    WHERE tenant_id = :tenant_id AND id = ANY(:event_ids)
    """
)


async def imported_turns(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    turns: list[tuple[str, str]],
    event_ids: list[str],
    dedupe_keys: dict[str, tuple[str, str]],
) -> set[tuple[str, str]]:
    """Those of these turns (conversation key, request id) the tenant already holds something
    of: a memo, one of ``event_ids``, or a job of one of ``dedupe_keys`` (each key's turn)."""
    if not turns:
        return set()
    params = {
        "tenant_id": tenant_id,
        "keys": [k for k, _ in turns],
        "request_ids": [r for _, r in turns],
        "event_ids": event_ids,
    }
    held = {(row[0], row[1]) for row in await session.execute(_IMPORTED_TURNS, params)}
    queued = await jobs.keyed(session, [(tenant_id, key) for key in dedupe_keys])
    return held | {dedupe_keys[key] for _, key in queued}


_EXISTING_EVENTS = text("SELECT id FROM events WHERE tenant_id = :tenant_id AND id = ANY(:ids)")


async def existing_events(session: AsyncSession, tenant_id: uuid.UUID, ids: list[str]) -> set[str]:
    """Which of these event ids the tenant has."""
    if not ids:
        return set()
    rows = await session.execute(_EXISTING_EVENTS, {"tenant_id": tenant_id, "ids": ids})
    return {row[0] for row in rows}
