"""The schema: migrations agree with the models; tenant tables are shaped for RLS and Citus."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from service.db.base import GLOBAL_TABLES
from service.db.types import compare_type
from service.models import metadata
from tests.conftest import DatabaseFactory, raw_connection


async def test_migrations_and_models_agree(db_url: str) -> None:
    engine = create_async_engine(db_url)
    try:
        async with engine.connect() as conn:

            def diff(sync_conn: object) -> list[object]:
                context = MigrationContext.configure(sync_conn, opts={"compare_type": compare_type})  # type: ignore[arg-type]
                return list(compare_metadata(context, metadata))

            differences = await conn.run_sync(diff)
    finally:
        await engine.dispose()
    assert differences == [], f"migrations and models differ: {differences}"


_TABLES = """
SELECT c.oid, c.relname, c.relrowsecurity
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
"""

# Every primary key, unique constraint, unique index and foreign key, with its columns in order.
_KEYS = """
SELECT con.conname::text AS name, con.contype::text AS kind,
       ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
             ORDER BY k.ord)::text[] AS columns
FROM pg_constraint con WHERE con.conrelid = $1 AND con.contype IN ('p', 'u', 'f')
UNION ALL
SELECT ic.relname::text, 'i'::text,
       ARRAY(SELECT a.attname FROM unnest(ix.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum
             ORDER BY k.ord)::text[]
FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid
WHERE ix.indrelid = $1 AND ix.indisunique
"""


async def test_every_tenant_table_leads_its_keys_with_tenant_id_and_has_rls(db_url: str) -> None:
    problems: list[str] = []
    async with raw_connection(db_url) as conn:
        tables = await conn.fetch(_TABLES)
        tenant_tables = [t for t in tables if t["relname"] not in GLOBAL_TABLES]
        assert tenant_tables, "no tenant tables found"
        for table in tenant_tables:
            name = table["relname"]
            keys = await conn.fetch(_KEYS, table["oid"])
            if not any(k["kind"] == "p" for k in keys):
                problems.append(f"{name}: no primary key")
            for key in keys:
                if not key["columns"] or key["columns"][0] != "tenant_id":
                    problems.append(
                        f"{name}.{key['name']} ({key['kind']}) leads with {key['columns']}"
                    )
            if not table["relrowsecurity"]:
                problems.append(f"{name}: row-level security is not enabled")
            policies = await conn.fetch(
                "SELECT qual, with_check FROM pg_policies WHERE tablename = $1", name
            )
            if not any("memoria_current_tenant()" in (p["qual"] or "") for p in policies):
                problems.append(f"{name}: no tenant policy")
        # The tenants table itself is protected by RLS on its id.
        tenants = next(t for t in tables if t["relname"] == "tenants")
        assert tenants["relrowsecurity"]
        # Tables are never owned by the application role (an owner would bypass RLS).
        owners = await conn.fetch(
            "SELECT tablename FROM pg_tables"
            " WHERE schemaname = 'public' AND tableowner = 'memoria_app'"
        )
        problems += [f"{r['tablename']}: owned by memoria_app" for r in owners]
    assert problems == []


async def test_the_catalog_check_catches_a_bad_table(db_url: str) -> None:
    """The walk above must fail on a table that breaks the rule (so it can fail at all)."""
    async with raw_connection(db_url) as conn:
        await conn.execute(
            "CREATE TABLE bad_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, body text)"
        )
        table = await conn.fetchrow(_TABLES + " AND c.relname = 'bad_notes'")
        keys = await conn.fetch(_KEYS, table["oid"])
        assert keys
        assert all(k["columns"] == ["id"] for k in keys)  # the walk would report each one
        assert table["relrowsecurity"] is False


async def test_migrations_apply_to_an_empty_database_twice_without_error(
    databases: DatabaseFactory,
) -> None:
    from service.db.migrate import upgrade_to_head
    from service.settings import Settings

    url = await databases.create_empty()
    await asyncio.to_thread(upgrade_to_head, url, Settings())
    await asyncio.to_thread(upgrade_to_head, url, Settings())  # already at head: a no-op
    async with raw_connection(url) as conn:
        assert (
            await conn.fetchval("SELECT value FROM memoria_meta WHERE key = 'embedding_dim'")
            == "384"
        )
        assert (
            await conn.fetchval("SELECT extname FROM pg_extension WHERE extname = 'vector'")
            == "vector"
        )


async def test_the_tables_read_by_index_only_scans_are_vacuumed_early(db_url: str) -> None:
    # Fresh rows cost a heap visit each in an index-only scan until a vacuum marks their
    # pages all-visible: the tables the searches read so are vacuumed after ~1% of changes.
    async with raw_connection(db_url) as conn:
        options = {
            row["relname"]: set(row["reloptions"] or [])
            for row in await conn.fetch(
                "SELECT relname, reloptions FROM pg_class"
                " WHERE relname IN ('messages', 'event_vectors')"
            )
        }
    assert "autovacuum_vacuum_insert_scale_factor=0.01" in options["event_vectors"]
    assert {
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_insert_scale_factor=0.01",
    } <= options["messages"]
