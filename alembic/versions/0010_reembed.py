"""Re-embedding: runs, each tenant's progress, and the trigger that marks shadow vectors stale.

A run adds a shadow column ``embedding_next vector(n)`` to each table with vectors and a
trigger built on ``memoria_reembed_stale()``; the switch at its end swaps the columns and
drops both. They are made and removed at run time because their type (the new dimension)
is only known then.

Revision ID: 0010
Revises: 0011
Create Date: 2026-11-24 09:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.rls import protect_tenant_table

revision: str = "0010"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reembed_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("dimensions", sa.Integer(), nullable=False),
        sa.Column("api_url", sa.Text(), server_default="", nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("previous_model", sa.String(length=200), nullable=False),
        sa.Column("previous_dimensions", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="embedding", nullable=False),
        sa.Column("caught_up", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('embedding', 'switching', 'done', 'cancelled')",
            name=op.f("ck_reembed_runs_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reembed_runs")),
    )
    op.create_table(
        "reembed_progress",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("table_name", sa.String(length=32), nullable=False),
        sa.Column("cursor", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("rows_total", sa.BigInteger(), nullable=True),
        sa.Column("rows_done", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("batches", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_reembed_progress_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "run_id", "table_name", name=op.f("pk_reembed_progress")
        ),
    )
    protect_tenant_table("reembed_progress")
    # A row whose vector changes during a run (new text, or a first vector) loses its
    # shadow vector, which was made from the old text: the run embeds it again.
    op.execute(
        """
        CREATE FUNCTION memoria_reembed_stale() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.embedding_next := NULL;
            RETURN NEW;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS memoria_reembed_stale() CASCADE")
    op.drop_table("reembed_progress")
    op.drop_table("reembed_runs")
