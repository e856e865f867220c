"""``/v1/memories``: list, add, change, delete, history, search, forget."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from sqlalchemy import and_, true
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.types import BIGINT_MAX
from service.errors import Invalid, NotFound
from service.http import RowId, errors, reads, runtime
from service.memories import repository, service
from service.memories.models import Memory
from service.memories.schemas import (
    ForgetRequest,
    ForgetResult,
    HistoryEntry,
    MemoryCreate,
    MemoryCreated,
    MemoryHit,
    MemoryInfo,
    MemoryPatch,
    MemorySearch,
)
from service.retrieval.terms import terms
from service.tenants.service import TenantContext


def _info(row: dict[str, Any]) -> MemoryInfo:
    return MemoryInfo(**{k: row[k] for k in MemoryInfo.model_fields})


def _cause(tenant: TenantContext) -> dict[str, Any]:
    return {"by": "api", "key_prefix": tenant.key_prefix}


class MemoryController(Controller):
    """Scoped memories."""

    path = "/v1/memories"
    tags = ["memories"]

    @get("/", dependencies=reads())
    async def list_memories(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        memory_scope: str | None = Parameter(
            query="scope", default=None, pattern="^(GLOBAL|PRIVATE|GROUP|MEMBER_IN_GROUP)$"
        ),
        user_id: str | None = None,
        group_id: str | None = None,
        category: str | None = Parameter(
            default=None, pattern="^(PROFILE|PREFERENCE|FACT|SUMMARY)$"
        ),
        active: bool | None = None,
        limit: int = Parameter(default=50, ge=1, le=500),
        before: int | None = Parameter(default=None, ge=1, le=BIGINT_MAX),
    ) -> list[MemoryInfo]:
        """Memories by exact filters, newest first (``before``: an id, for the next page)."""
        conditions = [
            Memory.scope == memory_scope if memory_scope else true(),
            Memory.user_id == user_id if user_id else true(),
            Memory.group_id == group_id if group_id else true(),
            Memory.category == category if category else true(),
            Memory.is_active.is_(active) if active is not None else true(),
        ]
        rows = await repository.listing(
            session, tenant.tenant_id, where=and_(*conditions), limit=limit, before=before
        )
        return [_info(r) for r in rows]

    @post(
        "/",
        responses={
            200: ResponseSpec(
                MemoryCreated, description="an active duplicate, returned", generate_examples=False
            )
        },
    )
    async def add_memory(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: MemoryCreate,
    ) -> Response[MemoryCreated]:
        """Add a memory (201); an active near-duplicate in the same scope is returned (200)."""
        rt = runtime(request)
        content = service.check_personal(data.scope, data.content, tenant.pii_policy)
        [vector] = await rt.embedder.passages([content])
        memory_id, created = await service.add(
            session,
            tenant.tenant_id,
            scope=data.scope,
            user_id=data.user_id,
            group_id=data.group_id,
            category=data.category,
            content=content,
            vector=vector,
            settings=rt.settings.cognitive.memory,
            cause=_cause(tenant),
            confidence=data.confidence,
            importance=data.importance,
            valid_from=data.valid_from,
            valid_to=data.valid_to,
            reason=data.reason,
        )
        row = await repository.get(session, tenant.tenant_id, memory_id)
        assert row is not None
        body = MemoryCreated(duplicate=not created, **_info(row).model_dump())
        return Response(body, status_code=201 if created else 200)

    @get("/{memory_id:int}", responses=errors(404))
    async def get_memory(
        self, tenant: TenantContext, session: AsyncSession, memory_id: RowId
    ) -> MemoryInfo:
        """One memory."""
        row = await repository.get(session, tenant.tenant_id, memory_id)
        if row is None:
            raise NotFound("no such memory")
        return _info(row)

    @patch("/{memory_id:int}", responses=errors(404))
    async def change_memory(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        memory_id: RowId,
        data: MemoryPatch,
    ) -> MemoryInfo:
        """Change a memory; the old content stays in its history."""
        vector, content = None, data.content
        if content is not None:
            current = await repository.get(session, tenant.tenant_id, memory_id)
            if current is None:
                raise NotFound("no such memory")
            content = service.check_personal(current["scope"], content, tenant.pii_policy)
            [vector] = await runtime(request).embedder.passages([content])
        row = await service.change(
            session,
            tenant.tenant_id,
            memory_id,
            cause=_cause(tenant),
            reason=data.reason,
            content=content,
            vector=vector,
            category=data.category,
            confidence=data.confidence,
            importance=data.importance,
            valid_to=data.valid_to,
            is_active=data.is_active,
        )
        return _info(row)

    @delete("/{memory_id:int}", status_code=200, responses=errors(404))
    async def delete_memory(
        self, tenant: TenantContext, session: AsyncSession, memory_id: RowId
    ) -> dict[str, Any]:
        """Delete for real; the history keeps only that a deletion happened."""
        await service.hard_delete(session, tenant.tenant_id, memory_id, cause=_cause(tenant))
        return {"deleted": memory_id}

    @get("/{memory_id:int}/history", responses=errors(404))
    async def history(
        self, tenant: TenantContext, session: AsyncSession, memory_id: RowId
    ) -> list[HistoryEntry]:
        """Every change of a memory, oldest first (also after a hard delete)."""
        rows = await repository.history(session, tenant.tenant_id, memory_id)
        if not rows:
            raise NotFound("no such memory")
        return [HistoryEntry(**r) for r in rows]

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: MemorySearch,
    ) -> list[MemoryHit]:
        """Memories nearest in meaning, only within the conversation's scopes."""
        vector = await runtime(request).embedder.query(data.query)
        rows = await service.search(session, tenant.tenant_id, data, vector)
        return [MemoryHit(score=float(r["score"]), **_info(r).model_dump()) for r in rows]

    @post("/forget", status_code=200)
    async def forget(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: ForgetRequest,
    ) -> ForgetResult:
        """Forget by id, by category or by query (seed 004 §14): deactivate or delete."""
        if not data.ids and not data.category and not data.query:
            raise Invalid("give ids, a category or a query", field="ids")
        conditions = []
        if data.group_id or data.user_id:
            scope = service.conversation_filter(data.group_id, data.user_id, data.scopes)
            conditions.append(scope.where())
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
            # Similarity alone sweeps too much: the local embedder puts unrelated short
            # texts above 0.8 to each other ("猫" took 9 of 10 memories). A memory is
            # forgotten only if it also shares a word with the query.
            wanted = set(terms(data.query))
            if not wanted:
                raise Invalid("the query has no words to match", field="query")
            vector = await runtime(request).embedder.query(data.query)
            rows = await repository.nearest(
                session, tenant.tenant_id, vector, where=where, limit=200
            )
            targets = [
                int(r["id"])
                for r in rows
                if float(r["score"]) >= data.min_score and wanted & set(terms(r["content"]))
            ]
        else:
            rows = await repository.listing(
                session, tenant.tenant_id, where=where, limit=10_000, before=None
            )
            targets = [int(r["id"]) for r in rows]
        if data.dry_run:
            return ForgetResult(mode=data.mode, changed=targets, dry_run=True)
        cause = {**_cause(tenant), "forget": data.model_dump(exclude={"ids"}, exclude_none=True)}
        for memory_id in targets:
            if data.mode == "delete":
                await service.hard_delete(session, tenant.tenant_id, memory_id, cause=cause)
            else:
                await service.deactivate(
                    session,
                    tenant.tenant_id,
                    memory_id,
                    cause=cause,
                    reason=data.reason or "forget",
                )
        return ForgetResult(mode=data.mode, changed=targets)
