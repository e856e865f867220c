"""Erasure of a person, a group or a tenant: their rows go, others' mentions of them are
redacted, a tombstone remains.

Which tables hold what of a person is declared by each aggregate (``service.db.registry``):
erasure loops over those declarations. A person's rows are found by their id in id columns
(sender, user, creator, assignee, the profiles of the person and of their memberships, the
rows that reference those), compared for equality. Another person's statement that names
them is kept and loses the name (see ``redaction``); it is never deleted, and nothing is
matched by a pattern built from an id or a name, so a name like "is", "2", "%" or "tags"
touches nobody else's data.

The ``jobs`` table's part is declared by the queue (``service.queue.personal``). A person's
or a group's erasure holds its tenant's erasure fence (``service.queue.repository.erasing``)
from its first statement: a job that read the tenant's rows before it writes nothing after
it, and one writing as it starts commits first, its rows erased here with the rest.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import registry
from service.db.registry import (
    PERSON_FIELDS,
    Erasing,
    PersonalTable,
    Rebuilding,
    Redaction,
)
from service.embedding import Embedder
from service.models import metadata
from service.privacy import keys
from service.privacy.people import find_person
from service.queue import repository as fence

# The column of a group's rows in an export document.
GROUP_FIELDS = ("group_id",)


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


async def _size(session: AsyncSession, parts: list[str], params: dict[str, Any]) -> int:
    """The sum of the declared counts (each a scalar subquery)."""
    if not parts:
        return 0
    sql = "SELECT " + " + ".join(f"({part})" for part in parts)
    return int((await session.execute(text(sql), params)).scalar_one())


async def count_user_rows(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> int:
    """A quick size of a person's data: decides between erasing now and as a job."""
    parts = [t.size_user for t in registry.tables() if t.size_user]
    return await _size(session, parts, {"t": tenant_id, "u": user_id})


async def count_group_rows(session: AsyncSession, tenant_id: uuid.UUID, group_id: str) -> int:
    """A quick size of a group's data."""
    parts = [t.size_group for t in registry.tables() if t.size_group]
    return await _size(session, parts, {"t": tenant_id, "k": f"g:{group_id}"})


async def count_tenant_rows(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    """A quick size of a tenant's data."""
    parts = [t.size_tenant for t in registry.tables() if t.size_tenant]
    return await _size(session, parts, {"t": tenant_id})


async def _erase_copies(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    subject_hash: str,
    names: list[str],
    fields: tuple[str, ...],
    counts: dict[str, int],
) -> None:
    erasing = Erasing(session, tenant_id, kind, subject, subject_hash, names, fields)
    for table in registry.tables():
        if table.erase_copies is not None:
            counts[table.table] = await table.erase_copies(erasing)


async def erase_user(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    embedder: Embedder,
    *,
    requested_by: str | None,
    keep: int,
    spare_job: int | None = None,
) -> dict[str, int]:
    """Erase a person: their rows, and their names in others' statements.

    ``spare_job``: the erasure's own job, which scrubs its payload itself.
    """
    # Before anything is read: a job's transaction under way in the tenant commits first
    # (and what it wrote is erased here), and none that read the person's rows before this
    # erasure commits after it (see ``service.queue.repository.erased_since``).
    await fence.erasing(session, tenant_id)
    person = await find_person(session, tenant_id, user_id)
    key = await keys.secret(session)
    subject = keys.keyed_hash(key, tenant_id, "user", user_id)
    p = {"t": tenant_id, "u": user_id, "pk": person.private_key, "spare": spare_job or 0}
    counts: dict[str, int] = {}
    # Copies first: an export is matched by what it holds before that is deleted.
    await _erase_copies(
        session, tenant_id, "user", user_id, subject, person.needles, PERSON_FIELDS, counts
    )
    # Then what was made of their words and others' (a group's day digest): which rows drew
    # on them is told by their rows, so this runs before those go.
    rebuilding = Rebuilding(
        session, tenant_id, user_id, embedder, counts, tuple(person.unshared.names), subject
    )
    for table in registry.tables():
        if table.rebuild_user is not None:
            await table.rebuild_user(rebuilding)
    for table in registry.tables():
        for name, sql in table.erase_user:
            counts[name] = _rowcount(await session.execute(text(sql), p))
    if person.redactor:
        redaction = Redaction(
            session=session,
            tenant_id=tenant_id,
            person_id=user_id,
            redactor=person.redactor,
            redactor_in=person.redactor_in,
            embedder=embedder,
            keep=keep,
            scope={
                "t": tenant_id,
                "keys": person.conversations,
                "groups": person.groups,
                "peers": person.peers,
                "needles": person.mention_needles,
            },
            counts=counts,
        )
        for table in registry.tables():
            if table.redact is not None:
                await table.redact(redaction)
    await _tombstone(session, tenant_id, "user", subject, requested_by, counts)
    return counts


# ---------------------------------------------------------------- groups and tenants


async def erase_group(
    session: AsyncSession, tenant_id: uuid.UUID, group_id: str, *, requested_by: str | None
) -> dict[str, int]:
    """Erase a group: its conversation, events, memos, memories, profiles, todos, jobs."""
    await fence.erasing(session, tenant_id)  # as a person's (see ``erase_user``)
    p = {"t": tenant_id, "g": group_id, "k": f"g:{group_id}"}
    subject = await keys.subject_hash(session, tenant_id, "group", group_id)
    counts: dict[str, int] = {}
    await _erase_copies(session, tenant_id, "group", group_id, subject, [], GROUP_FIELDS, counts)
    for table in registry.tables():
        for name, sql in table.erase_group:
            counts[name] = _rowcount(await session.execute(text(sql), p))
    await _tombstone(session, tenant_id, "group", subject, requested_by, counts)
    return counts


async def _tombstone(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject_hash: str,
    requested_by: str | None,
    counts: dict[str, int],
) -> None:
    # An erasure that found nothing of a subject already tombstoned adds nothing to know:
    # tombstones are kept for good, and a bot erasing the same person at every turn wrote
    # one a call. A first erasure, even of nothing (a request to keep no data of someone,
    # before any arrives), and every erasure that deleted something, are kept. (Asked apart:
    # on Citus an INSERT … SELECT goes through COPY, which row-level security refuses.)
    params = {"t": tenant_id, "kind": kind, "hash": subject_hash}
    if not any(counts.values()):
        known = await session.execute(
            text(
                "SELECT 1 FROM erasures WHERE tenant_id = :t AND subject_hash = :hash"
                " AND kind = :kind LIMIT 1"
            ),
            params,
        )
        if known.first() is not None:
            return
    await session.execute(
        text(
            "INSERT INTO erasures (tenant_id, kind, subject_hash, requested_by, counts)"
            " VALUES (:t, :kind, :hash, :by, CAST(:counts AS jsonb))"
        ),
        {**params, "by": requested_by, "counts": json.dumps(counts)},
    )


async def was_erased(session: AsyncSession, tenant_id: uuid.UUID, user_ids: list[str]) -> set[str]:
    """Which of these people were erased before (by their tombstones)."""
    wanted = {u for u in user_ids if u}
    if not wanted:
        return set()
    key = await keys.secret(session)
    hashes = {keys.keyed_hash(key, tenant_id, "user", u): u for u in wanted}
    rows = await session.execute(
        text(
            "SELECT subject_hash FROM erasures"
            " WHERE tenant_id = :t AND kind = 'user' AND subject_hash = ANY(:h)"
        ),
        {"t": tenant_id, "h": list(hashes)},
    )
    return {hashes[r.subject_hash] for r in rows}


def tenant_tables() -> list[PersonalTable]:
    """The tables of a tenant's rows, parents before children: the order of a whole-tenant
    export (after the tenant's own row)."""
    return [t for t in registry.tables() if t.tenant_key == "tenant_id" and t.tenant_export]


def tenant_rows() -> list[PersonalTable]:
    """The tables whose rows a tenant's erasure deletes by its id, in the order it does (a
    row's children go with it by cascade)."""
    return [t for t in registry.tables() if t.tenant_erase and t.tenant_key == "tenant_id"]


async def erase_tenant_rows(
    session: AsyncSession, tenant_id: uuid.UUID, table: PersonalTable, limit: int
) -> int:
    """Delete up to ``limit`` of the tenant's rows of ``table``; returns how many."""
    key = ", ".join(c.name for c in metadata.tables[table.table].primary_key.columns)
    result = await session.execute(
        text(
            f"DELETE FROM {table.table} WHERE tenant_id = :t AND ({key}) IN"
            f" (SELECT {key} FROM {table.table} WHERE tenant_id = :t LIMIT :limit)"
        ),
        {"t": tenant_id, "limit": limit},
    )
    return _rowcount(result)


async def erase_tenant(
    session: AsyncSession, tenant_id: uuid.UUID, erased: dict[str, int] | None = None
) -> dict[str, int] | None:
    """Delete a tenant and all its data (keys included); a tombstone remains, with the rows
    counted here added to ``erased`` (those a job deleted before, see ``erase_tenant_rows``).
    None: no such tenant."""
    counts = await _delete_tenant_rows(session, tenant_id, dict(erased or {}))
    tables = [t for t in registry.tables() if t.tenant_erase]
    for table in tables:
        if table.tenant_key != "tenant_id":  # the tenant's own row, last
            gone = await session.execute(
                text(f"DELETE FROM {table.table} WHERE {table.tenant_key} = :t"), {"t": tenant_id}
            )
            if not _rowcount(gone):
                return None
    subject = await keys.subject_hash(session, tenant_id, "tenant", str(tenant_id))
    await _tombstone(session, tenant_id, "tenant", subject, "admin", counts)
    return counts


async def _delete_tenant_rows(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    counts: dict[str, int],
    tables: list[PersonalTable] | None = None,
) -> dict[str, int]:
    """Delete every row of the tenant's in ``tables`` (default: all, its own row aside),
    adding each table's count."""
    for table in tenant_rows() if tables is None else tables:
        result = await session.execute(
            text(f"DELETE FROM {table.table} WHERE tenant_id = :t"), {"t": tenant_id}
        )
        counts[table.table] = counts.get(table.table, 0) + _rowcount(result)
    return counts


# By ix_erasures_tenants: the people's tombstones, years of them, are not read.
RECENTLY_ERASED_TENANTS = text(
    "SELECT DISTINCT tenant_id FROM erasures WHERE kind = 'tenant'"
    " AND created_at > now() - make_interval(secs => :window)"
)


async def sweep_erased_tenants(session: AsyncSession, window_days: float) -> dict[str, int]:
    """Delete the rows still held under tenants erased in the last ``window_days``: written
    after the erasure's last transaction by a request or a job step already under way (on
    Citus no foreign key to ``tenants`` refuses them). Only the tables PostgreSQL's foreign
    keys fence: the audit log's entries after the erasure are its trail (the admin's call,
    keys refused), kept to the audit's retention. Returns the rows per table, if any."""
    recent = await session.execute(RECENTLY_ERASED_TENANTS, {"window": window_days * 86400})
    erased = [r.tenant_id for r in recent]
    if not erased:
        return {}
    # Read apart, not joined: on Citus the tenants and the tombstones are not co-located.
    alive = await session.execute(
        text("SELECT id FROM tenants WHERE id = ANY(:ids)"), {"ids": erased}
    )
    living = {r.id for r in alive}
    fenced = [
        t
        for t in tenant_rows()
        if any(k.column.table.name == "tenants" for k in metadata.tables[t.table].foreign_keys)
    ]
    counts: dict[str, int] = {}
    for tenant_id in erased:
        if tenant_id not in living:
            await _delete_tenant_rows(session, tenant_id, counts, fenced)
    return {table: n for table, n in counts.items() if n}
