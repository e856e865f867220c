"""API shapes of memories."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.context import Moment, path_safe
from service.db.types import BIGINT_MAX

Scope = Literal["GLOBAL", "PRIVATE", "GROUP", "MEMBER_IN_GROUP"]
Category = Literal["PROFILE", "PREFERENCE", "FACT", "SUMMARY"]
_ON_CLOCKS = "ISO 8601; without an offset, on the tenant's clocks"


class MemoryInfo(BaseModel):
    """A memory as the API shows it."""

    id: int
    scope: str
    user_id: str | None
    group_id: str | None
    category: str
    content: str
    confidence: float
    importance: float
    valid_from: datetime | None
    valid_to: datetime | None
    is_active: bool
    last_used_at: datetime | None
    summary_day: date | None
    evidence: dict[str, Any]
    created_at: datetime
    updated_at: datetime


# What a search's score is, the same for memories, profiles and events.
RELEVANCE = (
    "relevance on the embedder's calibrated scale: 0 is what the model gives an unrelated"
    " text, 1 a clearly related one (below 0: less related than a typical unrelated text)"
)
MIN_RELEVANCE = (
    "只返回相关度不低于此值的结果 / only results at least this relevant (0..1, the scale of"
    " score; the tenant's context_min_relevance is the floor of a turn's context)"
)


class MemoryHit(MemoryInfo):
    """A memory found by meaning."""

    score: float = Field(description=RELEVANCE)


class MemoryCreate(BaseModel):
    """``POST /v1/memories``: an operator or a bot adds a memory directly."""

    model_config = ConfigDict(extra="forbid")

    scope: Scope
    user_id: str | None = Field(default=None, max_length=128)
    group_id: str | None = Field(default=None, max_length=128)
    category: Category = "FACT"
    content: str = Field(min_length=1, max_length=2000)
    confidence: float = Field(default=0.8, ge=0, le=1)
    importance: float = Field(default=0.5, ge=0, le=1)
    valid_from: Moment | None = Field(default=None, description=_ON_CLOCKS)
    valid_to: Moment | None = Field(default=None, description=_ON_CLOCKS)
    reason: str | None = Field(default=None, max_length=500)

    @field_validator("user_id", "group_id")
    @classmethod
    def _ids(cls, value: str | None) -> str | None:
        """An empty id is no id (the scope's binding needs NULL); see ``path_safe``."""
        return path_safe(value) or None


class MemoryCreated(MemoryInfo):
    """The memory added, or the active one it duplicates."""

    duplicate: bool


class MemoryPatch(BaseModel):
    """``PATCH /v1/memories/{id}``: change content or fields; every change is in the history."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = Field(default=None, min_length=1, max_length=2000)
    category: Category | None = None
    confidence: float | None = Field(default=None, ge=0, le=1)
    importance: float | None = Field(default=None, ge=0, le=1)
    valid_to: Moment | None = Field(default=None, description=_ON_CLOCKS)
    is_active: bool | None = None
    reason: str | None = Field(default=None, max_length=500)


class HistoryEntry(BaseModel):
    """One change of a memory."""

    id: int
    memory_id: int
    action: str
    old_content: str | None
    new_content: str | None
    reason: str | None
    cause: dict[str, Any]
    created_at: datetime


class MemorySearch(BaseModel):
    """``POST /v1/memories/search``: by meaning, within the scopes of a conversation."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000, description="搜索内容 / what to look for")
    group_id: str | None = Field(default=None, max_length=128)
    user_id: str | None = Field(default=None, max_length=128)
    scopes: list[Scope] | None = None
    categories: list[Category] | None = Field(
        default=None, description="限定类别 / only these categories"
    )
    include_inactive: bool = False
    top_k: int = Field(default=12, ge=1, le=200, description="返回条数 / how many results")
    min_relevance: float | None = Field(default=None, ge=0, le=1, description=MIN_RELEVANCE)


class ForgetRequest(BaseModel):
    """``POST /v1/memories/forget``: by ids, by category, or by query, within scope filters."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[int, Field(ge=1, le=BIGINT_MAX)]] | None = Field(
        default=None, max_length=1000
    )
    category: Category | None = None
    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=4000,
        description="forget memories that share a word with the query and are at least"
        " min_score similar to it",
    )
    min_score: float = Field(
        default=0.8,
        ge=0,
        le=1,
        description="with query: the least cosine similarity of a memory to forget; it must"
        " share a word with the query as well",
    )
    group_id: str | None = Field(default=None, max_length=128)
    user_id: str | None = Field(default=None, max_length=128)
    scopes: list[Scope] | None = None
    mode: Literal["deactivate", "delete"] = "deactivate"
    reason: str | None = Field(default=None, max_length=500)
    dry_run: bool = Field(
        default=False, description="answer which memories would be forgotten, change nothing"
    )


class ForgetResult(BaseModel):
    """What a forget request changed (or, as a dry run, would change)."""

    mode: str
    changed: list[int]
    dry_run: bool = False
