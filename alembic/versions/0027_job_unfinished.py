"""A tenant's unfinished job of one kind by an index of its own.

``repository.unfinished`` answers whether a tenant has a job of a kind under way: an erasure
or an export asked again reuses it, and every new key, settings change or admin call within
a tenant first asks whether the tenant is being erased. It walked the tenant's queued,
running and failed jobs by ``ix_jobs_tenant_status`` and read each one's row for its kind, so
a tenant with a backlog of twenty thousand historian jobs (a model's outage) had each of
those calls read all of them. ``ix_jobs_unfinished`` holds the unfinished jobs by tenant and
kind, newest first: the answer is its first entry. Made while writes to the jobs wait, as the
other job indexes (the table is small: finished jobs are pruned).

Revision ID: 0027_job_unfinished
Revises: 0026_erasure_tenants
Create Date: 2026-11-29 19:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_job_unfinished"
down_revision: str | None = "0026_erasure_tenants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_unfinished",
        "jobs",
        ["tenant_id", "kind", sa.text("id DESC")],
        postgresql_where=sa.text("status IN ('queued', 'running', 'failed')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_unfinished", table_name="jobs")
