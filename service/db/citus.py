"""Distributing the schema over a Citus cluster, after the migrations, when Citus is installed.

On a plain PostgreSQL this does nothing. With the ``citus`` extension in the database it makes
the schema Citus wants, and is idempotent, so every ``memoria migrate`` runs it again and a table
a later migration adds is distributed too:

* every tenant table is distributed by ``tenant_id``, all of them colocated, so one tenant's
  rows of every table live on the same node and a request for one tenant is a router query;
* ``tenants``, ``api_keys`` and the other small tables read across tenants (``memoria_meta``,
  ``reembed_runs``) become reference tables, copied to every node; an API key is found by its
  prefix before its tenant is known, which a table distributed by tenant could only answer by
  asking every shard;
* ``jobs`` stays an ordinary table on the coordinator: workers claim from it across tenants
  with ``FOR UPDATE SKIP LOCKED``, which needs one table on one node. Its foreign key to
  ``tenants`` is dropped for good, because a local table that references a reference table is
  turned into a Citus-managed table, whose planner rejects the queue's SQL ("non-IMMUTABLE
  functions are not allowed in CASE or COALESCE statements"); erasing a tenant deletes its jobs
  explicitly, so the cascade was only a safety net; ``job_receipts``, written in the same
  statement as a job, stays beside it (and has no foreign key either);
* foreign keys are dropped before the tables change kind and added back after (Citus checks
  them against the final layout); a reference table's identity column becomes a sequence
  default, because Citus refuses identity columns on reference tables;
* the tenant setting must reach the workers, where row-level security runs on each shard:
  ``citus.propagate_set_commands = 'local'`` for the migrating role makes every ``SET LOCAL``
  of a transaction follow it to the workers (the service binds its tenant with ``SET LOCAL`` on
  Citus, see ``service.db.engine``), and the application role gets LOGIN, because Citus opens
  its connections to the workers as the current role (``memoria_app`` after ``SET ROLE``).
  On a self-hosted cluster give that role a password in ``pg_dist_authinfo`` or ``.pgpass``;
  the local test cluster trusts 127.0.0.1;
* the lexical-match functions of migrations 0015 and 0020 are replaced by versions that route their
  query to the tenant's shard (see ``_ROUTED_TERM_MATCHES``), and the events' common terms are
  read from the shards' statistics (``_SHARDS_COMMON_TERMS``).

The analytics views of ``sql/`` are not made here (an operator installs them after migrating):
on Citus, ``sql/analytics.sql`` itself has them read through the owner's SECURITY DEFINER
functions, because Citus reads the shards as the querying role, which an analyst's is not
allowed to. Not handled: the re-embedding run's trigger on distributed tables
(``citus.enable_unsafe_triggers``).
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)

APP_ROLE = "memoria_app"
DISTRIBUTION_COLUMN = "tenant_id"
# Read across tenants, small, or both: a copy on every node.
REFERENCE_TABLES = ("tenants", "api_keys", "memoria_meta", "reembed_runs")
# Stays an ordinary PostgreSQL table on the coordinator.
LOCAL_TABLES = ("jobs", "job_receipts", "alembic_version")


def citus_installed(connection: Connection) -> bool:
    """Whether this database uses Citus."""
    found = connection.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
    return found.first() is not None


def _public_tables(connection: Connection) -> list[str]:
    """The schema's own tables, never Citus' shards of them.

    A node that holds placements keeps each shard as a table of its own (``api_keys_102008``),
    as the coordinator does for the reference tables once it is in the metadata; the migrating
    role lists them, because it turns Citus' hiding of shards off (see below), and a shard
    taken for a table cannot be distributed again."""
    rows = connection.execute(
        text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
            " AND NOT relation_is_a_known_shard(c.oid) ORDER BY c.relname"
        )
    )
    return [r.relname for r in rows]


def _has_tenant_column(connection: Connection, table: str) -> bool:
    found = connection.execute(
        text(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name = :t AND column_name = :c"
        ),
        {"t": table, "c": DISTRIBUTION_COLUMN},
    )
    return found.first() is not None


def _citus_kind(connection: Connection, table: str) -> str | None:
    """'distributed', 'reference', 'local' (Citus-managed local) or None (plain table)."""
    found = connection.execute(
        text("SELECT citus_table_type FROM citus_tables WHERE table_name = CAST(:t AS regclass)"),
        {"t": f"public.{table}"},
    ).first()
    if found is None:
        return None
    return str(found.citus_table_type)


def _foreign_keys(connection: Connection, tables: set[str]) -> list[tuple[str, str, str]]:
    """(table, constraint, definition) of every foreign key from or to one of ``tables``."""
    rows = connection.execute(
        text(
            "SELECT c.conrelid::regclass::text AS source, c.confrelid::regclass::text AS target,"
            " c.conname, pg_get_constraintdef(c.oid) AS definition"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE c.contype = 'f' AND n.nspname = 'public' ORDER BY c.conname"
        )
    )
    return [
        (r.source, r.conname, r.definition)
        for r in rows
        if r.source in tables or r.target in tables
    ]


def _identity_to_sequence(connection: Connection, table: str) -> None:
    """Replace the identity columns of ``table`` by an owned sequence with the same next value."""
    columns = connection.execute(
        text(
            "SELECT attname FROM pg_attribute WHERE attrelid = CAST(:t AS regclass)"
            " AND attidentity <> '' AND NOT attisdropped"
        ),
        {"t": f"public.{table}"},
    )
    for (column,) in columns.all():
        sequence = f"{table}_{column}_seq"
        last = connection.execute(
            text(f'SELECT coalesce(max("{column}"), 0) FROM "{table}"')
        ).scalar_one()
        connection.execute(text(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" DROP IDENTITY'))
        connection.execute(
            text(
                f'CREATE SEQUENCE "{sequence}" START {int(last) + 1} OWNED BY "{table}"."{column}"'
            )
        )
        connection.execute(
            text(
                f'ALTER TABLE "{table}" ALTER COLUMN "{column}"'
                f" SET DEFAULT nextval('\"{sequence}\"')"
            )
        )
        connection.execute(text(f'GRANT USAGE, SELECT ON SEQUENCE "{sequence}" TO {APP_ROLE}'))


def distribute_schema(connection: Connection) -> bool:
    """Lay the schema out over the Citus cluster (no-op without Citus); True if Citus is used."""
    if not citus_installed(connection):
        return False
    tables = _public_tables(connection)
    reference = [t for t in tables if t in REFERENCE_TABLES]
    distributed = [
        t
        for t in tables
        if t not in REFERENCE_TABLES and t not in LOCAL_TABLES and _has_tenant_column(connection, t)
    ]
    pending = {t for t in [*reference, *distributed] if _citus_kind(connection, t) is None}

    # Role settings, every time (cheap, and a new node or a restored role gets them again).
    # Citus creates the role on the workers; LOGIN because it connects to them as this role.
    can_login = connection.execute(
        text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :r"), {"r": APP_ROLE}
    ).scalar_one()
    if not can_login:
        # Needs CREATEROLE; on a managed cluster where the migrating role lacks it, an
        # administrator runs this once (deploy/initdb/01-memoria.sql creates the role).
        connection.execute(text(f"ALTER ROLE {APP_ROLE} LOGIN"))
    connection.execute(text("ALTER ROLE CURRENT_USER SET citus.propagate_set_commands = 'local'"))
    # Citus hides its shards from pg_class with a filter that asyncpg's type introspection (a
    # recursive catalog query, run once per connection and new type) pays for per row: 2.5 s
    # for the first bigint[] parameter, enough to lose a job's lease. The service lists no
    # tables, so it does without the hiding.
    connection.execute(text("ALTER ROLE CURRENT_USER SET citus.override_table_visibility = off"))

    if pending:
        log.info("distributing over Citus: %s", ", ".join(sorted(pending)))
        # DDL on many shards in one transaction must not mix parallel and sequential access.
        connection.execute(text("SET LOCAL citus.multi_shard_modify_mode = 'sequential'"))
        keys = _foreign_keys(connection, pending)
        for table, name, _ in keys:
            connection.execute(text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
        # The shards' policies call it on the workers.
        distributed_already = connection.execute(
            text(
                "SELECT 1 FROM pg_dist_object WHERE classid = 'pg_proc'::regclass"
                " AND objid = 'memoria_current_tenant()'::regprocedure"
            )
        ).first()
        if distributed_already is None:
            connection.execute(
                text("SELECT create_distributed_function('memoria_current_tenant()')")
            )
        for table in reference:
            if table in pending:
                _identity_to_sequence(connection, table)
                connection.execute(
                    text("SELECT create_reference_table(CAST(:t AS regclass))"),
                    {"t": f"public.{table}"},
                )
        colocate = next((t for t in distributed if t not in pending), None)
        for table in distributed:
            if table not in pending:
                continue
            connection.execute(
                text(
                    "SELECT create_distributed_table(CAST(:t AS regclass), :c,"
                    " colocate_with => :with)"
                ),
                {"t": f"public.{table}", "c": DISTRIBUTION_COLUMN, "with": colocate or "default"},
            )
            colocate = colocate or table
        for table, name, definition in keys:
            if table in LOCAL_TABLES:
                continue  # see the module docstring: jobs keeps no foreign key
            connection.execute(text(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'))
    for statement in (*_ROUTED_TERM_MATCHES, _SHARDS_COMMON_TERMS):
        connection.execute(text(statement))
    return True


# The lexical searches' functions (migrations 0015 and 0020) read events and messages as the owner,
# confined to the bound tenant by ``tenant_id = memoria_current_tenant()``. On Citus the
# search's query, one tenant's, is sent whole to that tenant's worker, function call included,
# and there the function's own query is a distributed query nested in a shard's query, which
# Citus refuses unless allowed (it could be sent elsewhere, outside the transaction). Here it
# cannot go elsewhere: the tenant is handed over as a bound value, so Citus routes the query to
# the tenant's shard of the same colocation group, the one this node is already reading, and
# runs it locally in the same transaction. Same signatures and results as on PostgreSQL.
_ROUTED_TERM_MATCHES = (
    """
    CREATE OR REPLACE FUNCTION memoria_event_term_matches(
        conversation_keys text[], terms tsquery, time_from timestamptz, time_to timestamptz,
        max_matches integer
    ) RETURNS TABLE (id varchar, lexical tsvector)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public SET citus.allow_nested_distributed_execution = on AS $$
    BEGIN
        RETURN QUERY EXECUTE
            'SELECT e.id, e.lexical FROM events e'
            ' WHERE e.tenant_id = $1 AND e.conversation_key = ANY($2) AND e.lexical @@ $3'
            ' AND ($4 IS NULL OR e.occurred_at >= $4) AND ($5 IS NULL OR e.occurred_at < $5)'
            ' LIMIT $6'
        USING memoria_current_tenant(), conversation_keys, terms, time_from, time_to,
              max_matches;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_message_term_sample(
        conversation_key text, terms tsquery, time_from timestamptz, time_to timestamptz,
        max_matches integer
    ) RETURNS TABLE (seq bigint, lexical tsvector)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public SET citus.allow_nested_distributed_execution = on AS $$
    BEGIN
        RETURN QUERY EXECUTE
            'SELECT m.seq, m.lexical FROM messages m'
            ' WHERE m.tenant_id = $1 AND m.conversation_key = $2 AND m.lexical @@ $3'
            ' AND ($4 IS NULL OR m.sent_at >= $4) AND ($5 IS NULL OR m.sent_at <= $5)'
            ' LIMIT $6'
        USING memoria_current_tenant(), conversation_key, terms, time_from, time_to,
              max_matches;
    END
    $$
    """,
)


# The events' common terms (migration 0009) come from PostgreSQL's statistics of the table,
# which on Citus hold nothing on the coordinator: each shard has its own. Here they are read
# from every shard and weighed by its rows, a term's frequency in the whole table as on
# PostgreSQL. (Without this, a big group's lexical side asked every term on Citus.) It asks
# every shard, about 30 ms on the local test cluster of 32 shards: the service reads it once
# every five minutes per process (``events.repository.common_terms``), inside a request. A
# worker that cannot be reached only leaves its shards out (a shard's failure is a row); one
# that does not answer costs at most the 2 s connection timeout set here, not Citus's 30 s.
_SHARDS_COMMON_TERMS = """
    CREATE OR REPLACE FUNCTION memoria_common_event_terms(min_frequency float8)
    RETURNS TABLE (term text, frequency float8)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
    SET citus.node_connection_timeout = 2000 AS $$
        WITH shards AS (
            SELECT r.result::json AS stats
            FROM run_command_on_shards('public.events', $cmd$
                SELECT json_build_object(
                    'rows', greatest(c.reltuples, 0),
                    'terms', coalesce((
                        SELECT json_agg(json_build_array(e.term, e.frequency))
                        FROM pg_stats s,
                             unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
                                 AS e(term, frequency)
                        WHERE s.tablename = c.relname AND s.attname = 'lexical'
                          AND e.term IS NOT NULL), '[]'::json))
                FROM pg_class c WHERE c.oid = '%s'::regclass
            $cmd$) r
            WHERE r.success
        ),
        total AS (SELECT nullif(sum((stats->>'rows')::float8), 0) AS rows FROM shards),
        terms AS (
            SELECT t.term, sum((s.stats->>'rows')::float8 * t.frequency) / max(total.rows)
                       AS frequency
            FROM shards s CROSS JOIN total,
                 LATERAL (SELECT x->>0 AS term, (x->>1)::float8 AS frequency
                          FROM json_array_elements(s.stats->'terms') x) t
            GROUP BY t.term
        )
        SELECT term, frequency FROM terms WHERE frequency >= min_frequency
    $$
"""
