"""One member's latest events in a group, read from an index.

In a group of a hundred members telling alike news, a member's question about their own
("the event I signed up for, where is it?") must find their event among everyone's similar
ones: a turn's few nearest events of the whole group often pass over it. The ranking now takes
the asker's own nearest events as candidates too, scored among their latest; this index gives
those newest first without reading the rest of the group.

Revision ID: 0018_event_sender
Revises: 0017_message_vacuum
Create Date: 2026-11-27 03:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_event_sender"
down_revision: str | None = "0017_message_vacuum"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_events_sender_time",
        "events",
        ["tenant_id", "conversation_key", "sender_id", sa.literal_column("occurred_at DESC")],
    )


def downgrade() -> None:
    op.drop_index("ix_events_sender_time", table_name="events")
