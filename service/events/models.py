"""The events table, and the layout of their vectors for exact nearest-neighbour search."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy import (
    text as sql,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column
from service.db.registry import Embedded
from service.db.types import Embedding
from service.events.vectors import EVENT_VECTORS_SCAN

# An event id holds a conversation's id (up to 128 characters) and a request id (up to 200),
# each of which may triple in length as they are escaped, with the turn's numbers.
EVENT_ID_MAX = 1000


class Event(Base):
    """One absolute fact of a conversation, with the seeds' metadata. Id: its conversation's
    turn and item (``g:<group>:<request_id>:<end_seq>.<n>``, see ``ends.service.event_ids``);
    an event stored before ids named their conversation keeps its ``<request_id>:<end_seq>…``."""

    __tablename__ = "events"
    __table_args__ = (
        Index(
            "ix_events_conversation_time", "tenant_id", "conversation_key", sql("occurred_at DESC")
        ),
        # One member's latest events in a group, for their questions about their own news.
        Index(
            "ix_events_sender_time",
            "tenant_id",
            "conversation_key",
            "sender_id",
            sql("occurred_at DESC"),
        ),
        # Lexical search: which events hold a term (filtered to the conversations after).
        Index("ix_events_lexical", "lexical", postgresql_using="gin"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[str] = mapped_column(String(EVENT_ID_MAX), primary_key=True)
    conversation_key: Mapped[str] = mapped_column(String(200), nullable=False)
    request_type: Mapped[str] = mapped_column(String(16), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    sender_id: Mapped[str | None] = mapped_column(String(128))
    request_id: Mapped[str] = mapped_column(String(200), nullable=False)
    end_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # observation | memo
    perspective: Mapped[str] = mapped_column(String(16), nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    source_text: Mapped[str] = mapped_column(Text, nullable=False)
    is_absolute: Mapped[bool] = mapped_column(Boolean, nullable=False)
    warnings: Mapped[list[Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'[]'::jsonb")
    )
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False)
    location_abs: Mapped[str | None] = mapped_column(Text)
    message_ids: Mapped[list[Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'[]'::jsonb")
    )
    meta: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    embedding: Mapped[Any] = mapped_column(Embedding(), nullable=True)
    # The text's terms as segmented by service.retrieval.terms, with positions.
    lexical: Mapped[str] = mapped_column(
        TSVECTOR, nullable=False, server_default=sql("''::tsvector")
    )
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class EventVector(Base):
    """An event's embedding, scaled to unit length and rounded to half precision.

    Only the covering index is read: it keeps each conversation's vectors together in time
    order, so a search scans one contiguous run of index pages (an index-only scan) instead
    of visiting the wide event rows one heap page at a time. The half-precision distances
    pick candidates; the full-precision vectors in ``events`` decide (see the repository).
    """

    __tablename__ = "event_vectors"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant_id", "event_id"], ["events.tenant_id", "events.id"], ondelete="CASCADE"
        ),
        # The one definition of the index (at a dimension small enough to carry the vectors).
        Index(
            EVENT_VECTORS_SCAN.name,
            *EVENT_VECTORS_SCAN.columns,
            postgresql_include=[*EVENT_VECTORS_SCAN.include, EVENT_VECTORS_SCAN.vector_column],
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(EVENT_ID_MAX), primary_key=True)
    conversation_key: Mapped[str] = mapped_column(String(200), nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    embedding: Mapped[Any] = mapped_column(HALFVEC(), nullable=False)


# An event's vector is made of its text as is.
EMBEDDED = Embedded(table="events", key=("id",), key_types=("text",), source=("text",))
