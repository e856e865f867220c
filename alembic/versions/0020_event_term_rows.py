"""The events' term look-up hands out each match's terms with its id.

Revision 0009's ``memoria_event_term_matches`` gave the ids of the events holding a query
term; the lexical search then read each match again by its key for its terms (four buffers
a match: 2 ms for 400 matches in a group of 50,000 events). The function has the row at
hand already, so it now returns the terms too, as the message archive's look-up does
(revision 0015). Same rule as before: the owner reads, confined to the bound tenant.

Revision ID: 0020_event_term_rows
Revises: 0019_event_rows_inline
Create Date: 2026-11-27 08:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from service.db.engine import APP_ROLE

revision: str = "0020_event_term_rows"
down_revision: str | None = "0019_event_rows_inline"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = "memoria_event_term_matches(text[], tsquery, timestamptz, timestamptz, integer)"


def _matches(returns: str, columns: str) -> str:
    return f"""
CREATE FUNCTION memoria_event_term_matches(
    conversation_keys text[], terms tsquery, time_from timestamptz, time_to timestamptz,
    max_matches integer
) RETURNS TABLE ({returns})
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT {columns} FROM events e
    WHERE e.tenant_id = memoria_current_tenant()
      AND e.conversation_key = ANY(conversation_keys)
      AND e.lexical @@ terms
      AND (time_from IS NULL OR e.occurred_at >= time_from)
      AND (time_to IS NULL OR e.occurred_at < time_to)
    LIMIT max_matches
$$
"""


def _replace(create: str) -> None:
    # A function's result type cannot be changed in place.
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute(create)
    # Only the app role may call it (PostgreSQL lets PUBLIC run a new function; an analyst
    # who could set app.tenant_id would read any tenant's matches).
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {APP_ROLE}")


def upgrade() -> None:
    _replace(_matches("id varchar, lexical tsvector", "e.id, e.lexical"))


def downgrade() -> None:
    _replace(_matches("id varchar", "e.id"))
