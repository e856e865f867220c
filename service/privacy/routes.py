"""``/v1/users/{id}`` and ``/v1/groups/{id}``: export and erasure; the admin's tenant-wide ones."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Response, delete, get
from litestar.di import Provide
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.exports import service as exports
from service.http import EmbedderDependency, errors, provide_admin, provide_system_session
from service.privacy import service
from service.settings import Settings
from service.tenants.service import ADMIN_ACTOR, TenantContext

_ID = "{subject:str}"

_LATER = {
    202: ResponseSpec(
        dict[str, Any],
        description="large: written by a job; fetch export_url once status_url says done",
        generate_examples=False,
    )
}

ERASED_LATER = {
    202: ResponseSpec(dict[str, Any], description="large: erased by a job", generate_examples=False)
}


def erased(
    kind: str, erasure: service.Erasure, status_url: str | None = None
) -> Response[dict[str, Any]]:
    """The receipt of counts (200), or the job that erases (202 with where to look: by
    default the job's own status)."""
    if erasure.job_id is not None:
        status_url = status_url or f"/v1/jobs/{erasure.job_id}"
        body = {"job_id": erasure.job_id, "status_url": status_url}
        return Response(body, status_code=202)
    return Response({"erased": kind, "counts": erasure.counts}, status_code=200)


class PrivacyController(Controller):
    """A person's or a group's data: all of it out, or all of it gone."""

    path = "/v1"
    tags = ["privacy"]

    @get(f"/users/{_ID}/export", media_type="application/json", responses=_LATER)
    async def export_user(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        db: Database,
        settings: Settings,
        subject: str,
    ) -> Response[Any]:
        """Everything the tenant holds about a person: one streamed JSON document, or 202 with
        a job that writes it when large."""
        return await _export(
            session, db, settings, tenant.tenant_id, "user", subject, tenant.key_prefix
        )

    @get(f"/groups/{_ID}/export", media_type="application/json", responses=_LATER)
    async def export_group(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        db: Database,
        settings: Settings,
        subject: str,
    ) -> Response[Any]:
        """Everything the tenant holds about a group: one streamed JSON document, or 202 with
        a job that writes it when large."""
        return await _export(
            session, db, settings, tenant.tenant_id, "group", subject, tenant.key_prefix
        )

    @delete(f"/users/{_ID}", status_code=200, responses=ERASED_LATER)
    async def erase_user(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        subject: str,
    ) -> Response[dict[str, Any]]:
        """Erase a person for real; 200 with a receipt, or 202 with a job when large."""
        erasure = await service.erase_user_now_or_later(
            session, tenant.tenant_id, subject, embedder, settings, requested_by=tenant.key_prefix
        )
        return erased("user", erasure)

    @delete(f"/groups/{_ID}", status_code=200, responses=ERASED_LATER)
    async def erase_group(
        self, tenant: TenantContext, session: AsyncSession, settings: Settings, subject: str
    ) -> Response[dict[str, Any]]:
        """Erase a group and everything of it; 200 with a receipt, or 202 with a job when
        large."""
        erasure = await service.erase_group_now_or_later(
            session, tenant.tenant_id, subject, settings, requested_by=tenant.key_prefix
        )
        return erased("group", erasure)


class TenantPrivacyController(Controller):
    """The admin's whole-tenant export and erasure."""

    path = "/admin/tenants"
    tags = ["admin"]
    dependencies = {"admin": Provide(provide_admin), "session": Provide(provide_system_session)}

    @get(
        "/{tenant_id:uuid}/export",
        media_type="application/x-ndjson",
        responses={**errors(404), **_LATER},
    )
    async def export_tenant(
        self,
        admin: None,
        session: AsyncSession,
        db: Database,
        settings: Settings,
        tenant_id: uuid.UUID,
    ) -> Response[Any]:
        """The whole tenant as NDJSON, streamed; or 202 with a job that writes it when large."""
        return await _export(
            session, db, settings, tenant_id, "tenant", str(tenant_id), ADMIN_ACTOR
        )


async def _export(
    session: AsyncSession,
    db: Database,
    settings: Settings,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    requested_by: str | None,
) -> Response[Any]:
    """Stream a small export now; hand a large one to a job (202 with where to look); only
    ``requested_by`` may fetch what the job writes."""
    export = await exports.export_now_or_later(
        session, db, tenant_id, kind, subject, settings, requested_by=requested_by
    )
    if not isinstance(export, exports.ExportJob):
        return Stream(export, media_type=exports.media_type(kind))
    # The admin has no job listing: the export's own address answers 409 until it is ready.
    status_url = f"/v1/jobs/{export.job_id}" if kind != "tenant" else export.url
    body = {
        "job_id": export.job_id,
        "status_url": status_url,
        "export_id": export.export_id,
        "export_url": export.url,
    }
    return Response(body, status_code=202, media_type="application/json")
