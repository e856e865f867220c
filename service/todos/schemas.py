"""API shapes of todos."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.context import ConversationContext, Moment, path_safe

Status = Literal["PENDING", "COMPLETED", "CANCELLED", "EXPIRED"]


class TodoInfo(BaseModel):
    """A todo."""

    id: int
    group_id: str | None
    user_id: str | None
    creator_id: str | None
    assignee_id: str | None
    description: str
    trigger_time: datetime | None
    status: str
    evidence: dict[str, Any]
    delivered_at: datetime | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None


class TodoPatch(BaseModel):
    """``PATCH /v1/todos/{id}``."""

    model_config = ConfigDict(extra="forbid")

    status: Status | None = None
    description: str | None = Field(default=None, min_length=1, max_length=2000)
    trigger_time: Moment | None = Field(
        default=None, description="ISO 8601; without an offset, on the tenant's clocks"
    )
    assignee_id: str | None = Field(default=None, max_length=128)

    _assignee = field_validator("assignee_id")(path_safe)

    @field_validator("status", "description")
    @classmethod
    def _given(cls, value: str | None) -> str:
        # Left out, either stays; null would clear what a todo always has (and hit the
        # database's NOT NULL, a conflict naming nothing). Null clears a time or an assignee.
        if value is None:
            raise ValueError("may be left out, not null")
        return value


class TodoCreate(ConversationContext):
    """``POST /v1/todos``: a bot adds a todo of the conversation it serves (a group's todo
    is read in that group, a private chat's in that chat alone)."""

    model_config = ConfigDict(extra="forbid", str_max_length=100_000)

    description: str = Field(min_length=1, max_length=2000, description="what is to be done")
    trigger_time: Moment | None = Field(
        default=None,
        description="ISO 8601 with offset; without one, on the conversation's clocks",
    )
