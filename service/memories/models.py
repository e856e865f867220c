"""Memories and their change history."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
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

SCOPES = ("GLOBAL", "PRIVATE", "GROUP", "MEMBER_IN_GROUP")
CATEGORIES = ("PROFILE", "PREFERENCE", "FACT", "SUMMARY")


class Memory(Base):
    """One curated fact, bound to a user (GLOBAL: everywhere they are; PRIVATE: only in their
    private chat), a group (GROUP) or both (MEMBER_IN_GROUP)."""

    __tablename__ = "memories"
    __table_args__ = (
        CheckConstraint("scope IN ('GLOBAL', 'PRIVATE', 'GROUP', 'MEMBER_IN_GROUP')", name="scope"),
        CheckConstraint(
            "category IN ('PROFILE', 'PREFERENCE', 'FACT', 'SUMMARY')", name="category"
        ),
        CheckConstraint(
            "(scope IN ('GLOBAL', 'PRIVATE') AND user_id IS NOT NULL AND group_id IS NULL)"
            " OR (scope = 'GROUP' AND group_id IS NOT NULL AND user_id IS NULL)"
            " OR (scope = 'MEMBER_IN_GROUP' AND group_id IS NOT NULL AND user_id IS NOT NULL)",
            name="scope_binding",
        ),
        # The conversation's scopes, active first: the historian's and the reader's filter.
        Index("ix_memories_scope", "tenant_id", "scope", "group_id", "user_id", "is_active"),
        Index("ix_memories_user", "tenant_id", "user_id"),
        # Forgetting: memories by last use.
        Index("ix_memories_last_used", "tenant_id", "last_used_at"),
        # One rolling SUMMARY per group and day.
        Index(
            "uq_memories_group_summary_day",
            "tenant_id",
            "group_id",
            "summary_day",
            unique=True,
            postgresql_where=sql("category = 'SUMMARY' AND summary_day IS NOT NULL"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16), nullable=False)
    user_id: Mapped[str | None] = mapped_column(String(128))
    group_id: Mapped[str | None] = mapped_column(String(128))
    category: Mapped[str] = mapped_column(String(16), nullable=False)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    embedding: Mapped[Any] = mapped_column(Embedding(), nullable=True)
    confidence: Mapped[float] = mapped_column(Float, nullable=False, server_default="0.5")
    importance: Mapped[float] = mapped_column(Float, nullable=False, server_default="0.5")
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_to: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    is_active: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=sql("true"))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    summary_day: Mapped[date | None] = mapped_column(Date)
    evidence: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class MemoryHistory(Base):
    """Every change of a memory: add, update, deactivate, restore, delete, no-op duplicate."""

    __tablename__ = "memory_history"
    __table_args__ = (Index("ix_memory_history_memory", "tenant_id", "memory_id", "id"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    # No foreign key: a hard-deleted memory's history says that it was deleted.
    memory_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    action: Mapped[str] = mapped_column(String(24), nullable=False)
    old_content: Mapped[str | None] = mapped_column(Text)
    new_content: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    cause: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = created_at_column()


# A memory's vector is made of its content as is.
EMBEDDED = Embedded(table="memories", key=("id",), key_types=("bigint",), source=("content",))
