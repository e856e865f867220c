"""SQL of the memo log."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# Idempotent by (tenant_id, request_id, end_seq): a retried end call records its memo once.
_INSERT_MEMO = text(
    """
    INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id, sender_id,
                       request_id, end_seq, memo, said_at)
    VALUES (:tenant_id, :conversation_key, :request_type, :group_id, :user_id, :sender_id,
            :request_id, :end_seq, :memo, :said_at)
    ON CONFLICT (tenant_id, request_id, end_seq) DO NOTHING
    RETURNING id
    """
)


async def insert_memo(session: AsyncSession, row: dict[str, Any]) -> bool:
    """Record one turn's memo; False when this (request_id, end_seq) was already recorded."""
    return (await session.execute(_INSERT_MEMO, row)).scalar_one_or_none() is not None


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
    return [dict(r._mapping) for r in await session.execute(_RECENT, params)]
