"""Profiles: Markdown documents with front matter columns, embeddings and kept revisions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 23:55:30.375169
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

from service.db.rls import embedding_dim, protect_tenant_table

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    dim = embedding_dim()
    op.create_table(
        "profiles",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("profile_key", sa.String(length=300), nullable=False),
        sa.Column("entity_type", sa.String(length=16), nullable=False),
        sa.Column("entity_id", sa.String(length=128), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "tags",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("source_event_id", sa.String(length=300), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("embedding", Vector(dim), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "modified_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_profiles_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "profile_key", name=op.f("pk_profiles")),
    )
    op.create_index(
        "ix_profiles_type", "profiles", ["tenant_id", "entity_type", "group_id"], unique=False
    )
    op.create_table(
        "profile_revisions",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("profile_key", sa.String(length=300), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column(
            "replaced_by",
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
            ["tenant_id", "profile_key"],
            ["profiles.tenant_id", "profiles.profile_key"],
            name=op.f("fk_profile_revisions_tenant_id_profile_key_profiles"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "profile_key", "version", name=op.f("pk_profile_revisions")
        ),
    )
    for table in ("profiles", "profile_revisions"):
        protect_tenant_table(table)


def downgrade() -> None:
    op.drop_table("profile_revisions")
    op.drop_index("ix_profiles_type", table_name="profiles")
    op.drop_table("profiles")
