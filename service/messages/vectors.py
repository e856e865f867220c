"""The messages' half-precision vectors (``messages.embedding_half``, revision 0014): the
covering index's one definition, and how a re-embedding drops and remakes the copy.

The copy is a stored generated column of ``embedding``, so PostgreSQL refuses to drop
``embedding`` while it exists: the switch releases the copy first and remakes it for the
new dimension after (adding a stored generated column rewrites the table once, under the
switch's lock).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.registry import DerivedVectors
from service.db.vector_index import VectorIndex

# As for the events' copies: a B-tree entry holds at most 2,704 bytes, 2 bytes a dimension.
MESSAGE_VECTORS_SCAN = VectorIndex(
    name="ix_messages_vectors",
    table="messages",
    vector_column="embedding_half",
    columns=("tenant_id", "conversation_key", "seq"),
    include=("sent_at",),
    covering_max_dim=1100,
    # A flood's copies are not searched by meaning (``repository.unindex``).
    where="NOT flood_copy",
)


async def release(session: AsyncSession) -> None:
    """Drop the copy (and its index with it) so that ``embedding`` can be swapped."""
    await session.execute(text("ALTER TABLE messages DROP COLUMN IF EXISTS embedding_half"))


async def rebuild(session: AsyncSession, dimensions: int) -> None:
    """Remake the copy from the new vectors, and its covering index."""
    dim = int(dimensions)
    index = MESSAGE_VECTORS_SCAN
    for statement in (
        f"ALTER TABLE messages ADD COLUMN embedding_half halfvec({dim})"
        f" GENERATED ALWAYS AS (CAST(l2_normalize(embedding) AS halfvec({dim}))) STORED",
        f"ALTER TABLE messages ALTER COLUMN embedding_half SET STORAGE {index.storage(dim)}",
        index.create_sql(dim),
    ):
        await session.execute(text(statement))


DERIVED = (
    DerivedVectors(
        table="messages",
        column="embedding_half",
        source="messages.embedding",
        rebuild=rebuild,
        release=release,
    ),
)
