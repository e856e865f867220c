"""The latest tenants' tombstones by an index of their own.

Every ten minutes the worker looks for rows written under a tenant after its erasure (a
request or a job step under way at the time; on Citus no foreign key refuses them), among the
tenants erased in the last day. Tombstones of people's erasures accumulate for years, so the
tenants' ones get a partial index by time instead of a scan of all of them each time.

Revision ID: 0026_erasure_tenants
Revises: 0025_job_pace
Create Date: 2026-11-29 16:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026_erasure_tenants"
down_revision: str | None = "0025_job_pace"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_erasures_tenants",
        "erasures",
        ["created_at"],
        postgresql_where=sa.text("kind = 'tenant'"),
    )


def downgrade() -> None:
    op.drop_index("ix_erasures_tenants", table_name="erasures")
