"""The analysts' SQL surface (sql/): views of the granted tenants only, and a role that can
read those views and nothing else. The example queries are taken from sql/README.md."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from service.db.migrate import upgrade_to_head
from service.settings import Settings
from tests.conftest import DatabaseFactory, database_url, plain_dsn, raw_connection

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
SCRIPTS = (SQL_DIR / "analytics.sql", SQL_DIR / "analyst_role.sql")


def readme_section(title: str) -> str:
    """The text of one ``## title`` section of sql/README.md."""
    text = (SQL_DIR / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def sql_blocks(section: str) -> list[str]:
    """The fenced ```sql blocks of a README section."""
    return re.findall(r"```sql\n(.*?)```", section, flags=re.DOTALL)


def example_queries() -> dict[str, str]:
    """The README's example queries, by the comment on their first line."""
    queries = {}
    for block in sql_blocks(readme_section("Example queries")):
        title = block.splitlines()[0]
        assert title.startswith("-- "), f"an example query without a title: {block}"
        queries[title.removeprefix("-- ")] = block
    return queries


async def install(conn: asyncpg.Connection) -> None:
    """Run both scripts, twice: running them again must change nothing."""
    for _ in range(2):
        for script in SCRIPTS:
            await conn.execute(script.read_text(encoding="utf-8"))


async def on_citus(conn: asyncpg.Connection) -> bool:
    """Whether the database is a Citus coordinator's."""
    return bool(await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'citus'"))


async def create_role(conn: asyncpg.Connection, prefix: str, *options: str) -> str:
    """A role with a name of its own: roles belong to the whole server, not the database."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await conn.execute(f'CREATE ROLE "{name}" {" ".join(options) or "NOLOGIN"}')
    return name


async def drop_role(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("RESET ROLE")
    await conn.execute(f'DROP ROLE IF EXISTS "{name}"')


# --- Two tenants with the same group and user ids, so that a leak shows in every number. ---


@dataclass
class Seeded:
    a: uuid.UUID
    b: uuid.UUID
    now: datetime
    memory: dict[str, int]
    contents: dict[str, str]


async def add_event(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    event_id: str,
    *,
    group: str | None,
    created_at: datetime,
    occurred_at: datetime | None = None,
    timezone: str = "Asia/Shanghai",
    kind: str = "observation",
    absolute: bool = True,
    warnings: tuple[str, ...] = (),
) -> None:
    await conn.execute(
        """
        INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id, user_id,
                            sender_id, request_id, end_seq, kind, perspective, text,
                            source_text, is_absolute, warnings, occurred_at, timezone,
                            created_at, embedding)
        VALUES ($1, $2::text, $3, $4, $5, $6::text, $6, $2, 1, $7, 'third', 'text of ' || $2,
                'source of ' || $2, $8, $9::jsonb, $10, $11, $12, NULL)
        """,
        tenant,
        event_id,
        f"g:{group}" if group else "p:10001",
        "group" if group else "private",
        group,
        None if group else "10001",
        kind,
        absolute,
        json.dumps(list(warnings)),
        occurred_at or created_at,
        timezone,
        created_at,
    )


async def add_memory(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    scope: str,
    category: str,
    content: str,
    *,
    user: str | None = None,
    group: str | None = None,
    importance: float = 0.5,
    active: bool = True,
) -> int:
    memory_id: int = await conn.fetchval(
        """
        INSERT INTO memories (tenant_id, scope, user_id, group_id, category, content,
                              embedding, importance, is_active)
        VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8) RETURNING id
        """,
        tenant,
        scope,
        user,
        group,
        category,
        content,
        importance,
        active,
    )
    return memory_id


async def add_change(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    memory_id: int,
    action: str,
    cause: dict[str, Any],
    at: datetime,
    new: str | None = None,
) -> None:
    await conn.execute(
        """
        INSERT INTO memory_history (tenant_id, memory_id, action, new_content, reason, cause,
                                    created_at)
        VALUES ($1, $2, $3::text, $4, 'because ' || $3, $5::jsonb, $6)
        """,
        tenant,
        memory_id,
        action,
        new,
        json.dumps(cause),
        at,
    )


async def add_job(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    kind: str,
    status: str,
    attempts: int,
    created_at: datetime,
    seconds: float | None = None,
) -> None:
    finished = created_at + timedelta(seconds=seconds) if seconds is not None else None
    await conn.execute(
        """
        INSERT INTO jobs (tenant_id, kind, payload, status, attempts, created_at, started_at,
                          finished_at, result, last_error)
        VALUES ($1, $2, '{"secret": "sk-payload"}', $3::text, $4, $5, $5, $6, '{"secret": 1}',
                CASE WHEN $3 = 'failed' THEN 'boom' END)
        """,
        tenant,
        kind,
        status,
        attempts,
        created_at,
        finished,
    )


async def add_profile(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    entity_type: str,
    entity_id: str,
    group: str | None,
    revisions: list[str],
) -> None:
    key = f"{entity_type}:{entity_id}"
    await conn.execute(
        """
        INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, group_id, name,
                              document, body, version, updated_at, embedding)
        VALUES ($1, $2, $3, $4::text, $5, 'name ' || $4, '---', 'body', $6, now(), NULL)
        """,
        tenant,
        key,
        entity_type,
        entity_id,
        group,
        len(revisions) + 1,
    )
    for version, by in enumerate(revisions, start=1):
        await conn.execute(
            "INSERT INTO profile_revisions (tenant_id, profile_key, version, document,"
            " replaced_by) VALUES ($1, $2, $3, 'old', $4::jsonb)",
            tenant,
            key,
            version,
            json.dumps({"by": by}),
        )


async def seed(conn: asyncpg.Connection) -> Seeded:
    """Tenant A, which the analyst may see, and tenant B, which it must not."""
    a, b = uuid.uuid4(), uuid.uuid4()
    await conn.executemany(
        "INSERT INTO tenants (id, name) VALUES ($1, $2)", [(a, "tenant-a"), (b, "tenant-b")]
    )
    await conn.execute(
        "INSERT INTO api_keys (tenant_id, id, prefix, key_hash) VALUES ($1, $2, 'mk_a', $3)",
        a,
        uuid.uuid4(),
        b"\x01" * 32,
    )
    now: datetime = await conn.fetchval("SELECT now()")
    day = timedelta(days=1)

    # Events. A: groups 100200 (3, one a memo that failed the gate), 100300 (1), a private
    # chat (1), and two stored yesterday in 100400 at one instant seen from two timezones.
    for n, absolute in enumerate((True, True, False)):
        await add_event(
            conn,
            a,
            f"a-g1-{n}",
            group="100200",
            created_at=now,
            kind="memo" if not absolute else "observation",
            absolute=absolute,
            warnings=() if absolute else ("relative_time",),
        )
    await add_event(conn, a, "a-g2", group="100300", created_at=now)
    await add_event(conn, a, "a-private", group=None, created_at=now)
    instant = datetime.fromisoformat("2024-01-15T16:30:00+00:00")
    await add_event(conn, a, "a-sh", group="100400", created_at=now - day, occurred_at=instant)
    await add_event(
        conn,
        a,
        "a-ny",
        group="100400",
        created_at=now - day,
        occurred_at=instant,
        timezone="America/New_York",
        absolute=False,
        warnings=("pronoun",),
    )
    # B: more events, in a group id A also has.
    for n in range(5):
        await add_event(conn, b, f"b-g2-{n}", group="100300", created_at=now)
    for n in range(2):
        await add_event(conn, b, f"b-g9-{n}", group="900900", created_at=now)

    # Memories of user 10001 in both tenants.
    contents = {
        "coffee": "用户 10001 喜欢喝美式咖啡",
        "title": "用户 10001 在群 100200 希望被称为王总",
        "tea": "用户 10001 喜欢喝茶",
        "rule": "群 100200 禁止发广告",
        "other": "用户 10002 喜欢爬山",
        "b-cats": "B 的用户 10001 喜欢猫",
    }
    memory = {
        "coffee": await add_memory(
            conn, a, "GLOBAL", "PREFERENCE", contents["coffee"], user="10001", importance=0.9
        ),
        "title": await add_memory(
            conn,
            a,
            "MEMBER_IN_GROUP",
            "PREFERENCE",
            contents["title"],
            user="10001",
            group="100200",
            importance=0.7,
        ),
        "tea": await add_memory(
            conn, a, "GLOBAL", "PREFERENCE", contents["tea"], user="10001", active=False
        ),
        "rule": await add_memory(conn, a, "GROUP", "FACT", contents["rule"], group="100200"),
        "other": await add_memory(conn, a, "GLOBAL", "PREFERENCE", contents["other"], user="10002"),
        "b-cats": await add_memory(
            conn, b, "GLOBAL", "PREFERENCE", contents["b-cats"], user="10001", importance=1.0
        ),
    }
    job = {"by": "job", "job_id": 7}
    await add_change(conn, a, memory["coffee"], "add", job, now, contents["coffee"])
    await add_change(conn, a, memory["title"], "update", job, now, contents["title"])
    await add_change(conn, a, memory["rule"], "add", {"by": "api", "key_prefix": "mk_a"}, now)
    await add_change(conn, a, memory["tea"], "deactivate", job, now - 2 * day)
    await add_change(conn, a, 999_999, "delete", job, now)  # hard-deleted: scrubbed, no row
    await add_change(conn, b, memory["b-cats"], "add", job, now, contents["b-cats"])

    # Jobs: A's historian.end took 1, 2 and 10 s, one retried, one failed after 4 attempts.
    hour_ago = now - timedelta(hours=1)
    for seconds, attempts in ((1, 1), (2, 1), (10, 2)):
        await add_job(conn, a, "historian.end", "done", attempts, hour_ago, seconds)
    await add_job(conn, a, "historian.end", "failed", 4, hour_ago, 30)
    await add_job(conn, a, "messages.extract", "done", 1, hour_ago, 4)
    await add_job(conn, a, "messages.extract", "queued", 0, hour_ago)
    for _ in range(3):
        await add_job(conn, b, "historian.end", "failed", 4, hour_ago, 5)

    await add_profile(conn, a, "user", "10001", None, ["job", "api"])
    await add_profile(conn, a, "group", "100200", "100200", [])
    await add_profile(conn, b, "user", "10001", None, ["job"])

    for tenant, text in ((a, "提醒张三周五交报告"), (b, "B 的提醒")):
        await conn.execute(
            "INSERT INTO todos (tenant_id, conversation_key, group_id, description)"
            " VALUES ($1, 'g:100200', '100200', $2)",
            tenant,
            text,
        )
    return Seeded(a, b, now, memory, contents)


@dataclass
class Analytics:
    owner: asyncpg.Connection  # the tables' owner (the test server's superuser)
    analyst: asyncpg.Connection  # a session switched to the analyst's role
    role: str
    data: Seeded


@pytest.fixture
async def analytics(db_url: str) -> AsyncIterator[Analytics]:
    """Seeded data, both scripts run, tenant A granted to a member of memoria_analyst."""
    owner = await asyncpg.connect(plain_dsn(db_url))
    analyst = await asyncpg.connect(plain_dsn(db_url))
    role = await create_role(owner, "memoria_test_analyst")
    try:
        data = await seed(owner)
        await install(owner)
        await owner.execute(f'GRANT memoria_analyst TO "{role}"')
        assert await owner.fetchval("SELECT analytics.grant_tenant($1, $2)", role, data.a)
        assert not await owner.fetchval("SELECT analytics.grant_tenant($1, $2)", role, data.a)
        await analyst.execute(f'SET ROLE "{role}"')
        yield Analytics(owner, analyst, role, data)
    finally:
        await analyst.close()
        await drop_role(owner, role)
        await owner.close()


# --- The README's example queries, as the analyst. ---


def _rows(records: list[asyncpg.Record]) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in records]


def _check_tenants(rows: list[asyncpg.Record], s: Seeded) -> None:
    assert _rows(rows) == [(s.a, "tenant-a")]


def _check_active_groups(rows: list[asyncpg.Record], s: Seeded) -> None:
    # B's 100300 has five events and 900900 two: neither counts here.
    assert _rows(rows) == [("tenant-a", "100200", 3), ("tenant-a", "100300", 1)]


def _check_preferences(rows: list[asyncpg.Record], s: Seeded) -> None:
    # Not the inactive one, not user 10002's, not tenant B's.
    assert [r["content"] for r in rows] == [s.contents["coffee"], s.contents["title"]]
    assert [r["scope"] for r in rows] == ["GLOBAL", "MEMBER_IN_GROUP"]
    assert {r["tenant_name"] for r in rows} == {"tenant-a"}


def _check_historian_today(rows: list[asyncpg.Record], s: Seeded) -> None:
    got = {(r["tenant_name"], r["memory_id"], r["action"], r["content"]) for r in rows}
    assert got == {
        ("tenant-a", s.memory["coffee"], "add", s.contents["coffee"]),
        ("tenant-a", s.memory["title"], "update", s.contents["title"]),
        ("tenant-a", 999_999, "delete", None),
    }


def _check_failure_rates(rows: list[asyncpg.Record], s: Seeded) -> None:
    assert _rows(rows) == [
        ("tenant-a", "historian.end", 3, 1, Decimal("0.250"), 4),
        ("tenant-a", "messages.extract", 1, 0, Decimal("0.000"), 0),
    ]


def _check_gate(rows: list[asyncpg.Record], s: Seeded) -> None:
    utc_today = s.now.astimezone(UTC).date()  # the database's clock, at seeding
    assert _rows(rows) == [
        ("tenant-a", utc_today, 5, Decimal("0.800"), 1),
        ("tenant-a", utc_today - timedelta(days=1), 2, Decimal("0.500"), 1),
    ]


CHECKS: dict[str, Callable[[list[asyncpg.Record], Seeded], None]] = {
    "The tenants you can see": _check_tenants,
    "The ten most active groups of the past seven days": _check_active_groups,
    "A user's preference memories, wherever they apply": _check_preferences,
    "Memories the historian changed today (the text only while the memory is active)": (
        _check_historian_today
    ),
    "Job failure rates by kind": _check_failure_rates,
    "The gate's pass rate per day": _check_gate,
}


async def test_every_readme_example_query_answers_for_the_granted_tenant_only(
    analytics: Analytics,
) -> None:
    queries = example_queries()
    assert set(queries) == set(CHECKS), "sql/README.md and this test list different queries"
    for title, query in queries.items():
        rows = await analytics.analyst.fetch(query)
        CHECKS[title](rows, analytics.data)


async def test_views_compute_local_days_latency_and_profile_changes(
    analytics: Analytics,
) -> None:
    analyst, s = analytics.analyst, analytics.data
    # 2024-01-15 16:30 UTC is already the 16th in Shanghai, still the 15th in New York.
    days = await analyst.fetch(
        "SELECT local_day, events, absolute_events, absolute_share"
        " FROM analytics.events_per_group_day WHERE group_id = '100400' ORDER BY local_day"
    )
    assert _rows(days) == [
        (date(2024, 1, 15), 1, 0, Decimal("0.000")),
        (date(2024, 1, 16), 1, 1, Decimal("1.000")),
    ]

    end = await analyst.fetchrow(
        "SELECT sum(jobs) AS jobs, sum(done) AS done, sum(failed) AS failed,"
        " max(avg_latency_seconds) AS avg, max(p95_latency_seconds) AS p95,"
        " max(failure_rate) AS rate, sum(retries) AS retries"
        " FROM analytics.job_stats WHERE kind = 'historian.end'"
    )
    # p95 of 1, 2, 10 s interpolates between 2 and 10: 2 + 0.9 * 8.
    assert tuple(end.values()) == (4, 3, 1, Decimal("4.333"), Decimal("9.200"), Decimal("0.250"), 4)
    queued = await analyst.fetchrow(
        "SELECT queued, done, avg_latency_seconds FROM analytics.job_stats"
        " WHERE kind = 'messages.extract'"
    )
    assert tuple(queued.values()) == (1, 1, Decimal("4.000"))

    profiles = await analyst.fetch(
        "SELECT entity_type, entity_id, group_id, current_version, revisions_kept,"
        " last_change_by FROM analytics.profile_changes ORDER BY entity_type"
    )
    assert _rows(profiles) == [
        ("group", "100200", "100200", 1, 0, None),
        ("user", "10001", None, 3, 2, "api"),
    ]

    changes = await analyst.fetch(
        "SELECT action, changed_by, job_id, scope, user_id FROM analytics.memory_changes"
        " WHERE memory_id = $1",
        s.memory["tea"],
    )
    assert _rows(changes) == [("deactivate", "job", 7, "GLOBAL", "10001")]

    todos = await analyst.fetch("SELECT description, status FROM analytics.todos")
    assert _rows(todos) == [("提醒张三周五交报告", "PENDING")]
    # The private chat's event counts for the gate but not per group.
    assert (
        await analyst.fetchval("SELECT sum(events) FROM analytics.events_per_group_day")
        == await analyst.fetchval("SELECT sum(events) FROM analytics.historian_gate") - 1
    )


async def test_every_view_shows_the_granted_tenant_and_never_secrets(
    analytics: Analytics,
) -> None:
    owner, analyst, s = analytics.owner, analytics.analyst, analytics.data
    views = await owner.fetch(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'analytics'::regnamespace"
        " AND c.relkind = 'v' ORDER BY 1"
    )
    names = [v["relname"] for v in views]
    assert set(names) >= {
        "tenants",
        "current_memories",
        "events_per_group_day",
        "profile_changes",
        "job_stats",
        "historian_gate",
        "memory_changes",
        "todos",
    }
    for name in names:
        seen = await analyst.fetch(f"SELECT DISTINCT tenant_id FROM analytics.{name}")
        assert [r["tenant_id"] for r in seen] == [s.a], name
        # A superuser inherits every role: it sees the tenants granted to anyone, no more.
        seen = await owner.fetch(f"SELECT DISTINCT tenant_id FROM analytics.{name}")
        assert [r["tenant_id"] for r in seen] == [s.a], name

    columns = await owner.fetch(
        "SELECT table_name, column_name, udt_name FROM information_schema.columns"
        " WHERE table_schema = 'analytics'"
    )
    secret = {"embedding", "key_hash", "payload", "result", "last_error", "settings"}
    secret |= {"document", "old_content", "new_content", "reason", "evidence", "replaced_by"}
    for c in columns:
        assert c["column_name"] not in secret, dict(c)
        assert c["udt_name"] not in ("vector", "bytea", "jsonb"), dict(c)


async def test_the_analyst_cannot_read_tables_write_or_grant_itself_tenants(
    analytics: Analytics,
) -> None:
    owner, analyst, role, s = analytics.owner, analytics.analyst, analytics.role, analytics.data
    tables = [
        f"{r['schemaname']}.{r['tablename']}"
        for r in await owner.fetch(
            "SELECT schemaname, tablename FROM pg_tables"
            " WHERE schemaname IN ('public', 'analytics')"
        )
    ]
    assert {"public.memories", "public.api_keys", "public.jobs", "analytics.analyst_grants"} <= set(
        tables
    )
    for table in tables:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await analyst.fetch(f"SELECT * FROM {table} LIMIT 1")

    denied = [
        "INSERT INTO analytics.analyst_grants (tenant_id, role_name) VALUES ($1, current_user)",
        "SELECT analytics.grant_tenant(current_user, $1)",
        "SELECT analytics.grant_tenant('memoria_analyst', $1)",
        "SELECT analytics.revoke_tenant(current_user, $1)",
        "DELETE FROM public.memories WHERE tenant_id = $1",
        "UPDATE public.jobs SET status = 'done' WHERE tenant_id = $1",
        "INSERT INTO public.tenants (id, name) VALUES ($1, 'mine')",
    ]
    for statement in denied:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await analyst.execute(statement, s.b)
    for statement in (
        "CREATE TEMP TABLE scratch (i int)",
        "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE TABLE public.scratch (i int)",
        "CREATE TABLE analytics.scratch (i int)",
        "CREATE SCHEMA scratch",
        "CREATE ROLE scratch",
        f'GRANT memoria_analyst TO "{role}"',
        "ALTER VIEW analytics.current_memories SET (security_barrier = false)",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await analyst.execute(statement)
    # Views are not a way around it (whatever the error, nothing may change).
    for statement in (
        "UPDATE analytics.current_memories SET content = 'x'",
        "DELETE FROM analytics.todos",
        "DELETE FROM analytics.tenants",
    ):
        with pytest.raises(asyncpg.PostgresError):
            await analyst.execute(statement)

    # Functions that run as the owner (the app's term lookups) trust app.tenant_id, which an
    # analyst can set: none of them may be callable by the analyst.
    definers = await owner.fetch(
        "SELECT p.oid::regprocedure::text AS signature,"
        " has_function_privilege($1, p.oid, 'EXECUTE') AS callable"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE p.prosecdef AND n.nspname = 'public'",
        role,
    )
    assert len(definers) >= 3 and not [d["signature"] for d in definers if d["callable"]]
    await analyst.execute("SELECT set_config('app.tenant_id', $1, false)", str(s.b))
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await analyst.fetch(
            "SELECT * FROM memoria_event_term_matches(ARRAY['g:1'], 'x'::tsquery, NULL, NULL, 10)"
        )

    assert _rows(
        await owner.fetch("SELECT tenant_id, role_name FROM analytics.analyst_grants")
    ) == [(s.a, role)]
    assert await owner.fetchval("SELECT count(*) FROM memories WHERE content = 'x'") == 0
    assert await owner.fetchval("SELECT count(*) FROM todos") == 2
    # Not a member of anything that could read the tables.
    for other in ("memoria_app", await owner.fetchval("SELECT current_user")):
        assert not await owner.fetchval("SELECT pg_has_role($1, $2, 'MEMBER')", role, other)


async def test_a_leaky_function_in_the_analysts_query_never_sees_other_tenants(
    analytics: Analytics,
) -> None:
    """The views are security barriers: the analyst's own conditions run after the filter."""
    owner, analyst, s = analytics.owner, analytics.analyst, analytics.data
    # Analysts cannot create functions; this stands for any function that reveals its input
    # (an error message, a notice), which is cheap enough for the planner to run early.
    await owner.execute(
        """
        CREATE FUNCTION public.memoria_test_peek(value text) RETURNS boolean
        LANGUAGE plpgsql COST 0.0000001 AS $$
        BEGIN RAISE NOTICE 'peek:%', value; RETURN true; END $$
        """
    )
    seen: list[str] = []
    analyst.add_log_listener(lambda _conn, message: seen.append(message.message))

    async def peek(query: str) -> set[str]:
        seen.clear()
        await analyst.fetch(query)
        await asyncio.sleep(0.05)
        return {m.removeprefix("peek:") for m in seen if m.startswith("peek:")}

    memories = "SELECT * FROM analytics.current_memories WHERE public.memoria_test_peek(content)"
    groups = "SELECT * FROM analytics.events_per_group_day WHERE public.memoria_test_peek(group_id)"
    assert s.contents["b-cats"] not in await peek(memories)
    assert await peek(groups) == {"100200", "100300", "100400"}

    await owner.execute("ALTER VIEW analytics.current_memories SET (security_barrier = false)")
    try:
        if await on_citus(owner):
            # On Citus the rows come out of the owner's function, which the analyst's
            # conditions never enter: even without the barrier nothing else shows.
            assert s.contents["b-cats"] not in await peek(memories)
        else:
            # Without the barrier the same query shows tenant B's text (so the test can fail).
            assert s.contents["b-cats"] in await peek(memories)
    finally:
        await owner.execute("ALTER VIEW analytics.current_memories SET (security_barrier = true)")


async def test_on_citus_the_views_read_as_the_owner_and_nothing_else_opens(
    analytics: Analytics,
) -> None:
    """Citus runs a query's shard part on the workers as the current role: the views read
    through the owner's functions (sql/analytics.sql), whose schema stays closed."""
    owner, analyst, s = analytics.owner, analytics.analyst, analytics.data
    if not await on_citus(owner):
        pytest.skip("a Citus coordinator only")
    # The data really is spread over the workers (so a query reaches them).
    placements = await owner.fetchval(
        "SELECT count(DISTINCT nodename || ':' || nodeport) FROM pg_dist_shard_placement"
        " JOIN pg_dist_shard USING (shardid) WHERE logicalrelid = 'memories'::regclass"
    )
    assert placements >= 2
    wrapped = await owner.fetch(
        "SELECT p.proname, p.prosecdef FROM pg_proc p"
        " WHERE p.pronamespace = 'analytics_owner'::regnamespace ORDER BY 1"
    )
    assert len(wrapped) >= 8 and all(w["prosecdef"] for w in wrapped)
    for statement in (
        "SELECT * FROM analytics_owner.current_memories",
        "SELECT * FROM analytics_owner.current_memories_rows()",
        "SELECT * FROM analytics_owner.tenants",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await analyst.fetch(statement)
    # Many rows of the other tenant on every shard: still only the granted tenant's.
    for i in range(40):
        await add_memory(owner, s.b, "GLOBAL", "FACT", f"B fact {i}", user=f"u{i}")
    counts = await analyst.fetch(
        "SELECT tenant_id, count(*) AS n FROM analytics.current_memories GROUP BY 1"
    )
    assert [r["tenant_id"] for r in counts] == [s.a]
    # Running sql/analytics.sql again alone (a release's update) rebuilds the wrappers and
    # keeps their grants.
    await owner.execute(SCRIPTS[0].read_text(encoding="utf-8"))
    assert [r["tenant_id"] for r in await analyst.fetch("TABLE analytics.tenants")] == [s.a]
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await analyst.fetch("SELECT * FROM analytics_owner.tenants")


async def test_grants_to_memoria_analyst_reach_its_members_and_revoking_takes_effect(
    analytics: Analytics,
) -> None:
    owner, analyst, role, s = analytics.owner, analytics.analyst, analytics.role, analytics.data
    other = await create_role(owner, "memoria_test_analyst")
    gone = await create_role(owner, "memoria_test_analyst")
    try:
        await owner.execute(f'GRANT memoria_analyst TO "{other}"')

        async def visible(as_role: str) -> set[uuid.UUID]:
            await owner.execute(f'SET ROLE "{as_role}"')
            try:
                return {r["tenant_id"] for r in await owner.fetch("TABLE analytics.tenants")}
            finally:
                await owner.execute("RESET ROLE")

        assert await visible(other) == set()
        await owner.execute("SELECT analytics.grant_tenant('memoria_analyst', $1)", s.b)
        assert await visible(other) == {s.b}
        assert await visible(role) == {s.a, s.b}
        assert {
            r["tenant_name"] for r in await analyst.fetch("TABLE analytics.current_memories")
        } == {"tenant-a", "tenant-b"}

        # A role dropped after its grant breaks nothing (and no one sees through it).
        await owner.execute("SELECT analytics.grant_tenant($1, $2)", gone, s.b)
        await owner.execute(f'DROP ROLE "{gone}"')
        assert await visible(other) == {s.b}

        assert await owner.fetchval("SELECT analytics.revoke_tenant('memoria_analyst', $1)", s.b)
        assert await visible(role) == {s.a}
        assert await visible(other) == set()
        with pytest.raises(asyncpg.UndefinedObjectError):
            await owner.execute("SELECT analytics.grant_tenant('no_such_role_here', $1)", s.a)
        # Deleting a tenant takes its grants with it.
        await owner.execute("DELETE FROM tenants WHERE id = $1", s.a)
        assert await visible(role) == set()
        assert await owner.fetchval("SELECT count(*) FROM analytics.analyst_grants") == 1
    finally:
        await drop_role(owner, other)
        await drop_role(owner, gone)


async def test_the_readme_setup_of_an_analyst_runs_as_written(analytics: Analytics) -> None:
    owner, s = analytics.owner, analytics.data
    blocks = sql_blocks(readme_section("Analysts and their tenants"))
    assert len(blocks) == 1
    alice = f"memoria_test_alice_{uuid.uuid4().hex[:8]}"
    block = re.sub(r"\balice\b", alice, blocks[0]).replace("TENANT_ID", str(s.a))
    try:
        await owner.execute(block)
        # alice's own grant was revoked again; the one to memoria_analyst remains.
        grants = await owner.fetch("SELECT role_name FROM analytics.analyst_grants ORDER BY 1")
        assert sorted(r["role_name"] for r in grants) == sorted(["memoria_analyst", analytics.role])
        await owner.execute(f'SET ROLE "{alice}"')
        assert [r["tenant_id"] for r in await owner.fetch("TABLE analytics.tenants")] == [s.a]
        assert await owner.fetchval("SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", alice)
    finally:
        await drop_role(owner, alice)


async def test_the_scripts_work_for_a_database_owner_who_is_not_a_superuser(
    databases: DatabaseFactory,
) -> None:
    """The managed-database path: the owner has CREATEROLE, the extension is made for it."""
    admin = await asyncpg.connect(plain_dsn(databases.server_url))
    password = uuid.uuid4().hex
    owner_role = await create_role(
        admin, "memoria_test_owner", "LOGIN", "CREATEROLE", f"PASSWORD '{password}'"
    )
    analyst_role = await create_role(admin, "memoria_test_analyst")
    name = f"memoria_o_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}" OWNER "{owner_role}"')
        await admin.execute(f'GRANT memoria_app TO "{owner_role}"')
        async with raw_connection(database_url(databases.server_url, name)) as as_admin:
            await as_admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
        url = (
            make_url(database_url(databases.server_url, name))
            .set(username=owner_role, password=password)
            .render_as_string(hide_password=False)
        )
        await asyncio.to_thread(upgrade_to_head, url, Settings())

        async with raw_connection(url) as owner:
            assert not await owner.fetchval(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            )
            tenant = uuid.uuid4()
            await owner.execute("INSERT INTO tenants (id, name) VALUES ($1, 'managed')", tenant)
            await install(owner)
            await owner.execute("SELECT analytics.grant_tenant($1, $2)", analyst_role, tenant)
            # Not being a superuser, the owner inherits no analyst's grants: it sees nothing.
            assert await owner.fetchval("SELECT count(*) FROM analytics.tenants") == 0
            # The service's role keeps its temporary tables; the owner too.
            await owner.execute("CREATE TEMP TABLE owner_scratch (i int)")
            await owner.execute("SET ROLE memoria_app")
            await owner.execute("CREATE TEMP TABLE app_scratch (i int)")

        # Making analysts is for whoever holds ADMIN on memoria_analyst (here: the superuser).
        await admin.execute(f'GRANT memoria_analyst TO "{analyst_role}"')
        async with raw_connection(database_url(databases.server_url, name)) as analyst:
            await analyst.execute(f'SET ROLE "{analyst_role}"')
            seen = await analyst.fetch("SELECT tenant_id, tenant_name FROM analytics.tenants")
            assert _rows(seen) == [(tenant, "managed")]
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await analyst.execute("CREATE TEMP TABLE scratch (i int)")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await analyst.fetch("SELECT * FROM public.tenants")
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await drop_role(admin, analyst_role)
        await drop_role(admin, owner_role)
        await admin.close()
