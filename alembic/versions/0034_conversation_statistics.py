"""The planner counts one tenant's conversation, not the product of two guesses.

Every search reads one conversation of one tenant (``tenant_id = … AND conversation_key =
…``). The planner took the two conditions as independent: in a table of 124,000 messages of
which a new tenant's one group holds 4,000, it multiplied the tenant's share by the group's
share and counted the group at 130 rows, and planned each search for a handful (nested loops
over the whole group, seconds a search, see ``service.db.statistics``). A conversation key
belongs to one tenant in practice though the same key repeats across tenants (``g:123``), so
the two columns' statistics are kept together: their functional dependency, and the most
common pairs.

Revision ID: 0034_conversation_statistics
Revises: 0033_turn_keys
Create Date: 2026-12-02 12:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0034_conversation_statistics"
down_revision: str | None = "0033_turn_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("messages", "events", "event_vectors")


def upgrade() -> None:
    for table in TABLES:
        op.execute(
            f"CREATE STATISTICS IF NOT EXISTS {table}_conversation (dependencies, mcv)"
            f" ON tenant_id, conversation_key FROM {table}"
        )
        # Counted on the table's next analysis (autovacuum's, or a job's).


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP STATISTICS IF EXISTS {table}_conversation")
