"""``POST /v1/context``, ``POST /v1/events/search``, ``/v1/persona``, ``/v1/tools``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Controller, delete, get, post, put
from litestar.di import Provide
from litestar.params import Dependency
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.embedding import Started, start_embedding
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

StartedDependency = Annotated[Started | None, Dependency(skip_validation=True)]


async def provide_turn_embedding(
    tenant: TenantContext, embedder: EmbedderDependency, data: ContextRequest
) -> AsyncIterator[Started | None]:
    """A turn's question embedded from the moment its caller is known, while its transaction
    opens (Litestar resolves the two side by side): the embedding is the longest step before
    the dense pass can start. Cancelled if the turn ends without it."""
    started = start_embedding(embedder, build_query(data)) if tenant.cognitive_enabled else None
    try:
        yield started
    finally:
        if started is None:
            pass
        elif not started.vector.done():
            started.vector.cancel()  # the turn ended before it needed the vector
        elif not started.vector.cancelled():
            started.vector.exception()  # seen: the turn reported its own outcome


class RecallController(Controller):
    """What the bot reads: every turn, and on purpose."""

    path = "/v1"
    tags = ["read"]

    @post(
        "/context",
        status_code=200,
        dependencies={**reads(), "started": Provide(provide_turn_embedding)},
    )
    async def context(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        reranker: RerankerDependency,
        read_db: Database,
        data: ContextRequest,
        started: StartedDependency,
    ) -> ContextResponse:
        """The memory context to inject this turn, with a ready ``prompt`` block."""
        return await Reader(embedder, reranker, read_db).context(session, tenant, data, started)

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
