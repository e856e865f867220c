"""API shapes of events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class EventInfo(BaseModel):
    """An event: the absolute text and the seeds' metadata."""

    id: str
    text: str
    source_text: str
    kind: str
    perspective: str
    is_absolute: bool
    warnings: list[Any]
    request_type: str
    group_id: str | None
    user_id: str | None
    sender_id: str | None
    request_id: str
    end_seq: int
    occurred_at: datetime
    timezone: str
    location_abs: str | None
    message_ids: list[Any]
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class EventPage(BaseModel):
    """A page of events, newest first; pass ``next_before`` as ``before`` for the next page."""

    events: list[EventInfo]
    next_before: str | None
