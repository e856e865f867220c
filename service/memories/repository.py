"""SQL of memories and their history. Every change goes with a history row (the service
writes both in the caller's transaction)."""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Float, bindparam, select, text, true
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import NullType

from service.db.engine import LAST_USE
from service.db.rows import dicts
from service.memories.models import Memory

_FIELDS = [
    Memory.id,
    Memory.scope,
    Memory.user_id,
    Memory.group_id,
    Memory.category,
    Memory.content,
    Memory.confidence,
    Memory.importance,
    Memory.valid_from,
    Memory.valid_to,
    Memory.is_active,
    Memory.last_used_at,
    Memory.summary_day,
    Memory.evidence,
    Memory.created_at,
    Memory.updated_at,
]


async def insert(session: AsyncSession, tenant_id: uuid.UUID, row: dict[str, Any]) -> int:
    """A new memory; returns its id."""
    result = await session.execute(
        text(
            """
            INSERT INTO memories (tenant_id, scope, user_id, group_id, category, content,
                                  embedding, confidence, importance, valid_from, valid_to,
                                  summary_day, evidence)
            VALUES (:tenant_id, :scope, :user_id, :group_id, :category, :content, :embedding,
                    :confidence, :importance, :valid_from, :valid_to, :summary_day,
                    CAST(:evidence AS jsonb))
            RETURNING id
            """
        ),
        {
            "tenant_id": tenant_id,
            "confidence": 0.5,
            "importance": 0.5,
            "valid_from": None,
            "valid_to": None,
            "summary_day": None,
            **row,
            "evidence": json.dumps(row.get("evidence") or {}, ensure_ascii=False),
        },
    )
    return int(result.scalar_one())


async def get(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: int, *, lock: bool = False
) -> dict[str, Any] | None:
    """One memory (optionally locked for change)."""
    query = select(*_FIELDS).where(Memory.tenant_id == tenant_id, Memory.id == memory_id)
    if lock:
        query = query.with_for_update()
    row = (await session.execute(query)).first()
    return dict(row._mapping) if row is not None else None


async def update(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: int, values: dict[str, Any]
) -> None:
    """Change columns of a memory (``updated_at`` follows)."""
    sets = ", ".join(
        f"{column} = CAST(:{column} AS jsonb)" if column == "evidence" else f"{column} = :{column}"
        for column in values
    )
    params = {**values, "tenant_id": tenant_id, "id": memory_id}
    if "evidence" in values:
        params["evidence"] = json.dumps(values["evidence"], ensure_ascii=False)
    await session.execute(
        text(
            f"UPDATE memories SET {sets}, updated_at = now()"
            " WHERE tenant_id = :tenant_id AND id = :id"
        ),
        params,
    )


async def delete(session: AsyncSession, tenant_id: uuid.UUID, memory_id: int) -> None:
    """Remove a memory row (its vector with it)."""
    await session.execute(
        text("DELETE FROM memories WHERE tenant_id = :tenant_id AND id = :id"),
        {"tenant_id": tenant_id, "id": memory_id},
    )


async def erase(session: AsyncSession, tenant_id: uuid.UUID, memory_id: int) -> None:
    """Remove a memory and its whole history: nothing says it was."""
    params = {"tenant_id": tenant_id, "id": memory_id}
    await session.execute(
        text("DELETE FROM memory_history WHERE tenant_id = :tenant_id AND memory_id = :id"),
        params,
    )
    await session.execute(
        text("DELETE FROM memories WHERE tenant_id = :tenant_id AND id = :id"), params
    )


async def add_history(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: int,
    action: str,
    *,
    old: str | None = None,
    new: str | None = None,
    reason: str | None = None,
    cause: dict[str, Any] | None = None,
) -> None:
    """Record one change of a memory."""
    await session.execute(
        text(
            """
            INSERT INTO memory_history (tenant_id, memory_id, action, old_content, new_content,
                                        reason, cause)
            VALUES (:tenant_id, :memory_id, :action, :old, :new, :reason, CAST(:cause AS jsonb))
            """
        ),
        {
            "tenant_id": tenant_id,
            "memory_id": memory_id,
            "action": action,
            "old": old,
            "new": new,
            "reason": reason,
            "cause": json.dumps(cause or {}, ensure_ascii=False),
        },
    )


async def scrub_history(session: AsyncSession, tenant_id: uuid.UUID, memory_id: int) -> None:
    """After a hard delete the history says only that the memory existed and was deleted."""
    await session.execute(
        text(
            """
            UPDATE memory_history SET old_content = NULL, new_content = NULL, reason = NULL
            WHERE tenant_id = :tenant_id AND memory_id = :memory_id
            """
        ),
        {"tenant_id": tenant_id, "memory_id": memory_id},
    )


async def history(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: int, limit: int, after: int | None
) -> list[dict[str, Any]]:
    """A memory's changes, oldest first: ``limit`` of them after the entry ``after``."""
    rows = await session.execute(
        text(
            """
            SELECT id, memory_id, action, old_content, new_content, reason, cause, created_at
            FROM memory_history WHERE tenant_id = :tenant_id AND memory_id = :memory_id
              AND (CAST(:after AS bigint) IS NULL OR id > :after)
            ORDER BY id
            LIMIT :limit
            """
        ),
        {"tenant_id": tenant_id, "memory_id": memory_id, "limit": limit, "after": after},
    )
    return dicts(rows)


async def has_history(session: AsyncSession, tenant_id: uuid.UUID, memory_id: int) -> bool:
    """Whether the memory ever existed (its history outlives a hard delete)."""
    found = await session.execute(
        text(
            "SELECT 1 FROM memory_history WHERE tenant_id = :tenant_id AND memory_id = :memory_id"
            " LIMIT 1"
        ),
        {"tenant_id": tenant_id, "memory_id": memory_id},
    )
    return found.first() is not None


async def listing(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    where: ColumnElement[bool],
    limit: int,
    before: int | None,
) -> list[dict[str, Any]]:
    """Memories matching ``where``, newest first, paginated by id."""
    query = (
        select(*_FIELDS)
        .where(Memory.tenant_id == tenant_id, where)
        .where(Memory.id < before if before else true())
        .order_by(Memory.id.desc())
        .limit(limit)
    )
    return dicts(await session.execute(query))


async def nearest(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    vector: np.ndarray[Any, Any],
    *,
    where: ColumnElement[bool],
    limit: int,
    with_vectors: bool = False,
) -> list[dict[str, Any]]:
    """Memories nearest to ``vector`` among those matching ``where`` (exact, small sets),
    each with its cosine (``score``) and, ``with_vectors``, its own vector (``embedding``)."""
    # An untyped parameter: the connection's binary vector codec encodes the array itself.
    distance = Memory.embedding.op("<=>", return_type=Float())(
        bindparam("vector", vector, type_=NullType())
    )
    fields = [*_FIELDS, Memory.embedding] if with_vectors else _FIELDS
    query = (
        select(*fields, (1 - distance).label("score"))
        .where(Memory.tenant_id == tenant_id, Memory.embedding.is_not(None), where)
        .order_by(distance)
        .limit(limit)
    )
    return dicts(await session.execute(query))


async def vectors(
    session: AsyncSession, tenant_id: uuid.UUID, *, where: ColumnElement[bool]
) -> list[dict[str, Any]]:
    """Id, binding and vector of the memories matching ``where``, newest first."""
    query = (
        select(
            Memory.id,
            Memory.scope,
            Memory.user_id,
            Memory.group_id,
            Memory.content,
            Memory.embedding,
        )
        .where(Memory.tenant_id == tenant_id, Memory.embedding.is_not(None), where)
        .order_by(Memory.id.desc())
        .limit(5000)
    )
    return dicts(await session.execute(query))


async def touch(session: AsyncSession, tenant_id: uuid.UUID, ids: list[int]) -> None:
    """Retrieval counts as use (forgetting spares what is used).

    A session opened by ``Database`` hands the ids to the process's ``LastUse`` batch, which
    writes them to the primary within seconds: the read itself writes nothing (so a read
    replica can serve it). Any other session writes them at once.
    """
    last_use = session.info.get(LAST_USE)
    if last_use is not None:
        last_use.record("memories", tenant_id, ids)
    elif ids:
        await session.execute(
            text(
                "UPDATE memories SET last_used_at = now()"
                " WHERE tenant_id = :tenant_id AND id = ANY(:ids)"
            ),
            {"tenant_id": tenant_id, "ids": ids},
        )


async def summary_of_day(
    session: AsyncSession, tenant_id: uuid.UUID, group_id: str, day: date
) -> dict[str, Any] | None:
    """The group's SUMMARY memory of one day, if any."""
    query = select(*_FIELDS).where(
        Memory.tenant_id == tenant_id,
        Memory.group_id == group_id,
        Memory.category == "SUMMARY",
        Memory.summary_day == day,
    )
    row = (await session.execute(query.with_for_update())).first()
    return dict(row._mapping) if row is not None else None


_EXPIRED = text(
    """
    UPDATE memories SET is_active = false, updated_at = now()
    WHERE tenant_id = :tenant_id AND is_active AND valid_to IS NOT NULL AND valid_to < :now
    RETURNING id, content
    """
)

_DECAY = text(
    """
    UPDATE memories SET importance = importance * :factor, updated_at = now()
    WHERE tenant_id = :tenant_id AND is_active AND category <> 'SUMMARY'
      AND COALESCE(last_used_at, created_at) < :unused_since
    RETURNING id
    """
)

_FADED = text(
    """
    UPDATE memories SET is_active = false, valid_to = COALESCE(valid_to, :now), updated_at = now()
    WHERE tenant_id = :tenant_id AND is_active AND importance < :threshold
      AND COALESCE(last_used_at, created_at) < :unused_since
    RETURNING id, content
    """
)


async def expire(session: AsyncSession, tenant_id: uuid.UUID, now: datetime) -> list[Any]:
    """Deactivate memories whose validity ended."""
    return list(await session.execute(_EXPIRED, {"tenant_id": tenant_id, "now": now}))


async def decay(
    session: AsyncSession, tenant_id: uuid.UUID, factor: float, unused_since: datetime
) -> int:
    """Lower the importance of memories nobody used lately."""
    rows = await session.execute(
        _DECAY, {"tenant_id": tenant_id, "factor": factor, "unused_since": unused_since}
    )
    return len(rows.all())


async def fade(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    threshold: float,
    unused_since: datetime,
    now: datetime,
) -> list[Any]:
    """Deactivate low-importance memories unused for long."""
    params = {
        "tenant_id": tenant_id,
        "threshold": threshold,
        "unused_since": unused_since,
        "now": now,
    }
    return list(await session.execute(_FADED, params))
