"""Profiles and their kept revisions."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column
from service.db.registry import Embedded
from service.db.types import Embedding
from service.profiles.consolidate import digest

# The longest key: "member:" and two ids of 128 characters, each ':' and '%' in them escaped to
# three (``document.key_part``), and the ':' between them.
PROFILE_KEY_MAX = 800


class ProfileRow(Base):
    """The current document of one entity, with its front matter as columns."""

    __tablename__ = "profiles"
    __table_args__ = (Index("ix_profiles_type", "tenant_id", "entity_type", "group_id"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    profile_key: Mapped[str] = mapped_column(String(PROFILE_KEY_MAX), primary_key=True)
    entity_type: Mapped[str] = mapped_column(String(16), nullable=False)
    entity_id: Mapped[str] = mapped_column(String(128), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    tags: Mapped[list[Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'[]'::jsonb")
    )
    document: Mapped[str] = mapped_column(Text, nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    source_event_id: Mapped[str | None] = mapped_column(String(1000))
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    embedding: Mapped[Any] = mapped_column(Embedding(), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    created_at: Mapped[datetime] = created_at_column()
    modified_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class ProfileRevision(Base):
    """A previous text of a profile and what replaced it (the newest few are kept)."""

    __tablename__ = "profile_revisions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant_id", "profile_key"],
            ["profiles.tenant_id", "profiles.profile_key"],
            ondelete="CASCADE",
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    profile_key: Mapped[str] = mapped_column(String(PROFILE_KEY_MAX), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    document: Mapped[str] = mapped_column(Text, nullable=False)
    # Who replaced this text: {"by": "job"|"api"|"rollback"|"name", "job_id", "event_id", …}
    replaced_by: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = created_at_column()


def _passage(row: Any) -> str:
    return digest(row.body)


# A profile's vector is made of a digest of its body (see ``consolidate.digest``).
EMBEDDED = Embedded(
    table="profiles",
    key=("profile_key",),
    key_types=("text",),
    source=("body",),
    passage=_passage,
)
