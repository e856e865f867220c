"""Message lexical search: segmented terms as a tsvector with a GIN index, and each
conversation's term count (BM25's mean message length).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 00:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.retrieval.terms import terms, to_tsvector_literal

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Existing messages are segmented here, in batches, by the same code as at ingest.
_BATCH = 2000

_PAGE = sa.text(
    """
    SELECT tenant_id, conversation_key, message_id, text FROM messages
    WHERE (tenant_id, conversation_key, message_id) > (:tenant_id, :conversation_key, :message_id)
    ORDER BY tenant_id, conversation_key, message_id
    LIMIT :limit
    """
)

_FILL = sa.text(
    """
    UPDATE messages AS m SET lexical = v.lexical
    FROM unnest(CAST(:tenants AS uuid[]), CAST(:keys AS text[]), CAST(:ids AS text[]),
                CAST(:lexicals AS tsvector[]))
         AS v(tenant_id, conversation_key, message_id, lexical)
    WHERE m.tenant_id = v.tenant_id AND m.conversation_key = v.conversation_key
      AND m.message_id = v.message_id
    """
)


def _backfill() -> None:
    bind = op.get_bind()
    last = {
        "tenant_id": "00000000-0000-0000-0000-000000000000",
        "conversation_key": "",
        "message_id": "",
    }
    while True:
        rows = bind.execute(_PAGE, {**last, "limit": _BATCH}).all()
        if not rows:
            break
        bind.execute(
            _FILL,
            {
                "tenants": [r.tenant_id for r in rows],
                "keys": [r.conversation_key for r in rows],
                "ids": [r.message_id for r in rows],
                "lexicals": [to_tsvector_literal(terms(r.text)) for r in rows],
            },
        )
        tail = rows[-1]
        last = {
            "tenant_id": tail.tenant_id,
            "conversation_key": tail.conversation_key,
            "message_id": tail.message_id,
        }
    op.execute(
        """
        UPDATE conversations AS c SET term_count = t.term_count
        FROM (SELECT tenant_id, conversation_key, sum(length(lexical)) AS term_count
              FROM messages GROUP BY tenant_id, conversation_key) AS t
        WHERE c.tenant_id = t.tenant_id AND c.conversation_key = t.conversation_key
        """
    )


def upgrade() -> None:
    op.add_column(
        "messages",
        sa.Column(
            "lexical",
            postgresql.TSVECTOR(),
            server_default=sa.text("''::tsvector"),
            nullable=False,
        ),
    )
    op.add_column(
        "conversations",
        sa.Column("term_count", sa.BigInteger(), server_default="0", nullable=False),
    )
    _backfill()
    op.create_index(
        "ix_messages_lexical", "messages", ["lexical"], unique=False, postgresql_using="gin"
    )


def downgrade() -> None:
    op.drop_index("ix_messages_lexical", table_name="messages", postgresql_using="gin")
    op.drop_column("conversations", "term_count")
    op.drop_column("messages", "lexical")
