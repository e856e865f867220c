"""The SQL of exports: create, fill in chunks, finish, read back, prune, erase."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


# A pending export; it expires like a finished one, so an export whose job never runs is
# pruned all the same.
_CREATE = text(
    """
    INSERT INTO exports (tenant_id, kind, subject_hash, requested_by, expires_at)
    VALUES (:t, :kind, :hash, :by, now() + make_interval(secs => :keep))
    RETURNING id
    """
)


async def create(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject_hash: str,
    keep_seconds: float,
    requested_by: str | None,
) -> int:
    """A pending export, asked for by ``requested_by``; returns its id."""
    params = {
        "t": tenant_id,
        "kind": kind,
        "hash": subject_hash,
        "keep": keep_seconds,
        "by": requested_by,
    }
    return int((await session.execute(_CREATE, params)).scalar_one())


# The same caller's export of the same subject still being written (its job has not finished).
_PENDING_AGAIN = text(
    """
    SELECT id, job_id FROM exports
    WHERE tenant_id = :t AND kind = :kind AND subject_hash = :hash
      AND requested_by IS NOT DISTINCT FROM :by AND ready_at IS NULL AND job_id IS NOT NULL
      AND expires_at > now()
    ORDER BY id DESC LIMIT 1
    """
)


async def pending_again(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject_hash: str,
    requested_by: str | None,
) -> tuple[int, int] | None:
    """(export id, job id) of ``requested_by``'s export of this subject still being written."""
    params = {"t": tenant_id, "kind": kind, "hash": subject_hash, "by": requested_by}
    row = (await session.execute(_PENDING_AGAIN, params)).first()
    return (int(row.id), int(row.job_id)) if row is not None else None


# A tenant's exports kept (pending or ready, not expired), and when the first of them expires.
_KEPT = text(
    """
    SELECT count(*) AS kept, EXTRACT(EPOCH FROM min(expires_at) - now()) AS first_expiry
    FROM exports WHERE tenant_id = :t AND expires_at > now()
    """
)


async def kept(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[int, float]:
    """How many exports the tenant keeps, and the seconds until the first of them expires."""
    row = (await session.execute(_KEPT, {"t": tenant_id})).one()
    return int(row.kept), float(row.first_expiry or 0.0)


async def attach_job(
    session: AsyncSession, tenant_id: uuid.UUID, export_id: int, job_id: int
) -> None:
    """Record the job that writes the export."""
    await session.execute(
        text("UPDATE exports SET job_id = :job WHERE tenant_id = :t AND id = :id"),
        {"t": tenant_id, "id": export_id, "job": job_id},
    )


# Only a pending export takes chunks: a retried job starts from nothing (its earlier attempt
# rolled back), and a ready export is never written twice.
_PENDING = text(
    "SELECT 1 FROM exports WHERE tenant_id = :t AND id = :id AND ready_at IS NULL FOR UPDATE"
)


async def lock_pending(session: AsyncSession, tenant_id: uuid.UUID, export_id: int) -> bool:
    """Lock a pending export for writing; False when it is gone or already written."""
    row = (await session.execute(_PENDING, {"t": tenant_id, "id": export_id})).first()
    return row is not None


async def append_chunk(
    session: AsyncSession, tenant_id: uuid.UUID, export_id: int, seq: int, data: str
) -> None:
    """Store the next piece of the document."""
    await session.execute(
        text(
            "INSERT INTO export_chunks (tenant_id, export_id, seq, data)"
            " VALUES (:t, :id, :seq, :data)"
        ),
        {"t": tenant_id, "id": export_id, "seq": seq, "data": data},
    )


# Ready from now; the retention counts from when the document can be fetched.
_FINISH = text(
    """
    UPDATE exports
    SET ready_at = now(), size_bytes = :size, manifest = CAST(:manifest AS jsonb),
        expires_at = now() + make_interval(secs => :keep)
    WHERE tenant_id = :t AND id = :id AND ready_at IS NULL
    """
)


async def finish(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    export_id: int,
    size: int,
    manifest: dict[str, int],
    keep_seconds: float,
) -> bool:
    """Mark a written export ready; False when it was not pending."""
    params = {
        "t": tenant_id,
        "id": export_id,
        "size": size,
        "manifest": json.dumps(manifest),
        "keep": keep_seconds,
    }
    return _rowcount(await session.execute(_FINISH, params)) == 1


# An expired export is as good as gone, even before the prune reaches it.
_GET = text(
    """
    SELECT id, kind, requested_by, job_id, size_bytes, manifest, created_at, ready_at,
           expires_at
    FROM exports
    WHERE tenant_id = :t AND id = :id AND expires_at > now()
    """
)


async def get(session: AsyncSession, tenant_id: uuid.UUID, export_id: int) -> dict[str, Any] | None:
    """One unexpired export of a tenant."""
    row = (await session.execute(_GET, {"t": tenant_id, "id": export_id})).first()
    return dict(row._mapping) if row is not None else None


async def chunk_page(
    session: AsyncSession, tenant_id: uuid.UUID, export_id: int, after: int, limit: int
) -> list[tuple[int, str]]:
    """The document's next ``limit`` pieces after piece ``after``, in order, with their seq."""
    rows = await session.execute(
        text(
            "SELECT seq, data FROM export_chunks WHERE tenant_id = :t AND export_id = :id"
            " AND seq > :after ORDER BY seq LIMIT :limit"
        ),
        {"t": tenant_id, "id": export_id, "after": after, "limit": limit},
    )
    return [(int(row.seq), str(row.data)) for row in rows]


# Across tenants (the owning role): every export past its expiry, content included (cascade).
_PRUNE = text("DELETE FROM exports WHERE expires_at <= now()")


async def prune(session: AsyncSession) -> int:
    """Delete expired exports; returns how many."""
    return _rowcount(await session.execute(_PRUNE))


# An erased subject's own exports, and any other export that holds a row of theirs (an id
# field equal to their id, as the documents write it) or names them. Plain substring tests:
# nothing from an id or a name is ever read as a pattern.
_ERASE = text(
    """
    DELETE FROM exports AS e
    WHERE e.tenant_id = :t
      AND (e.subject_hash = :hash
           OR EXISTS (SELECT 1 FROM export_chunks AS c, unnest(CAST(:needles AS text[])) AS n
                      WHERE c.tenant_id = e.tenant_id AND c.export_id = e.id
                        AND strpos(c.data, n) > 0))
    """
)


async def erase(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    subject_hash: str,
    subject: str,
    names: list[str],
    fields: tuple[str, ...],
) -> int:
    """Delete the exports of a subject, those holding a row of theirs (``fields`` equal to
    ``subject``) and those naming them; returns how many."""
    value = json.dumps(subject, ensure_ascii=False)
    needles = [f'"{field}": {value}' for field in fields] + names
    params = {"t": tenant_id, "hash": subject_hash, "needles": needles}
    return _rowcount(await session.execute(_ERASE, params))
