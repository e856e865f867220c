"""``/v1/todos``: list, due (for bots that poll), change."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from zoneinfo import ZoneInfo

from litestar import Controller, get, patch
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.http import RowId, errors
from service.tenants.service import TenantContext
from service.todos import service
from service.todos.schemas import TodoInfo, TodoPatch


def _info(row: dict[str, object]) -> TodoInfo:
    return TodoInfo(**{k: row[k] for k in TodoInfo.model_fields})


class TodoController(Controller):
    """Todos and intentions."""

    path = "/v1/todos"
    tags = ["todos"]

    @get("/")
    async def list_todos(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        status: str | None = Parameter(
            default=None, pattern="^(PENDING|COMPLETED|CANCELLED|EXPIRED)$"
        ),
        group_id: str | None = None,
        user_id: str | None = None,
        due_before: Annotated[
            datetime | None,
            Parameter(description="ISO 8601; without an offset, on the tenant's clocks"),
        ] = None,
        limit: int = Parameter(default=100, ge=1, le=1000),
    ) -> list[TodoInfo]:
        """Todos by status, conversation and due time."""
        zone = ZoneInfo(tenant.timezone)
        rows = await service.listing(
            session, tenant.tenant_id, status, group_id, user_id, due_before, limit, zone
        )
        return [_info(r) for r in rows]

    @get("/due")
    async def due(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str | None = None,
        user_id: str | None = None,
    ) -> list[TodoInfo]:
        """Pending todos whose time has come (bots poll this, then PATCH them done)."""
        return [_info(r) for r in await service.due(session, tenant.tenant_id, group_id, user_id)]

    @patch("/{todo_id:int}", responses=errors(404))
    async def change(
        self, tenant: TenantContext, session: AsyncSession, todo_id: RowId, data: TodoPatch
    ) -> TodoInfo:
        """Complete, cancel, reopen, reschedule or reassign a todo."""
        values = data.model_dump(exclude_unset=True)
        zone = ZoneInfo(tenant.timezone)
        return _info(await service.patch(session, tenant.tenant_id, todo_id, values, zone))
