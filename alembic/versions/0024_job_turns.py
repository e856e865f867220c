"""The claim takes the tenants' jobs in turns: each job's turn is set at enqueue.

The claim took the oldest due jobs of all tenants, so a tenant's burst of hundreds of jobs
held up every job another tenant queued after it until the whole burst was done. A job's
``turn`` is now a virtual time given at enqueue: its run_after (now), or a step after the
turn of its tenant's latest queued job, whichever is later; the claim takes jobs by
(priority, turn), so a burst's jobs are spread out and another tenant's job falls in
between. The claimable index is on the turn, still one index scan per claim whatever the
number of tenants, and carries run_after, so a job not yet due is passed over on its entry.
The jobs already queued take their run_after as their turn.

Revision ID: 0024_job_turns
Revises: 0023_job_receipts
Create Date: 2026-11-29 11:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024_job_turns"
down_revision: str | None = "0023_job_receipts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Added empty and filled apart: a column with a default of now() would rewrite the table.
    op.add_column("jobs", sa.Column("turn", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET turn = run_after")
    op.alter_column("jobs", "turn", nullable=False, server_default=sa.func.now())
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        # run_after last: whether a job is due is read from the entry, not the row.
        [sa.text("priority DESC"), "turn", "id", "run_after"],
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
    op.drop_column("jobs", "turn")
