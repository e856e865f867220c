"""SQL for tenants and API keys."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, tuple_, update
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
