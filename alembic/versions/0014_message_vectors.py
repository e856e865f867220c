"""Message vectors laid out for exact search within a conversation.

A message's vector is stored out of line (pgvector's vectors are TOASTed once a row passes
about 2 kB, as a message row with its text and terms does), so an exact scan of a
conversation of 50,000 messages read some 140,000 pages. Like the events' (revision 0006),
a unit-length, half-precision copy now rides in a covering B-tree on (tenant, conversation,
seq): one conversation's copies are read by an index-only scan of contiguous leaf pages, and
the full-precision vectors of the best candidates decide (see the repository). The copy is a
generated column, so every write of ``embedding`` keeps it in step without the code doing so.

Adding a stored generated column rewrites the table once.

Revision ID: 0014_message_vectors
Revises: 0013
Create Date: 2026-11-25 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from service.db.rls import embedding_dim

revision: str = "0014_message_vectors"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As in revision 0006: a B-tree entry holds at most 2,704 bytes, 2 bytes a dimension.
COVERING_MAX_DIM = 1100


def upgrade() -> None:
    dim = embedding_dim()
    op.execute(
        f"ALTER TABLE messages ADD COLUMN embedding_half halfvec({dim})"
        f" GENERATED ALWAYS AS (CAST(l2_normalize(embedding) AS halfvec({dim}))) STORED"
    )
    if dim > COVERING_MAX_DIM:
        op.execute("ALTER TABLE messages ALTER COLUMN embedding_half SET STORAGE MAIN")
    op.create_index(
        "ix_messages_vectors",
        "messages",
        ["tenant_id", "conversation_key", "seq"],
        unique=False,
        postgresql_include=["sent_at", "embedding_half"] if dim <= COVERING_MAX_DIM else [],
    )


def downgrade() -> None:
    op.drop_index("ix_messages_vectors", table_name="messages")
    op.drop_column("messages", "embedding_half")
