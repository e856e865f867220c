"""``POST /v1/end`` and the memo log."""

from __future__ import annotations

from litestar import Controller, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.ends import service
from service.ends.schemas import EndAccepted, EndRequest, MemoInfo
from service.settings import Settings
from service.tenants.service import TenantContext


class EndController(Controller):
    """The bot's end-of-turn hand-over."""

    path = "/v1"
    tags = ["write"]

    @post(
        "/end",
        status_code=202,
        responses={
            200: ResponseSpec(
                EndAccepted, description="nothing to hand over or a repeat", generate_examples=False
            )
        },
    )
    async def end(
        self, tenant: TenantContext, db: Database, settings: Settings, data: EndRequest
    ) -> Response[EndAccepted]:
        """Hand over the turn: 202 with the job and its event ids, or 200 when nothing to do."""
        accepted = await service.accept_end(db, tenant, data, settings)
        return Response(accepted, status_code=202 if accepted.enqueued else 200)

    @get("/memos")
    async def memos(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str | None = None,
        user_id: str | None = None,
        limit: int = Parameter(default=30, ge=1, le=500),
    ) -> list[MemoInfo]:
        """A conversation's memo log, newest first."""
        return await service.recent_memos(session, tenant.tenant_id, group_id, user_id, limit)
