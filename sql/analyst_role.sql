-- Memoria: the read-only role `memoria_analyst`, which can read the analytics views and
-- nothing else. Run after sql/analytics.sql, as the same role (the owner of the tables):
--
--     psql -v ON_ERROR_STOP=1 -d memoria -f sql/analyst_role.sql
--
-- Running it again is harmless. Creating the role needs CREATEROLE; without it, have an
-- administrator run `CREATE ROLE memoria_analyst NOLOGIN` first.
--
-- memoria_analyst cannot log in. Give each analyst a login role that is a member of it
-- (sql/README.md), and grant tenants with analytics.grant_tenant: to the analyst's own role,
-- or to memoria_analyst for every analyst at once.
--
-- Beyond its grants, a role keeps what PUBLIC has: CONNECT to the database, USAGE on schema
-- public (but no privilege on any table there) and EXECUTE on ordinary functions. This file
-- takes away the two things PUBLIC could still create: temporary objects and tables in
-- schema public.

BEGIN;

DO $$
BEGIN
    IF to_regclass('analytics.tenants') IS NULL THEN
        RAISE EXCEPTION 'schema analytics is missing: run sql/analytics.sql first';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'memoria_analyst') THEN
        BEGIN
            CREATE ROLE memoria_analyst
                NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
            COMMENT ON ROLE memoria_analyst IS
                'Reads the analytics views of the tenants granted to it.';
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role memoria_analyst does not exist and % may not create it',
                current_user
                USING HINT = 'Have an administrator run: CREATE ROLE memoria_analyst NOLOGIN';
        END;
    END IF;
    -- A role made by someone else must still be harmless: reading the views is all it is for.
    IF EXISTS (
        SELECT 1 FROM pg_roles
        WHERE rolname = 'memoria_analyst'
          AND (rolsuper OR rolbypassrls OR rolcreaterole OR rolcreatedb OR rolreplication)
    ) THEN
        RAISE EXCEPTION 'role memoria_analyst has more than read rights: recreate it NOLOGIN';
    END IF;
END
$$;

-- The schema, and in it SELECT on every view and nothing else (the grants table and the
-- grant functions stay the owner's). Granting per view in a loop keeps a view added to
-- analytics.sql readable without editing this file; relkind 'v' leaves tables out.
REVOKE ALL ON SCHEMA analytics FROM PUBLIC;
GRANT USAGE ON SCHEMA analytics TO memoria_analyst;
REVOKE ALL ON analytics.analyst_grants FROM PUBLIC, memoria_analyst;
REVOKE ALL ON FUNCTION analytics.grant_tenant(name, uuid) FROM PUBLIC, memoria_analyst;
REVOKE ALL ON FUNCTION analytics.revoke_tenant(name, uuid) FROM PUBLIC, memoria_analyst;

DO $$
DECLARE
    view regclass;
BEGIN
    FOR view IN
        SELECT c.oid::regclass FROM pg_class c
        WHERE c.relnamespace = 'analytics'::regnamespace AND c.relkind = 'v'
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM PUBLIC, memoria_analyst', view);
        EXECUTE format('GRANT SELECT ON %s TO memoria_analyst', view);
    END LOOP;
END
$$;

-- No temporary tables or functions for PUBLIC. Temporary objects are where a role without
-- any CREATE privilege could still define functions, and fill the disk. The database's
-- owner keeps the right, and memoria_app is given it back so the
-- service behaves the same whether or not this file was run. Other roles that need
-- temporary tables in this database must be granted TEMPORARY explicitly.
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO memoria_app', current_database());
END
$$;

-- No tables of one's own in schema public (already the default since PostgreSQL 15).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

COMMIT;
