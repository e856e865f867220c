"""The memo log: what the bot did each turn (the short-term memory, the old end_summaries)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column


class Memo(Base):
    """One turn's memo, kept per conversation; the newest are injected into the next turns."""

    __tablename__ = "memos"
    __table_args__ = (
        # One memo per turn of a conversation: the bot's request ids repeat across them.
        UniqueConstraint("tenant_id", "conversation_key", "request_id", "end_seq"),
        Index("ix_memos_conversation_time", "tenant_id", "conversation_key", text("said_at DESC")),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    conversation_key: Mapped[str] = mapped_column(String(200), nullable=False)
    request_type: Mapped[str] = mapped_column(String(16), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    sender_id: Mapped[str | None] = mapped_column(String(128))
    request_id: Mapped[str] = mapped_column(String(200), nullable=False)
    end_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    memo: Mapped[str] = mapped_column(Text, nullable=False)
    said_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    created_at: Mapped[datetime] = created_at_column()
