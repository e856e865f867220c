"""An enqueue finds its tenant's pace in one probe, however many of its jobs are not yet due.

A job's turn is a step after the turn of its tenant's latest due queued job. That job was
found by walking the tenant's queued jobs newest first and reading each one's row to test its
run_after, so a tenant with thousands of jobs waiting out a retry's backoff, or queued to run
later, had every enqueue read all of them. Only a job queued to run at once (its run_after not
after its created_at) now sets the pace, and ``ix_jobs_pace`` holds those jobs alone: the
tenant's first entry in it is the one. Like the claimable index, it is made while writes to
the jobs wait (the table is small: finished jobs are pruned).

Revision ID: 0025_job_pace
Revises: 0024_job_turns
Create Date: 2026-11-30 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_job_pace"
down_revision: str | None = "0024_job_turns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_pace",
        "jobs",
        ["tenant_id", sa.text("id DESC")],
        postgresql_where=sa.text("status = 'queued' AND run_after <= created_at"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_pace", table_name="jobs")
