"""Re-embedding runs (one deployment-wide row each) and each tenant's progress in them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, DateTime, ForeignKey, Identity, Integer, String
from sqlalchemy import Text as TextType
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base

RUN_STATUSES = ("embedding", "switching", "done", "cancelled")
ACTIVE = ("embedding", "switching")


class ReembedRun(Base):
    """Which model every vector is being remade with, and how far the run has come.

    Not a tenant's row: the embedding model is the deployment's. The API key is not kept
    here; each worker uses the one of its own ``models.embedding`` settings.
    """

    __tablename__ = "reembed_runs"
    __table_args__ = (
        CheckConstraint("status IN ('embedding', 'switching', 'done', 'cancelled')", name="status"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    provider: Mapped[str] = mapped_column(String(16), nullable=False)
    model_name: Mapped[str] = mapped_column(String(200), nullable=False)
    dimensions: Mapped[int] = mapped_column(Integer, nullable=False)
    api_url: Mapped[str] = mapped_column(TextType, nullable=False, server_default="")
    batch_size: Mapped[int] = mapped_column(Integer, nullable=False)
    previous_model: Mapped[str] = mapped_column(String(200), nullable=False)
    previous_dimensions: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="embedding")
    # Rows written while the run went on, embedded by the switch's catch-up.
    caught_up: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=sql("now()")
    )
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ReembedProgress(Base):
    """One tenant's pass over one table: the last key embedded, rows done of rows seen.

    No foreign key to the run: every key of a tenant table leads with ``tenant_id``.
    """

    __tablename__ = "reembed_progress"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    table_name: Mapped[str] = mapped_column(String(32), primary_key=True)
    cursor: Mapped[list[Any] | None] = mapped_column(JSONB)
    rows_total: Mapped[int | None] = mapped_column(BigInteger)
    rows_done: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    batches: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=sql("now()")
    )
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
