"""A bounded lexical look-up for big conversations of the message archive.

Revision 0009's ``memoria_message_term_matches`` returned every message of a conversation
holding any query term. In a group of 50,000 messages the common words of a question match
a fifth of them, and scoring all of those took 260 ms a search. Its replacement takes one
term at a time and at most ``max_matches`` of its messages, within the search's time range,
each with its terms: a rare term's messages are all found, a common one's are a sample (they
barely tell messages apart, and every message found is still scored on all the query's
terms). Same rule as before: the owner reads, confined to the bound tenant.

Revision ID: 0015_message_term_sample
Revises: 0014_message_vectors
Create Date: 2026-11-26 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from service.db.engine import APP_ROLE

revision: str = "0015_message_term_sample"
down_revision: str | None = "0014_message_vectors"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SAMPLE_SIGNATURE = "memoria_message_term_sample(text, tsquery, timestamptz, timestamptz, integer)"

_SAMPLE = """
CREATE FUNCTION memoria_message_term_sample(
    conversation_key text, terms tsquery, time_from timestamptz, time_to timestamptz,
    max_matches integer
) RETURNS TABLE (seq bigint, lexical tsvector)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT m.seq, m.lexical FROM messages m
    WHERE m.tenant_id = memoria_current_tenant()
      AND m.conversation_key = memoria_message_term_sample.conversation_key
      AND m.lexical @@ terms
      AND (time_from IS NULL OR m.sent_at >= time_from)
      AND (time_to IS NULL OR m.sent_at <= time_to)
    LIMIT max_matches
$$
"""

# Revision 0009's function, for the downgrade.
_MATCHES_SIGNATURE = "memoria_message_term_matches(text, tsquery)"
_MATCHES = """
CREATE FUNCTION memoria_message_term_matches(conversation_key text, terms tsquery)
RETURNS TABLE (seq bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT m.seq FROM messages m
    WHERE m.tenant_id = memoria_current_tenant()
      AND m.conversation_key = memoria_message_term_matches.conversation_key
      AND m.lexical @@ terms
$$
"""


def _definer(create: str, signature: str) -> None:
    op.execute(create)
    # Only the app role may call it (PostgreSQL lets PUBLIC run a new function; an analyst
    # who could set app.tenant_id would read any tenant's matches).
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {APP_ROLE}")


def upgrade() -> None:
    _definer(_SAMPLE, SAMPLE_SIGNATURE)
    op.execute(f"DROP FUNCTION {_MATCHES_SIGNATURE}")


def downgrade() -> None:
    _definer(_MATCHES, _MATCHES_SIGNATURE)
    op.execute(f"DROP FUNCTION {SAMPLE_SIGNATURE}")
