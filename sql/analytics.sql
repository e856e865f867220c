-- Memoria: read-only views of tenant data for analysts (schema `analytics`).
--
-- Run as the role that owns Memoria's tables (the one that runs `memoria migrate`), after
-- the migrations, then run sql/analyst_role.sql:
--
--     psql -v ON_ERROR_STOP=1 -d memoria -f sql/analytics.sql
--
-- Running it again is harmless: every statement is idempotent and the grants survive.
--
-- How tenants are kept apart. A view runs with the rights of its owner, and the owner of
-- the tables bypasses their row-level security, so the views do the filtering themselves:
-- each one joins `analytics.tenants`, which holds only the tenants granted (in
-- `analytics.analyst_grants`) to the querying role or to a role whose privileges it inherits
-- (`pg_has_role(…, 'USAGE')` of the querying role: the role set with SET ROLE, else the
-- role that logged in; read from the session rather than `current_user` so that it is the
-- analyst's also inside the owner's functions of a Citus cluster, below). Every view is a
-- security barrier, so a condition or function in the analyst's own query is never
-- evaluated on rows before that filter has removed the other tenants. Consequently the
-- owner must never be `memoria_app` (RLS would then hide every row).
--
-- On a Citus cluster (the `citus` extension installed) the last block of this file wraps
-- every view: Citus runs the shards' part of a query on the workers as the current role,
-- where an analyst has no privilege on the shards and row-level security hides every row.
-- There the views' queries move to schema `analytics_owner` (no access for anyone else) and
-- each `analytics` view reads them through a SECURITY DEFINER function, so the query runs,
-- and reaches the workers, as the owner, while the tenant filter still names the analyst.
--
-- What is never shown: vectors (`embedding`), API keys, job payloads, results and errors,
-- tenant settings (webhook URLs), profile documents, and the text kept in memory_history.
--
-- To change the columns of an existing view, DROP it first (CREATE OR REPLACE VIEW can only
-- add columns at the end), then run this file and sql/analyst_role.sql again.

BEGIN;

CREATE SCHEMA IF NOT EXISTS analytics;
COMMENT ON SCHEMA analytics IS 'Read-only views of Memoria''s tenant data for analysts.';

-- Which role may see which tenant. A grant to a group role (e.g. memoria_analyst) applies to
-- every member that inherits its privileges. tenant_id leads the key like in every tenant
-- table; deleting a tenant deletes its grants.
CREATE TABLE IF NOT EXISTS analytics.analyst_grants (
    tenant_id uuid NOT NULL REFERENCES public.tenants (id) ON DELETE CASCADE,
    role_name name NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, role_name)
);
COMMENT ON TABLE analytics.analyst_grants IS
    'Tenants an analyst role may see; change it with analytics.grant_tenant / revoke_tenant.';

-- The tenants the querying role may see: the one place where the grants are read.
-- pg_roles is joined rather than calling pg_has_role(role_name, …), which raises an error
-- for a role dropped after its grant.
CREATE OR REPLACE VIEW analytics.tenants WITH (security_barrier = true) AS
SELECT t.id AS tenant_id, t.name AS tenant_name, t.created_at
FROM public.tenants t
WHERE t.id IN (
    SELECT g.tenant_id
    FROM analytics.analyst_grants g
    JOIN pg_catalog.pg_roles r ON r.rolname = g.role_name
    -- The querying role: SET ROLE's (checked by PostgreSQL: only a role one is a member of),
    -- else the login role. Unlike current_user, it stays the analyst's inside a SECURITY
    -- DEFINER function (the Citus wrappers below).
    WHERE pg_catalog.pg_has_role(
        CASE pg_catalog.current_setting('role')
            WHEN 'none' THEN session_user
            ELSE pg_catalog.current_setting('role')::name
        END,
        r.oid,
        'USAGE'
    )
);
COMMENT ON VIEW analytics.tenants IS 'The tenants granted to you (directly or to a role you inherit).';

-- Active memories: what the bots currently act on.
CREATE OR REPLACE VIEW analytics.current_memories WITH (security_barrier = true) AS
SELECT m.tenant_id, t.tenant_name, m.id AS memory_id, m.scope, m.category,
       m.user_id, m.group_id, m.content, m.confidence, m.importance,
       m.valid_from, m.valid_to, m.last_used_at, m.created_at, m.updated_at
FROM public.memories m
JOIN analytics.tenants t ON t.tenant_id = m.tenant_id
WHERE m.is_active;
COMMENT ON VIEW analytics.current_memories IS 'Active memories (is_active), without vectors.';

-- Group events per local day: the day on the group's own calendar (the event's timezone),
-- not the server's.
CREATE OR REPLACE VIEW analytics.events_per_group_day WITH (security_barrier = true) AS
SELECT e.tenant_id, t.tenant_name, e.group_id,
       (e.occurred_at AT TIME ZONE e.timezone)::date AS local_day,
       count(*) AS events,
       count(*) FILTER (WHERE e.is_absolute) AS absolute_events,
       round(avg(e.is_absolute::int), 3) AS absolute_share
FROM public.events e
JOIN analytics.tenants t ON t.tenant_id = e.tenant_id
WHERE e.group_id IS NOT NULL
GROUP BY e.tenant_id, t.tenant_name, e.group_id, local_day;
COMMENT ON VIEW analytics.events_per_group_day IS
    'Events of group chats per group and local day, with the share stored as absolute.';

-- One row per profile: how often it changed and what changed it last (the newest kept
-- revision records what replaced it: job, api, rollback or name).
CREATE OR REPLACE VIEW analytics.profile_changes WITH (security_barrier = true) AS
SELECT p.tenant_id, t.tenant_name, p.entity_type, p.entity_id, p.group_id, p.name,
       p.version AS current_version, rev.kept AS revisions_kept,
       rev.last_by AS last_change_by, p.created_at, p.modified_at AS last_modified
FROM public.profiles p
JOIN analytics.tenants t ON t.tenant_id = p.tenant_id
CROSS JOIN LATERAL (
    SELECT count(*) AS kept,
           (array_agg(r.replaced_by ->> 'by' ORDER BY r.version DESC))[1] AS last_by
    FROM public.profile_revisions r
    WHERE r.tenant_id = p.tenant_id AND r.profile_key = p.profile_key
) rev;
COMMENT ON VIEW analytics.profile_changes IS
    'Profiles with their current version, revisions kept and last change (no documents).';

-- The queue per tenant, kind and UTC day of enqueueing. Latency is enqueue to done, over
-- done jobs; retries are the attempts beyond the first (attempts count claims).
-- Done jobs are pruned after done_retention_hours (24 h), failed ones after
-- failed_max_age_days: rates are only comparable for recent days.
CREATE OR REPLACE VIEW analytics.job_stats WITH (security_barrier = true) AS
SELECT j.tenant_id, t.tenant_name, j.kind,
       (j.created_at AT TIME ZONE 'UTC')::date AS day_utc,
       count(*) AS jobs,
       count(*) FILTER (WHERE j.status = 'queued') AS queued,
       count(*) FILTER (WHERE j.status = 'running') AS running,
       count(*) FILTER (WHERE j.status = 'done') AS done,
       count(*) FILTER (WHERE j.status = 'failed') AS failed,
       round(extract(epoch FROM avg(j.finished_at - j.created_at)
                                FILTER (WHERE j.status = 'done')), 3) AS avg_latency_seconds,
       round(extract(epoch FROM percentile_cont(0.95) WITHIN GROUP
                                (ORDER BY j.finished_at - j.created_at)
                                FILTER (WHERE j.status = 'done')), 3) AS p95_latency_seconds,
       round(count(*) FILTER (WHERE j.status = 'failed')::numeric
             / nullif(count(*) FILTER (WHERE j.status IN ('done', 'failed')), 0), 3)
           AS failure_rate,
       sum(greatest(j.attempts - 1, 0)) AS retries
FROM public.jobs j
JOIN analytics.tenants t ON t.tenant_id = j.tenant_id
GROUP BY j.tenant_id, t.tenant_name, j.kind, day_utc;
COMMENT ON VIEW analytics.job_stats IS
    'Jobs per tenant, kind and UTC day: counts by status, latency, failure rate, retries.';

-- The historian's gate per tenant and UTC day of storing: an event stored with
-- is_absolute = false still failed the gate after every retry.
CREATE OR REPLACE VIEW analytics.historian_gate WITH (security_barrier = true) AS
SELECT e.tenant_id, t.tenant_name,
       (e.created_at AT TIME ZONE 'UTC')::date AS day_utc,
       count(*) AS events,
       count(*) FILTER (WHERE e.is_absolute) AS absolute_events,
       round(avg(e.is_absolute::int), 3) AS absolute_share,
       count(*) FILTER (WHERE e.warnings <> '[]'::jsonb) AS with_warnings,
       count(*) FILTER (WHERE e.kind = 'observation') AS observations,
       count(*) FILTER (WHERE e.kind = 'memo') AS memos
FROM public.events e
JOIN analytics.tenants t ON t.tenant_id = e.tenant_id
GROUP BY e.tenant_id, t.tenant_name, day_utc;
COMMENT ON VIEW analytics.historian_gate IS
    'Events stored per tenant and UTC day, and the share that passed the absoluteness gate.';

-- Every change of a memory, without its text or reason (a hard delete scrubs them, and the
-- reason may quote the text). Scope and owner come from the memory while it still exists.
CREATE OR REPLACE VIEW analytics.memory_changes WITH (security_barrier = true) AS
SELECT h.tenant_id, t.tenant_name, h.id AS change_id, h.memory_id, h.action,
       h.cause ->> 'by' AS changed_by,
       CASE WHEN jsonb_typeof(h.cause -> 'job_id') = 'number'
            THEN (h.cause ->> 'job_id')::bigint END AS job_id,
       m.scope, m.category, m.user_id, m.group_id,
       h.created_at AS changed_at, (h.created_at AT TIME ZONE 'UTC')::date AS day_utc
FROM public.memory_history h
JOIN analytics.tenants t ON t.tenant_id = h.tenant_id
LEFT JOIN public.memories m ON m.tenant_id = h.tenant_id AND m.id = h.memory_id;
COMMENT ON VIEW analytics.memory_changes IS
    'memory_history without content: action, what caused it (job, api, maintenance), when.';

CREATE OR REPLACE VIEW analytics.todos WITH (security_barrier = true) AS
SELECT d.tenant_id, t.tenant_name, d.id AS todo_id, d.group_id, d.user_id, d.creator_id,
       d.assignee_id, d.description, d.trigger_time, d.status, d.delivered_at,
       d.created_at, d.updated_at, d.completed_at
FROM public.todos d
JOIN analytics.tenants t ON t.tenant_id = d.tenant_id;
COMMENT ON VIEW analytics.todos IS 'Todos and reminders with their status.';

-- Granting and revoking, for the owner (EXECUTE is revoked from everyone else, and they run
-- with the caller's rights: nobody without INSERT on analyst_grants can grant anything).
CREATE OR REPLACE FUNCTION analytics.grant_tenant(analyst name, tenant uuid) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = analyst) THEN
        RAISE EXCEPTION 'role "%" does not exist', analyst USING ERRCODE = 'undefined_object';
    END IF;
    INSERT INTO analytics.analyst_grants (tenant_id, role_name) VALUES (tenant, analyst)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION analytics.grant_tenant(name, uuid) IS
    'Let a role (and the roles that inherit it) see a tenant; false if it already could.';

CREATE OR REPLACE FUNCTION analytics.revoke_tenant(analyst name, tenant uuid) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM analytics.analyst_grants WHERE tenant_id = tenant AND role_name = analyst
        RETURNING 1
    )
    SELECT count(*) > 0 FROM gone
$$;
COMMENT ON FUNCTION analytics.revoke_tenant(name, uuid) IS
    'Stop a role seeing a tenant (a grant to a group role it inherits still applies).';

REVOKE ALL ON FUNCTION analytics.grant_tenant(name, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION analytics.revoke_tenant(name, uuid) FROM PUBLIC;

-- Citus only: each view's query moves to analytics_owner.<view>, read by a SECURITY DEFINER
-- function analytics_owner.<view>_rows(), and analytics.<view> becomes a view of that
-- function (see the top of this file for why). The statements above have just made every
-- analytics view a plain one again, so what analytics_owner held is stale: it is rebuilt.
-- The function takes no argument and filters on the session's role itself, so calling it
-- directly gives nothing more than the view.
DO $$
DECLARE
    views text[];
    view text;
    grant_ record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    DROP SCHEMA IF EXISTS analytics_owner CASCADE;
    CREATE SCHEMA analytics_owner;
    REVOKE ALL ON SCHEMA analytics_owner FROM PUBLIC;
    COMMENT ON SCHEMA analytics_owner IS
        'The analytics views'' queries on Citus, run as the owner (made by sql/analytics.sql).';
    -- The names first: the loop adds views of the same names to the schema it reads.
    SELECT array_agg(c.relname::text ORDER BY c.relname) INTO views
    FROM pg_class c
    WHERE c.relnamespace = 'analytics'::regnamespace AND c.relkind = 'v';
    FOREACH view IN ARRAY coalesce(views, '{}')
    LOOP
        EXECUTE format('ALTER VIEW analytics.%I SET SCHEMA analytics_owner', view);
        EXECUTE format(
            'CREATE FUNCTION analytics_owner.%I() RETURNS SETOF analytics_owner.%I'
            ' LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp'
            ' AS %L',
            view || '_rows', view,
            format('SELECT * FROM analytics_owner.%I', view)
        );
        EXECUTE format(
            'CREATE VIEW analytics.%I WITH (security_barrier = true)'
            ' AS SELECT * FROM analytics_owner.%I()',
            view, view || '_rows'
        );
        EXECUTE format(
            'COMMENT ON VIEW analytics.%I IS %L',
            view, obj_description(format('analytics_owner.%I', view)::regclass, 'pg_class')
        );
        -- The grants made on the view (by sql/analyst_role.sql) pass to its wrapper; the
        -- query itself is the owner's alone.
        FOR grant_ IN
            SELECT a.privilege_type, a.grantee
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = format('analytics_owner.%I', view)::regclass
              AND a.grantee <> c.relowner
        LOOP
            EXECUTE format(
                'GRANT %s ON analytics.%I TO %s',
                grant_.privilege_type, view,
                CASE WHEN grant_.grantee = 0 THEN 'PUBLIC'
                     ELSE quote_ident(pg_get_userbyid(grant_.grantee)) END
            );
        END LOOP;
        EXECUTE format('REVOKE ALL ON analytics_owner.%I FROM PUBLIC', view);
        FOR grant_ IN
            SELECT DISTINCT a.grantee
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = format('analytics_owner.%I', view)::regclass
              AND a.grantee NOT IN (0, c.relowner)
        LOOP
            EXECUTE format(
                'REVOKE ALL ON analytics_owner.%I FROM %I', view, pg_get_userbyid(grant_.grantee)
            );
        END LOOP;
    END LOOP;
END
$$;

COMMIT;
