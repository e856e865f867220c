"""``/v1/jobs``: a tenant's own jobs, and retrying a failed one."""

from __future__ import annotations

from typing import Literal

from litestar import Controller, get, post
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.types import BIGINT_MAX
from service.errors import Conflict, NotFound
from service.http import RowId, errors
from service.queue import repository
from service.queue.schemas import JobInfo, JobPage
from service.tenants.service import TenantContext


class JobController(Controller):
    """The calling tenant's jobs."""

    path = "/v1/jobs"
    tags = ["jobs"]

    @get("/")
    async def list_jobs(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        status: Literal["queued", "running", "done", "failed"] | None = None,
        before: int | None = Parameter(default=None, ge=1, le=BIGINT_MAX),
        limit: int = Parameter(default=50, ge=1, le=500),
    ) -> JobPage:
        """Jobs newest first, optionally of one status."""
        rows = await repository.list_jobs(session, tenant.tenant_id, status, before, limit)
        jobs = [JobInfo(**row) for row in rows]
        return JobPage(jobs=jobs, next_before=jobs[-1].id if len(jobs) == limit else None)

    @get("/{job_id:int}", responses=errors(404))
    async def get_job(self, tenant: TenantContext, session: AsyncSession, job_id: RowId) -> JobInfo:
        """One job."""
        row = await repository.get_job(session, tenant.tenant_id, job_id)
        if row is None:
            raise NotFound("no such job")
        return JobInfo(**row)

    @post("/{job_id:int}/retry", status_code=200, responses=errors(404, 409))
    async def retry_job(
        self, tenant: TenantContext, session: AsyncSession, job_id: RowId
    ) -> JobInfo:
        """Queue a failed job again with a fresh set of attempts."""
        if not await repository.retry(session, tenant.tenant_id, job_id):
            row = await repository.get_job(session, tenant.tenant_id, job_id)
            if row is None:
                raise NotFound("no such job")
            raise Conflict(f"only failed jobs can be retried; this one is {row['status']}")
        row = await repository.get_job(session, tenant.tenant_id, job_id)
        assert row is not None
        return JobInfo(**row)
