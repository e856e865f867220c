"""API shapes of the raw message archive."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.context import ID_MAX, ConversationContext, Moment, _as_id, iana_zone

_INHERITED = (
    "request_type",
    "group_id",
    "group_name",
    "user_id",
    "sender_id",
    "sender_name",
    "timezone",
)


def _optional_id(value: Any) -> Any:
    """An id as ``_as_id`` reads it; empty is none."""
    value = _as_id(value)
    return value if value != "" else None


class MessageIn(BaseModel):
    """One chat message; context fields missing here come from the batch's top level. An
    unknown field is refused by name, not dropped."""

    model_config = ConfigDict(extra="forbid")

    message_id: str = Field(min_length=1, max_length=ID_MAX)
    request_type: Literal["group", "private"]
    group_id: str | None = Field(default=None, max_length=ID_MAX)
    group_name: str | None = Field(default=None, max_length=200)
    user_id: str | None = Field(default=None, max_length=ID_MAX)
    sender_id: str | None = Field(default=None, max_length=ID_MAX)
    sender_name: str | None = Field(default=None, max_length=200)
    text: str = Field(
        max_length=1_000_000,
        description="at most cognitive.messages.text_max_chars characters (20,000 by default);"
        " longer is refused with 422 naming the message",
    )
    sent_at: Moment | None = None
    timezone: str | None = Field(default=None, max_length=64)

    @field_validator("message_id", "group_id", "user_id", "sender_id", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        return _optional_id(value)

    @model_validator(mode="after")
    def _conversation(self) -> MessageIn:
        if self.request_type == "group" and not self.group_id:
            raise ValueError("group_id is required when request_type is 'group'")
        if self.request_type == "private" and not (self.user_id or self.sender_id):
            raise ValueError("user_id is required when request_type is 'private'")
        return self


class MessageBatch(BaseModel):
    """``POST /v1/messages``: up to the configured batch size of messages (and the context
    fields they share); an unknown field is refused by name."""

    model_config = ConfigDict(extra="forbid")

    messages: list[MessageIn] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        """Context given once at the top level applies to every message lacking it."""
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            return data
        shared = {k: data[k] for k in _INHERITED if data.get(k) not in (None, "")}
        # Handed down to the messages. The rest of a conversation context (bot_id, timestamp,
        # …: a bot may send the one it sends everywhere) is known and has no use here.
        data = {k: v for k, v in data.items() if k not in ConversationContext.model_fields}
        data["messages"] = [
            {**shared, **{k: v for k, v in m.items() if v not in (None, "")}}
            if isinstance(m, dict)
            else m
            for m in data["messages"]
        ]
        return data


class MessagesStored(BaseModel):
    """What ``POST /v1/messages`` did."""

    stored: int
    duplicates: int
    dropped: int = 0
    warnings: list[str] = Field(default_factory=list)
    extraction_job_ids: list[int] = Field(default_factory=list)
    embed_job_id: int | None = None


class MessageSearch(BaseModel):
    """``POST /v1/messages/search``: the archive look-up of one conversation."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    # As /v1/messages takes it; it must agree with the id given.
    request_type: Literal["group", "private"] | None = None
    group_id: str | None = Field(default=None, max_length=ID_MAX)
    user_id: str | None = Field(default=None, max_length=ID_MAX)
    top_k: int = Field(default=12, ge=1, le=200)
    time_from: Moment | None = None
    time_to: Moment | None = None
    asker_id: str | None = Field(
        default=None,
        max_length=ID_MAX,
        description="who asks (a member's sender_id, as /v1/context's sender_id): in a group,"
        " among close matches their own messages rank first, unless the query names a member",
    )
    timezone: str | None = Field(
        default=None,
        max_length=64,
        description='IANA name; a day the query names ("on 13 October 2023"), and time_from'
        " and time_to given without an offset, are read on its clocks (default: the tenant's)",
    )

    @model_validator(mode="after")
    def _request_type(self) -> MessageSearch:
        if self.request_type == "group" and not self.group_id:
            raise ValueError("group_id is required when request_type is 'group'")
        if self.request_type == "private" and (self.group_id or not self.user_id):
            raise ValueError("a private chat is searched by user_id alone")
        return self

    @field_validator("group_id", "user_id", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        return _as_id(value)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str | None) -> str | None:
        return iana_zone(value)

    @field_validator("asker_id", mode="before")
    @classmethod
    def _asker(cls, value: Any) -> Any:
        return _optional_id(value)


class MessageHit(BaseModel):
    """One archived message found by a search."""

    message_id: str
    text: str
    sender_id: str | None
    sender_name: str | None
    sent_at: datetime
    score: float


class MessageSearchResult(BaseModel):
    """The hits, best first, and any note about the query."""

    messages: list[MessageHit]
    warnings: list[str] = Field(default_factory=list)
