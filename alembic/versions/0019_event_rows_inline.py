"""An event's vector kept in its row, not in TOAST.

An event row is about 1.2 kB without its vector and 2.7 kB with it (384 dimensions), over
the 2 kB at which PostgreSQL moves a row's largest values out of line: pgvector's vectors
(storage EXTERNAL) went to the TOAST table, and every exact distance the read path computes
(the nearest events rescored, the asker's own, every neighbour's similarity, the lexical
candidates' vectors) fetched its vector through the TOAST index: four or five buffers a row
instead of one. The rows now stay whole up to 8,160 bytes (a page); only a much longer text
is still moved out. In a typical group of a million-event table the neighbours' read fell
from 1,471 buffers to 469 (2.3 to 1.4 ms), the dense pass's from 466 to 334.

Rows written before keep their vectors out of line until the table is rewritten: ``VACUUM
(FULL, ANALYZE) events`` (an exclusive lock, about 35 s per million events here), then a
plain ``VACUUM events`` so that index-only counts do not visit the heap. The message archive
keeps the default: its dense pass reads the conversation's rows themselves, which whole
vectors would make twice as many pages.

Revision ID: 0019_event_rows_inline
Revises: 0018_event_sender
Create Date: 2026-11-27 05:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019_event_rows_inline"
down_revision: str | None = "0018_event_sender"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE events SET (toast_tuple_target = 8160)")


def downgrade() -> None:
    op.execute("ALTER TABLE events RESET (toast_tuple_target)")
