"""``POST /v1/context``, ``POST /v1/events/search``, ``/v1/persona``, ``/v1/tools``."""

from __future__ import annotations

import json
from typing import Any

from litestar import Controller, delete, get, post, put
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.embedding import start_embedding
from service.errors import NotFound
from service.http import EmbedderDependency, RerankerDependency, errors, reads
from service.recall import tools
from service.recall.schemas import (
    ContextRequest,
    ContextResponse,
    EventSearch,
    EventSearchResult,
    Persona,
    ToolCall,
    ToolResult,
)
from service.recall.service import Reader, build_query
from service.settings import Settings
from service.tenants import service as tenants
from service.tenants.service import Authenticator, TenantContext


class RecallController(Controller):
    """What the bot reads: every turn, and on purpose."""

    path = "/v1"
    tags = ["read"]

    @post("/context", status_code=200)
    async def context(
        self,
        tenant: TenantContext,
        embedder: EmbedderDependency,
        reranker: RerankerDependency,
        read_db: Database,
        data: ContextRequest,
    ) -> ContextResponse:
        """The memory context to inject this turn, with a ready ``prompt`` block."""
        # The question goes to the model as soon as the caller is known, while the turn's
        # read transaction opens (as ``provide_read_session`` would open it): the embedding is
        # the longest step before the dense pass. The transaction is opened here, in the
        # request's own task: as a dependency resolved beside another, Litestar would open it
        # in a task of its own, which left connections to the garbage collector.
        started = None
        if tenant.cognitive_enabled:
            started = start_embedding(embedder, build_query(data))
        try:
            async with read_db.tenant(tenant.tenant_id, read_only=True) as session:
                reader = Reader(embedder, reranker, read_db)
                return await reader.context(session, tenant, data, started)
        finally:
            if started is not None:
                started.discard()  # the turn may have ended before it needed the vector

    @post("/events/search", status_code=200, responses=errors(403), dependencies=reads())
    async def search_events(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        reranker: RerankerDependency,
        read_db: Database,
        data: EventSearch,
    ) -> EventSearchResult:
        """``cognitive.search_events``: a conversation's events by meaning and time."""
        return await Reader(embedder, reranker, read_db).search_events(session, tenant, data)

    @get("/persona", responses=errors(404))
    async def get_persona(self, tenant: TenantContext) -> Persona:
        """The tenant's persona block."""
        text = tenant.overrides.get("persona")
        if not text:
            raise NotFound("no persona set")
        return Persona(text=text)

    @put("/persona")
    async def put_persona(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        auth: Authenticator,
        data: Persona,
    ) -> Persona:
        """Set the persona: the bot's character and boundary rules, injected first every turn."""
        await tenants.set_persona(session, auth, tenant.tenant_id, data.text)
        return data

    @delete("/persona", status_code=200)
    async def delete_persona(
        self, tenant: TenantContext, session: AsyncSession, auth: Authenticator
    ) -> dict[str, bool]:
        """Remove the persona."""
        await tenants.set_persona(session, auth, tenant.tenant_id, None)
        return {"deleted": True}

    @get("/tools")
    async def list_tools(self, tenant: TenantContext) -> list[dict[str, Any]]:
        """OpenAI function-calling definitions of the memory tools (and of ``end``)."""
        return tools.DEFINITIONS

    @post("/tools/call", status_code=200, responses=errors(403, 404))
    async def call_tool(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        db: Database,
        embedder: EmbedderDependency,
        settings: Settings,
        reranker: RerankerDependency,
        data: ToolCall,
    ) -> ToolResult:
        """Run one tool call of the bot's LLM; ``content`` goes back to the model as is."""
        result = await tools.call(
            data.name,
            data.arguments,
            data.context,
            session=session,
            db=db,
            tenant=tenant,
            embedder=embedder,
            settings=settings,
            reranker=reranker,
        )
        return ToolResult(
            name=tools.normalize(data.name),
            result=result,
            content=json.dumps(result, ensure_ascii=False, default=str),
        )
