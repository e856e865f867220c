"""``POST /v1/context``, ``POST /v1/events/search``, ``/v1/persona``, ``/v1/tools``."""

from __future__ import annotations

import json
from typing import Any

from litestar import Controller, Request, delete, get, post, put
from sqlalchemy.ext.asyncio import AsyncSession

from service.errors import NotFound
from service.http import errors, reads, runtime
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
from service.recall.service import Reader
from service.tenants import repository as tenants
from service.tenants.service import TenantContext


class RecallController(Controller):
    """What the bot reads: every turn, and on purpose."""

    path = "/v1"
    tags = ["read"]

    @post("/context", status_code=200, dependencies=reads())
    async def context(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: ContextRequest,
    ) -> ContextResponse:
        """The memory context to inject this turn, with a ready ``prompt`` block."""
        rt = runtime(request)
        return await Reader(rt.embedder, rt.reranker).context(session, tenant, data)

    @post("/events/search", status_code=200, responses=errors(403), dependencies=reads())
    async def search_events(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: EventSearch,
    ) -> EventSearchResult:
        """``cognitive.search_events``: a conversation's events by meaning and time."""
        rt = runtime(request)
        return await Reader(rt.embedder, rt.reranker).search_events(session, tenant, data)

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
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: Persona,
    ) -> Persona:
        """Set the persona: the bot's character and boundary rules, injected first every turn."""
        await _set_persona(session, tenant, data.text)
        runtime(request).auth.forget(tenant.tenant_id)
        return data

    @delete("/persona", status_code=200)
    async def delete_persona(
        self, request: Request[Any, Any, Any], tenant: TenantContext, session: AsyncSession
    ) -> dict[str, bool]:
        """Remove the persona."""
        await _set_persona(session, tenant, None)
        runtime(request).auth.forget(tenant.tenant_id)
        return {"deleted": True}

    @get("/tools")
    async def list_tools(self, tenant: TenantContext) -> list[dict[str, Any]]:
        """OpenAI function-calling definitions of the memory tools (and of ``end``)."""
        return tools.DEFINITIONS

    @post("/tools/call", status_code=200, responses=errors(403, 404))
    async def call_tool(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: ToolCall,
    ) -> ToolResult:
        """Run one tool call of the bot's LLM; ``content`` goes back to the model as is."""
        rt = runtime(request)
        result = await tools.call(
            data.name,
            data.arguments,
            data.context,
            session=session,
            db=rt.db,
            tenant=tenant,
            embedder=rt.embedder,
            settings=rt.settings,
            reranker=rt.reranker,
        )
        return ToolResult(
            name=tools.normalize(data.name),
            result=result,
            content=json.dumps(result, ensure_ascii=False, default=str),
        )


async def _set_persona(session: AsyncSession, tenant: TenantContext, text: str | None) -> None:
    row = await tenants.get_tenant(session, tenant.tenant_id)
    if row is None:
        raise NotFound("no such tenant")
    settings = dict(row.settings or {})
    if text is None:
        settings.pop("persona", None)
    else:
        settings["persona"] = text
    row.settings = settings
    await session.flush()
