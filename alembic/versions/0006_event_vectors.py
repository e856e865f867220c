"""Event vectors laid out for exact search within a conversation.

A narrow table of unit-length, half-precision copies of the event embeddings, with a covering
B-tree on (tenant, conversation, time) that carries the vectors: one conversation's vectors
are then read by an index-only scan of contiguous leaf pages. Existing events are copied over.

A B-tree entry holds at most 2,704 bytes. The key and event id take up to ~490 bytes, the
vector 2 bytes a dimension: above 1,100 dimensions the index carries only the ids, the vectors
stay in the table's rows (kept inline, not in TOAST), and a search visits those rows instead.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 10:12:40.512907
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import HALFVEC

from service.db.rls import embedding_dim, protect_tenant_table

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COVERING_MAX_DIM = 1100


def upgrade() -> None:
    dim = embedding_dim()
    op.create_table(
        "event_vectors",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("event_id", sa.String(length=300), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("embedding", HALFVEC(dim), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "event_id"],
            ["events.tenant_id", "events.id"],
            name=op.f("fk_event_vectors_tenant_id_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "event_id", name=op.f("pk_event_vectors")),
    )
    if dim > COVERING_MAX_DIM:
        op.execute("ALTER TABLE event_vectors ALTER COLUMN embedding SET STORAGE MAIN")
    # Index-only scans skip the heap only for pages the visibility map marks all-visible;
    # vacuum after every ~1% of new rows keeps freshly written vectors from costing heap visits.
    op.execute(
        "ALTER TABLE event_vectors SET (autovacuum_vacuum_insert_threshold = 1000,"
        " autovacuum_vacuum_insert_scale_factor = 0.01)"
    )
    # Copy before indexing: one sorted index build is far cheaper than a million insertions.
    op.execute(
        f"""
        INSERT INTO event_vectors (tenant_id, event_id, conversation_key, occurred_at, embedding)
        SELECT tenant_id, id, conversation_key, occurred_at,
               CAST(l2_normalize(embedding) AS halfvec({dim}))
        FROM events WHERE embedding IS NOT NULL
        """
    )
    op.create_index(
        "ix_event_vectors_scan",
        "event_vectors",
        ["tenant_id", "conversation_key", "occurred_at"],
        unique=False,
        postgresql_include=["event_id", "embedding"] if dim <= COVERING_MAX_DIM else ["event_id"],
    )
    protect_tenant_table("event_vectors")


def downgrade() -> None:
    op.drop_index("ix_event_vectors_scan", table_name="event_vectors")
    op.drop_table("event_vectors")
