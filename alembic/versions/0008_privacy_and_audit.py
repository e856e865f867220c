"""Privacy and audit: erasure tombstones and the audit log.

Revision ID: 0008
Revises: 0006
Create Date: 2026-11-22 00:24:22.411288
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.rls import APP_ROLE, protect_tenant_table

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("actor", sa.String(length=64), nullable=True),
        sa.Column("method", sa.String(length=10), nullable=False),
        sa.Column("route", sa.String(length=300), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column(
            "targets",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["tenant_id", "at"], unique=False)
    op.create_index("ix_audit_log_prune", "audit_log", ["at"], unique=False)
    op.create_table(
        "erasures",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject_hash", sa.String(length=64), nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=True),
        sa.Column(
            "counts",
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
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_erasures")),
    )
    op.create_index("ix_erasures_subject", "erasures", ["tenant_id", "subject_hash"], unique=False)
    for table in ("audit_log", "erasures"):
        protect_tenant_table(table)
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE audit_log_id_seq, erasures_id_seq TO {APP_ROLE}")


def downgrade() -> None:
    op.drop_index("ix_erasures_subject", table_name="erasures")
    op.drop_table("erasures")
    op.drop_index("ix_audit_log_prune", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
