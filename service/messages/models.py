"""Raw chat messages, and the per-conversation bookkeeping of their extraction."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import (
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column
from service.db.registry import Embedded
from service.db.types import Embedding
from service.messages.vectors import MESSAGE_VECTORS_SCAN


class Message(Base):
    """One chat message as the client sent it; ``message_id`` is unique per conversation."""

    __tablename__ = "messages"
    __table_args__ = (
        Index("ix_messages_conversation_time", "tenant_id", "conversation_key", "sent_at"),
        # A conversation in order, with what the ranking reads of a neighbour (revision 0016).
        Index(
            "ix_messages_neighbours",
            "tenant_id",
            "conversation_key",
            "seq",
            postgresql_include=["sent_at", "sender_id"],
        ),
        # The embedding job's work list: messages still without a vector.
        Index(
            "ix_messages_unembedded", "tenant_id", "seq", postgresql_where=sql("embedding IS NULL")
        ),
        # Lexical search: which messages hold a term (filtered to the conversation after).
        Index("ix_messages_lexical", "lexical", postgresql_using="gin"),
        # Dense search: a conversation's half-precision vectors, read by an index-only scan,
        # but a flood's copies' (revision 0022).
        Index(
            MESSAGE_VECTORS_SCAN.name,
            *MESSAGE_VECTORS_SCAN.columns,
            postgresql_include=[*MESSAGE_VECTORS_SCAN.include, MESSAGE_VECTORS_SCAN.vector_column],
            postgresql_where=sql(MESSAGE_VECTORS_SCAN.where or ""),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    conversation_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=True), nullable=False)
    request_type: Mapped[str] = mapped_column(String(16), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    sender_id: Mapped[str | None] = mapped_column(String(128))
    sender_name: Mapped[str | None] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text, nullable=False)
    sent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    embedding: Mapped[Any] = mapped_column(Embedding(), nullable=True)
    # ``embedding`` at unit length in half precision, kept by PostgreSQL (migration 0014).
    embedding_half: Mapped[Any] = mapped_column(
        HALFVEC(),
        Computed("CAST(l2_normalize(embedding) AS halfvec)", persisted=True),
        nullable=True,
    )
    # The text's terms as segmented by service.retrieval.terms, with positions.
    lexical: Mapped[str] = mapped_column(
        TSVECTOR, nullable=False, server_default=sql("''::tsvector")
    )
    # One of a flood's copies left unindexed (``service.retrieval.floods``): its words are
    # indexed in another copy, and it is left out of the dense search too (revision 0022).
    flood_copy: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=sql("false"))
    created_at: Mapped[datetime] = created_at_column()


class Conversation(Base):
    """A group chat or one user's private chat: counters and the extraction high-water mark."""

    __tablename__ = "conversations"
    __table_args__ = (
        # The pause trigger: conversations with unprocessed messages, quiet longest first.
        Index(
            "ix_conversations_pending",
            "updated_at",
            postgresql_where=sql("pending_count > 0"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    conversation_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_type: Mapped[str] = mapped_column(String(16), nullable=False)
    group_id: Mapped[str | None] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    group_name: Mapped[str | None] = mapped_column(String(200))
    message_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # Distinct terms summed over the messages: BM25's mean message length.
    term_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_message_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # Messages with seq <= extracted_seq have been handed to an extraction job.
    extracted_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    pending_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


def passage_text(sender_name: str | None, text: str) -> str:
    """What is embedded of a message: who said it, and what.

    Questions about a chat name people ("what did Caroline paint?"); a vector of the bare
    text cannot tell whose message it was (on LoCoMo, dense hit@10 0.30 without the name,
    0.55 with it).
    """
    return f"{sender_name}: {text}" if sender_name else text


def _passage(row: Any) -> str:
    return passage_text(row.sender_name, row.text)


# The message's vector is made of who said it and what (see ``passage_text``).
EMBEDDED = Embedded(
    table="messages",
    key=("conversation_key", "message_id"),
    key_types=("text", "text"),
    source=("sender_name", "text"),
    passage=_passage,
)
