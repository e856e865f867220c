"""The message archive vacuumed after every ~1% of changed rows.

A message is written twice: stored, then given its vector by the embedding job, which leaves
the first version dead. Until a vacuum, the pages of fresh messages are not all-visible, so
the archive search's index-only scans (the vector copies, the neighbours) fetch the heap
row by row: on 3,900 freshly embedded messages the dense step took 20 ms instead of 2. The
default threshold, a fifth of the table changed, is reached ever more rarely as the archive
grows. Like ``event_vectors`` (revision 0006): vacuum after ~1% of rows changed or inserted.

Revision ID: 0017_message_vacuum
Revises: 0016_message_neighbours
Create Date: 2026-11-26 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017_message_vacuum"
down_revision: str | None = "0016_message_neighbours"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE messages SET (autovacuum_vacuum_scale_factor = 0.01,"
        " autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.01)"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE messages RESET (autovacuum_vacuum_scale_factor,"
        " autovacuum_vacuum_insert_threshold, autovacuum_vacuum_insert_scale_factor)"
    )
