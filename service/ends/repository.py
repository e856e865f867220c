"""SQL of the memo log."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# The whole hand-over in one statement on the hot path: the memo (if any) and the historian's
# job (if wanted), each idempotent — the memo by (request_id, end_seq), the job by its
# dedupe key. The outer SELECT runs on the statement's snapshot, so `existing` finds only a
# job from an earlier call, never the one inserted here.
ACCEPT_END = """
WITH memo AS (
    INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id, sender_id,
                       request_id, end_seq, memo, said_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
    WHERE $9 <> ''
    ON CONFLICT (tenant_id, request_id, end_seq) DO NOTHING
    RETURNING id
), job AS (
    INSERT INTO jobs (tenant_id, kind, payload, max_attempts, dedupe_key)
    SELECT $1, $11, CAST($12 AS jsonb), $13, $14
    WHERE $15
    ON CONFLICT (tenant_id, dedupe_key) DO NOTHING
    RETURNING id
)
SELECT (SELECT id FROM job) AS created,
       existing.id AS existing,
       existing.payload -> 'event_ids' AS existing_event_ids
FROM (SELECT 1) AS one
LEFT JOIN jobs AS existing ON existing.tenant_id = $1 AND existing.dedupe_key = $14
"""

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


# A memo from elsewhere (an import): idempotent by (request_id, end_seq) like the hot path's.
_RECORD_MEMO = text(
    """
    INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id, sender_id,
                       request_id, end_seq, memo, said_at)
    VALUES (:tenant_id, :conversation_key, :request_type, :group_id, :user_id, :sender_id,
            :request_id, :end_seq, :memo, :said_at)
    ON CONFLICT (tenant_id, request_id, end_seq) DO NOTHING
    RETURNING id
    """
)


async def record_memo(session: AsyncSession, row: dict[str, Any]) -> bool:
    """Add one memo; False when a memo of that (request_id, end_seq) is already there."""
    return (await session.execute(_RECORD_MEMO, row)).first() is not None
