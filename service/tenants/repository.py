"""SQL for tenants and API keys."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.tenants.models import ApiKey, Tenant


async def insert_tenant(session: AsyncSession, name: str, settings: dict[str, Any]) -> Tenant:
    """Insert a tenant with a fresh id."""
    tenant = Tenant(id=uuid.uuid4(), name=name, settings=settings)
    session.add(tenant)
    await session.flush()
    await session.refresh(tenant)
    return tenant


async def get_tenant(
    session: AsyncSession, tenant_id: uuid.UUID, *, lock: bool = False
) -> Tenant | None:
    """One tenant by id; ``lock``: its row locked to the end of the transaction (writes that
    count the tenant's rows first take turns)."""
    return await session.get(Tenant, tenant_id, with_for_update=lock)


async def count_active_keys(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    """How many unrevoked keys the tenant has."""
    result = await session.execute(
        select(func.count())
        .select_from(ApiKey)
        .where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
    )
    return int(result.scalar_one())


async def list_tenants(
    session: AsyncSession, limit: int, after: Tenant | None = None
) -> Sequence[Tenant]:
    """``limit`` tenants, oldest first, those made after the tenant ``after`` (None: from
    the first)."""
    order = (Tenant.created_at, Tenant.id)
    query = select(Tenant).order_by(*order).limit(limit)
    if after is not None:
        query = query.where(tuple_(*order) > tuple_(after.created_at, after.id))
    result = await session.execute(query)
    return result.scalars().all()


async def insert_key(
    session: AsyncSession, tenant_id: uuid.UUID, name: str, prefix: str, key_hash: bytes
) -> ApiKey:
    """Store a new key's hash."""
    key = ApiKey(tenant_id=tenant_id, id=uuid.uuid4(), name=name, prefix=prefix, key_hash=key_hash)
    session.add(key)
    await session.flush()
    await session.refresh(key)
    return key


async def keys_by_prefix(session: AsyncSession, prefix: str) -> Sequence[ApiKey]:
    """Keys whose visible prefix matches (normally one)."""
    result = await session.execute(select(ApiKey).where(ApiKey.prefix == prefix))
    return result.scalars().all()


async def list_keys(session: AsyncSession, tenant_id: uuid.UUID) -> Sequence[ApiKey]:
    """A tenant's keys, newest first."""
    result = await session.execute(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at.desc())
    )
    return result.scalars().all()


async def revoke_keys(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """Mark every key of the tenant revoked."""
    await session.execute(
        update(ApiKey)
        .where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
    )


async def prune_revoked_keys(session: AsyncSession, retention_days: float) -> int:
    """Forget every tenant's keys revoked more than ``retention_days`` ago; returns how many
    (a tenant making and revoking keys in a loop would grow the table without end)."""
    cutoff = datetime.now(UTC) - timedelta(days=retention_days)
    result = await session.execute(delete(ApiKey).where(ApiKey.revoked_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)


async def forget_revoked_beyond(session: AsyncSession, tenant_id: uuid.UUID, keep: int) -> int:
    """Forget the tenant's revoked keys but the ``keep`` revoked last; returns how many."""
    kept = (
        select(ApiKey.id)
        .where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_not(None))
        .order_by(ApiKey.revoked_at.desc(), ApiKey.id)
        .limit(keep)
    )
    result = await session.execute(
        delete(ApiKey).where(
            ApiKey.tenant_id == tenant_id,
            ApiKey.revoked_at.is_not(None),
            ApiKey.id.not_in(kept.scalar_subquery()),
        )
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def revoke_key(
    session: AsyncSession, tenant_id: uuid.UUID, key_id: uuid.UUID
) -> ApiKey | None:
    """Mark a key revoked (idempotent); None if the tenant has no such key."""
    key = await session.get(ApiKey, (tenant_id, key_id))
    if key is None:
        return None
    if key.revoked_at is None:
        key.revoked_at = datetime.now(UTC)
        await session.flush()
    return key


# One model call of a tenant's jobs against its budget, in one statement on the tenant's row
# (every worker counts there, so the budget is the tenant's, not a process's). A window that
# began :span ago or more starts again at this call, its refusals forgotten; within
# the window, a call past :limit is not counted (DO UPDATE's WHERE) and no row comes back.
# The DO UPDATE reads the time from EXCLUDED (its now()) and compares intervals: Citus
# refuses any function there that is not immutable, now() and timestamptz - interval too.
_SPEND_LLM_CALL = text(
    """
    INSERT INTO llm_budgets AS b (tenant_id, window_start, calls, refused)
    VALUES (:tenant_id, now(), 1, 0)
    ON CONFLICT (tenant_id) DO UPDATE SET
        window_start = CASE
            WHEN EXCLUDED.window_start - b.window_start >= CAST(:span AS interval)
            THEN EXCLUDED.window_start ELSE b.window_start END,
        calls = CASE
            WHEN EXCLUDED.window_start - b.window_start >= CAST(:span AS interval)
            THEN 1 ELSE b.calls + 1 END,
        refused = CASE
            WHEN EXCLUDED.window_start - b.window_start >= CAST(:span AS interval)
            THEN 0 ELSE b.refused END
    WHERE EXCLUDED.window_start - b.window_start >= CAST(:span AS interval)
       OR b.calls < :limit
    RETURNING calls
    """
)

# A refused call: counted (the window's first refusal is the one logged), and when the
# window began. How long until it ends is asked apart: Citus refuses now() in RETURNING.
_REFUSE_LLM_CALL = text(
    """
    UPDATE llm_budgets SET refused = refused + 1
    WHERE tenant_id = :tenant_id
    RETURNING refused, window_start
    """
)
_UNTIL = text("SELECT GREATEST(EXTRACT(EPOCH FROM CAST(:moment AS timestamptz) - now()), 0)")


@dataclass(frozen=True)
class LLMSpend:
    """One model call asked of a tenant's budget: granted, or refused (the ``refused``-th of
    the window, which ends in ``wait_seconds``)."""

    granted: bool
    refused: int = 0
    wait_seconds: float = 0.0


async def spend_llm_call(
    session: AsyncSession, tenant_id: uuid.UUID, limit: int, window_seconds: float
) -> LLMSpend:
    """Count one model call against the tenant's ``limit`` per window of ``window_seconds``."""
    span = timedelta(seconds=window_seconds)
    params = {"tenant_id": tenant_id, "limit": limit, "span": span}
    if (await session.execute(_SPEND_LLM_CALL, params)).first() is not None:
        return LLMSpend(granted=True)
    row = (await session.execute(_REFUSE_LLM_CALL, params)).one()
    wait = await session.execute(_UNTIL, {"moment": row.window_start + span})
    return LLMSpend(granted=False, refused=int(row.refused), wait_seconds=float(wait.scalar_one()))
