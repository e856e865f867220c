"""The memories' API: list, read, add, change, delete and forget, as a tenant's key asks.

The rules these follow (binding, duplicates, history) are in ``service``.
"""

from __future__ import annotations

import uuid
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import and_, true
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import on_clocks
from service.embedding import Embedder
from service.errors import Invalid, NotFound
from service.memories import repository
from service.memories.models import Memory
from service.memories.schemas import ForgetRequest, ForgetResult, MemoryCreate, MemoryPatch
from service.memories.scope import MEMORY
from service.memories.service import (
    add,
    change,
    check_personal,
    conversation_filter,
    deactivate,
    hard_delete,
)
from service.retrieval.terms import terms
from service.settings import MemorySettings
from service.tenants.service import TenantContext


def _api_cause(key_prefix: str | None) -> dict[str, Any]:
    return {"by": "api", "key_prefix": key_prefix}


async def get(session: AsyncSession, tenant_id: uuid.UUID, memory_id: int) -> dict[str, Any]:
    """One memory; ``NotFound`` when the tenant has none by that id."""
    row = await repository.get(session, tenant_id, memory_id)
    if row is None:
        raise NotFound("no such memory")
    return row


async def listing(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    scope: str | None,
    user_id: str | None,
    group_id: str | None,
    category: str | None,
    active: bool | None,
    limit: int,
    before: int | None,
) -> list[dict[str, Any]]:
    """Memories by exact filters, newest first (``before``: an id, for the next page)."""
    conditions = [
        Memory.scope == scope if scope else true(),
        Memory.user_id == user_id if user_id else true(),
        Memory.group_id == group_id if group_id else true(),
        Memory.category == category if category else true(),
        Memory.is_active.is_(active) if active is not None else true(),
    ]
    return await repository.listing(
        session, tenant_id, where=and_(*conditions), limit=limit, before=before
    )


async def history(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: int, limit: int, after: int | None
) -> list[dict[str, Any]]:
    """A page of a memory's changes, oldest first (also after a hard delete): ``limit`` of
    them after the entry ``after``. A memory rewritten every day (a group's day summary, a
    fact that keeps changing) gathers thousands, each with its old and new text."""
    rows = await repository.history(session, tenant_id, memory_id, limit, after)
    if not rows and (
        after is None or not await repository.has_history(session, tenant_id, memory_id)
    ):
        raise NotFound("no such memory")
    return rows


async def create(
    session: AsyncSession,
    tenant: TenantContext,
    data: MemoryCreate,
    embedder: Embedder,
    settings: MemorySettings,
) -> tuple[dict[str, Any], bool]:
    """``POST /v1/memories``: the new memory, or the active near-duplicate of its scope; and
    whether it was created."""
    content = check_personal(data.scope, data.content, tenant.pii_policy)
    [vector] = await embedder.passages([content])
    zone = ZoneInfo(tenant.timezone)
    memory_id, created = await add(
        session,
        tenant.tenant_id,
        scope=data.scope,
        user_id=data.user_id,
        group_id=data.group_id,
        category=data.category,
        content=content,
        vector=vector,
        settings=settings,
        cause=_api_cause(tenant.key_prefix),
        confidence=data.confidence,
        importance=data.importance,
        valid_from=on_clocks(data.valid_from, zone),
        valid_to=on_clocks(data.valid_to, zone),
        reason=data.reason,
    )
    return await get(session, tenant.tenant_id, memory_id), created


async def edit(
    session: AsyncSession,
    tenant: TenantContext,
    memory_id: int,
    data: MemoryPatch,
    embedder: Embedder,
) -> dict[str, Any]:
    """``PATCH /v1/memories/{id}``: a new content is screened and embedded; the old content
    stays in the history."""
    vector, content = None, data.content
    if content is not None:
        current = await get(session, tenant.tenant_id, memory_id)
        content = check_personal(current["scope"], content, tenant.pii_policy)
        [vector] = await embedder.passages([content])
    return await change(
        session,
        tenant.tenant_id,
        memory_id,
        cause=_api_cause(tenant.key_prefix),
        reason=data.reason,
        content=content,
        vector=vector,
        category=data.category,
        confidence=data.confidence,
        importance=data.importance,
        valid_to=on_clocks(data.valid_to, ZoneInfo(tenant.timezone)),
        is_active=data.is_active,
    )


async def delete(session: AsyncSession, tenant: TenantContext, memory_id: int) -> None:
    """``DELETE /v1/memories/{id}``: for real; the history keeps only that it happened."""
    await hard_delete(session, tenant.tenant_id, memory_id, cause=_api_cause(tenant.key_prefix))


# Similarity alone sweeps too much: the local embedder puts unrelated short texts above 0.8
# to each other ("猫" took 9 of 10 memories). A memory is forgotten by query only if it also
# shares a word with the query. At most this many are looked at.
_FORGET_BY_QUERY_LIMIT = 200
_FORGET_LIMIT = 10_000


async def forget(
    session: AsyncSession, tenant: TenantContext, data: ForgetRequest, embedder: Embedder
) -> ForgetResult:
    """``POST /v1/memories/forget`` (seed 004 §14): by ids, by category or by query, within
    the request's scope filters; deactivate or delete (or only name them, ``dry_run``)."""
    if not data.ids and not data.category and not data.query:
        raise Invalid("give ids, a category or a query", field="ids")
    conditions = []
    if data.group_id or data.user_id:
        reader = conversation_filter(data.group_id, data.user_id, data.scopes)
        conditions.append(reader.where(MEMORY))
    elif data.scopes:
        conditions.append(Memory.scope.in_(data.scopes))
    if data.ids:
        conditions.append(Memory.id.in_(data.ids))
    if data.category:
        conditions.append(Memory.category == data.category)
    if data.mode == "deactivate":
        conditions.append(Memory.is_active.is_(True))
    where = and_(*conditions) if conditions else true()
    if data.query:
        wanted = set(terms(data.query))
        if not wanted:
            raise Invalid("the query has no words to match", field="query")
        vector = await embedder.query(data.query)
        rows = await repository.nearest(
            session, tenant.tenant_id, vector, where=where, limit=_FORGET_BY_QUERY_LIMIT
        )
        targets = [
            int(r["id"])
            for r in rows
            if float(r["score"]) >= data.min_score and wanted & set(terms(r["content"]))
        ]
    else:
        rows = await repository.listing(
            session, tenant.tenant_id, where=where, limit=_FORGET_LIMIT, before=None
        )
        targets = [int(r["id"]) for r in rows]
    if data.dry_run:
        return ForgetResult(mode=data.mode, changed=targets, dry_run=True)
    cause = {
        **_api_cause(tenant.key_prefix),
        "forget": data.model_dump(exclude={"ids"}, exclude_none=True),
    }
    for memory_id in targets:
        if data.mode == "delete":
            await hard_delete(session, tenant.tenant_id, memory_id, cause=cause)
        else:
            await deactivate(
                session, tenant.tenant_id, memory_id, cause=cause, reason=data.reason or "forget"
            )
    return ForgetResult(mode=data.mode, changed=targets)
