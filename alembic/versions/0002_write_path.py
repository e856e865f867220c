"""Write path: the memo log, events, raw messages and per-conversation bookkeeping.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 23:41:02.185314
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

from service.db.rls import APP_ROLE, embedding_dim, protect_tenant_table

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The deployment's embedding dimension, fixed when the schema was created.
    dim = embedding_dim()
    op.create_table(
        "conversations",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("request_type", sa.String(length=16), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("group_name", sa.String(length=200), nullable=True),
        sa.Column("message_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_message_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("extracted_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("pending_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_conversations_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "conversation_key", name=op.f("pk_conversations")),
    )
    op.create_index(
        "ix_conversations_pending",
        "conversations",
        ["updated_at"],
        unique=False,
        postgresql_where=sa.text("pending_count > 0"),
    )
    op.create_table(
        "events",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.String(length=300), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("request_type", sa.String(length=16), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("sender_id", sa.String(length=128), nullable=True),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("end_seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("perspective", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("source_text", sa.Text(), nullable=False),
        sa.Column("is_absolute", sa.Boolean(), nullable=False),
        sa.Column(
            "warnings",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("location_abs", sa.Text(), nullable=True),
        sa.Column(
            "message_ids",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("embedding", Vector(dim), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_events_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_events")),
    )
    op.create_index(
        "ix_events_conversation_time",
        "events",
        ["tenant_id", "conversation_key", sa.literal_column("occurred_at DESC")],
        unique=False,
    )
    op.create_table(
        "memos",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("request_type", sa.String(length=16), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("sender_id", sa.String(length=128), nullable=True),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("end_seq", sa.Integer(), nullable=False),
        sa.Column("memo", sa.Text(), nullable=False),
        sa.Column("said_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_memos_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_memos")),
        sa.UniqueConstraint(
            "tenant_id", "request_id", "end_seq", name=op.f("uq_memos_tenant_id_request_id_end_seq")
        ),
    )
    op.create_index(
        "ix_memos_conversation_time",
        "memos",
        ["tenant_id", "conversation_key", sa.literal_column("said_at DESC")],
        unique=False,
    )
    op.create_table(
        "messages",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("message_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("request_type", sa.String(length=16), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("sender_id", sa.String(length=128), nullable=True),
        sa.Column("sender_name", sa.String(length=200), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("embedding", Vector(dim), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_messages_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "conversation_key", "message_id", name=op.f("pk_messages")
        ),
    )
    op.create_index(
        "ix_messages_conversation_seq",
        "messages",
        ["tenant_id", "conversation_key", "seq"],
        unique=False,
    )
    op.create_index(
        "ix_messages_conversation_time",
        "messages",
        ["tenant_id", "conversation_key", "sent_at"],
        unique=False,
    )
    op.create_index(
        "ix_messages_unembedded",
        "messages",
        ["tenant_id", "seq"],
        unique=False,
        postgresql_where=sa.text("embedding IS NULL"),
    )
    for table in ("conversations", "events", "memos", "messages"):
        protect_tenant_table(table)
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE memos_id_seq, messages_seq_seq TO {APP_ROLE}")


def downgrade() -> None:
    op.drop_index(
        "ix_messages_unembedded",
        table_name="messages",
        postgresql_where=sa.text("embedding IS NULL"),
    )
    op.drop_index("ix_messages_conversation_time", table_name="messages")
    op.drop_index("ix_messages_conversation_seq", table_name="messages")
    op.drop_table("messages")
    op.drop_index("ix_memos_conversation_time", table_name="memos")
    op.drop_table("memos")
    op.drop_index("ix_events_conversation_time", table_name="events")
    op.drop_table("events")
    op.drop_index(
        "ix_conversations_pending",
        table_name="conversations",
        postgresql_where=sa.text("pending_count > 0"),
    )
    op.drop_table("conversations")
