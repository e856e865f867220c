"""SQL of re-embedding: runs, progress, the shadow columns, and the switch.

While a run goes on, each table with vectors has a shadow column ``embedding_next`` of the
new type, filled batch by batch; searches keep reading ``embedding``. A trigger empties a
row's shadow whenever its vector changes (new text, a first vector), so a shadow vector is
always made from the row's current text. The switch swaps the columns in one transaction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import Vector
from sqlalchemy import Row, TextClause, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import registry
from service.db.registry import Embedded
from service.reembed.models import ACTIVE, ReembedRun

# A table whose rows carry an embedding of their text, as its aggregate declares it.
VectorTable = Embedded


def vector_tables() -> list[VectorTable]:
    """Every table with vectors made from text (``service.db.registry``)."""
    return registry.embedded()


def vector_table(name: str) -> VectorTable:
    """One table with vectors, by name; KeyError when there is none."""
    for table in vector_tables():
        if table.name == name:
            return table
    raise KeyError(name)


# ---------------------------------------------------------------- runs


async def lock_runs(session: AsyncSession) -> None:
    """Serialize run starts, so two operators cannot both start one."""
    await session.execute(text("LOCK TABLE reembed_runs IN SHARE ROW EXCLUSIVE MODE"))


async def active_run(session: AsyncSession) -> ReembedRun | None:
    """The run that is embedding or switching, if any."""
    query = select(ReembedRun).where(ReembedRun.status.in_(ACTIVE)).order_by(ReembedRun.id.desc())
    return (await session.execute(query.limit(1))).scalar_one_or_none()


async def latest_run(session: AsyncSession) -> ReembedRun | None:
    """The newest run, whatever its status."""
    query = select(ReembedRun).order_by(ReembedRun.id.desc()).limit(1)
    return (await session.execute(query)).scalar_one_or_none()


async def get_run(session: AsyncSession, run_id: int, *, lock: bool = False) -> ReembedRun | None:
    """One run; ``lock`` holds its row for this transaction (status changes are serialized)."""
    query = select(ReembedRun).where(ReembedRun.id == run_id)
    if lock:
        query = query.with_for_update()
    return (await session.execute(query)).scalar_one_or_none()


async def switched_to(session: AsyncSession, model: str, dimensions: int) -> ReembedRun | None:
    """The newest finished run that made the stored vectors with this model, if any."""
    exists = await session.execute(text("SELECT to_regclass('public.reembed_runs')"))
    if exists.scalar_one() is None:  # a schema older than re-embedding
        return None
    query = (
        select(ReembedRun)
        .where(
            ReembedRun.status == "done",
            ReembedRun.model_name == model,
            ReembedRun.dimensions == dimensions,
        )
        .order_by(ReembedRun.id.desc())
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def insert_run(session: AsyncSession, values: dict[str, Any]) -> int:
    """Record a new run; returns its id."""
    result = await session.execute(
        text(
            """
            INSERT INTO reembed_runs (provider, model_name, dimensions, api_url, batch_size,
                                      previous_model, previous_dimensions)
            VALUES (:provider, :model_name, :dimensions, :api_url, :batch_size,
                    :previous_model, :previous_dimensions)
            RETURNING id
            """
        ),
        values,
    )
    return int(result.scalar_one())


async def set_status(session: AsyncSession, run_id: int, status: str) -> None:
    """Move a run on; finished runs get their end time."""
    await session.execute(
        text(
            "UPDATE reembed_runs SET status = :status,"
            " finished_at = CASE WHEN :finished THEN now() END WHERE id = :id"
        ),
        {"id": run_id, "status": status, "finished": status not in ACTIVE},
    )


async def count_caught_up(session: AsyncSession, run_id: int, rows: int) -> None:
    """Add rows embedded by the switch's catch-up to the run's tally."""
    await session.execute(
        text("UPDATE reembed_runs SET caught_up = caught_up + :n WHERE id = :id"),
        {"id": run_id, "n": rows},
    )


# ---------------------------------------------------------------- progress


async def tenant_ids(session: AsyncSession) -> list[uuid.UUID]:
    """Every tenant (a system transaction)."""
    return [r.id for r in await session.execute(text("SELECT id FROM tenants ORDER BY id"))]


async def insert_progress(
    session: AsyncSession, tenant_id: uuid.UUID, run_id: int, table: str
) -> None:
    """A tenant's pass over a table, not started."""
    await session.execute(
        text(
            "INSERT INTO reembed_progress (tenant_id, run_id, table_name)"
            " VALUES (:tenant_id, :run_id, :table)"
        ),
        {"tenant_id": tenant_id, "run_id": run_id, "table": table},
    )


@dataclass(frozen=True)
class Progress:
    """Where a tenant's pass over a table stands."""

    cursor: list[Any] | None
    rows_total: int | None
    rows_done: int
    batches: int
    finished: bool


async def lock_progress(
    session: AsyncSession, tenant_id: uuid.UUID, run_id: int, table: str
) -> Progress | None:
    """The pass, locked: a second job of the same pass waits, then starts where this ends."""
    row = (
        await session.execute(
            text(
                """
                SELECT cursor, rows_total, rows_done, batches, finished_at IS NOT NULL AS finished
                FROM reembed_progress
                WHERE tenant_id = :tenant_id AND run_id = :run_id AND table_name = :table
                FOR UPDATE
                """
            ),
            {"tenant_id": tenant_id, "run_id": run_id, "table": table},
        )
    ).first()
    return Progress(**row._mapping) if row is not None else None


async def advance(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    run_id: int,
    table: str,
    *,
    cursor: list[Any] | None,
    written: int,
    total: int | None,
    finished: bool,
) -> None:
    """Record a batch (or the end of the pass) in the batch's own transaction."""
    await session.execute(
        text(
            """
            UPDATE reembed_progress
            SET cursor = COALESCE(CAST(:cursor AS jsonb), cursor),
                rows_done = rows_done + :written,
                rows_total = COALESCE(rows_total, :total),
                batches = batches + CASE WHEN :written_batch THEN 1 ELSE 0 END,
                finished_at = CASE WHEN :finished THEN now() END,
                updated_at = now()
            WHERE tenant_id = :tenant_id AND run_id = :run_id AND table_name = :table
            """
        ),
        {
            "tenant_id": tenant_id,
            "run_id": run_id,
            "table": table,
            "cursor": json.dumps(cursor) if cursor is not None else None,
            "written": written,
            "written_batch": cursor is not None,
            "total": total,
            "finished": finished,
        },
    )


async def unfinished_passes(session: AsyncSession, run_id: int) -> int:
    """Passes of the run (all tenants) not at their end yet."""
    result = await session.execute(
        text(
            "SELECT count(*) FROM reembed_progress WHERE run_id = :run_id AND finished_at IS NULL"
        ),
        {"run_id": run_id},
    )
    return int(result.scalar_one())


@dataclass(frozen=True)
class TableProgress:
    """One table's progress summed over tenants."""

    table: str
    rows_done: int
    rows_total: int
    passes_open: int


async def table_progress(session: AsyncSession, run_id: int) -> list[TableProgress]:
    """Per table: rows embedded, rows seen at the passes' start, passes still going."""
    rows = await session.execute(
        text(
            """
            SELECT table_name, sum(rows_done) AS done, sum(COALESCE(rows_total, 0)) AS total,
                   count(*) FILTER (WHERE finished_at IS NULL) AS open
            FROM reembed_progress WHERE run_id = :run_id GROUP BY table_name
            """
        ),
        {"run_id": run_id},
    )
    found = {r.table_name: r for r in rows}
    out = []
    for table in vector_tables():
        r = found.get(table.name)
        done, total, open_ = (int(r.done), int(r.total), int(r.open)) if r else (0, 0, 0)
        # Rows written during the pass, ahead of its cursor, are embedded too.
        out.append(TableProgress(table.name, done, max(total, done), open_))
    return out


async def open_passes(session: AsyncSession, run_id: int) -> list[tuple[uuid.UUID, str, int]]:
    """The run's unfinished passes: (tenant, table, batches so far)."""
    rows = await session.execute(
        text(
            """
            SELECT tenant_id, table_name, batches FROM reembed_progress
            WHERE run_id = :run_id AND finished_at IS NULL
            """
        ),
        {"run_id": run_id},
    )
    return [(r.tenant_id, r.table_name, int(r.batches)) for r in rows]


async def delete_progress(session: AsyncSession, run_id: int) -> None:
    """Forget a cancelled run's passes."""
    await session.execute(
        text("DELETE FROM reembed_progress WHERE run_id = :run_id"), {"run_id": run_id}
    )


# ---------------------------------------------------------------- shadow columns


async def bound_lock_waits(session: AsyncSession, seconds: float) -> None:
    """Give up on a table lock after ``seconds`` rather than queue every query behind us."""
    await session.execute(text(f"SET LOCAL lock_timeout = '{int(seconds * 1000)}ms'"))


async def add_shadows(session: AsyncSession, dimensions: int) -> None:
    """The shadow column of the new type, and its trigger, on every table with vectors."""
    for table in vector_tables():
        # No default: adding the column only changes the catalog, whatever the table's size.
        await session.execute(
            text(f"ALTER TABLE {table.name} ADD COLUMN embedding_next vector({int(dimensions)})")
        )
        await session.execute(
            text(
                f"""
                CREATE TRIGGER {table.trigger} BEFORE UPDATE OF embedding ON {table.name}
                FOR EACH ROW WHEN (NEW.embedding IS DISTINCT FROM OLD.embedding)
                EXECUTE FUNCTION memoria_reembed_stale()
                """
            )
        )


async def drop_shadows(session: AsyncSession) -> None:
    """Remove the shadow columns and triggers (a cancelled run)."""
    for table in vector_tables():
        await session.execute(text(f"DROP TRIGGER IF EXISTS {table.trigger} ON {table.name}"))
        await session.execute(
            text(f"ALTER TABLE {table.name} DROP COLUMN IF EXISTS embedding_next")
        )


def _selected(table: VectorTable) -> str:
    return ", ".join(("tenant_id", *table.key, *table.source))


def _after_cursor(table: VectorTable) -> str:
    keys = ", ".join(table.key)
    marks = ", ".join(f":c{i}" for i in range(len(table.key)))
    return f"AND ({keys}) > ({marks})"


async def count_vectors(session: AsyncSession, table: VectorTable, tenant_id: uuid.UUID) -> int:
    """A tenant's rows that have a vector to remake."""
    result = await session.execute(
        text(
            f"SELECT count(*) FROM {table.name}"
            " WHERE tenant_id = :tenant_id AND embedding IS NOT NULL"
        ),
        {"tenant_id": tenant_id},
    )
    return int(result.scalar_one())


async def next_batch(
    session: AsyncSession,
    table: VectorTable,
    tenant_id: uuid.UUID,
    cursor: list[Any] | None,
    limit: int,
) -> list[Row[Any]]:
    """The tenant's next rows after ``cursor`` in key order still lacking a shadow vector.

    The key order is the primary key's, so each batch is one range of that index.
    """
    params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit}
    after = ""
    if cursor is not None:
        after = _after_cursor(table)
        params.update({f"c{i}": value for i, value in enumerate(cursor)})
    sql = f"""
        SELECT {_selected(table)} FROM {table.name}
        WHERE tenant_id = :tenant_id AND embedding IS NOT NULL AND embedding_next IS NULL
          {after}
        ORDER BY {", ".join(table.key)}
        LIMIT :limit
    """
    return list(await session.execute(text(sql), params))


async def stale_rows(session: AsyncSession, table: VectorTable, limit: int) -> list[Row[Any]]:
    """Rows of any tenant lacking a shadow vector (written or changed during the run)."""
    sql = f"""
        SELECT {_selected(table)} FROM {table.name}
        WHERE embedding IS NOT NULL AND embedding_next IS NULL
        LIMIT :limit
    """
    return list(await session.execute(text(sql), {"limit": limit}))


def _write_statement(table: VectorTable) -> TextClause:
    keys = [f"k{i}" for i in range(len(table.key))]
    sources = [f"s{i}" for i in range(len(table.source))]
    arrays = ", ".join(
        [
            "CAST(:tenants AS uuid[])",
            *(f"CAST(:{k} AS {t}[])" for k, t in zip(keys, table.key_types, strict=True)),
            "CAST(:vectors AS vector[])",
            *(f"CAST(:{s} AS text[])" for s in sources),
        ]
    )
    names = ", ".join(["tenant_id", *keys, "vector", *sources])
    matches = " AND ".join(
        [
            "r.tenant_id = v.tenant_id",
            *(f"r.{c} = v.{k}" for c, k in zip(table.key, keys, strict=True)),
            # The text embedded must still be the row's: a row rewritten since it was read
            # keeps no shadow, and is embedded again later.
            *(
                f"r.{c} IS NOT DISTINCT FROM v.{s}"
                for c, s in zip(table.source, sources, strict=True)
            ),
        ]
    )
    return text(
        f"""
        UPDATE {table.name} AS r SET embedding_next = v.vector
        FROM unnest({arrays}) AS v({names})
        WHERE {matches} AND r.embedding IS NOT NULL AND r.embedding_next IS NULL
        """
    )


async def write_shadows(
    session: AsyncSession,
    table: VectorTable,
    rows: Sequence[Row[Any]],
    vectors: Sequence[np.ndarray[Any, Any]],
) -> int:
    """Store new vectors of rows as read; returns how many rows still had that text."""
    if not rows:
        return 0
    params: dict[str, Any] = {
        "tenants": [r.tenant_id for r in rows],
        # pgvector's Vector, not bare arrays: asyncpg would read an array as a dimension.
        "vectors": [Vector(v) for v in vectors],
    }
    for i, column in enumerate(table.key):
        params[f"k{i}"] = [getattr(r, column) for r in rows]
    for i, column in enumerate(table.source):
        params[f"s{i}"] = [getattr(r, column) for r in rows]
    result = await session.execute(_write_statement(table), params)
    return int(getattr(result, "rowcount", 0))


# ---------------------------------------------------------------- the switch


async def lock_tables(session: AsyncSession) -> None:
    """Hold every table with vectors for the switch, and the tables of their copies: no
    writes, no reads of the old vectors."""
    names: list[str] = []
    for table in vector_tables():
        names.append(table.name)
        names += [d.table for d in registry.derived() if d.source.split(".")[0] == table.name]
    unique = list(dict.fromkeys(names))
    await session.execute(text(f"LOCK TABLE {', '.join(unique)} IN ACCESS EXCLUSIVE MODE"))


# Indexes that read the vector column (in a key, an expression or a predicate), as SQL.
_INDEXES_ON_VECTORS = text(
    """
    SELECT DISTINCT pg_get_indexdef(d.objid) AS definition
    FROM pg_depend d
    JOIN pg_class i ON i.oid = d.objid AND i.relkind = 'i'
    JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE d.classid = 'pg_class'::regclass AND d.refobjid = CAST(:table AS regclass)
      AND a.attname = 'embedding'
    """
)


async def swap_columns(session: AsyncSession, table: VectorTable) -> None:
    """The shadow column becomes ``embedding``; the indexes on the old one are rebuilt on it.

    Dropping and renaming columns only changes the catalog; the old vectors' bytes stay in
    the rows until they are next rewritten (VACUUM FULL gives the space back at once).
    """
    indexes = [
        r.definition for r in await session.execute(_INDEXES_ON_VECTORS, {"table": table.name})
    ]
    await session.execute(text(f"DROP TRIGGER {table.trigger} ON {table.name}"))
    await session.execute(text(f"ALTER TABLE {table.name} DROP COLUMN embedding"))
    await session.execute(
        text(f"ALTER TABLE {table.name} RENAME COLUMN embedding_next TO embedding")
    )
    connection = await session.connection()
    for definition in indexes:
        # As the catalog wrote it: no bind parameters to parse.
        await connection.exec_driver_sql(definition)


async def release_copies(session: AsyncSession) -> None:
    """Let go of the copies that hold on to the vector columns about to be swapped."""
    for copy in registry.derived():
        if copy.release is not None:
            await copy.release(session)


async def rebuild_copies(session: AsyncSession, dimensions: int) -> None:
    """Remake the vectors copied from the new ones (the events' half-precision copies and
    their covering index, as their one definition says)."""
    for copy in registry.derived():
        await copy.rebuild(session, dimensions)


async def record_model(session: AsyncSession, model: str, dimensions: int) -> None:
    """The model and dimension the stored vectors now belong to."""
    for key, value in (("embedding_model", model), ("embedding_dim", str(dimensions))):
        await session.execute(
            text(
                "INSERT INTO memoria_meta (key, value) VALUES (:key, :value)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ),
            {"key": key, "value": value},
        )
