"""``POST /v1/messages`` (archive the raw chat) and ``POST /v1/messages/search``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from sqlalchemy.ext.asyncio import AsyncSession

from service.http import reads, runtime
from service.messages import search as archive
from service.messages import service
from service.messages.schemas import (
    MessageBatch,
    MessageSearch,
    MessageSearchResult,
    MessagesStored,
)
from service.tenants.service import TenantContext


class MessageController(Controller):
    """The raw message archive."""

    path = "/v1/messages"
    tags = ["messages"]

    @post("/", status_code=202)
    async def store(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: MessageBatch,
    ) -> MessagesStored:
        """Store a batch of messages; embedding and extraction happen in the background."""
        return await service.ingest(session, tenant, data, runtime(request).settings)

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: MessageSearch,
    ) -> MessageSearchResult:
        """The archive look-up: one conversation's messages best matching the query."""
        return await archive.search(session, tenant, data, runtime(request).embedder)
