"""SQL of messages and conversation bookkeeping."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import numpy as np
from pgvector import Vector
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# One statement for the whole batch; duplicates (by conversation and message_id) are skipped.
# Rows get their seq in array order, so seq follows the batch's order.
_INSERT = text(
    """
    INSERT INTO messages (tenant_id, conversation_key, message_id, request_type, group_id,
                          user_id, sender_id, sender_name, text, sent_at, lexical)
    SELECT :tenant_id, * FROM unnest(
        CAST(:keys AS text[]), CAST(:ids AS text[]), CAST(:types AS text[]),
        CAST(:groups AS text[]), CAST(:users AS text[]), CAST(:senders AS text[]),
        CAST(:names AS text[]), CAST(:texts AS text[]), CAST(:sent AS timestamptz[]),
        CAST(:lexicals AS tsvector[]))
    ON CONFLICT (tenant_id, conversation_key, message_id) DO NOTHING
    RETURNING conversation_key, seq, text, sent_at, length(lexical) AS term_count
    """
)


async def insert_messages(
    session: AsyncSession, tenant_id: uuid.UUID, rows: list[dict[str, Any]]
) -> list[Any]:
    """Store new messages; returns the rows actually inserted."""
    params = {
        "tenant_id": tenant_id,
        "keys": [r["conversation_key"] for r in rows],
        "ids": [r["message_id"] for r in rows],
        "types": [r["request_type"] for r in rows],
        "groups": [r["group_id"] for r in rows],
        "users": [r["user_id"] for r in rows],
        "senders": [r["sender_id"] for r in rows],
        "names": [r["sender_name"] for r in rows],
        "texts": [r["text"] for r in rows],
        "sent": [r["sent_at"] for r in rows],
        "lexicals": [r["lexical"] for r in rows],
    }
    return list(await session.execute(_INSERT, params))


# Count what arrived; pending_count is what no extraction job has been asked to read yet.
_TOUCH = text(
    """
    INSERT INTO conversations AS c (tenant_id, conversation_key, request_type, group_id, user_id,
                                    group_name, message_count, term_count, last_message_at,
                                    last_seq, pending_count)
    VALUES (:tenant_id, :conversation_key, :request_type, :group_id, :user_id, :group_name,
            CAST(:count AS bigint), CAST(:term_count AS bigint), :last_at, :last_seq,
            CAST(:count AS integer))
    ON CONFLICT (tenant_id, conversation_key) DO UPDATE SET
        message_count = c.message_count + EXCLUDED.message_count,
        term_count = c.term_count + EXCLUDED.term_count,
        last_message_at = GREATEST(c.last_message_at, EXCLUDED.last_message_at),
        last_seq = GREATEST(c.last_seq, EXCLUDED.last_seq),
        pending_count = c.pending_count + EXCLUDED.pending_count,
        group_name = COALESCE(EXCLUDED.group_name, c.group_name),
        updated_at = now()
    RETURNING pending_count, last_seq
    """
)


async def touch_conversation(session: AsyncSession, row: dict[str, Any]) -> tuple[int, int]:
    """Add a batch's counts; returns (pending messages, newest seq)."""
    result = (await session.execute(_TOUCH, row)).one()
    return int(result.pending_count), int(result.last_seq)


_RESET_PENDING = text(
    """
    UPDATE conversations SET pending_count = 0
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    """
)


async def reset_pending(session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str) -> None:
    """An extraction job was queued for everything pending."""
    await session.execute(
        _RESET_PENDING, {"tenant_id": tenant_id, "conversation_key": conversation_key}
    )


# The pause trigger, across tenants (runs as the owner): conversations quiet for a while with
# messages no extraction job has been asked to read. Claimed in the same statement.
_QUIET = text(
    """
    UPDATE conversations SET pending_count = 0
    WHERE (tenant_id, conversation_key) IN (
        SELECT tenant_id, conversation_key FROM conversations
        WHERE pending_count > 0 AND updated_at < now() - make_interval(secs => :quiet)
        ORDER BY updated_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING tenant_id, conversation_key, last_seq
    """
)


async def take_quiet_conversations(
    session: AsyncSession, quiet_seconds: float, limit: int
) -> list[Any]:
    """Quiet conversations with pending messages, their pending count reset."""
    return list(await session.execute(_QUIET, {"quiet": quiet_seconds, "limit": limit}))


_CLAIM_EXTRACTION = text(
    """
    SELECT extracted_seq FROM conversations
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    FOR UPDATE
    """
)

_UNREAD = text(
    """
    SELECT seq, message_id, sender_id, sender_name, text, sent_at FROM messages
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND seq > :after AND seq <= :upto
    ORDER BY seq
    LIMIT :limit
    """
)

_ADVANCE = text(
    """
    UPDATE conversations SET extracted_seq = GREATEST(extracted_seq, :seq)
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    """
)


async def unread_messages(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, upto: int, limit: int
) -> tuple[int, list[Any]]:
    """Lock the conversation's bookkeeping; return its high-water mark and the messages after it."""
    key = {"tenant_id": tenant_id, "conversation_key": conversation_key}
    mark = (await session.execute(_CLAIM_EXTRACTION, key)).scalar_one_or_none()
    if mark is None:
        return 0, []
    rows = await session.execute(_UNREAD, {**key, "after": mark, "upto": upto, "limit": limit})
    return int(mark), list(rows)


async def advance_extracted(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, seq: int
) -> None:
    """Mark messages up to ``seq`` as processed."""
    await session.execute(
        _ADVANCE, {"tenant_id": tenant_id, "conversation_key": conversation_key, "seq": seq}
    )


_QUEUED_EMBED = text(
    """
    SELECT 1 FROM jobs WHERE tenant_id = :tenant_id AND status = 'queued' AND kind = :kind LIMIT 1
    """
)


async def embed_job_queued(session: AsyncSession, tenant_id: uuid.UUID, kind: str) -> bool:
    """Whether a not-yet-started embedding job will see messages committed now."""
    return (
        await session.execute(_QUEUED_EMBED, {"tenant_id": tenant_id, "kind": kind})
    ).first() is not None


# SKIP LOCKED: two embedding jobs of one tenant split the work instead of repeating it.
_UNEMBEDDED = text(
    """
    SELECT conversation_key, message_id, sender_name, text FROM messages
    WHERE tenant_id = :tenant_id AND embedding IS NULL
    ORDER BY seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

# The terms are segmented again with the vector: a text rewritten in place (a privacy
# redaction clears the vector and the terms) becomes searchable again, and only as rewritten.
_SET_EMBEDDINGS = text(
    """
    UPDATE messages AS m SET embedding = v.embedding, lexical = v.lexical
    FROM unnest(CAST(:keys AS text[]), CAST(:ids AS text[]), CAST(:vectors AS vector[]),
                CAST(:lexicals AS tsvector[]))
         AS v(conversation_key, message_id, embedding, lexical)
    WHERE m.tenant_id = :tenant_id AND m.conversation_key = v.conversation_key
      AND m.message_id = v.message_id
    """
)


async def unembedded_messages(session: AsyncSession, tenant_id: uuid.UUID, limit: int) -> list[Any]:
    """The oldest messages still without a vector, locked for this transaction."""
    return list(await session.execute(_UNEMBEDDED, {"tenant_id": tenant_id, "limit": limit}))


async def set_embeddings(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    rows: list[Any],
    vectors: list[np.ndarray[Any, Any]],
    lexicals: list[str],
) -> None:
    """Store the vectors of messages, and their terms as of the text embedded."""
    await session.execute(
        _SET_EMBEDDINGS,
        {
            "tenant_id": tenant_id,
            "keys": [r.conversation_key for r in rows],
            "ids": [r.message_id for r in rows],
            # pgvector's Vector, not bare arrays: asyncpg would read an array as a dimension.
            "vectors": [Vector(v) for v in vectors],
            "lexicals": lexicals,
        },
    )


_SEARCH = text(
    """
    SELECT message_id, text, sender_id, sender_name, sent_at,
           1 - (embedding <=> :query) AS score
    FROM messages
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND embedding IS NOT NULL
      AND (CAST(:time_from AS timestamptz) IS NULL OR sent_at >= :time_from)
      AND (CAST(:time_to AS timestamptz) IS NULL OR sent_at <= :time_to)
    ORDER BY embedding <=> :query
    LIMIT :limit
    """
)


async def search_messages(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    query: np.ndarray[Any, Any],
    limit: int,
    time_from: datetime | None,
    time_to: datetime | None,
) -> list[dict[str, Any]]:
    """The conversation's messages nearest to the query vector (an exact scan of one chat)."""
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "query": query,
        "limit": limit,
        "time_from": time_from,
        "time_to": time_to,
    }
    return [dict(r._mapping) for r in await session.execute(_SEARCH, params)]
