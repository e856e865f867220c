"""A hand-over's receipt outlives its job: a repeat after the job is pruned makes no second one.

``/v1/end`` answered a repeated (request_id, end_seq) with the first answer by finding the job
of that dedupe key; done jobs are pruned after ``done_retention_hours`` (24 h), and a repeat
after that made a second job, which wrote the turn's events and memories again. The job is
now made beside a receipt (tenant, dedupe key, job id, the first answer's payload field),
and the repeat is answered from the receipt, which is kept ``receipt_retention_days`` (90).

Like ``jobs``, the table stays on the coordinator under Citus (it is written in the same
statement as the job) and has no foreign key to ``tenants`` (see ``service.db.citus``).
The receipts of the end jobs still in the queue are made here.

Revision ID: 0023_job_receipts
Revises: 0022_message_copies_unsearched
Create Date: 2026-11-29 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.rls import protect_tenant_table

revision: str = "0023_job_receipts"
down_revision: str | None = "0022_message_copies_unsearched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_receipts",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("dedupe_key", sa.String(400), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("answer", postgresql.JSONB(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tenant_id", "dedupe_key", name="pk_job_receipts"),
    )
    op.create_index("ix_job_receipts_created", "job_receipts", ["created_at"])
    protect_tenant_table("job_receipts")
    op.execute(
        """
        INSERT INTO job_receipts (tenant_id, dedupe_key, job_id, answer, created_at)
        SELECT tenant_id, dedupe_key, id, payload -> 'event_ids', created_at FROM jobs
        WHERE kind = 'historian.end' AND dedupe_key IS NOT NULL
        """
    )


def downgrade() -> None:
    op.drop_table("job_receipts")
