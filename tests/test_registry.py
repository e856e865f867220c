"""The registry against the live schema: no text, JSON or vector column escapes erasure,
export or re-embedding unnoticed, and the vector index is the one defined in code."""

from __future__ import annotations

import asyncpg
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from service.db import registry
from service.db.rls import create_vector_index
from service.events.vectors import EVENT_VECTORS_SCAN
from tests.conftest import raw_connection

# Every column of a table in the public schema whose type can hold what a person said or
# is: text of any kind, JSON, and vectors made from text.
_COLUMNS = """
SELECT c.relname AS table_name, a.attname AS column_name, t.typname AS type_name
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
  AND t.typname IN ('text', 'varchar', 'bpchar', 'json', 'jsonb', 'vector', 'halfvec',
                    'sparsevec', '_text', '_varchar')
ORDER BY c.relname, a.attnum
"""

_TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
"""

_VECTOR_TYPES = {"vector", "halfvec", "sparsevec"}


async def undeclared(conn: asyncpg.Connection) -> list[str]:
    """What the live schema holds that no aggregate declares (or declares wrongly)."""
    declared = {t.table: t for t in registry.tables()}
    embedded = {(e.table, e.vector) for e in registry.embedded()}
    derived = {(d.table, d.column) for d in registry.derived()}
    problems: list[str] = []
    for record in await conn.fetch(_TABLES):
        if record["relname"] not in declared:
            problems.append(f"table {record['relname']}: declared by no aggregate")
    for record in await conn.fetch(_COLUMNS):
        table, column, kind = record["table_name"], record["column_name"], record["type_name"]
        entry = declared.get(table)
        if entry is None:
            continue
        covered = (*entry.ids, *entry.personal, *entry.not_personal, *entry.hidden)
        if column not in covered:
            problems.append(
                f"{table}.{column} ({kind}): neither personal (erased, exported) nor declared"
                " not personal with a reason"
            )
        if kind in _VECTOR_TYPES and (table, column) not in embedded | derived:
            problems.append(f"{table}.{column} ({kind}): not registered for re-embedding")
    return problems


async def stale(conn: asyncpg.Connection) -> list[str]:
    """Declarations naming tables or columns the schema does not have."""
    columns: dict[str, set[str]] = {}
    for record in await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'public'"
    ):
        columns.setdefault(record["table_name"], set()).add(record["column_name"])
    problems = []
    for entry in registry.tables():
        named = (*entry.ids, *entry.personal, *entry.not_personal, *entry.hidden)
        for column in named:
            if column not in columns.get(entry.table, set()):
                problems.append(f"{entry.table}.{column}: declared, but not in the schema")
    for e in registry.embedded():
        for column in (*e.key, *e.source, e.vector):
            if column not in columns.get(e.table, set()):
                problems.append(f"{e.table}.{column}: embedded, but not in the schema")
    return problems


async def test_every_text_json_and_vector_column_is_declared(db_url: str) -> None:
    async with raw_connection(db_url) as conn:
        assert await undeclared(conn) == []
        assert await stale(conn) == []


async def test_a_new_column_or_table_is_reported(db_url: str) -> None:
    """A text column added without a declaration, a vector column nobody re-embeds and a
    new table are each caught; so is a declaration whose column was dropped."""
    async with raw_connection(db_url) as conn:
        dim = int(await conn.fetchval("SELECT value FROM memoria_meta WHERE key = 'embedding_dim'"))
        await conn.execute("ALTER TABLE memos ADD COLUMN mood text")
        await conn.execute("ALTER TABLE todos ADD COLUMN notes jsonb")
        await conn.execute(f"ALTER TABLE memories ADD COLUMN summary_vector vector({dim})")
        await conn.execute("CREATE TABLE nicknames (tenant_id uuid, nickname varchar(50))")
        await conn.execute("ALTER TABLE profiles DROP COLUMN source_event_id")
        problems = "\n".join(await undeclared(conn))
        assert "memos.mood (text)" in problems
        assert "todos.notes (jsonb)" in problems
        assert "memories.summary_vector (vector): neither" in problems
        assert "memories.summary_vector (vector): not registered for re-embedding" in problems
        assert "table nicknames: declared by no aggregate" in problems
        assert len(problems.splitlines()) == 5
        assert await stale(conn) == ["profiles.source_event_id: declared, but not in the schema"]


def test_not_personal_columns_say_why() -> None:
    for entry in registry.tables():
        for column, reason in entry.not_personal.items():
            assert reason.strip(), f"{entry.table}.{column}: no reason given"
        clash = set(entry.personal) & set(entry.not_personal)
        assert not clash, f"{entry.table}: both personal and not: {clash}"


def test_every_vector_made_from_text_is_personal_and_every_table_once() -> None:
    names = [t.table for t in registry.tables()]
    assert len(names) == len(set(names))
    declared = {t.table: t for t in registry.tables()}
    for e in registry.embedded():
        assert e.vector in declared[e.table].personal, f"{e.table}.{e.vector}"
        assert len(e.key) == len(e.key_types)
    for d in registry.derived():
        assert d.column in declared[d.table].personal, f"{d.table}.{d.column}"


async def test_the_vector_index_is_the_one_defined_in_code(db_url: str) -> None:
    async with raw_connection(db_url) as conn:
        dim = int(await conn.fetchval("SELECT value FROM memoria_meta WHERE key = 'embedding_dim'"))
        live = await conn.fetchval(
            "SELECT pg_get_indexdef(CAST($1 AS regclass))", EVENT_VECTORS_SCAN.name
        )
        storage = await conn.fetchval(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = CAST($1 AS regclass)"
            " AND attname = $2",
            EVENT_VECTORS_SCAN.table,
            EVENT_VECTORS_SCAN.vector_column,
        )
    normalised = live.replace("public.", "").replace(" USING btree", "")
    assert normalised == EVENT_VECTORS_SCAN.create_sql(dim)
    # Kept in the rows exactly when the index cannot carry the vectors.
    assert (storage == "m") == (EVENT_VECTORS_SCAN.storage(dim) == "MAIN")


def test_the_index_definition_at_both_sides_of_the_covering_limit() -> None:
    index = EVENT_VECTORS_SCAN
    limit = index.covering_max_dim
    assert limit is not None
    assert index.create_sql(limit).endswith("INCLUDE (event_id, embedding)")
    assert index.storage(limit) == "EXTERNAL"
    assert index.create_sql(limit + 1).endswith("INCLUDE (event_id)")
    assert index.storage(limit + 1) == "MAIN"


async def test_the_migration_helper_creates_the_index_as_defined(db_url: str) -> None:
    """A future migration that rebuilds the index gets the same definition."""
    async with raw_connection(db_url) as conn:
        before = await conn.fetchval(
            "SELECT pg_get_indexdef(CAST($1 AS regclass))", EVENT_VECTORS_SCAN.name
        )
        await conn.execute(EVENT_VECTORS_SCAN.drop_sql())
    engine = create_async_engine(db_url)
    try:
        async with engine.begin() as connection:

            def migrate(sync_conn: object) -> None:
                context = MigrationContext.configure(sync_conn)  # type: ignore[arg-type]
                with Operations.context(context):
                    create_vector_index(EVENT_VECTORS_SCAN)

            await connection.run_sync(migrate)
            after = (
                await connection.execute(
                    text("SELECT pg_get_indexdef(CAST(:name AS regclass))"),
                    {"name": EVENT_VECTORS_SCAN.name},
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    assert after == before
