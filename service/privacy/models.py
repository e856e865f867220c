"""Erasure tombstones: that an erasure happened, never what was erased."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Identity, Index, String
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column


class Erasure(Base):
    """A hashed subject, when, by whom, how many rows. No foreign key: a tenant's own
    erasure outlives the tenant."""

    __tablename__ = "erasures"
    __table_args__ = (
        Index("ix_erasures_subject", "tenant_id", "subject_hash"),
        # The worker's sweep after tenants' erasures: the latest tenant tombstones alone, not
        # a scan of every person's over the years.
        Index("ix_erasures_tenants", "created_at", postgresql_where=sql("kind = 'tenant'")),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # user | group | tenant
    subject_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    requested_by: Mapped[str | None] = mapped_column(String(64))
    counts: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=sql("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = created_at_column()
