"""API shapes of profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.context import ID_MAX, ConversationContext
from service.memories.schemas import MIN_RELEVANCE, RELEVANCE


class ProfileInfo(BaseModel):
    """A profile: its Markdown document and the parsed front matter."""

    entity_type: str
    entity_id: str
    group_id: str | None
    name: str
    tags: list[Any]
    document: str
    body: str
    source_event_id: str | None
    version: int
    updated_at: datetime
    modified_at: datetime


class RevisionInfo(BaseModel):
    """A kept previous text and what replaced it."""

    version: int
    document: str
    replaced_by: dict[str, Any]
    created_at: datetime


class ProfileReplace(BaseModel):
    """``PUT``: a complete document (validated like the historian's)."""

    model_config = ConfigDict(extra="forbid")

    document: str = Field(min_length=1, max_length=20_000)


class Rollback(BaseModel):
    """``POST …/rollback``: the version to make current again."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=2**31 - 1)


class ProfileSearch(BaseModel):
    """``POST /v1/profiles/search`` = ``cognitive_search_profiles``. With ``context``, only
    what that conversation may see: in a group, the group's own profile, its members' and the
    user profiles of its members; in a private chat, its user's profile."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000, description="搜索关键词 / what to look for")
    entity_type: Literal["user", "group", "member", "private"] | None = Field(
        default=None,
        description="限定类型（默认：用户和群） / only this kind (default: users and groups)",
    )
    group_id: str | None = Field(
        default=None,
        max_length=ID_MAX,
        description="也查这个群的成员侧写 / also the member profiles of this group",
    )
    top_k: int | None = Field(
        default=None,
        ge=1,
        le=200,
        description="返回条数（默认 8） / how many results (default 8, a tenant setting)",
    )
    min_relevance: float | None = Field(default=None, ge=0, le=1, description=MIN_RELEVANCE)
    context: ConversationContext | None = None


class ProfileLookup(BaseModel):
    """``cognitive_get_profile``: one profile, as a conversation may see it (a member is one
    of the conversation's group)."""

    model_config = ConfigDict(extra="forbid")

    entity_type: Literal["user", "group", "member"] = Field(
        description="user、group 或 member / user, group or member"
    )
    entity_id: str = Field(
        min_length=1, max_length=ID_MAX, description="用户 ID 或群 ID / user id or group id"
    )


class ProfileHit(ProfileInfo):
    """A profile found by meaning."""

    score: float = Field(description=RELEVANCE)
