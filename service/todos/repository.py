"""SQL of todos."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts

_COLUMNS = """id, conversation_key, group_id, user_id, creator_id, assignee_id, description,
              trigger_time, status, evidence, delivered_at, created_at, updated_at, completed_at"""


# One writer of a conversation's todos at a time (the check for the same pending todo and the
# insert after it; a transaction's lock, as the conversation's messages take theirs).
_LOCK_CONVERSATION = text(
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'todos/' || CAST(:tenant_id AS text) || '/' || :conversation_key, 0))"
)
_SAME_PENDING = text(
    f"""
    SELECT {_COLUMNS} FROM todos
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND status = 'PENDING' AND description = :description
      AND trigger_time IS NOT DISTINCT FROM :trigger_time
      AND assignee_id IS NOT DISTINCT FROM :assignee_id
    ORDER BY id LIMIT 1
    """
)


async def same_pending(
    session: AsyncSession, tenant_id: uuid.UUID, row: dict[str, Any]
) -> dict[str, Any] | None:
    """The conversation's pending todo that ``row`` would repeat (its description, due time
    and assignee), with the conversation's todos locked until the transaction ends."""
    keys = {"tenant_id": tenant_id, "conversation_key": row["conversation_key"]}
    await session.execute(_LOCK_CONVERSATION, {**keys, "tenant_id": str(tenant_id)})
    found = await session.execute(
        _SAME_PENDING,
        {
            **keys,
            "description": row["description"],
            "trigger_time": row.get("trigger_time"),
            "assignee_id": row.get("assignee_id"),
        },
    )
    first = found.first()
    return dict(first._mapping) if first is not None else None


async def insert(session: AsyncSession, tenant_id: uuid.UUID, row: dict[str, Any]) -> int:
    """A new pending todo."""
    result = await session.execute(
        text(
            """
            INSERT INTO todos (tenant_id, conversation_key, group_id, user_id, creator_id,
                               assignee_id, description, trigger_time, evidence)
            VALUES (:tenant_id, :conversation_key, :group_id, :user_id, :creator_id,
                    :assignee_id, :description, :trigger_time, CAST(:evidence AS jsonb))
            RETURNING id
            """
        ),
        {
            "tenant_id": tenant_id,
            "assignee_id": None,
            "trigger_time": None,
            **row,
            "evidence": json.dumps(row.get("evidence") or {}, ensure_ascii=False),
        },
    )
    return int(result.scalar_one())


async def get(session: AsyncSession, tenant_id: uuid.UUID, todo_id: int) -> dict[str, Any] | None:
    """One todo."""
    row = (
        await session.execute(
            text(
                f"SELECT {_COLUMNS} FROM todos WHERE tenant_id = :tenant_id AND id = :id FOR UPDATE"
            ),
            {"tenant_id": tenant_id, "id": todo_id},
        )
    ).first()
    return dict(row._mapping) if row is not None else None


async def update(
    session: AsyncSession, tenant_id: uuid.UUID, todo_id: int, values: dict[str, Any]
) -> None:
    """Change a todo's fields (``completed_at`` follows a finishing status)."""
    values = dict(values)
    if "status" in values:
        finished = values["status"] in ("COMPLETED", "CANCELLED", "EXPIRED")
        values["completed_at"] = datetime.now(UTC) if finished else None
    sets = ", ".join(f"{column} = :{column}" for column in values)
    await session.execute(
        text(
            f"UPDATE todos SET {sets}, updated_at = now() WHERE tenant_id = :tenant_id AND id = :id"
        ),
        {**values, "tenant_id": tenant_id, "id": todo_id},
    )


async def listing(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    status: str | None,
    conversation_key: str | None,
    due_before: datetime | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Todos by filters, soonest trigger first (untimed last), then newest."""
    rows = await session.execute(
        text(
            f"""
            SELECT {_COLUMNS} FROM todos
            WHERE tenant_id = :tenant_id
              AND (CAST(:status AS text) IS NULL OR status = :status)
              AND (CAST(:conversation_key AS text) IS NULL OR conversation_key = :conversation_key)
              AND (CAST(:due_before AS timestamptz) IS NULL OR trigger_time <= :due_before)
            ORDER BY trigger_time NULLS LAST, id DESC
            LIMIT :limit
            """
        ),
        {
            "tenant_id": tenant_id,
            "status": status,
            "conversation_key": conversation_key,
            "due_before": due_before,
            "limit": limit,
        },
    )
    return dicts(rows)


_EXPIRE = text(
    """
    UPDATE todos SET status = 'EXPIRED', completed_at = now(), updated_at = now()
    WHERE tenant_id = :tenant_id AND status = 'PENDING' AND trigger_time < :before
    RETURNING id
    """
)


async def expire_overdue(session: AsyncSession, tenant_id: uuid.UUID, before: datetime) -> int:
    """Pending todos whose time is long past become EXPIRED."""
    return len((await session.execute(_EXPIRE, {"tenant_id": tenant_id, "before": before})).all())


# Due todos of tenants with a webhook, not yet delivered (runs as the owner, across tenants),
# a page at a time after a (tenant_id, id).
_DUE = text(
    """
    SELECT t.tenant_id, t.id, t.updated_at FROM todos AS t JOIN tenants AS n ON n.id = t.tenant_id
    WHERE t.status = 'PENDING' AND t.trigger_time <= now() AND t.delivered_at IS NULL
      AND COALESCE(n.settings ->> 'webhook_url', '') <> ''
      AND (t.tenant_id, t.id) > (CAST(:tenant_id AS uuid), CAST(:id AS bigint))
    ORDER BY t.tenant_id, t.id
    LIMIT :limit
    """
)

# The first (tenant_id, id) of the due todos' order comes after this.
BEFORE_ALL = (uuid.UUID(int=0), 0)


async def due(
    session: AsyncSession, after: tuple[uuid.UUID, int], limit: int
) -> list[tuple[uuid.UUID, int, datetime]]:
    """Up to ``limit`` due todos waiting for their webhook delivery after ``after`` in
    (tenant_id, id) order: their tenant, id and version (``updated_at``)."""
    params = {"tenant_id": after[0], "id": after[1], "limit": limit}
    return [(r.tenant_id, r.id, r.updated_at) for r in await session.execute(_DUE, params)]


def delivery_key(todo_id: int, version: datetime) -> str:
    """The dedupe key of a todo's delivery: one job per version of the todo. A todo delivered
    and then rescheduled or reopened is a new version, delivered again: keyed by the todo
    alone, its new time found the first delivery's job (kept for a day) and made none."""
    return f"deliver:{todo_id}@{version.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}"


_DELIVERED = text(
    """
    UPDATE todos SET delivered_at = now(), updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND updated_at = :version
      AND delivered_at IS NULL
    """
)


async def mark_delivered(
    session: AsyncSession, tenant_id: uuid.UUID, todo_id: int, version: datetime
) -> None:
    """Note a todo delivered, unless it changed since ``version`` (its ``updated_at``) was read:
    a todo rescheduled while its old time was being POSTed is delivered again at its new one."""
    await session.execute(_DELIVERED, {"tenant_id": tenant_id, "id": todo_id, "version": version})
