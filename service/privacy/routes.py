"""``/v1/users/{id}`` and ``/v1/groups/{id}``: export and erasure; the admin's tenant-wide ones."""

from __future__ import annotations

import json
import uuid
from typing import Any

from litestar import Controller, Request, Response, delete, get
from litestar.di import Provide
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.exports import service as exports
from service.http import errors, provide_admin, provide_system_session, runtime
from service.privacy import service
from service.queue import repository as jobs
from service.queue.worker import JobContext
from service.runtime import Runtime
from service.tenants.service import ADMIN_ACTOR, TenantContext

ERASE_JOB = "privacy.erase_user"
_ID = "{subject:str}"

_LATER = {
    202: ResponseSpec(
        dict[str, Any],
        description="large: written by a job; fetch export_url once status_url says done",
        generate_examples=False,
    )
}


class PrivacyController(Controller):
    """A person's or a group's data: all of it out, or all of it gone."""

    path = "/v1"
    tags = ["privacy"]

    @get(f"/users/{_ID}/export", media_type="application/json", responses=_LATER)
    async def export_user(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        subject: str,
    ) -> Response[Any]:
        """Everything the tenant holds about a person: one streamed JSON document, or 202 with
        a job that writes it when large."""
        return await _export(request, session, tenant.tenant_id, "user", subject, tenant.key_prefix)

    @get(f"/groups/{_ID}/export", media_type="application/json", responses=_LATER)
    async def export_group(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        subject: str,
    ) -> Response[Any]:
        """Everything the tenant holds about a group: one streamed JSON document, or 202 with
        a job that writes it when large."""
        return await _export(
            request, session, tenant.tenant_id, "group", subject, tenant.key_prefix
        )

    @delete(
        f"/users/{_ID}",
        status_code=200,
        responses={
            202: ResponseSpec(
                dict[str, Any], description="large: erased by a job", generate_examples=False
            )
        },
    )
    async def erase_user(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        subject: str,
    ) -> Response[dict[str, Any]]:
        """Erase a person for real; 200 with a receipt, or 202 with a job when large."""
        rt = runtime(request)
        limit = rt.settings.privacy_sync_limit
        if await service.count_user_rows(session, tenant.tenant_id, subject) > limit:
            job_id, _ = await jobs.enqueue(
                session,
                tenant.tenant_id,
                ERASE_JOB,
                {"user_id": subject, "requested_by": tenant.key_prefix},
                max_attempts=rt.settings.cognitive.queue.max_attempts,
            )
            body = {"job_id": job_id, "status_url": f"/v1/jobs/{job_id}"}
            return Response(body, status_code=202)
        counts = await service.erase_user(
            session,
            tenant.tenant_id,
            subject,
            rt.embedder,
            requested_by=tenant.key_prefix,
            keep=rt.settings.cognitive.profile.revision_keep,
        )
        return Response({"erased": "user", "counts": counts}, status_code=200)

    @delete(f"/groups/{_ID}", status_code=200)
    async def erase_group(
        self, tenant: TenantContext, session: AsyncSession, subject: str
    ) -> dict[str, Any]:
        """Erase a group and everything of it."""
        counts = await service.erase_group(
            session, tenant.tenant_id, subject, requested_by=tenant.key_prefix
        )
        return {"erased": "group", "counts": counts}


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
        request: Request[Any, Any, Any],
        admin: None,
        session: AsyncSession,
        tenant_id: uuid.UUID,
    ) -> Response[Any]:
        """The whole tenant as NDJSON, streamed; or 202 with a job that writes it when large."""
        return await _export(request, session, tenant_id, "tenant", str(tenant_id), ADMIN_ACTOR)


async def _export(
    request: Request[Any, Any, Any],
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    requested_by: str | None,
) -> Response[Any]:
    """Stream a small export now; hand a large one to a job (202 with where to look); only
    ``requested_by`` may fetch what the job writes."""
    rt = runtime(request)
    later = await exports.export_later(
        session, tenant_id, kind, subject, rt.settings, requested_by=requested_by
    )
    if later is None:
        chunks = (
            service.export_tenant(rt.db, tenant_id)
            if kind == "tenant"
            else service.export_stream(rt.db, tenant_id, kind, subject)
        )
        return Stream(chunks, media_type=exports.media_type(kind))
    # The admin has no job listing: the export's own address answers 409 until it is ready.
    status_url = f"/v1/jobs/{later.job_id}" if kind != "tenant" else later.url
    body = {
        "job_id": later.job_id,
        "status_url": status_url,
        "export_id": later.export_id,
        "export_url": later.url,
    }
    return Response(body, status_code=202, media_type="application/json")


def erase_handler(rt: Runtime) -> Any:
    """The ``privacy.erase_user`` job: a large erasure, then its own payload is scrubbed."""

    async def run(job: JobContext) -> dict[str, Any]:
        user_id = str(job.job.payload["user_id"])
        async with job.finishing() as session:
            counts = await service.erase_user(
                session,
                job.job.tenant_id,
                user_id,
                rt.embedder,
                requested_by=job.job.payload.get("requested_by"),
                keep=rt.settings.cognitive.profile.revision_keep,
                spare_job=job.job.id,
            )
            # The job row itself must not keep the id it erased.
            hashed = await service.subject_hash(session, job.job.tenant_id, "user", user_id)
            await session.execute(
                text(
                    "UPDATE jobs SET payload = CAST(:p AS jsonb) WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "p": json.dumps({"subject_hash": hashed}),
                    "t": job.job.tenant_id,
                    "id": job.job.id,
                },
            )
            job.result = {"erased": "user", "counts": counts}
        return job.result

    return run
