"""The events' vectors laid out for exact search within a conversation (``event_vectors``):
the covering index's one definition, and their rebuild from the events' vectors."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.registry import DerivedVectors
from service.db.vector_index import VectorIndex
from service.retrieval.floods import stored_copies

# A B-tree entry holds at most 2,704 bytes: the key and event id take up to ~490 bytes, a
# half-precision vector 2 bytes a dimension. Above 1,100 dimensions the index carries only
# the ids (see migration 0006, which created it).
EVENT_VECTORS_SCAN = VectorIndex(
    name="ix_event_vectors_scan",
    table="event_vectors",
    vector_column="embedding",
    columns=("tenant_id", "conversation_key", "occurred_at"),
    include=("event_id",),
    covering_max_dim=1100,
)


async def rebuild(session: AsyncSession, dimensions: int) -> None:
    """Remake the half-precision copies of the events' vectors (after their vectors changed
    model or dimension): copy first, then build the index once (one sorted build is far
    cheaper than many insertions)."""
    dim = int(dimensions)
    index = EVENT_VECTORS_SCAN
    for statement in (
        index.drop_sql(),
        "TRUNCATE event_vectors",
        f"ALTER TABLE event_vectors ALTER COLUMN embedding TYPE halfvec({dim})",
        # Too wide for the index, the vectors stay in the rows (not in TOAST) for the search.
        f"ALTER TABLE event_vectors ALTER COLUMN embedding SET STORAGE {index.storage(dim)}",
        f"""
        INSERT INTO event_vectors (tenant_id, event_id, conversation_key, occurred_at, embedding)
        SELECT tenant_id, id, conversation_key, occurred_at,
               CAST(l2_normalize(embedding) AS halfvec({dim}))
        FROM events WHERE embedding IS NOT NULL
        """,
        index.create_sql(dim),
    ):
        await session.execute(text(statement))
    await session.run_sync(lambda sync: leave_out_copies(sync.execute))


# A flood's copies are not in the scan (``repository.unindex``). A tenant's at a time (routed
# to its shard on Citus).
_LEAVE_OUT = text(
    "DELETE FROM event_vectors"
    " WHERE tenant_id = :tenant_id AND event_id = ANY(CAST(:ids AS text[]))"
)


def leave_out_copies(execute: Any) -> None:
    """Take a flood's copies (``floods.stored_copies``) out of the scan, through ``execute``
    (a synchronous connection's or session's): after the scan is rebuilt, and once for the
    events stored before copies were left out of it (revision 0021)."""
    for tenant_id, keys in stored_copies(execute, "events", ("id",)):
        execute(_LEAVE_OUT, {"tenant_id": tenant_id, "ids": [key for (key,) in keys]})


# The copies are derived from ``events.embedding``; a re-embedding rebuilds them.
DERIVED = (
    DerivedVectors(
        table="event_vectors", column="embedding", source="events.embedding", rebuild=rebuild
    ),
)
