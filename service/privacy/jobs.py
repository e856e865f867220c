"""The privacy package's jobs: a person's, a group's or a tenant's erasure too large to run
in the request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.embedding import Embedder
from service.privacy import erasure, service
from service.queue import repository as jobs
from service.queue.payloads import ErasedPayload, EraseGroupPayload, EraseUserPayload
from service.queue.personal import JOBS
from service.queue.worker import JobContext
from service.settings import Settings

# Rows of one table a tenant's erasure job deletes per transaction.
TENANT_BATCH_ROWS = 5000


@dataclass
class Eraser:
    """Runs ``privacy.erase_user``, ``privacy.erase_group`` and ``privacy.erase_tenant`` jobs
    (enqueued by ``service.erase_*_now_or_later``)."""

    embedder: Embedder
    settings: Settings

    async def run_erase(self, job: JobContext) -> dict[str, Any]:
        """Erase the person, then scrub the job's own payload, in the job's last transaction
        (the erasure takes the tenant's erasure fence itself, exclusively)."""
        payload = EraseUserPayload.of(job.job.payload)
        tenant_id = job.job.tenant_id
        async with job.finishing(fenced=False) as session:
            counts = await service.erase_user(
                session,
                tenant_id,
                payload.user_id,
                self.embedder,
                requested_by=payload.requested_by,
                keep=self.settings.cognitive.profile.revision_keep,
                spare_job=job.job.id,
            )
            # The job row itself must not keep the id it erased.
            hashed = await service.subject_hash(session, tenant_id, "user", payload.user_id)
            await jobs.replace_payload(
                session, tenant_id, job.job.id, ErasedPayload(subject_hash=hashed)
            )
            job.result = {"erased": "user", "counts": counts}
        return job.result

    async def run_erase_group(self, job: JobContext) -> dict[str, Any]:
        """Erase the group, then scrub the job's own payload, in the job's last transaction."""
        payload = EraseGroupPayload.of(job.job.payload)
        tenant_id = job.job.tenant_id
        async with job.finishing(fenced=False) as session:
            counts = await service.erase_group(
                session, tenant_id, payload.group_id, requested_by=payload.requested_by
            )
            # The job row itself must not keep the id it erased.
            hashed = await service.subject_hash(session, tenant_id, "group", payload.group_id)
            await jobs.replace_payload(
                session, tenant_id, job.job.id, ErasedPayload(subject_hash=hashed)
            )
            job.result = {"erased": "group", "counts": counts}
        return job.result

    async def run_erase_tenant(self, job: JobContext) -> dict[str, Any]:
        """Erase the tenant a batch of rows per transaction (one transaction held every row of
        a million events' tenant locked for 20 s), then what is left, its own row and this
        job's with it, in the last. Each batch commits the rows counted so far with it, so a
        run stopped half way (a failed attempt, a worker stopping or dying) goes on where it
        stopped, and the tombstone counts every run's rows."""
        tenant_id = job.job.tenant_id
        erased: dict[str, int] = dict((job.job.progress or {}).get("counts", {}))
        for table in erasure.tenant_rows():
            if table is JOBS:  # this job's row goes in the last transaction
                continue
            deleted = TENANT_BATCH_ROWS
            while deleted == TENANT_BATCH_ROWS:
                job.stop_point()
                async with job.db.system() as session:
                    deleted = await erasure.erase_tenant_rows(
                        session, tenant_id, table, TENANT_BATCH_ROWS
                    )
                    if deleted:
                        erased[table.table] = erased.get(table.table, 0) + deleted
                        await job.checkpoint(session, {"erased": "tenant", "counts": erased})
        async with job.vanishing() as session:
            counts = await service.erase_tenant(session, tenant_id, erased)
        job.result = {"erased": "tenant", "counts": counts if counts is not None else erased}
        return job.result
