"""Keeping memory small and sharp: periodic maintenance per tenant, consolidation when quiet."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from service.db.engine import Database
from service.memories import service
from service.queue import repository as jobs
from service.queue.payloads import ConsolidatePayload, NoPayload
from service.queue.worker import JobContext
from service.settings import Settings
from service.todos import service as todos
from service.visibility import Viewer

MAINTAIN_JOB = "memories.maintain"
CONSOLIDATE_JOB = "memories.consolidate"


@dataclass
class Upkeep:
    """The maintenance and consolidation jobs."""

    db: Database
    settings: Settings

    async def schedule_maintenance(self) -> int:
        """Periodic: one maintenance job per tenant per interval (deduplicated by bucket)."""
        interval = self.settings.cognitive.memory.maintenance_interval_minutes * 60
        bucket = int(datetime.now(UTC).timestamp() // interval)
        async with self.db.system() as session:
            tenants = [r.id for r in await session.execute(text("SELECT id FROM tenants"))]
            for tenant_id in tenants:
                await jobs.enqueue(
                    session,
                    tenant_id,
                    MAINTAIN_JOB,
                    NoPayload(),
                    max_attempts=self.settings.cognitive.queue.max_attempts,
                    dedupe_key=f"maintain:{bucket}",
                )
        return len(tenants)

    async def run_maintain(self, job: JobContext) -> dict[str, Any]:
        """Expire validity, decay and forget unused memories, expire overdue todos."""
        now = datetime.now(UTC)
        async with job.finishing() as session:
            result: dict[str, Any] = await service.maintain(
                session, job.job.tenant_id, self.settings.cognitive.memory, now
            )
            result["todos_expired"] = await todos.expire_overdue(
                session, job.job.tenant_id, now, self.settings
            )
            job.result = result
        return result

    async def run_consolidate(self, job: JobContext) -> dict[str, Any]:
        """Merge near-duplicate memories of a conversation that went quiet."""
        key = ConsolidatePayload.of(job.job.payload).conversation_key
        scope = Viewer.of_key(key)
        async with job.finishing() as session:
            merged = await service.consolidate(
                session,
                job.job.tenant_id,
                scope,
                self.settings.cognitive.memory,
                {"by": "job", "job_id": job.job.id},
            )
            job.result = {"conversation_key": key, "merged": merged}
        return job.result


async def enqueue_consolidation(
    session: Any, tenant_id: Any, conversation_key: str, settings: Settings, stamp: int
) -> None:
    """Ask for a consolidation of a conversation (once per quiet spell)."""
    await jobs.enqueue(
        session,
        tenant_id,
        CONSOLIDATE_JOB,
        ConsolidatePayload(conversation_key=conversation_key),
        max_attempts=settings.cognitive.queue.max_attempts,
        dedupe_key=f"consolidate:{conversation_key}:{stamp}",
    )
