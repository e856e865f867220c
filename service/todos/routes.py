"""``/v1/todos``: add, list, due (for bots that poll), change."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from zoneinfo import ZoneInfo

from litestar import Controller, Response, get, patch, post
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.ends.service import check_erased
from service.http import RowId, errors
from service.tenants.service import TenantContext
from service.todos import service
from service.todos.schemas import TodoCreate, TodoInfo, TodoPatch


def _info(row: dict[str, object]) -> TodoInfo:
    return TodoInfo(**{k: row[k] for k in TodoInfo.model_fields})


class TodoController(Controller):
    """Todos and intentions."""

    path = "/v1/todos"
    tags = ["todos"]

    @post("/", status_code=201)
    async def add_todo(
        self, tenant: TenantContext, session: AsyncSession, data: TodoCreate
    ) -> Response[TodoInfo]:
        """Add a pending todo to the conversation the context names (201): due at
        ``trigger_time``, shown in that conversation's context, delivered to the webhook.
        The same pending todo there (description, due time, assignee) is answered as it is
        (200), not made again: a retried call is delivered once."""
        await check_erased(session, tenant, [data.sender_id, data.user_id])
        # Who asked: the sender, else the person served (a private chat's always is).
        person = data.private_user if data.request_type == "private" else None
        place = service.Place.of(
            data.request_type, data.group_id, person or data.sender_id or data.user_id
        )
        evidence: dict[str, object] = {"by": "api"}
        if data.message_ids:
            evidence["message_ids"] = data.message_ids
        row, created = await service.add(
            session,
            tenant.tenant_id,
            place,
            data.description,
            data.trigger_time,
            data.zone(tenant.timezone),
            evidence=evidence,
        )
        return Response(_info(row), status_code=201 if created else 200)

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
