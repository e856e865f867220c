"""A flood's copies out of the nearest events' scan.

A flood's copies (one member's words said more than ten times a day, or the same words from
more than ten members: a bot farm's ad) were already indexed for words once, and kept every
copy's vector in ``event_vectors``. A spammer varies each copy, so each lies at its own
distance: the nearest 30 events of a question near the ad were all its copies, and the
results, which show a flood as its indexed copies, held fewer than asked. The copies now
keep their vector in ``events.embedding`` only; the ones stored before leave the scan here
(the events whose words are unindexed although they have some, told apart by the same code
as at write time).

Revision ID: 0021_event_copies_unsearched
Revises: 0020_event_term_rows
Create Date: 2026-11-28 13:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from service.events.vectors import leave_out_copies

revision: str = "0021_event_copies_unsearched"
down_revision: str | None = "0020_event_term_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACK = """
    INSERT INTO event_vectors (tenant_id, event_id, conversation_key, occurred_at, embedding)
    SELECT e.tenant_id, e.id, e.conversation_key, e.occurred_at,
           CAST(l2_normalize(e.embedding) AS halfvec)
    FROM events e
    WHERE e.embedding IS NOT NULL AND coalesce(length(e.lexical), 0) = 0
    ON CONFLICT (tenant_id, event_id) DO NOTHING
"""


def upgrade() -> None:
    leave_out_copies(op.get_bind().execute)


def downgrade() -> None:
    op.execute(_BACK)
