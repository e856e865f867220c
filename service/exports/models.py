"""A finished (or pending) export and its content, kept in chunks of whole rows."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column


class Export(Base):
    """One export: whose (by hash only), which job writes it, when it is ready and expires."""

    __tablename__ = "exports"
    __table_args__ = (
        # Erasure finds a subject's exports by the hash of the subject.
        Index("ix_exports_subject", "tenant_id", "subject_hash"),
        # The prune: exports past their expiry, across tenants.
        Index("ix_exports_expiry", "expires_at"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # user | group | tenant
    subject_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    # The key prefix (or "admin") that asked for it: only the same caller may fetch it.
    requested_by: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Rows per section (counts only: no personal data).
    manifest: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = created_at_column()
    ready_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class ExportChunk(Base):
    """A piece of an export's document; a chunk always ends between rows, so a name is never
    split across two chunks (erasure matches it within one)."""

    __tablename__ = "export_chunks"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant_id", "export_id"], ["exports.tenant_id", "exports.id"], ondelete="CASCADE"
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    export_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[str] = mapped_column(Text, nullable=False)
