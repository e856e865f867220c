"""Foundation: pgvector, the application role, tenants, API keys, the jobs queue.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from service.db.rls import APP_ROLE, create_app_role, protect_tenant_table

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    create_app_role()

    op.create_table(
        "memoria_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_memoria_meta"),
    )
    dim = int(context.config.attributes.get("embedding_dim", 384))
    model = str(context.config.attributes.get("embedding_model", "multilingual-e5-small"))
    meta = sa.table("memoria_meta", sa.column("key"), sa.column("value"))
    op.bulk_insert(
        meta,
        [{"key": "embedding_dim", "value": str(dim)}, {"key": "embedding_model", "value": model}],
    )
    op.execute(f"GRANT SELECT ON memoria_meta TO {APP_ROLE}")

    op.create_table(
        "tenants",
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column(
            "settings",
            postgresql.JSONB(),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
    )
    protect_tenant_table("tenants", column="id")

    op.create_table(
        "api_keys",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.String(200), server_default="", nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.LargeBinary(32), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name="fk_api_keys_tenant_id_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_api_keys"),
    )
    op.create_index("ix_api_keys_prefix", "api_keys", ["prefix"])
    protect_tenant_table("api_keys")

    op.create_table(
        "jobs",
        sa.Column("tenant_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column(
            "payload", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("status", sa.String(16), server_default="queued", nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column(
            "run_after", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="4", nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(), nullable=True),
        sa.Column("dedupe_key", sa.String(400), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed')", name="ck_jobs_status"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_jobs_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_jobs"),
        sa.UniqueConstraint("tenant_id", "dedupe_key", name="uq_jobs_tenant_id_dedupe_key"),
    )
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        [sa.text("priority DESC"), "run_after", "id"],
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_jobs_leases",
        "jobs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index("ix_jobs_tenant_status", "jobs", ["tenant_id", "status", sa.text("id DESC")])
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["status", "finished_at"],
        postgresql_where=sa.text("status IN ('done', 'failed')"),
    )
    protect_tenant_table("jobs")
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE jobs_id_seq TO {APP_ROLE}")
    # Wake sleeping workers when a job becomes claimable. pg_notify is delivered at COMMIT,
    # so a worker never wakes for a job it cannot yet see.
    op.execute(
        """
        CREATE FUNCTION memoria_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('memoria_jobs', NEW.kind);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_notify AFTER INSERT OR UPDATE OF status ON jobs
        FOR EACH ROW WHEN (NEW.status = 'queued') EXECUTE FUNCTION memoria_jobs_notify()
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS jobs CASCADE")
    op.execute("DROP FUNCTION IF EXISTS memoria_jobs_notify()")
    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("memoria_meta")
    op.execute("DROP FUNCTION IF EXISTS memoria_current_tenant()")
