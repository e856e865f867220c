"""The registry of job kinds: which service function runs each kind of job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from service.audit import service as audit
from service.ends.service import END_JOB
from service.exports import service as exports
from service.historian.extraction import Extractor
from service.historian.service import Historian
from service.memories.upkeep import CONSOLIDATE_JOB, MAINTAIN_JOB, Upkeep
from service.messages.service import EMBED_JOB, EXTRACT_JOB, Archivist
from service.privacy.routes import ERASE_JOB, erase_handler
from service.queue.worker import BatchHandler, JobHandler, Periodic
from service.reembed.service import BATCH_JOB, SWITCH_JOB, Reembedder
from service.todos.service import DELIVER_JOB, Courier

if TYPE_CHECKING:
    from service.runtime import Runtime


def handlers(runtime: Runtime) -> dict[str, JobHandler]:
    """Job kind → handler, bound to this process's runtime."""
    historian = Historian(runtime.embedder, runtime.llm, runtime.settings)
    archivist = Archivist(runtime.db, runtime.embedder, runtime.settings)
    extractor = Extractor(runtime.db, runtime.embedder, runtime.settings, runtime.llm)
    upkeep = Upkeep(runtime.db, runtime.settings)
    courier = Courier(runtime.db, runtime.settings)
    reembedder = Reembedder(runtime.db, runtime.settings)
    runtime.on_close.append(reembedder.close)
    return {
        END_JOB: historian.run_end,
        EMBED_JOB: archivist.run_embed,
        EXTRACT_JOB: extractor.run_extract,
        MAINTAIN_JOB: upkeep.run_maintain,
        CONSOLIDATE_JOB: upkeep.run_consolidate,
        DELIVER_JOB: courier.run_deliver,
        ERASE_JOB: erase_handler(runtime),
        exports.EXPORT_JOB: exports.ExportWriter(runtime.settings).run,
        BATCH_JOB: reembedder.run_batch,
        SWITCH_JOB: reembedder.run_switch,
    }


def batch_handlers(runtime: Runtime) -> dict[str, BatchHandler]:
    """Job kinds a worker claims and runs many at a time (each also has a one-job handler,
    which runs what a batch could not finish)."""
    historian = Historian(runtime.embedder, runtime.llm, runtime.settings)
    return {END_JOB: historian.run_end_batch}


def periodic(runtime: Runtime) -> list[Periodic]:
    """Work a worker does on a timer rather than from the queue."""
    extractor = Extractor(runtime.db, runtime.embedder, runtime.settings)
    upkeep = Upkeep(runtime.db, runtime.settings)
    courier = Courier(runtime.db, runtime.settings)
    check = runtime.settings.cognitive.extraction.check_interval_seconds
    maintenance = runtime.settings.cognitive.memory.maintenance_interval_minutes * 60
    return [
        Periodic("pause-trigger", check, extractor.trigger_quiet_conversations),
        Periodic("todo-delivery", check, courier.enqueue_due),
        Periodic("maintenance", min(maintenance, 300.0), upkeep.schedule_maintenance),
        Periodic("audit-prune", 3600.0, _audit_pruner(runtime)),
        # Every few minutes, so an export outlives its retention by little.
        Periodic("export-prune", 300.0, lambda: exports.prune(runtime.db)),
    ]


def _audit_pruner(runtime: Runtime) -> Callable[[], Awaitable[int]]:
    async def prune() -> int:
        async with runtime.db.system() as session:
            return await audit.prune(session, runtime.settings.audit_retention_days)

    return prune
