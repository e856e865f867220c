"""Exports written by a job: their rows and their content in chunks.

Revision ID: 0011
Revises: 0009
Create Date: 2026-11-23 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.rls import APP_ROLE, protect_tenant_table

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column(
            "manifest",
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
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_exports_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_exports")),
    )
    op.create_index("ix_exports_subject", "exports", ["tenant_id", "subject_hash"], unique=False)
    op.create_index("ix_exports_expiry", "exports", ["expires_at"], unique=False)
    op.create_table(
        "export_chunks",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("export_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "export_id"],
            ["exports.tenant_id", "exports.id"],
            name=op.f("fk_export_chunks_tenant_id_export_id_exports"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "export_id", "seq", name=op.f("pk_export_chunks")),
    )
    for table in ("exports", "export_chunks"):
        protect_tenant_table(table)
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE exports_id_seq TO {APP_ROLE}")


def downgrade() -> None:
    op.drop_table("export_chunks")
    op.drop_index("ix_exports_expiry", table_name="exports")
    op.drop_index("ix_exports_subject", table_name="exports")
    op.drop_table("exports")
