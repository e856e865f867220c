"""The claim takes the tenants' due jobs in turns: the claimable index leads with tenant_id.

The claim took the oldest due jobs of all tenants, so a tenant's burst of thousands of jobs
held up every job another tenant queued after it until the whole burst was done. It now
numbers each tenant's due jobs and takes every tenant's first before anyone's second (within
a priority); it finds the tenants with queued jobs one index probe each, and their most
urgent jobs by the same index.

Revision ID: 0023_fair_claim
Revises: 0022_message_copies_unsearched
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_fair_claim"
down_revision: str | None = "0022_message_copies_unsearched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        ["tenant_id", sa.text("priority DESC"), "run_after", "id"],
        postgresql_where=sa.text("status = 'queued'"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        [sa.text("priority DESC"), "run_after", "id"],
        postgresql_where=sa.text("status = 'queued'"),
    )
