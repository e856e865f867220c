"""API shapes of the read path: the per-turn context, event search, persona, tools."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from service.context import ID_MAX, ConversationContext, Moment, _as_id


class ContextRequest(ConversationContext):
    """``POST /v1/context``: the conversation and the current message (or a batch of them)."""

    message: str | None = Field(default=None, max_length=100_000)
    messages: list[str] | None = Field(default=None, max_length=100)
    token_budget: int | None = Field(default=None, ge=100, le=100_000)
    at_bot: bool | None = Field(default=None, description="the bot was @-mentioned")

    @model_validator(mode="after")
    def _one_message(self) -> ContextRequest:
        if not self.message and not self.messages:
            raise ValueError("message or messages is required")
        return self


class ContextItem(BaseModel):
    """One injected item, with its id so the bot can cite it."""

    id: str
    kind: str
    text: str
    score: float | None = Field(
        default=None,
        description="events and memories: relevance on the embedder's calibrated scale (0 is"
        " what the model gives an unrelated text, 1 a clearly related one; an event's with its"
        " recency lift, at most ×(1 + time_decay_boost)); none under the tenant's"
        " context_min_relevance is injected",
    )
    meta: dict[str, Any] = Field(default_factory=dict)


class ContextResponse(BaseModel):
    """Everything to inject this turn, and the ready-made ``prompt`` block."""

    query: str
    cognitive_enabled: bool
    persona: str | None
    user_profile: ContextItem | None
    group_profile: ContextItem | None
    member_profile: ContextItem | None
    # The person as their own private chat knows them: only ever in that chat.
    private_profile: ContextItem | None = None
    events: list[ContextItem]
    memories: list[ContextItem]
    todos: list[ContextItem]
    memos: list[ContextItem]
    dropped: list[str]
    token_estimate: int
    prompt: str


class EventSearch(BaseModel):
    """``POST /v1/events/search`` = ``cognitive.search_events``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=4000,
        description="搜索关键词或语义描述 / keywords or a description",
    )
    # ``group_id`` / ``user_id`` as the memory and message searches name them.
    target_user_id: str | None = Field(
        default=None,
        max_length=ID_MAX,
        validation_alias=AliasChoices("target_user_id", "user_id"),
        description="限定用户 ID / only events of this user",
    )
    target_group_id: str | None = Field(
        default=None,
        max_length=ID_MAX,
        validation_alias=AliasChoices("target_group_id", "group_id"),
        description="限定群 ID / only events of this group",
    )
    top_k: int | None = Field(
        default=None,
        ge=1,
        le=200,
        description="返回条数（默认 12） / how many results (default 12, a tenant setting)",
    )
    time_from: Moment | None = Field(default=None, description="起始时间 / start time, ISO 8601")
    time_to: Moment | None = Field(default=None, description="截止时间 / end time, ISO 8601")
    context: ConversationContext | None = None

    @field_validator("target_user_id", "target_group_id", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        # As the message search reads them: a number is an id, an id with '/' is none that
        # could have been stored (see ``path_safe``).
        return _as_id(value)


class EventHit(BaseModel):
    """An event found by a search, with the scores that ranked it."""

    id: str
    text: str
    occurred_at: datetime
    group_id: str | None
    user_id: str | None
    sender_id: str | None
    kind: str
    is_absolute: bool
    similarity: float
    score: float


class EventSearchResult(BaseModel):
    """Hits best first, and notes about the query (swapped bounds, …)."""

    events: list[EventHit]
    warnings: list[str] = Field(default_factory=list)


class Persona(BaseModel):
    """The tenant's persona block: the bot's character and boundary rules."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=20_000)


class ToolCall(BaseModel):
    """``POST /v1/tools/call``: one of the bot's function calls, forwarded as is."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    context: dict[str, Any] | None = None


class ToolResult(BaseModel):
    """The tool's answer, ready to hand back to the model as the tool message content."""

    name: str
    result: Any
    content: str
