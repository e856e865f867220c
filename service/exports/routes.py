"""``/v1/exports/{id}`` and the admin's tenant exports: fetching what an export job wrote."""

from __future__ import annotations

import uuid

from litestar import Controller, get
from litestar.di import Provide
from litestar.response import Stream
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.exports import service
from service.http import RowId, errors, provide_admin, provide_system_session, reads
from service.tenants.service import TenantContext


class ExportController(Controller):
    """A tenant's exports that were too large to stream at once."""

    path = "/v1/exports"
    tags = ["privacy"]

    @get(
        "/{export_id:int}",
        media_type="application/json",
        responses=errors(404, 409),
        dependencies=reads(),
    )
    async def fetch(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        read_db: Database,
        export_id: RowId,
    ) -> Stream:
        """The export's document once its job finished; 409 while it is being written."""
        export = await service.ready(
            session, tenant.tenant_id, export_id, caller=tenant.key_prefix or ""
        )
        # Read where ``ready`` was: an export visible there has all its chunks there too.
        return Stream(
            service.content(read_db, tenant.tenant_id, export_id),
            media_type=service.media_type(export["kind"]),
        )


class AdminExportController(Controller):
    """The admin's whole-tenant exports written by a job."""

    path = "/admin/tenants"
    tags = ["admin"]
    dependencies = {"admin": Provide(provide_admin), "session": Provide(provide_system_session)}

    @get(
        "/{tenant_id:uuid}/exports/{export_id:int}",
        media_type="application/x-ndjson",
        responses=errors(404, 409),
    )
    async def fetch_tenant_export(
        self,
        admin: None,
        session: AsyncSession,
        db: Database,
        tenant_id: uuid.UUID,
        export_id: RowId,
    ) -> Stream:
        """A tenant's export once its job finished; 409 while it is being written."""
        export = await service.ready(session, tenant_id, export_id, caller=None)
        return Stream(
            service.content(db, tenant_id, export_id),
            media_type=service.media_type(export["kind"]),
        )
