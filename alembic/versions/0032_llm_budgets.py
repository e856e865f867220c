"""A tenant's budget of model calls per minute, counted in one row per tenant.

A chat member who posts "remember this" again and again had the historian call the model for
each; nothing bounded what one tenant's jobs asked of it. ``llm_budgets`` counts the calls
of a tenant's jobs in the current window across every worker; past the tenant's budget, its
jobs wait for the next window (see ``service.tenants.budget``). A tenant table like the others
(row-level security; distributed by tenant on Citus, where its one-row statements go to the
tenant's shard).

Revision ID: 0032_llm_budgets
Revises: 0031_job_queueing_locks
Create Date: 2026-12-02 00:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.rls import protect_tenant_table

revision: str = "0032_llm_budgets"
down_revision: str | None = "0031_job_queueing_locks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "llm_budgets",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column(
            "window_start",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_llm_budgets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_llm_budgets")),
    )
    protect_tenant_table("llm_budgets")


def downgrade() -> None:
    op.drop_table("llm_budgets")
