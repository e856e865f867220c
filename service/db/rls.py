"""Migration helpers: the application role and row-level security on each tenant table."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.engine import APP_ROLE
from service.db.vector_index import VectorIndex


def create_app_role() -> None:
    """Create the non-owner role that every tenant transaction switches to, and join it."""
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                CREATE ROLE {APP_ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS;
            END IF;
            IF NOT pg_has_role(current_user, '{APP_ROLE}', 'MEMBER') THEN
                EXECUTE format('GRANT {APP_ROLE} TO %I', current_user);
            END IF;
        END
        $$
        """
    )
    op.execute(f"GRANT USAGE ON SCHEMA public TO {APP_ROLE}")
    # The tenant of the current transaction, or NULL when none is bound (then RLS hides all).
    op.execute(
        """
        CREATE OR REPLACE FUNCTION memoria_current_tenant() RETURNS uuid
        LANGUAGE sql STABLE PARALLEL SAFE
        AS $$ SELECT NULLIF(current_setting('app.tenant_id', true), '')::uuid $$
        """
    )
    op.execute(f"GRANT EXECUTE ON FUNCTION memoria_current_tenant() TO {APP_ROLE}")


def protect_tenant_table(table: str, column: str = "tenant_id") -> None:
    """Grant the app role DML on ``table`` and confine it to the bound tenant's rows."""
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}")
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"""
        CREATE POLICY tenant_isolation ON {table}
            USING ({column} = memoria_current_tenant())
            WITH CHECK ({column} = memoria_current_tenant())
        """
    )


def embedding_dim() -> int:
    """The deployment's vector dimension, as recorded by the first migration."""
    bind = op.get_bind()
    value = bind.execute(
        sa.text("SELECT value FROM memoria_meta WHERE key = 'embedding_dim'")
    ).scalar_one()
    return int(value)


def create_vector_index(index: VectorIndex) -> None:
    """Create a vector index as defined once (``service.db.vector_index``), for the
    deployment's dimension; a covering index too narrow for the vectors leaves them in the
    rows (storage MAIN)."""
    dim = embedding_dim()
    if index.storage(dim) == "MAIN":
        op.execute(f"ALTER TABLE {index.table} ALTER COLUMN {index.vector_column} SET STORAGE MAIN")
    op.execute(index.create_sql(dim))
