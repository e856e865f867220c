"""API shapes of jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class JobInfo(BaseModel):
    """A job as its tenant sees it."""

    id: int
    kind: str
    status: str
    priority: int
    attempts: int
    max_attempts: int
    run_after: datetime
    last_error: str | None
    result: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobPage(BaseModel):
    """One page of jobs; pass ``next_before`` as ``before`` for the next page."""

    jobs: list[JobInfo]
    next_before: int | None
