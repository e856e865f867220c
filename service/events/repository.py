"""SQL of events."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# Upsert by event id: a retried job rewrites the same rows instead of adding new ones.
_UPSERT = text(
    """
    INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id, user_id,
                        sender_id, request_id, end_seq, kind, perspective, text, source_text,
                        is_absolute, warnings, occurred_at, timezone, location_abs, message_ids,
                        metadata, embedding, job_id)
    VALUES (:tenant_id, :id, :conversation_key, :request_type, :group_id, :user_id,
            :sender_id, :request_id, :end_seq, :kind, :perspective, :text, :source_text,
            :is_absolute, CAST(:warnings AS jsonb), :occurred_at, :timezone, :location_abs,
            CAST(:message_ids AS jsonb), CAST(:metadata AS jsonb), :embedding, :job_id)
    ON CONFLICT (tenant_id, id) DO UPDATE SET
        text = EXCLUDED.text, source_text = EXCLUDED.source_text,
        is_absolute = EXCLUDED.is_absolute, warnings = EXCLUDED.warnings,
        metadata = EXCLUDED.metadata, embedding = EXCLUDED.embedding,
        job_id = EXCLUDED.job_id, updated_at = now()
    """
)


async def upsert_events(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Write events (one round trip for the batch)."""
    if not rows:
        return
    prepared = [
        {
            **row,
            "warnings": json.dumps(row["warnings"], ensure_ascii=False),
            "message_ids": json.dumps(row["message_ids"], ensure_ascii=False),
            "metadata": json.dumps(row["metadata"], ensure_ascii=False),
        }
        for row in rows
    ]
    await session.execute(_UPSERT, prepared)


_COLUMNS = """id, conversation_key, request_type, group_id, user_id, sender_id, request_id,
              end_seq, kind, perspective, text, source_text, is_absolute, warnings, occurred_at,
              timezone, location_abs, message_ids, metadata, job_id, created_at, updated_at"""

_LIST = text(
    f"""
    SELECT {_COLUMNS} FROM events
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND (CAST(:before_at AS timestamptz) IS NULL OR (occurred_at, id) < (:before_at, :before_id))
    ORDER BY occurred_at DESC, id DESC
    LIMIT :limit
    """
)


async def list_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    limit: int,
    before: tuple[datetime, str] | None,
) -> list[dict[str, Any]]:
    """A conversation's events, newest first, strictly before the (time, id) cursor."""
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "limit": limit,
        "before_at": before[0] if before else None,
        "before_id": before[1] if before else "",
    }
    return [dict(r._mapping) for r in await session.execute(_LIST, params)]


_GET = text(f"SELECT {_COLUMNS} FROM events WHERE tenant_id = :tenant_id AND id = :id")


async def get_event(
    session: AsyncSession, tenant_id: uuid.UUID, event_id: str
) -> dict[str, Any] | None:
    """One event by id."""
    row = (await session.execute(_GET, {"tenant_id": tenant_id, "id": event_id})).first()
    return dict(row._mapping) if row is not None else None


_NEAREST = text(
    f"""
    SELECT {_COLUMNS}, embedding <=> :query AS distance FROM events
    WHERE tenant_id = :tenant_id AND conversation_key = ANY(:keys) AND embedding IS NOT NULL
      AND (CAST(:time_from AS timestamptz) IS NULL OR occurred_at >= :time_from)
      AND (CAST(:time_to AS timestamptz) IS NULL OR occurred_at <= :time_to)
    ORDER BY embedding <=> :query
    LIMIT :limit
    """
)


async def nearest_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    query: Any,
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> list[dict[str, Any]]:
    """The exact top-``limit`` events of the conversations by cosine distance, nearest first."""
    params = {
        "tenant_id": tenant_id,
        "keys": conversation_keys,
        "query": query,
        "limit": limit,
        "time_from": time_from,
        "time_to": time_to,
    }
    return [dict(r._mapping) for r in await session.execute(_NEAREST, params)]
