"""Scoped memories with their change history, and todos.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 00:04:28.684125
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

from service.db.rls import APP_ROLE, embedding_dim, protect_tenant_table

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    dim = embedding_dim()
    op.create_table(
        "memories",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("embedding", Vector(dim), nullable=True),
        sa.Column("confidence", sa.Float(), server_default="0.5", nullable=False),
        sa.Column("importance", sa.Float(), server_default="0.5", nullable=False),
        sa.Column("valid_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("valid_to", sa.DateTime(timezone=True), nullable=True),
        sa.Column("is_active", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary_day", sa.Date(), nullable=True),
        sa.Column(
            "evidence",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
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
        sa.CheckConstraint(
            "(scope = 'GLOBAL' AND user_id IS NOT NULL AND group_id IS NULL)"
            " OR (scope = 'GROUP' AND group_id IS NOT NULL AND user_id IS NULL)"
            " OR (scope = 'MEMBER_IN_GROUP' AND group_id IS NOT NULL AND user_id IS NOT NULL)",
            name=op.f("ck_memories_scope_binding"),
        ),
        sa.CheckConstraint(
            "category IN ('PROFILE', 'PREFERENCE', 'FACT', 'SUMMARY')",
            name=op.f("ck_memories_category"),
        ),
        sa.CheckConstraint(
            "scope IN ('GLOBAL', 'GROUP', 'MEMBER_IN_GROUP')", name=op.f("ck_memories_scope")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_memories_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_memories")),
    )
    op.create_index(
        "ix_memories_last_used", "memories", ["tenant_id", "last_used_at"], unique=False
    )
    op.create_index(
        "ix_memories_scope",
        "memories",
        ["tenant_id", "scope", "group_id", "user_id", "is_active"],
        unique=False,
    )
    op.create_index("ix_memories_user", "memories", ["tenant_id", "user_id"], unique=False)
    op.create_index(
        "uq_memories_group_summary_day",
        "memories",
        ["tenant_id", "group_id", "summary_day"],
        unique=True,
        postgresql_where=sa.text("category = 'SUMMARY' AND summary_day IS NOT NULL"),
    )
    op.create_table(
        "memory_history",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("memory_id", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(length=24), nullable=False),
        sa.Column("old_content", sa.Text(), nullable=True),
        sa.Column("new_content", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "cause",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_memory_history_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_memory_history")),
    )
    op.create_index(
        "ix_memory_history_memory", "memory_history", ["tenant_id", "memory_id", "id"], unique=False
    )
    op.create_table(
        "todos",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("conversation_key", sa.String(length=200), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.String(length=128), nullable=True),
        sa.Column("creator_id", sa.String(length=128), nullable=True),
        sa.Column("assignee_id", sa.String(length=128), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("trigger_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="PENDING", nullable=False),
        sa.Column(
            "evidence",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
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
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('PENDING', 'COMPLETED', 'CANCELLED', 'EXPIRED')",
            name=op.f("ck_todos_status"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_todos_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_todos")),
    )
    op.create_index(
        "ix_todos_conversation", "todos", ["tenant_id", "conversation_key", "status"], unique=False
    )
    op.create_index(
        "ix_todos_due",
        "todos",
        ["tenant_id", "trigger_time"],
        unique=False,
        postgresql_where=sa.text("status = 'PENDING'"),
    )
    for table in ("memories", "memory_history", "todos"):
        protect_tenant_table(table)
    op.execute(
        f"GRANT USAGE, SELECT ON SEQUENCE memories_id_seq, memory_history_id_seq, todos_id_seq"
        f" TO {APP_ROLE}"
    )


def downgrade() -> None:
    op.drop_index(
        "ix_todos_due", table_name="todos", postgresql_where=sa.text("status = 'PENDING'")
    )
    op.drop_index("ix_todos_conversation", table_name="todos")
    op.drop_table("todos")
    op.drop_index("ix_memory_history_memory", table_name="memory_history")
    op.drop_table("memory_history")
    op.drop_index(
        "uq_memories_group_summary_day",
        table_name="memories",
        postgresql_where=sa.text("category = 'SUMMARY' AND summary_day IS NOT NULL"),
    )
    op.drop_index("ix_memories_user", table_name="memories")
    op.drop_index("ix_memories_scope", table_name="memories")
    op.drop_index("ix_memories_last_used", table_name="memories")
    op.drop_table("memories")
