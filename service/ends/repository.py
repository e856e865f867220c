"""SQL of the memo log."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts
from service.queue import repository as jobs

# The whole hand-over in one statement on the hot path: the memo (if any) and the historian's
# job (if wanted), each idempotent by the turn of its conversation — the memo by
# (conversation_key, request_id, end_seq), the job by its dedupe key. Parameters: $1 the
# tenant, $2–$7 the job's (see queue.repository), then $8 conversation_key, $9 request_type,
# $10 group_id, $11 user_id, $12 sender_id, $13 request_id, $14 end_seq, $15 memo,
# $16 said_at.
ACCEPT_END = jobs.enqueue_beside(
    """
    INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id, sender_id,
                       request_id, end_seq, memo, said_at)
    SELECT $1, $8, $9, $10, $11, $12, $13, $14, $15, $16
    WHERE $15 <> ''
    ON CONFLICT (tenant_id, conversation_key, request_id, end_seq) DO NOTHING
    RETURNING id
    """,
    existing_field="event_ids",
)

# The receipt of a turn ($1 the tenant, $2 the dedupe key), as ACCEPT_END's row has it.
RECEIPT = jobs.receipt_beside("event_ids")

_RECENT = text(
    """
    SELECT id, request_id, end_seq, memo, sender_id, said_at
    FROM memos
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND (CAST(:before AS timestamptz) IS NULL OR said_at < :before)
    ORDER BY said_at DESC, id DESC
    LIMIT :limit
    """
)


async def recent_memos(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    limit: int,
    before: datetime | None = None,
) -> list[dict[str, Any]]:
    """A conversation's newest memos, newest first."""
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "limit": limit,
        "before": before,
    }
    return dicts(await session.execute(_RECENT, params))


# A memo from elsewhere (an import): idempotent by its conversation's (request_id, end_seq)
# like the hot path's.
_RECORD_MEMO = text(
    """
    INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id, sender_id,
                       request_id, end_seq, memo, said_at)
    VALUES (:tenant_id, :conversation_key, :request_type, :group_id, :user_id, :sender_id,
            :request_id, :end_seq, :memo, :said_at)
    ON CONFLICT (tenant_id, conversation_key, request_id, end_seq) DO NOTHING
    RETURNING id
    """
)


async def record_memo(session: AsyncSession, row: dict[str, Any]) -> bool:
    """Add one memo; False when its conversation has a memo of that (request_id, end_seq)."""
    return (await session.execute(_RECORD_MEMO, row)).first() is not None
