"""``/v1/memories``: list, add, change, delete, history, search, forget."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, delete, get, patch, post
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.types import BIGINT_MAX
from service.http import EmbedderDependency, RowId, errors, reads
from service.memories import curation, service
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
from service.settings import Settings
from service.tenants.service import TenantContext


def _info(row: dict[str, Any]) -> MemoryInfo:
    return MemoryInfo(**{k: row[k] for k in MemoryInfo.model_fields})


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
        rows = await curation.listing(
            session,
            tenant.tenant_id,
            scope=memory_scope,
            user_id=user_id,
            group_id=group_id,
            category=category,
            active=active,
            limit=limit,
            before=before,
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
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        data: MemoryCreate,
    ) -> Response[MemoryCreated]:
        """Add a memory (201); an active near-duplicate in the same scope is returned (200)."""
        row, created = await curation.create(
            session, tenant, data, embedder, settings.cognitive.memory
        )
        body = MemoryCreated(duplicate=not created, **_info(row).model_dump())
        return Response(body, status_code=201 if created else 200)

    @get("/{memory_id:int}", responses=errors(404))
    async def get_memory(
        self, tenant: TenantContext, session: AsyncSession, memory_id: RowId
    ) -> MemoryInfo:
        """One memory."""
        return _info(await curation.get(session, tenant.tenant_id, memory_id))

    @patch("/{memory_id:int}", responses=errors(404))
    async def change_memory(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        memory_id: RowId,
        data: MemoryPatch,
    ) -> MemoryInfo:
        """Change a memory; the old content stays in its history."""
        return _info(await curation.edit(session, tenant, memory_id, data, embedder))

    @delete("/{memory_id:int}", status_code=200, responses=errors(404))
    async def delete_memory(
        self, tenant: TenantContext, session: AsyncSession, memory_id: RowId
    ) -> dict[str, Any]:
        """Delete for real; the history keeps only that a deletion happened."""
        await curation.delete(session, tenant, memory_id)
        return {"deleted": memory_id}

    @get("/{memory_id:int}/history", responses=errors(404))
    async def history(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        memory_id: RowId,
        limit: int = Parameter(default=100, ge=1, le=500),
        after: int | None = Parameter(
            default=None, ge=1, le=BIGINT_MAX, description="an entry's id: the changes after it"
        ),
    ) -> list[HistoryEntry]:
        """A memory's changes, oldest first (also after a hard delete), a page at a time
        (``after``: the last entry's id, for the next page)."""
        rows = await curation.history(session, tenant.tenant_id, memory_id, limit, after)
        return [HistoryEntry(**r) for r in rows]

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        data: MemorySearch,
    ) -> list[MemoryHit]:
        """Memories nearest in meaning, only within the conversation's scopes."""
        vector = await embedder.query(data.query)
        rows = await service.search(session, tenant.tenant_id, data, vector, embedder.calibration)
        return [MemoryHit(score=round(r["relevance"], 4), **_info(r).model_dump()) for r in rows]

    @post("/forget", status_code=200)
    async def forget(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        data: ForgetRequest,
    ) -> ForgetResult:
        """Forget by id, by category or by query (seed 004 §14): deactivate or delete."""
        return await curation.forget(session, tenant, data, embedder)
