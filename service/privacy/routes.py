"""``/v1/users/{id}`` and ``/v1/groups/{id}``: export and erasure; the admin's tenant-wide ones."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, Response, delete, get
from litestar.di import Provide
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.http import errors, provide_admin, provide_system_session, runtime
from service.privacy import service
from service.queue import repository as jobs
from service.queue.worker import JobContext
from service.runtime import Runtime
from service.tenants.service import TenantContext

ERASE_JOB = "privacy.erase_user"
_ID = "{subject:str}"


class PrivacyController(Controller):
    """A person's or a group's data: all of it out, or all of it gone."""

    path = "/v1"
    tags = ["privacy"]

    @get(f"/users/{_ID}/export", media_type="application/json")
    async def export_user(
        self, request: Request[Any, Any, Any], tenant: TenantContext, subject: str
    ) -> Stream:
        """Everything the tenant holds about a person, as one streamed JSON document."""
        return Stream(service.export_stream(runtime(request).db, tenant.tenant_id, "user", subject))

    @get(f"/groups/{_ID}/export", media_type="application/json")
    async def export_group(
        self, request: Request[Any, Any, Any], tenant: TenantContext, subject: str
    ) -> Stream:
        """Everything the tenant holds about a group, as one streamed JSON document."""
        return Stream(
            service.export_stream(runtime(request).db, tenant.tenant_id, "group", subject)
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
                max_attempts=rt.settings.cognitive.queue.job_max_retries + 1,
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

    @get("/{tenant_id:uuid}/export", media_type="application/x-ndjson", responses=errors(404))
    async def export_tenant(
        self, request: Request[Any, Any, Any], admin: None, tenant_id: uuid.UUID
    ) -> Stream:
        """The whole tenant as NDJSON, streamed."""
        return Stream(service.export_tenant(runtime(request).db, tenant_id))


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


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
            await session.execute(
                text(
                    "UPDATE jobs SET payload = CAST(:p AS jsonb) WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "p": _dumps(
                        {"subject_hash": service.subject_hash(job.job.tenant_id, "user", user_id)}
                    ),
                    "t": job.job.tenant_id,
                    "id": job.job.id,
                },
            )
            job.result = {"erased": "user", "counts": counts}
        return job.result

    return run
