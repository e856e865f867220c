"""The registry of job kinds: which service function runs each kind of job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.queue.worker import JobHandler

if TYPE_CHECKING:
    from service.runtime import Runtime


def handlers(runtime: Runtime) -> dict[str, JobHandler]:
    """Job kind → handler, bound to this process's runtime."""
    return {}
