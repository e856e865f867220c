"""The privacy package's jobs: a person's or a group's erasure too large to run in the
request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.embedding import Embedder
from service.privacy import service
from service.queue import repository as jobs
from service.queue.payloads import ErasedPayload, EraseGroupPayload, EraseUserPayload
from service.queue.worker import JobContext
from service.settings import Settings


@dataclass
class Eraser:
    """Runs ``privacy.erase_user`` and ``privacy.erase_group`` jobs (enqueued by
    ``service.erase_user_now_or_later`` and ``service.erase_group_now_or_later``)."""

    embedder: Embedder
    settings: Settings

    async def run_erase(self, job: JobContext) -> dict[str, Any]:
        """Erase the person, then scrub the job's own payload, in the job's last transaction."""
        payload = EraseUserPayload.of(job.job.payload)
        tenant_id = job.job.tenant_id
        async with job.finishing() as session:
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
        async with job.finishing() as session:
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
