"""API shapes of profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    """``POST /v1/profiles/search``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    entity_type: str | None = Field(default=None, pattern="^(user|group|member)$")
    group_id: str | None = Field(default=None, max_length=128)
    top_k: int | None = Field(default=None, ge=1, le=200)


class ProfileHit(ProfileInfo):
    """A profile found by meaning."""

    score: float
