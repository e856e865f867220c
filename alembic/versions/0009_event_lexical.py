"""Event lexical search: each event's segmented terms as a tsvector with a GIN index; and
term lookups that can use the GIN indexes under row-level security.

Events are short absolute sentences ("2025-03-02 小明在杭州西湖划船"): a name, a place or a
rare word in the query is strong evidence that the embedding alone may rank too low, and
Chinese needs the application's segmentation (service.retrieval.terms) to match at all.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22 03:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.db.engine import APP_ROLE
from service.retrieval.terms import terms, to_tsvector_literal

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Existing events are segmented here, in batches, by the same code as at write time.
_BATCH = 5000

_PAGE = sa.text(
    """
    SELECT tenant_id, id, text FROM events
    WHERE (tenant_id, id) > (:tenant_id, :id)
    ORDER BY tenant_id, id
    LIMIT :limit
    """
)

_FILL = sa.text(
    """
    UPDATE events AS e SET lexical = v.lexical
    FROM unnest(CAST(:tenants AS uuid[]), CAST(:ids AS text[]), CAST(:lexicals AS tsvector[]))
         AS v(tenant_id, id, lexical)
    WHERE e.tenant_id = v.tenant_id AND e.id = v.id
    """
)


def _backfill() -> None:
    bind = op.get_bind()
    last = {"tenant_id": "00000000-0000-0000-0000-000000000000", "id": ""}
    while True:
        rows = bind.execute(_PAGE, {**last, "limit": _BATCH}).all()
        if not rows:
            break
        bind.execute(
            _FILL,
            {
                "tenants": [r.tenant_id for r in rows],
                "ids": [r.id for r in rows],
                "lexicals": [to_tsvector_literal(terms(r.text)) for r in rows],
            },
        )
        last = {"tenant_id": rows[-1].tenant_id, "id": rows[-1].id}


# Terms in more than a small share of all events say little and match thousands of rows, so
# the read path leaves them out of its lexical search. PostgreSQL already counts them: the
# most common elements of the column in pg_stats (kept by ANALYZE). The app role cannot read
# the statistics of a table under row-level security, so this function, run as the owner,
# hands out only terms and table-wide frequencies, never a row.
_COMMON_TERMS = """
CREATE FUNCTION memoria_common_event_terms(min_frequency float8)
RETURNS TABLE (term text, frequency float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT e.term, e.frequency::float8
    FROM pg_stats s,
         unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
             AS e(term, frequency)
    WHERE s.schemaname = 'public' AND s.tablename = 'events' AND s.attname = 'lexical'
      AND e.term IS NOT NULL AND e.frequency >= min_frequency
$$
"""


# Row-level security keeps an operator that is not leakproof, such as tsvector's @@, from
# being checked before the tenant policy, so under the app role the GIN index cannot serve
# @@ and a busy conversation is read row by row (230 ms for 50,000 events). This function
# runs as the owner and applies the same rule the policy does, the transaction's bound tenant
# (memoria_current_tenant(), NULL and so no rows when none is bound): the index serves the
# match, and only ids of the caller's own tenant come out.
_TERM_MATCHES = """
CREATE FUNCTION memoria_event_term_matches(
    conversation_keys text[], terms tsquery, time_from timestamptz, time_to timestamptz,
    max_matches integer
) RETURNS TABLE (id varchar)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT e.id FROM events e
    WHERE e.tenant_id = memoria_current_tenant()
      AND e.conversation_key = ANY(conversation_keys)
      AND e.lexical @@ terms
      AND (time_from IS NULL OR e.occurred_at >= time_from)
      AND (time_to IS NULL OR e.occurred_at < time_to)
    LIMIT max_matches
$$
"""
_TERM_MATCHES_ARGS = "text[], tsquery, timestamptz, timestamptz, integer"

# The same for the message archive's lexical search (revision 0005), one conversation at a
# time; its time bounds stay in the caller's query.
_MESSAGE_TERM_MATCHES = """
CREATE FUNCTION memoria_message_term_matches(conversation_key text, terms tsquery)
RETURNS TABLE (seq bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT m.seq FROM messages m
    WHERE m.tenant_id = memoria_current_tenant()
      AND m.conversation_key = memoria_message_term_matches.conversation_key
      AND m.lexical @@ terms
$$
"""


_DEFINER_FUNCTIONS = (
    "memoria_common_event_terms(float8)",
    f"memoria_event_term_matches({_TERM_MATCHES_ARGS})",
    "memoria_message_term_matches(text, tsquery)",
)


def upgrade() -> None:
    op.add_column(
        "events",
        sa.Column(
            "lexical",
            postgresql.TSVECTOR(),
            server_default=sa.text("''::tsvector"),
            nullable=False,
        ),
    )
    _backfill()
    op.create_index(
        "ix_events_lexical", "events", ["lexical"], unique=False, postgresql_using="gin"
    )
    op.execute(_COMMON_TERMS)
    op.execute(_TERM_MATCHES)
    op.execute(_MESSAGE_TERM_MATCHES)
    # These run as the owner: only the app role may call them (PostgreSQL lets PUBLIC run a
    # new function; an analyst who could set app.tenant_id would read any tenant's matches).
    for signature in _DEFINER_FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {APP_ROLE}")


def downgrade() -> None:
    for signature in _DEFINER_FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
    op.drop_index("ix_events_lexical", table_name="events", postgresql_using="gin")
    op.drop_column("events", "lexical")
