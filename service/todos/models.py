"""The todos table."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
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

STATUSES = ("PENDING", "COMPLETED", "CANCELLED", "EXPIRED")


class Todo(Base):
    """Something to do or remind, in a group or a private chat, maybe at a time."""

    __tablename__ = "todos"
    __table_args__ = (
        CheckConstraint(
            "status IN ('PENDING', 'COMPLETED', 'CANCELLED', 'EXPIRED')", name="status"
        ),
        Index("ix_todos_conversation", "tenant_id", "conversation_key", "status"),
        # Bots polling for due todos, and the expiry sweep.
        Index(
            "ix_todos_due", "tenant_id", "trigger_time", postgresql_where=sql("status = 'PENDING'")
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    conversation_key: Mapped[str] = mapped_column(String(200), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    creator_id: Mapped[str | None] = mapped_column(String(128))
    assignee_id: Mapped[str | None] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, nullable=False)
    trigger_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="PENDING")
    evidence: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
