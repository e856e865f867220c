"""The jobs table: the historian's durable queue."""

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
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base, created_at_column

JOB_STATUSES = ("queued", "running", "done", "failed")


class Job(Base):
    """One unit of background work, claimed with ``FOR UPDATE SKIP LOCKED``."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="status"),
        UniqueConstraint("tenant_id", "dedupe_key"),
        # The claim query: queued jobs by priority, then turn (the tenants' jobs in turns).
        # run_after last (after the unique id, so not for the order): the claim's "due" is
        # then decided on the index entry, with no read of the row of a job not yet due.
        Index(
            "ix_jobs_claimable",
            text("priority DESC"),
            "turn",
            "id",
            "run_after",
            postgresql_where=text("status = 'queued'"),
        ),
        # A tenant's pace (see service.queue.repository): its jobs queued to run at once,
        # newest first; none of its jobs not yet due has an entry to pass over.
        Index(
            "ix_jobs_pace",
            "tenant_id",
            text("id DESC"),
            postgresql_where=text("status = 'queued' AND run_after <= created_at"),
        ),
        # One job waiting per queueing lock (``repository.enqueue_joined``): a request that
        # would queue a second joins the one not yet started instead. A job put back in the
        # queue after it started (a retry, a shutdown) is not held to it: it may meet the
        # job queued meanwhile, and each reads only what is still to do when it runs.
        Index(
            "ux_jobs_queueing_lock",
            "tenant_id",
            "queueing_lock",
            unique=True,
            postgresql_where=text(
                "status = 'queued' AND started_at IS NULL AND queueing_lock IS NOT NULL"
            ),
        ),
        # The claim passes over a job whose queueing lock is held by a running job.
        Index(
            "ix_jobs_running_lock",
            "tenant_id",
            "queueing_lock",
            postgresql_where=text("status = 'running' AND queueing_lock IS NOT NULL"),
        ),
        # Reclaiming jobs whose worker died: running jobs by lease expiry.
        Index("ix_jobs_leases", "lease_expires_at", postgresql_where=text("status = 'running'")),
        # GET /v1/jobs?status=…: a tenant's jobs newest first.
        Index("ix_jobs_tenant_status", "tenant_id", "status", text("id DESC")),
        # A tenant's unfinished job of a kind (``repository.unfinished``: an erasure or an
        # export asked again, every key made or admin call while the tenant may be erased):
        # its own entries only, not past each of the tenant's queued jobs of other kinds.
        Index(
            "ix_jobs_unfinished",
            "tenant_id",
            "kind",
            text("id DESC"),
            postgresql_where=text("status IN ('queued', 'running', 'failed')"),
        ),
        # Pruning finished jobs by age.
        Index(
            "ix_jobs_finished",
            "status",
            "finished_at",
            postgresql_where=text("status IN ('done', 'failed')"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(String(64), nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="queued")
    priority: Mapped[int] = mapped_column(SmallInteger, nullable=False, server_default="0")
    run_after: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    # A virtual time set at enqueue (see service.queue.repository): the claim's order.
    turn: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="4")
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    dedupe_key: Mapped[str | None] = mapped_column(String(1000))
    # Jobs of one lock (e.g. one conversation's extraction) wait one at a time and run one
    # at a time; None: no such rule.
    queueing_lock: Mapped[str | None] = mapped_column(String(400))
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobReceipt(Base):
    """The first answer to a request that made a job, kept past the job's own retention, so
    that a repeat of the request long after its job was pruned makes no second one."""

    __tablename__ = "job_receipts"
    # No foreign key to tenants: see service.db.citus (the table stays beside jobs).
    __table_args__ = (
        # Pruning receipts by age.
        Index("ix_job_receipts_created", "created_at"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(1000), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    answer: Mapped[Any] = mapped_column(JSONB, nullable=True)
    # A digest of the request that made the job: a repeat of the key with another request is
    # refused, not answered as the first (None: a receipt made before requests were digested).
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = created_at_column()
