"""A profile's key holds the longest ids it is made of.

Ids are up to 128 characters of anything but '/'. In a profile's key each ':' and '%' of an
id is escaped to three characters, so a member of a group is a key of up to 776 characters
("member:", two such ids and the ':' between them), and a person's own up to 389. The keys
were kept in 300: the end job of every turn of a member whose ids hold many colons failed for
good on "value too long". A longer varchar is the same type to PostgreSQL: neither the rows
nor the indexes are rewritten.

Revision ID: 0028_profile_keys
Revises: 0027_job_unfinished
Create Date: 2026-11-29 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028_profile_keys"
down_revision: str | None = "0027_job_unfinished"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("profiles", "profile_revisions")


def upgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "profile_key", type_=sa.String(800), existing_type=sa.String(300))


def downgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "profile_key", type_=sa.String(300), existing_type=sa.String(800))
