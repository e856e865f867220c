"""The registry of job kinds: which service function runs each kind of job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.ends.service import END_JOB
from service.historian.service import Historian
from service.messages.service import EMBED_JOB, EXTRACT_JOB, Archivist
from service.queue.worker import JobHandler, Periodic

if TYPE_CHECKING:
    from service.runtime import Runtime


def handlers(runtime: Runtime) -> dict[str, JobHandler]:
    """Job kind → handler, bound to this process's runtime."""
    historian = Historian(runtime.embedder, runtime.llm, runtime.settings)
    archivist = Archivist(runtime.db, runtime.embedder, runtime.settings, runtime.llm)
    return {
        END_JOB: historian.run_end,
        EMBED_JOB: archivist.run_embed,
        EXTRACT_JOB: archivist.run_extract,
    }


def periodic(runtime: Runtime) -> list[Periodic]:
    """Work a worker does on a timer rather than from the queue."""
    archivist = Archivist(runtime.db, runtime.embedder, runtime.settings)
    interval = runtime.settings.cognitive.extraction.check_interval_seconds
    return [Periodic("pause-trigger", interval, archivist.trigger_quiet_conversations)]
