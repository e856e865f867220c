"""``POST /v1/messages`` (archive the raw chat) and ``POST /v1/messages/search``."""

from __future__ import annotations

from litestar import Controller, post
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.http import EmbedderDependency, reads
from service.messages import search as archive
from service.messages import service
from service.messages.schemas import (
    MessageBatch,
    MessageSearch,
    MessageSearchResult,
    MessagesStored,
)
from service.settings import Settings
from service.tenants.service import TenantContext


class MessageController(Controller):
    """The raw message archive."""

    path = "/v1/messages"
    tags = ["messages"]

    @post("/", status_code=202)
    async def store(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        settings: Settings,
        data: MessageBatch,
    ) -> MessagesStored:
        """Store a batch of messages; embedding and extraction happen in the background."""
        return await service.ingest(session, tenant, data, settings)

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        read_db: Database,
        data: MessageSearch,
    ) -> MessageSearchResult:
        """The archive look-up: one conversation's messages best matching the query."""
        return await archive.search(session, tenant, data, embedder, read_db)
