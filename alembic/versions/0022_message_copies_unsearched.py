"""A flood's copies out of the message archive's dense search.

As the events' (revision 0021): a bot farm's varied copies of an ad each lie at their own
distance, so the nearest messages of a question near the ad were all its copies, and the
other members' nearest were not found. A copy left unindexed for words is now marked
``flood_copy``, and the covering index of the dense search leaves it out (a partial index:
the search names the same condition and still reads the index alone). The copies stored
before are marked here: the messages whose words are unindexed although they have some,
told apart by the same code as at write time. The index is built again.

Revision ID: 0022_message_copies_unsearched
Revises: 0021_event_copies_unsearched
Create Date: 2026-11-28 14:00:00.000000
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.db.rls import create_vector_index
from service.messages.vectors import MESSAGE_VECTORS_SCAN
from service.retrieval.floods import stored_copies

revision: str = "0022_message_copies_unsearched"
down_revision: str | None = "0021_event_copies_unsearched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A tenant's at a time (routed to its shard on Citus).
_MARK = sa.text(
    """
    UPDATE messages AS m SET flood_copy = true
    FROM unnest(CAST(:keys AS text[]), CAST(:ids AS text[])) AS c(conversation_key, message_id)
    WHERE m.tenant_id = :tenant_id AND m.conversation_key = c.conversation_key
      AND m.message_id = c.message_id
    """
)


def upgrade() -> None:
    op.add_column(
        "messages",
        sa.Column("flood_copy", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    execute = op.get_bind().execute
    for tenant_id, keys in stored_copies(execute, "messages", ("conversation_key", "message_id")):
        conversations, ids = zip(*keys, strict=True)
        execute(_MARK, {"tenant_id": tenant_id, "keys": list(conversations), "ids": list(ids)})
    op.drop_index(MESSAGE_VECTORS_SCAN.name, table_name="messages")
    create_vector_index(MESSAGE_VECTORS_SCAN)


def downgrade() -> None:
    op.drop_index(MESSAGE_VECTORS_SCAN.name, table_name="messages")
    create_vector_index(dataclasses.replace(MESSAGE_VECTORS_SCAN, where=None))
    op.drop_column("messages", "flood_copy")
