"""The wiring of job kinds: which aggregate's service runs each kind of job, and the work a
worker does on a timer.

This is the one module that knows every aggregate's jobs. It sits above the runtime (it is
handed to ``Runtime.build``) and above the routes; nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession

from service.audit import service as audit
from service.db.engine import Database
from service.ends.service import END_JOB
from service.exports import service as exports
from service.historian.extraction import Extractor
from service.historian.service import Historian
from service.memories.upkeep import CONSOLIDATE_JOB, MAINTAIN_JOB, Upkeep
from service.messages.service import EMBED_JOB, EXTRACT_JOB, Archivist
from service.privacy import service as privacy
from service.privacy.jobs import Eraser
from service.privacy.service import ERASE_GROUP_JOB, ERASE_TENANT_JOB, ERASE_USER_JOB
from service.queue.worker import BatchHandler, JobHandler, Periodic
from service.reembed.service import BATCH_JOB, SWITCH_JOB, Reembedder
from service.runtime import JobKinds, Runtime
from service.settings import Settings
from service.tenants import service as tenants
from service.todos.service import DELIVER_JOB, Courier


def build_runtime(
    settings: Settings, *, db: Database | None = None, config: str | Path | None = None
) -> Runtime:
    """A runtime whose worker runs every job kind (see ``Runtime.build``)."""
    return Runtime.build(settings, db=db, config=config, wiring=wiring)


def wiring(runtime: Runtime) -> JobKinds:
    """Job kind → handler, the kinds run in batches, and the timed work, bound to this
    process's runtime."""
    historian = Historian(runtime.embedder, runtime.llm, runtime.settings)
    return JobKinds(
        handlers=handlers(runtime, historian),
        periodic=periodic(runtime),
        batch_handlers=batch_handlers(historian),
    )


def handlers(runtime: Runtime, historian: Historian) -> dict[str, JobHandler]:
    """Job kind → handler, bound to this process's runtime."""
    archivist = Archivist(runtime.db, runtime.embedder, runtime.settings)
    extractor = Extractor(runtime.db, runtime.embedder, runtime.settings, runtime.llm)
    upkeep = Upkeep(runtime.db, runtime.settings)
    courier = Courier(runtime.db, runtime.settings)
    eraser = Eraser(runtime.embedder, runtime.settings)
    reembedder = Reembedder(runtime.db, runtime.settings)
    runtime.on_close.append(reembedder.close)
    return {
        END_JOB: historian.run_end,
        EMBED_JOB: archivist.run_embed,
        EXTRACT_JOB: extractor.run_extract,
        MAINTAIN_JOB: upkeep.run_maintain,
        CONSOLIDATE_JOB: upkeep.run_consolidate,
        DELIVER_JOB: courier.run_deliver,
        ERASE_USER_JOB: eraser.run_erase,
        ERASE_GROUP_JOB: eraser.run_erase_group,
        ERASE_TENANT_JOB: eraser.run_erase_tenant,
        exports.EXPORT_JOB: exports.ExportWriter(runtime.settings).run,
        BATCH_JOB: reembedder.run_batch,
        SWITCH_JOB: reembedder.run_switch,
    }


def batch_handlers(historian: Historian) -> dict[str, BatchHandler]:
    """Job kinds a worker claims and runs many at a time (each also has a one-job handler,
    which runs what a batch could not finish)."""
    return {END_JOB: historian.run_end_batch}


def periodic(runtime: Runtime) -> list[Periodic]:
    """Work a worker does on a timer rather than from the queue."""
    extractor = Extractor(runtime.db, runtime.embedder, runtime.settings)
    upkeep = Upkeep(runtime.db, runtime.settings)
    courier = Courier(runtime.db, runtime.settings)
    settings = runtime.settings
    check = settings.cognitive.extraction.check_interval_seconds
    maintenance = runtime.settings.cognitive.memory.maintenance_interval_minutes * 60
    return [
        Periodic("pause-trigger", check, extractor.trigger_quiet_conversations),
        Periodic("todo-delivery", check, courier.enqueue_due),
        Periodic("maintenance", min(maintenance, 300.0), upkeep.schedule_maintenance),
        Periodic(
            "audit-prune", 3600.0, _pruner(runtime, audit.prune, settings.audit_retention_days)
        ),
        Periodic(
            "key-prune",
            3600.0,
            _pruner(runtime, tenants.prune_revoked_keys, settings.revoked_key_retention_days),
        ),
        # What a request or job step under way at a tenant's erasure wrote after it (seen
        # within minutes of the erasure: a day's tombstones are looked at).
        Periodic("tenant-sweep", 600.0, _pruner(runtime, privacy.sweep_after_tenants, 1.0)),
        # Every few minutes, so an export outlives its retention by little.
        Periodic("export-prune", 300.0, lambda: exports.prune(runtime.db)),
    ]


def _pruner(
    runtime: Runtime, prune: Callable[[AsyncSession, float], Awaitable[int]], days: float
) -> Callable[[], Awaitable[int]]:
    """``prune`` with its span of ``days`` (what is older goes, or for the sweep, which
    erasures are looked at), as the owning role (every tenant's rows)."""

    async def run() -> int:
        async with runtime.db.system() as session:
            return await prune(session, days)

    return run
