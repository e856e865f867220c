-- Memoria: database prerequisites.
--
-- The official postgres image runs this once, on an empty data directory, as POSTGRES_USER
-- (memoria, a superuser there). On a managed PostgreSQL, where the migration user is not a
-- superuser, a DBA runs it by hand as an administrator, connected to Memoria's database:
--
--     psql -v ON_ERROR_STOP=1 -d memoria -f deploy/initdb/01-memoria.sql
--
-- (if the migration user is not called `memoria`, replace that name below). Every statement
-- is idempotent, so running it again is harmless.
--
-- How the roles are used:
--   * memoria, the owning role, logs in and runs the migrations (`memoria migrate`). They
--     create and own the tables, enable row-level security on the tenant tables and grant
--     DML on them to memoria_app. The service uses this role directly only for the few
--     cross-tenant operations: authenticating API keys, creating tenants, claiming jobs.
--   * memoria_app cannot log in. Every tenant transaction of the service runs
--     `SET LOCAL role memoria_app` and sets `app.tenant_id`, so the RLS policies confine it
--     to that tenant's rows.
--   A table's owner bypasses its RLS policies, so the tables must never be owned by
--   memoria_app: never run migrations as memoria_app, and never make it a superuser or
--   give it BYPASSRLS.
--
-- The migrations repeat the first two steps when they are allowed to; on a managed server
-- they are not, which is what this file is for. The migration user also needs to create
-- tables in schema public and grant USAGE on it (simplest: it owns the database).

-- pgvector (creating it needs a superuser, or the provider's admin role).
CREATE EXTENSION IF NOT EXISTS vector;

-- The application role, and membership of the owner in it (needed for SET ROLE).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'memoria_app') THEN
        CREATE ROLE memoria_app NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
    -- pg_auth_members rather than pg_has_role(): the latter says yes for any superuser.
    IF NOT EXISTS (
        SELECT 1
        FROM pg_auth_members m
        JOIN pg_roles g ON g.oid = m.roleid
        JOIN pg_roles u ON u.oid = m.member
        WHERE g.rolname = 'memoria_app' AND u.rolname = 'memoria'
    ) THEN
        GRANT memoria_app TO memoria;
    END IF;
END
$$;
