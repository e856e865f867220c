"""One job waiting, and one running, per queueing lock.

Every message that asked the bot to remember something queued an extraction job of its
conversation: a hundred such messages, posted one request each, made a hundred jobs and two
hundred model calls, where one batch of the same messages made one job. A job now carries an
optional queueing lock (an extraction's: its conversation); ``ux_jobs_queueing_lock`` allows
one job of a lock queued and not yet started, which a later request joins (it moves the
job's high-water mark up) instead of queueing a second, and ``ix_jobs_running_lock`` lets the
claim pass over a lock's waiting job while another of it runs. Jobs queued before this
migration have no lock and run as they were. Made while writes to the jobs wait, as the other
job indexes (the table is small: finished jobs are pruned).

Revision ID: 0031_job_queueing_locks
Revises: 0030_profile_places
Create Date: 2026-12-02 00:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031_job_queueing_locks"
down_revision: str | None = "0030_profile_places"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("queueing_lock", sa.String(400), nullable=True))
    op.create_index(
        "ux_jobs_queueing_lock",
        "jobs",
        ["tenant_id", "queueing_lock"],
        unique=True,
        postgresql_where=sa.text(
            "status = 'queued' AND started_at IS NULL AND queueing_lock IS NOT NULL"
        ),
    )
    op.create_index(
        "ix_jobs_running_lock",
        "jobs",
        ["tenant_id", "queueing_lock"],
        postgresql_where=sa.text("status = 'running' AND queueing_lock IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_running_lock", table_name="jobs")
    op.drop_index("ux_jobs_queueing_lock", table_name="jobs")
    op.drop_column("jobs", "queueing_lock")
